"""The compiled model (kvsim's analogue of the vendor's ``.mxq``) and the compiler entry.

A compiled model holds the model and bit configs, the KV formats, the core mode and the
SRAM plan parameters, the DRAM memory map (weights, one KV region per layer, component and
cache slot, activations, host I/O), the integer parameters (:mod:`numerics`), and how to
get the weights (a synthetic generator and seed, or safetensors files). It is frozen: the
compiler searches the token tile and the weight tile sizes on scratch state first, then
builds it once. Programs are lowered from it on demand for any ``(tokens, cache_size,
slot)`` by the driver (:mod:`.driver`) from the model's blocks (:mod:`.blocks`); the file
(:mod:`.kvm`) also carries the encoded prefill and decode programs of the sizes it was
compiled for, for inspection (``kvsim compile`` prints them as assembly with ``--asm``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from isa import kvformats
from isa.instructions import MemoryLayout, Program
from kvsim.errors import ConfigError, DeviceError, KvsimError

from ..bits import BitConfig
from ..config import ModelConfig
from ..reference import rope_cos_sin
from ..weights import WeightSource
from .blocks.mla_image import mla_layer_image
from .blocks.moe_calib import moe_gemms
from .blocks.registry import ModelBlocks, blocks_for, probe_layers
from .builder import CORE_MODES, Target
from .calibrate_wide import calibrate_for, device_weights
from .dram import build_memory_map, dram_problem
from .driver import lower_call
from .errors import CompileError
from .kvm import check_consistent, fields_from_header, read_kvm, write_kvm
from .kvspec import KvCacheSpec
from .lowering import Lowering
from .memmap import MemoryMap
from .numerics import GemmQ, Numerics, numerics_problem, residual_bits, rotation_problem
from .rotation import head_tensor
from .sram import SramOverflow
from .wgroup import quantize_matrix, weight_group_size

#: Weight tile buffer size: two of them per core double-buffer weight streaming (an
#: assumption of the compiler: large enough that the per-tile DMA set-up is amortised).
DEFAULT_TILE_BYTES = 256 * 1024
ROPE_Q = 14  # isa.kernels.vector: Q14 cos/sin tables


@dataclass(frozen=True)
class HardwareTarget:
    """The hardware facts the compiler uses (from ``sim.device.hw.HardwareConfig``)."""

    name: str
    num_cores: int
    sram_bytes: int
    dram_bytes: int

    @classmethod
    def from_hw(cls, hw) -> HardwareTarget:
        return cls(hw.name, hw.cores.num_cores, hw.sram.bytes_per_core, hw.dram.capacity_bytes)


@dataclass(frozen=True)
class CompiledModel:
    model: ModelConfig
    bits: BitConfig
    kv: str  # KV layout name (e.g. "kivi-4") or spec
    hw: HardwareTarget
    core_mode: str
    max_seq: int
    cap: int
    slots: int
    tile_bytes: int
    m_tile: int
    mm: MemoryMap
    numerics: Numerics
    weights: dict[str, Any]  # {"kind": "synthetic", "seed": s} | {"kind": "safetensors", ...}
    programs: dict[str, Program] = field(default_factory=dict)
    tile_fixed: bool = False  # tile_bytes given by the user: use it for every pass
    #: passes of up to this many tokens stream weights in :attr:`big_tile_bytes` tiles
    big_tile_tokens: int = 0
    #: the weight tile of short passes (0: the tile itself); see :func:`big_tile`
    big_tile: int = 0
    blocks: ModelBlocks = field(init=False, repr=False, compare=False)
    #: weight tile bytes -> the lowering context (kept: its block memo serves every call)
    lowerings: dict[int, Lowering] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", blocks_for(self.model))
        object.__setattr__(self, "lowerings", {})

    # --- derived --------------------------------------------------------------------------
    @property
    def k_fmt(self) -> kvformats.KVFormat:
        return kvformats.pair(self.kv).k

    @property
    def v_fmt(self) -> kvformats.KVFormat:
        return kvformats.pair(self.kv).v

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(range(CORE_MODES[self.core_mode]))

    @property
    def big_tile_bytes(self) -> int:
        """The weight tile of short passes (a decode step's activations are small, so it
        streams weights in larger tiles than a prefill pass can)."""
        return self.big_tile or self.tile_bytes

    def bits_for(self, name: str) -> int:
        return self.bits.weights.bits_for(self.model.tensor_spec(name).role)

    def lowering(self, tile_bytes: int | None = None) -> Lowering:
        """The lowering context for weight tiles of ``tile_bytes`` (made once per size)."""
        tile = tile_bytes or self.tile_bytes
        if tile not in self.lowerings:
            self.lowerings[tile] = _lowering(
                self.model, self.bits, self.kv, self.hw, self.core_mode, max_seq=self.max_seq,
                cap=self.cap, m_tile=self.m_tile, mm=self.mm, numerics=self.numerics,
                tile_bytes=tile, blocks=self.blocks)
        return self.lowerings[tile]

    def layout(self, *, host_bytes: int) -> MemoryLayout:
        return MemoryLayout(dram_bytes=self.hw.dram_bytes, sram_bytes=self.hw.sram_bytes,
                            host_bytes=host_bytes, num_cores=self.hw.num_cores,
                            regions=tuple(self.mm.regions))

    def program(self, *, tokens: int, cache_size: int, slot: int = 0, host_in: int = 0,
                host_out: int = 0, all_logits: bool = False, shift: int = 0) -> Program:
        """One call's program (``all_logits``: every token's logits; ``shift``: RoPE
        positions beyond the cache positions; see :func:`.driver.lower_call`)."""
        if not 0 <= slot < self.slots:
            raise ConfigError(f"cache slot {slot} out of range 0..{self.slots - 1}")
        tile = self.tile_for(min(tokens, self.m_tile))
        return lower_call(self.lowering(tile), n=tokens, cache_size=cache_size, slot=slot,
                          host_in=host_in, host_out=host_out, all_logits=all_logits,
                          shift=shift)

    def tile_for(self, m: int) -> int:
        """The weight tile size for passes of ``m`` tokens: the big tile when its stage
        buffers still fit SRAM beside two tiles (found at compile time), else the tile."""
        return self.big_tile_bytes if m <= self.big_tile_tokens else self.tile_bytes

    def weight_source(self) -> WeightSource:
        """The float weights as the device and the host see them: rotated when the
        numerics rotate the residual stream (the host's embedding table is then ``E R``)."""
        return device_weights(self.model, self.weights, self.bits)

    def kv_caches(self, slot: int | None = None) -> list[KvCacheSpec]:
        """One spec per (slot, layer, component), of every slot or of ``slot``.

        GQA: components ``k`` and ``v`` of ``num_kv_heads`` heads of ``head_dim``; MLA: one
        component ``c`` (the ``[latent | rope key]`` records, ``kv_lora_rank +
        qk_rope_head_dim`` wide, one head) in the K format."""
        specs = self.blocks.attention.kv_specs(self.mm, pair=kvformats.pair(self.kv),
                                               cap=self.cap, slots=self.slots)
        return [s for s in specs if slot is None or s.slot == slot]

    def weight_image(self):
        """Yield ``(dram_addr, uint8 bytes)`` of everything launch loads into DRAM: weight
        codes, integer parameters, RoPE tables (functional runs only)."""
        if not self.numerics.functional:
            raise CompileError("this compiled model has no integer parameters (timing-only)")
        cfg = self.model
        src = self.weight_source()
        nq = self.numerics

        def gemm_entries(name: str, gq: GemmQ, values: np.ndarray | None = None):
            qw = quantize_matrix(src.tensor(name) if values is None else values,
                                 self.bits_for(name), weight_group_size(self.bits))
            yield self.mm[f"w.{name}"].base, qw.data.reshape(-1)
            n = qw.n
            p = np.zeros(2 * n, np.int32)
            if gq.bias is not None:
                p[:n] = gq.bias
            if gq.mult is not None:
                p[n:] = gq.mult
            yield self.mm[f"p.{name}"].base, p.view(np.uint8)

        def moe_entries(i: int, L):
            if cfg.layer_is_moe(i):  # router, routed and shared experts (blocks/moe_calib.py)
                for nm, gq in moe_gemms(cfg, i, L):
                    yield from gemm_entries(nm, gq)

        for i, L in enumerate(nq.layers):
            pre = f"layers.{i}."
            if cfg.is_mla:  # matrices in the device's basis (blocks/mla_calib.py)
                gemms, raw = mla_layer_image(cfg, src, i, L, self.bits_for)
                for nm, gq, values in gemms:
                    yield from gemm_entries(nm, gq, values)
                for region, data in raw:
                    yield self.mm[region].base, data
                yield from moe_entries(i, L)
                continue
            mlp = () if cfg.layer_is_moe(i) else (("gate_proj", L.gate), ("up_proj", L.up),
                                                   ("down_proj", L.down))
            for nm, gq in (("q_proj", L.q), ("k_proj", L.k), ("v_proj", L.v), ("o_proj", L.o),
                           *mlp):
                yield from gemm_entries(pre + nm, gq)
            yield from moe_entries(i, L)
            for nm in ("attn_norm", "mlp_norm", "q_norm", "k_norm", "post_attn_norm",
                       "post_mlp_norm"):  # the norms this model's layers have
                if f"p.{pre}{nm}" in self.mm:
                    yield self.mm[f"p.{pre}{nm}"].base, getattr(L, nm).gamma.view(np.uint8)
        yield from gemm_entries(cfg.lm_head_tensor, nq.head, head_tensor(src))
        yield self.mm["p.final_norm"].base, nq.final_norm.gamma.view(np.uint8)
        cos, sin = rope_tables(cfg, self.cap)
        yield self.mm["rope.cos"].base, cos.view(np.uint8).reshape(-1)
        yield self.mm["rope.sin"].base, sin.view(np.uint8).reshape(-1)


    # --- files ----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        write_kvm(self, path)

    @classmethod
    def load(cls, path: str | Path) -> CompiledModel:
        header, arrays, progs = read_kvm(path)
        f = fields_from_header(header, arrays)
        try:
            f["hw"] = HardwareTarget(**f["hw"])
            cm = cls(**f, programs=progs)
        except (KeyError, TypeError, ValueError, AttributeError, KvsimError) as err:
            raise CompileError(f"compiled model header is incomplete or invalid: {err!r}") \
                from None
        check_consistent(cm, arrays)
        return cm


def rope_tables(cfg: ModelConfig, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """Q14 int16 cos/sin tables ``[positions, rope_dim/2]`` (scalings included)."""
    cos, sin = rope_cos_sin(cfg, np.arange(positions))
    one = 1 << ROPE_Q
    return (np.floor(cos.astype(np.float64) * one + 0.5).astype(np.int16),
            np.floor(sin.astype(np.float64) * one + 0.5).astype(np.int16))


#: The grid of weight tile sizes the compiler searches, bytes (whole DMA bursts and SRAM
#: alignment units; an assumption of the compiler).
TILE_STEP = 4 * 1024


def tile_schedule(hw: HardwareTarget) -> int:
    """The weight tile of prefill passes: an eighth of a core's SRAM (two buffers, a
    quarter), at most :data:`DEFAULT_TILE_BYTES`. A smaller tile leaves room for more
    tokens per pass (fewer weight passes, less DRAM traffic) but pays the per-transfer
    costs (DMA set-up, DRAM access latency, a row opened per channel) more often; on
    ``aries`` both ways are slower (Llama-3.2-1B, 240 tokens: 14 KiB tiles hold 22 tokens
    but prefill 14 % slower, 56 KiB tiles 12 tokens and 31 % slower than 28 KiB's 19)."""
    return min(DEFAULT_TILE_BYTES, hw.sram_bytes // 8)


def _lowering(model: ModelConfig, bits: BitConfig, kv: str, hw: HardwareTarget,
              core_mode: str, *, max_seq: int, cap: int, m_tile: int, mm: MemoryMap,
              numerics: Numerics, tile_bytes: int, blocks: ModelBlocks) -> Lowering:
    wb = {s.name: bits.weights.bits_for(s.role) for s in model.tensors()
          if s.kind == "matrix" and s.role != "embedding"}  # an untied embedding: host
    pair = kvformats.pair(kv)
    return Lowering(model=model, weight_bits=wb, k_fmt=pair.k, v_fmt=pair.v, cap=cap,
                    max_seq=max_seq, m_tile=m_tile, mm=mm, numerics=numerics,
                    target=Target(tuple(range(CORE_MODES[core_mode])), hw.sram_bytes,
                                  tile_bytes),
                    blocks=blocks, weight_group=weight_group_size(bits),
                    kv_read=bits.kv_read, wide_schedule=bits.numerics.schedule)


def compile_model(
    model: ModelConfig,
    bits: BitConfig,
    hw: HardwareTarget,
    *,
    kv: str = "int8",
    core_mode: str = "global8",
    max_seq: int = 512,
    cap: int = 4096,
    slots: int = 1,
    tile_bytes: int | None = None,
    functional: bool = True,
    weights: dict[str, Any] | None = None,
    store_programs: bool = True,
) -> CompiledModel:
    """Compile ``model`` for ``hw``: memory map, SRAM tiling, integer parameters; with
    ``store_programs``, also the prefill and decode programs of the compiled sizes (what a
    ``.kvm`` file carries for inspection; a run lowers its own programs on demand, so it
    can leave them out and hold neither their instructions nor their lowering time)."""
    if core_mode not in CORE_MODES:
        raise CompileError(f"core_mode: {core_mode!r} is not one of {', '.join(CORE_MODES)}")
    if CORE_MODES[core_mode] > hw.num_cores:
        raise CompileError(f"core_mode {core_mode!r} needs {CORE_MODES[core_mode]} cores; "
                           f"{hw.name} has {hw.num_cores}")
    try:
        blocks = blocks_for(model)
    except KvsimError as err:
        raise CompileError(str(err)) from None
    problem = blocks.attention.kv_problem(kv)
    if problem:
        raise CompileError(f"kv.format: {problem}")
    if bits.kv_read == "dequant" and blocks.attention.kind not in ("gqa", "sliding-gqa"):
        raise CompileError(f"kv.read: the dequantize-on-read path is built for grouped-query "
                           f"attention; {blocks.attention.kind} attention reads its cache "
                           "as integers (kv.read = 'integer')")
    if max_seq < 1 or cap < max_seq:
        raise CompileError(f"max_sequence_length ({max_seq}) must be >= 1 and <= the cache "
                           f"length ({cap})")
    if type(slots) is not int or slots < 1:
        raise CompileError(f"cache slots: must be an integer >= 1, got {slots!r}")
    try:
        kvformats.pair(kv)
    except KvsimError as err:
        raise CompileError(f"kv.format: {err}") from None
    # before any map of all the slots is built (a million slots would take minutes)
    if (why := numerics_problem(bits.numerics, mla_or_moe=model.is_mla or model.is_moe,
                                unrotatable=rotation_problem(
                                    model, wide=residual_bits(bits.numerics) > 8))) is not None:
        raise CompileError(f"bits.numerics: {why}")
    if (why := dram_problem(model, bits, kv, cap=cap, slots=slots, max_seq=max_seq,
                            dram_bytes=hw.dram_bytes, hw_name=hw.name)) is not None:
        raise CompileError(f"model {model.name!r} {why}")
    if functional and model.rope_local_theta is not None:
        raise CompileError(f"model {model.name!r}: its sliding layers have their own RoPE "
                           f"(rope_local_theta {model.rope_local_theta:g}); kvsim builds one "
                           f"RoPE table per model, so it compiles for timing only "
                           f"(sim.fidelity = 'timing')")
    weights = weights or {"kind": "synthetic", "seed": 0}
    tile_fixed = tile_bytes is not None
    if tile_bytes is None:
        tile_bytes = tile_schedule(hw)
    search = _TileSearch(model, bits, kv, hw, core_mode, max_seq=max_seq, cap=cap,
                         slots=slots, blocks=blocks)
    m_tile = search.m_tile(tile_bytes)
    big = tile_bytes if tile_fixed else search.big_tile(m_tile, tile_bytes)
    big_tokens = search.big_tile_tokens(big, m_tile) if big != tile_bytes else 0
    mm = search.memory_map(m_tile)
    if (why := mm.too_big(hw.dram_bytes, hw.name)) is not None:
        raise CompileError(f"model {model.name!r} {why}")
    numerics = Numerics.placeholder(model.num_layers, residual_bits(bits.numerics),
                                    bits.numerics.rotation != "none")
    if functional:
        numerics = calibrate_for(model, bits, device_weights(model, weights, bits), weights)
    cm = CompiledModel(model=model, bits=bits, kv=kv, hw=hw, core_mode=core_mode,
                       max_seq=max_seq, cap=cap, slots=slots, tile_bytes=tile_bytes,
                       m_tile=m_tile, mm=mm, numerics=numerics, weights=weights,
                       tile_fixed=tile_fixed, big_tile_tokens=big_tokens,
                       big_tile=big if big_tokens else 0)
    if not store_programs:
        return cm
    done = replace(cm, programs={
        f"prefill_{max_seq}": cm.program(tokens=max_seq, cache_size=0),
        "decode": cm.program(tokens=1, cache_size=min(max_seq, cap - 1)),
    })
    done.lowerings.update(cm.lowerings)  # the runtime's calls replay the blocks seen here
    return done


class _TileSearch:
    """Scratch state of the tile searches: memory maps and lowerings of one layer of each
    kind (every layer of a kind needs the same SRAM, :func:`.blocks.registry.probe_layers`)
    for candidate token tiles, with placeholder integer parameters (SRAM use does not
    depend on their values)."""

    def __init__(self, model: ModelConfig, bits: BitConfig, kv: str, hw: HardwareTarget,
                 core_mode: str, *, max_seq: int, cap: int, slots: int, blocks: ModelBlocks):
        self.model, self.bits, self.kv, self.hw = model, bits, kv, hw
        self.core_mode, self.max_seq, self.cap, self.slots = core_mode, max_seq, cap, slots
        self.blocks = blocks
        self.layers = probe_layers(model)
        self.numerics = Numerics.placeholder(model.num_layers, residual_bits(bits.numerics),
                                             bits.numerics.rotation != "none")
        self._maps: dict[int, MemoryMap] = {}

    def memory_map(self, m_tile: int) -> MemoryMap:
        if m_tile not in self._maps:
            self._maps[m_tile] = build_memory_map(self.model, self.bits, self.kv, cap=self.cap,
                                                  slots=self.slots, max_seq=self.max_seq,
                                                  m_tile=m_tile)
        return self._maps[m_tile]

    def lower(self, m_tile: int, tile_bytes: int, m: int, *, head: bool = False) -> None:
        """Lower a pass of ``m`` tokens (raises :class:`SramOverflow` if it does not fit);
        ``head``: with the head (its buffers do not grow with the tokens, so each tile
        size checks it once, in its first probe)."""
        lw = _lowering(self.model, self.bits, self.kv, self.hw, self.core_mode,
                       max_seq=self.max_seq, cap=self.cap, m_tile=m_tile,
                       mm=self.memory_map(m_tile), numerics=self.numerics,
                       tile_bytes=tile_bytes, blocks=self.blocks)
        lower_call(lw, n=m, cache_size=0, layers=self.layers, head=head)

    def fits(self, m_tile: int, tile_bytes: int, m: int, *, head: bool = False) -> bool:
        try:
            self.lower(m_tile, tile_bytes, m, head=head)
        except SramOverflow:
            return False
        return True

    def m_tile(self, tile_bytes: int) -> int:
        """The most tokens per pass whose stage buffers fit in SRAM (binary search)."""
        try:
            self.lower(1, tile_bytes, 1, head=True)
        except SramOverflow as err:
            raise CompileError(f"model {self.model.name!r} does not fit {self.hw.name}'s SRAM "
                               f"even one token at a time: {err}") from None
        return _largest(1, self.max_seq, lambda m: self.fits(m, tile_bytes, m))

    def big_tile(self, m_tile: int, tile_bytes: int) -> int:
        """The weight tile of a decode pass: the largest on the :data:`TILE_STEP` grid
        (at least ``tile_bytes``, at most half the SRAM) whose one-token pass, head
        included, fits beside two of them: weights are nearly all a decode step moves, so
        the fewer transfers the better (binary search: a larger tile leaves less room)."""
        lo, hi = tile_bytes // TILE_STEP, self.hw.sram_bytes // 2 // TILE_STEP
        if lo >= hi or not self.fits(m_tile, lo * TILE_STEP, 1, head=True):
            return tile_bytes
        return _largest(lo, hi, lambda k: self.fits(m_tile, k * TILE_STEP, 1,
                                                     head=True)) * TILE_STEP

    def big_tile_tokens(self, big: int, m_tile: int) -> int:
        """The most tokens (0..m_tile) of a pass whose buffers fit beside two ``big``
        tiles, in the memory map of ``m_tile``-token tiles (buffers grow with the tokens,
        so the passes that fit are those up to a bound: binary search)."""
        if not self.fits(m_tile, big, 1, head=True):
            return 0
        return _largest(1, m_tile, lambda m: self.fits(m_tile, big, m))


def _largest(lo: int, hi: int, ok) -> int:
    """The largest ``m`` in ``lo..hi`` with ``ok(m)``, for a predicate true up to a bound
    and false beyond it (``ok(lo)`` is taken as true: binary search)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


__all__ = ["CompiledModel", "CompileError", "HardwareTarget", "compile_model", "CORE_MODES",
           "DeviceError", "build_memory_map", "dram_problem", "rope_tables"]

"""The compiled model (kvsim's analogue of the vendor's ``.mxq``) and the compiler entry.

A compiled model holds the model and bit configs, the KV formats, the core mode and the
SRAM plan parameters, the DRAM memory map (weights, one KV region per layer, component and
cache slot, activations, host I/O), the integer parameters (:mod:`numerics`), and how to
get the weights (a synthetic generator and seed, or safetensors files). Programs are
lowered from it on demand for any ``(tokens, cache_size, slot)``; the file also carries
the encoded prefill and decode programs of the sizes it was compiled for, for inspection
(``kvsim compile`` prints them as assembly with ``--asm``).

File format (versioned): a zip archive with ``header.json`` (format name and version,
configs, memory map, scalar parameters), ``arrays.npz`` (integer parameter arrays) and
``programs/*.bin`` (ISA binaries).
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from isa import kvformats
from isa.encoding import decode_program, encode_program
from isa.errors import ConfigError, DecodeError, DeviceError, KvsimError
from isa.instructions import MemoryLayout, Program

from ..bits import BitConfig, build_bit_config
from ..config import ModelConfig, build_model
from ..reference import rope_cos_sin, rope_dim
from ..source import open_weights
from ..weights import WeightSource, quantize_weight
from .calibrate import calibrate
from .lower import Lowering, SramOverflow, Target, lower_forward
from .lower_mla import (
    absorbed_params_region,
    lower_forward_mla,
    mla_kv_problem,
    mla_record_width,
    probe_layers,
)
from .memmap import MemoryMap, dram_shortfall
from .numerics import AddQ, AttnQ, GemmQ, LayerQ, NormQ, Numerics, SiluQ

FILE_FORMAT = "kvsim-compiled-model"
FILE_VERSION = 1
#: Cores each core mode runs one inference on (qb runtime ModelConfig; FACTS.md).
CORE_MODES = {"single": 1, "global4": 4, "global8": 8}
#: Weight tile buffer size: two of them per core double-buffer weight streaming (an
#: assumption of the compiler: large enough that the per-tile DMA set-up is amortised).
DEFAULT_TILE_BYTES = 256 * 1024
ROPE_Q = 14  # isa.kernels.vector: Q14 cos/sin tables


class CompileError(KvsimError, ValueError):
    """The model cannot be compiled for this hardware (it does not fit, or is invalid)."""


@dataclass(frozen=True)
class HardwareTarget:
    """The hardware facts the compiler uses (from ``sim.hw.HardwareConfig``)."""

    name: str
    num_cores: int
    sram_bytes: int
    dram_bytes: int

    @classmethod
    def from_hw(cls, hw) -> HardwareTarget:
        return cls(hw.name, hw.cores.num_cores, hw.sram.bytes_per_core, hw.dram.capacity_bytes)


@dataclass
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

    def bits_for(self, name: str) -> int:
        return self.bits.weights.bits_for(self.model.tensor_spec(name).role)

    def lowering(self, tile_bytes: int | None = None) -> Lowering:
        wb = {s.name: self.bits_for(s.name) for s in self.model.tensors()
              if s.kind == "matrix" and s.role != "embedding"}  # an untied embedding: host
        return Lowering(
            model=self.model, weight_bits=wb, k_fmt=self.k_fmt, v_fmt=self.v_fmt,
            cap=self.cap, max_seq=self.max_seq, m_tile=self.m_tile, mm=self.mm,
            numerics=self.numerics,
            target=Target(self.cores, self.hw.sram_bytes, tile_bytes or self.tile_bytes),
        )

    def layout(self, *, host_bytes: int) -> MemoryLayout:
        return MemoryLayout(dram_bytes=self.hw.dram_bytes, sram_bytes=self.hw.sram_bytes,
                            host_bytes=host_bytes, num_cores=self.hw.num_cores,
                            regions=tuple(self.mm.regions))

    def program(self, *, tokens: int, cache_size: int, slot: int = 0, host_in: int = 0,
                host_out: int = 0) -> Program:
        if not 0 <= slot < self.slots:
            raise ConfigError(f"cache slot {slot} out of range 0..{self.slots - 1}")
        lower = lower_forward_mla if self.model.is_mla else lower_forward
        tile = self.tile_for(min(tokens, self.m_tile))
        return lower(self.lowering(tile), n=tokens, cache_size=cache_size, slot=slot,
                     host_in=host_in, host_out=host_out)

    def tile_for(self, m: int) -> int:
        """The weight tile size for passes of ``m`` tokens: the largest candidate whose
        stage buffers still fit SRAM beside two tiles (a decode step's activations are
        small, so it streams weights in larger tiles than a prefill pass can)."""
        cache = self.__dict__.setdefault("_tile_cache", {})
        if m in cache:
            return cache[m]
        candidates = [self.tile_bytes]
        if not self.tile_fixed:
            big = min(DEFAULT_TILE_BYTES, self.hw.sram_bytes // 4)
            candidates = sorted({big, self.tile_bytes}, reverse=True)
        lower = lower_forward_mla if self.model.is_mla else lower_forward
        for t in candidates:
            try:
                lower(self.lowering(t), n=m, cache_size=0)
            except SramOverflow:
                continue
            cache[m] = t
            return t
        cache[m] = self.tile_bytes
        return self.tile_bytes

    def weight_source(self) -> WeightSource:
        return open_weights(self.model, self.weights)

    def kv_caches(self) -> list[dict[str, Any]]:
        """One entry per (slot, layer, component): name, region, format, width, heads.

        GQA: components ``k`` and ``v`` of ``num_kv_heads`` heads of ``head_dim``; MLA: one
        component ``c`` (the ``[latent | rope key]`` records, ``kv_lora_rank +
        qk_rope_head_dim`` wide, one head) in the K format."""
        out = []
        if self.model.is_mla:
            w = mla_record_width(self.model)
            fmt = self.k_fmt
            for s in range(self.slots):
                for layer in range(self.model.num_layers):
                    name = Lowering.kv_region(s, layer, "c")
                    out.append({"name": name, "slot": s, "layer": layer, "component": "c",
                                "region": self.mm[name], "format": fmt, "width": w,
                                "heads": 1, "head_bytes": fmt.max_bytes(self.cap, w)})
            return out
        hd = self.model.head_dim
        for s in range(self.slots):
            for layer in range(self.model.num_layers):
                for comp, fmt in (("k", self.k_fmt), ("v", self.v_fmt)):
                    name = Lowering.kv_region(s, layer, comp)
                    out.append({"name": name, "slot": s, "layer": layer, "component": comp,
                                "region": self.mm[name], "format": fmt, "width": hd,
                                "heads": self.model.num_kv_heads,
                                "head_bytes": fmt.max_bytes(self.cap, hd)})
        return out

    def weight_image(self):
        """Yield ``(dram_addr, uint8 bytes)`` of everything launch loads into DRAM: weight
        codes, integer parameters, RoPE tables (functional runs only)."""
        if not self.numerics.functional:
            raise CompileError("this compiled model has no integer parameters (timing-only)")
        cfg = self.model
        src = self.weight_source()
        nq = self.numerics

        def gemm_entries(name: str, gq: GemmQ):
            qw = quantize_weight(src.tensor(name), self.bits_for(name))
            yield self.mm[f"w.{name}"].base, qw.data.reshape(-1)
            n = qw.n
            p = np.zeros(2 * n, np.int32)
            if gq.bias is not None:
                p[:n] = gq.bias
            if gq.mult is not None:
                p[n:] = gq.mult
            yield self.mm[f"p.{name}"].base, p.view(np.uint8)

        for i, L in enumerate(nq.layers):
            pre = f"layers.{i}."
            for nm, gq in (("q_proj", L.q), ("k_proj", L.k), ("v_proj", L.v), ("o_proj", L.o),
                           ("gate_proj", L.gate), ("up_proj", L.up), ("down_proj", L.down)):
                yield from gemm_entries(pre + nm, gq)
            yield self.mm[f"p.{pre}attn_norm"].base, L.attn_norm.gamma.view(np.uint8)
            yield self.mm[f"p.{pre}mlp_norm"].base, L.mlp_norm.gamma.view(np.uint8)
        yield from gemm_entries(cfg.lm_head_tensor, nq.head)
        yield self.mm["p.final_norm"].base, nq.final_norm.gamma.view(np.uint8)
        cos, sin = rope_tables(cfg, self.cap)
        yield self.mm["rope.cos"].base, cos.view(np.uint8).reshape(-1)
        yield self.mm["rope.sin"].base, sin.view(np.uint8).reshape(-1)

    # --- files ----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        from traces.io import atomic_write_bytes

        header, arrays = _to_header(self)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("header.json", json.dumps(header, indent=1))
            npz = io.BytesIO()
            np.savez(npz, **arrays)
            z.writestr("arrays.npz", npz.getvalue())
            for name, prog in self.programs.items():
                z.writestr(f"programs/{name}.bin", encode_program(prog))
        atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: str | Path) -> CompiledModel:
        p = Path(path)
        if not p.is_file():
            raise CompileError(f"compiled model {str(p)!r} does not exist")
        try:
            with zipfile.ZipFile(p) as z:
                header = json.loads(z.read("header.json"))
                arrays = dict(np.load(io.BytesIO(z.read("arrays.npz"))))
                progs = {n[len("programs/"):-len(".bin")]: decode_program(z.read(n))
                         for n in z.namelist() if n.startswith("programs/")}
        except (zipfile.BadZipFile, KeyError, json.JSONDecodeError, ValueError, OSError,
                zlib.error, EOFError, NotImplementedError, DecodeError) as err:
            # zlib.error: a corrupt deflate stream; NotImplementedError: a corrupt
            # compression-method field; EOFError: a member cut short
            raise CompileError(f"{p}: not a kvsim compiled model ({err})") from None
        if not isinstance(header, dict) or header.get("format") != FILE_FORMAT:
            raise CompileError(f"{p}: not a kvsim compiled model")
        if header.get("version") != FILE_VERSION:
            raise CompileError(f"{p}: compiled-model version {header.get('version')} is not "
                               f"supported (this kvsim reads version {FILE_VERSION})")
        cm = _from_header(header, arrays)
        _check_consistent(cm, arrays)
        cm.programs = progs
        return cm


def rope_tables(cfg: ModelConfig, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """Q14 int16 cos/sin tables ``[positions, rope_dim/2]`` (scalings included)."""
    cos, sin = rope_cos_sin(cfg, np.arange(positions))
    one = 1 << ROPE_Q
    return (np.floor(cos.astype(np.float64) * one + 0.5).astype(np.int16),
            np.floor(sin.astype(np.float64) * one + 0.5).astype(np.int16))


def build_memory_map(cfg: ModelConfig, bits: BitConfig, kv: str, *, cap: int, slots: int,
                     max_seq: int, m_tile: int) -> MemoryMap:
    mm = MemoryMap()
    pair = kvformats.pair(kv)
    for spec in cfg.tensors():
        if spec.kind == "matrix":
            if spec.name == "embed" and not cfg.tie_word_embeddings:
                continue  # the embedding runs on the host
            n, k = spec.shape
            wbits = bits.weights.bits_for(spec.role)
            mm.add(f"w.{spec.name}", n * ((k * wbits + 7) // 8), "weights")
            mm.add(f"p.{spec.name}", 8 * n, "weights")
        elif spec.role == "norm":
            mm.add(f"p.{spec.name}", 2 * spec.shape[0], "weights")
    rot = rope_dim(cfg)
    mm.add("rope.cos", cap * rot, "weights")
    mm.add("rope.sin", cap * rot, "weights")
    h = cfg.hidden_size
    if cfg.is_mla:
        # absorbed attention (lower_mla): per-head multipliers of the absorption GEMMs, one
        # [latent | rope key] cache per slot and layer, score queries, attention outputs
        assert cfg.kv_lora_rank is not None
        w = mla_record_width(cfg)
        for layer in range(cfg.num_layers):
            mm.add(absorbed_params_region(layer), 8 * cfg.num_heads * cfg.kv_lora_rank,
                   "weights")
        for s in range(slots):
            for layer in range(cfg.num_layers):
                mm.add(Lowering.kv_region(s, layer, "c"), pair.k.max_bytes(cap, w), "kv_cache")
        mm.add("act.qs", m_tile * cfg.num_heads * w, "activations")
        mm.add("act.lat", m_tile * cfg.num_heads * w, "activations")
        mm.add("act.kv", m_tile * w, "activations")
        if cfg.q_lora_rank:
            mm.add("act.qa", m_tile * cfg.q_lora_rank, "activations")
    if cfg.is_moe:
        assert cfg.n_routed_experts is not None and cfg.moe_intermediate_size is not None
        mm.add("act.router", m_tile * cfg.n_routed_experts, "activations")
        # one routed partial sum per core that runs experts (at most one per core)
        contributors = min(max(CORE_MODES.values()), cfg.n_routed_experts)
        mm.add("act.moe", contributors * m_tile * h, "activations")
    if not cfg.is_mla:
        hd = cfg.head_dim
        for s in range(slots):
            for layer in range(cfg.num_layers):
                mm.add(Lowering.kv_region(s, layer, "k"),
                       cfg.num_kv_heads * pair.k.max_bytes(cap, hd), "kv_cache")
                mm.add(Lowering.kv_region(s, layer, "v"),
                       cfg.num_kv_heads * pair.v.max_bytes(cap, hd), "kv_cache")
    mm.add("act.x0", m_tile * h, "activations")
    mm.add("act.x1", m_tile * h, "activations")
    mm.add("act.xm", m_tile * h, "activations")
    mm.add("act.ao", m_tile * cfg.num_heads * cfg.head_dim, "activations")
    shared = (cfg.n_shared_experts or 0) * (cfg.moe_intermediate_size or 0)
    mm.add("act.hb", m_tile * max(cfg.intermediate_size, shared), "activations")
    mm.add("io.emb", 4 * max_seq * h, "host_io")
    mm.add("io.logits", 4 * cfg.vocab_size, "host_io")
    # scratch for on-device cache rearrangement (sim.cacheops): one cache's worth of int8
    # values per core, so compaction never reads a token it has already overwritten
    width = mla_record_width(cfg) if cfg.is_mla else cfg.head_dim
    mm.add("act.kvtmp", max(CORE_MODES.values()) * cap * width, "activations")
    return mm


def dram_problem(model: ModelConfig, bits: BitConfig, kv: str, *, cap: int, slots: int,
                 max_seq: int, dram_bytes: int, hw_name: str) -> str | None:
    """Why the memory map of ``slots`` cache slots (one token per pass: the smallest
    activations) does not fit ``dram_bytes``, or None. Computed from the maps of one and two
    slots, without building the map of all of them: every slot adds the same page-aligned
    regions (tests/sim/test_config_errors.py checks that this is exact)."""
    one = build_memory_map(model, bits, kv, cap=cap, slots=1, max_seq=max_seq, m_tile=1)
    if slots == 1:
        return one.too_big(dram_bytes, hw_name)
    two = build_memory_map(model, bits, kv, cap=cap, slots=2, max_seq=max_seq, m_tile=1)
    more = slots - 1
    kv1 = one.bytes_of_kind("kv_cache")
    return dram_shortfall(one.total_bytes + more * (two.total_bytes - one.total_bytes),
                          one.bytes_of_kind("weights"),
                          kv1 + more * (two.bytes_of_kind("kv_cache") - kv1), dram_bytes, hw_name)


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
) -> CompiledModel:
    """Compile ``model`` for ``hw``: memory map, SRAM tiling, integer parameters."""
    if core_mode not in CORE_MODES:
        raise CompileError(f"core_mode: {core_mode!r} is not one of {', '.join(CORE_MODES)}")
    if CORE_MODES[core_mode] > hw.num_cores:
        raise CompileError(f"core_mode {core_mode!r} needs {CORE_MODES[core_mode]} cores; "
                           f"{hw.name} has {hw.num_cores}")
    if model.is_mla:
        problem = mla_kv_problem(model, kv)
        if problem:
            raise CompileError(f"kv.format: {problem}")
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
    if (why := dram_problem(model, bits, kv, cap=cap, slots=slots, max_seq=max_seq,
                            dram_bytes=hw.dram_bytes, hw_name=hw.name)) is not None:
        raise CompileError(f"model {model.name!r} {why}")
    weights = weights or {"kind": "synthetic", "seed": 0}
    tile_fixed = tile_bytes is not None
    if tile_bytes is None:
        tile_bytes = min(DEFAULT_TILE_BYTES, hw.sram_bytes // 8)
    cm = CompiledModel(model=model, bits=bits, kv=kv, hw=hw, core_mode=core_mode,
                       max_seq=max_seq, cap=cap, slots=slots, tile_bytes=tile_bytes, m_tile=1,
                       tile_fixed=tile_fixed,
                       mm=MemoryMap(), numerics=Numerics.placeholder(model.num_layers),
                       weights=weights)
    cm.m_tile = _fit_m_tile(cm)
    cm.mm = build_memory_map(model, bits, kv, cap=cap, slots=slots, max_seq=max_seq,
                             m_tile=cm.m_tile)
    if (why := cm.mm.too_big(hw.dram_bytes, hw.name)) is not None:
        raise CompileError(f"model {model.name!r} {why}")
    if functional:
        cm.numerics = calibrate(model, cm.weight_source(), cm.bits_for,
                                seed=int(weights.get("seed", 0)))
    cm.programs = {
        f"prefill_{max_seq}": cm.program(tokens=max_seq, cache_size=0),
        "decode": cm.program(tokens=1, cache_size=min(max_seq, cap - 1)),
    }
    return cm


def _fit_m_tile(cm: CompiledModel) -> int:
    """The most tokens per pass whose stage buffers fit in SRAM (binary search)."""
    def lower(m: int) -> None:
        if cm.model.is_mla:  # one layer of each kind says as much, much faster
            lower_forward_mla(cm.lowering(), n=m, cache_size=0,
                              layers=probe_layers(cm.model))
        else:
            lower_forward(cm.lowering(), n=m, cache_size=0)

    def fits(m: int) -> bool:
        cm.m_tile = m
        cm.mm = build_memory_map(cm.model, cm.bits, cm.kv, cap=cm.cap, slots=cm.slots,
                                 max_seq=cm.max_seq, m_tile=m)
        try:
            lower(m)
        except SramOverflow:
            return False
        return True

    try:
        if not fits(1):
            lower(1)  # re-raise with its message
    except SramOverflow as err:
        raise CompileError(f"model {cm.model.name!r} does not fit {cm.hw.name}'s SRAM even "
                           f"one token at a time: {err}") from None
    lo, hi = 1, cm.max_seq
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


# --- (de)serialisation --------------------------------------------------------------------

def _to_header(cm: CompiledModel) -> tuple[dict, dict[str, np.ndarray]]:
    arrays: dict[str, np.ndarray] = {}
    nq = cm.numerics

    def gemm(key: str, g: GemmQ) -> dict:
        if g.mult is not None:
            arrays[f"{key}.mult"] = g.mult
        if g.bias is not None:
            arrays[f"{key}.bias"] = g.bias
        return {"shift": g.shift}

    def norm(key: str, n: NormQ) -> dict:
        if n.gamma is not None:
            arrays[f"{key}.gamma"] = n.gamma
        return {"eps_q": n.eps_q, "shift": n.shift}

    layers = []
    for i, L in enumerate(nq.layers):
        d: dict[str, Any] = {}
        for f in ("q", "k", "v", "o", "gate", "up", "down"):
            d[f] = gemm(f"{i}.{f}", getattr(L, f))
        for f in ("attn_norm", "mlp_norm"):
            d[f] = norm(f"{i}.{f}", getattr(L, f))
        d["attn"] = vars(L.attn)
        d["add1"] = vars(L.add1)
        d["add2"] = vars(L.add2)
        d["silu"] = vars(L.silu)
        layers.append(d)
    if nq.head_row_scale is not None:
        arrays["head_row_scale"] = nq.head_row_scale
    numerics = {
        "functional": nq.functional, "input_scale": nq.input_scale, "layers": layers,
        "final_norm": norm("final_norm", nq.final_norm), "head": gemm("head", nq.head),
        "scales": nq.scales,
    }
    header = {
        "format": FILE_FORMAT, "version": FILE_VERSION,
        "model": cm.model.model_dump(mode="json"),
        "bits": cm.bits.model_dump(mode="json"),
        "kv": cm.kv, "hw": vars(cm.hw), "core_mode": cm.core_mode, "max_seq": cm.max_seq,
        "cap": cm.cap, "slots": cm.slots, "tile_bytes": cm.tile_bytes, "m_tile": cm.m_tile,
        "tile_fixed": cm.tile_fixed,
        "memory_map": cm.mm.to_json(), "numerics": numerics, "weights": cm.weights,
    }
    return header, arrays


def _from_header(h: dict, arrays: dict[str, np.ndarray]) -> CompiledModel:
    try:
        n = h["numerics"]

        def gemm(key: str, d: dict) -> GemmQ:
            return GemmQ(shift=d["shift"], mult=arrays.get(f"{key}.mult"),
                         bias=arrays.get(f"{key}.bias"))

        def norm(key: str, d: dict) -> NormQ:
            return NormQ(eps_q=d["eps_q"], shift=d["shift"], gamma=arrays.get(f"{key}.gamma"))

        layers = []
        for i, d in enumerate(n["layers"]):
            L = LayerQ(attn=AttnQ(**d["attn"]), add1=AddQ(**d["add1"]), add2=AddQ(**d["add2"]),
                       silu=SiluQ(**d["silu"]))
            for f in ("q", "k", "v", "o", "gate", "up", "down"):
                setattr(L, f, gemm(f"{i}.{f}", d[f]))
            for f in ("attn_norm", "mlp_norm"):
                setattr(L, f, norm(f"{i}.{f}", d[f]))
            layers.append(L)
        numerics = Numerics(input_scale=n["input_scale"], layers=layers,
                            final_norm=norm("final_norm", n["final_norm"]),
                            head=gemm("head", n["head"]),
                            head_row_scale=arrays.get("head_row_scale"), scales=n["scales"],
                            functional=n["functional"])
        _check_scalars(h)
        return CompiledModel(
            model=build_model(h["model"]), bits=build_bit_config(h["bits"]), kv=h["kv"],
            hw=HardwareTarget(**h["hw"]), core_mode=h["core_mode"], max_seq=h["max_seq"],
            cap=h["cap"], slots=h["slots"], tile_bytes=h["tile_bytes"], m_tile=h["m_tile"],
            tile_fixed=h.get("tile_fixed", False),
            mm=MemoryMap.from_json(h["memory_map"]), numerics=numerics, weights=h["weights"],
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CompileError(f"compiled model header is incomplete or invalid: {err!r}") from None


_I32 = (-(1 << 31), (1 << 31) - 1)
_GEMMS = (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj"),
          ("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj"))


def _check_consistent(cm: CompiledModel, arrays: dict[str, np.ndarray]) -> None:
    """Refuse a loaded model whose parts disagree (a hand-edited or corrupt header): the
    hardware target, the memory map (it must be the one the compiler builds from the
    header's model, bits, format and sizes), the integer parameters and their arrays."""
    hw = cm.hw
    if not isinstance(hw.name, str) or any(type(v) is not int or v <= 0 for v in (
            hw.num_cores, hw.sram_bytes, hw.dram_bytes)):
        raise CompileError(f"compiled model header: hw = {vars(hw)} is not a hardware target")
    if CORE_MODES[cm.core_mode] > hw.num_cores:
        raise CompileError(f"compiled model header: core_mode {cm.core_mode!r} needs "
                           f"{CORE_MODES[cm.core_mode]} cores; hw has {hw.num_cores}")
    try:
        if (why := dram_problem(cm.model, cm.bits, cm.kv, cap=cm.cap, slots=cm.slots,
                                max_seq=cm.max_seq, dram_bytes=hw.dram_bytes,
                                hw_name=hw.name)) is not None:
            raise CompileError(f"compiled model header: the model {why}")
        expect = build_memory_map(cm.model, cm.bits, cm.kv, cap=cm.cap, slots=cm.slots,
                                  max_seq=cm.max_seq, m_tile=cm.m_tile)
    except KvsimError as err:
        raise CompileError(f"compiled model header: {err}") from None
    if cm.mm.to_json() != expect.to_json():
        raise CompileError("compiled model header: memory_map is not the one model, bits, kv, "
                           "cap, slots, max_seq and m_tile give (the file was edited)")
    if (why := cm.mm.too_big(hw.dram_bytes, hw.name)) is not None:
        raise CompileError(f"compiled model header: the model {why}")
    _check_numerics(cm, arrays)


def _check_numerics(cm: CompiledModel, arrays: dict[str, np.ndarray]) -> None:
    nq, cfg = cm.numerics, cm.model

    def bad(where: str, why: str) -> CompileError:
        return CompileError(f"compiled model header: numerics.{where} {why}")

    def ints(where: str, obj) -> None:
        for k, v in vars(obj).items():
            if isinstance(v, np.ndarray) or v is None:
                continue
            if type(v) is not int or not _I32[0] <= v <= _I32[1]:
                raise bad(f"{where}.{k}", f"= {v!r} is not a 32-bit integer")

    if not isinstance(nq.functional, bool):
        raise bad("functional", "is not a boolean")
    if (not isinstance(nq.input_scale, int | float) or isinstance(nq.input_scale, bool)
            or not np.isfinite(nq.input_scale) or nq.input_scale <= 0):
        raise bad("input_scale", f"= {nq.input_scale!r} is not a positive number")
    if len(nq.layers) != cfg.num_layers:
        raise bad("layers", f"has {len(nq.layers)} entries; the model has {cfg.num_layers} "
                            "layers")
    if nq.functional and (cfg.is_mla or cfg.is_moe):
        raise bad("functional", "is true for an MLA/MoE model (timing only)")
    for i, L in enumerate(nq.layers):
        for f in ("attn_norm", "q", "k", "v", "attn", "o", "add1", "mlp_norm", "gate", "up",
                  "silu", "down", "add2"):
            ints(f"layers[{i}].{f}", getattr(L, f))
    ints("final_norm", nq.final_norm)
    ints("head", nq.head)
    if not nq.functional:
        if arrays:
            raise bad("functional", f"is false, yet the file holds arrays ({min(arrays)}, ...)")
        return

    def vector(key: str, dtype, n: int) -> None:
        a = arrays.get(key)
        if a is None or a.dtype != dtype or a.shape != (n,):
            got = "missing" if a is None else f"{a.dtype}{list(a.shape)}"
            raise bad(key, f"must be {np.dtype(dtype)}[{n}], got {got}")

    h = cfg.hidden_size
    for i in range(cfg.num_layers):
        for f, name in _GEMMS:
            n = cfg.tensor_spec(f"layers.{i}.{name}").shape[0]
            vector(f"{i}.{f}.mult", np.int32, n)
            if f"{i}.{f}.bias" in arrays:
                vector(f"{i}.{f}.bias", np.int32, n)
        vector(f"{i}.attn_norm.gamma", np.int16, h)
        vector(f"{i}.mlp_norm.gamma", np.int16, h)
    vector("final_norm.gamma", np.int16, h)
    vector("head_row_scale", np.float32, cfg.vocab_size)
    for key in ("head.mult", "head.bias"):
        if key in arrays:
            vector(key, np.int32, cfg.vocab_size)


def _check_scalars(h: dict) -> None:
    """Refuse a header whose scalar fields a later call would trip over, naming the field."""
    def bad(field: str, why: str) -> CompileError:
        return CompileError(f"compiled model header: {field} = {h.get(field)!r} {why}")

    try:
        kvformats.pair(h["kv"])
    except (KvsimError, TypeError, AttributeError) as err:
        raise bad("kv", f"is not a KV format ({err})") from None
    if h["core_mode"] not in CORE_MODES:
        raise bad("core_mode", f"is not one of {sorted(CORE_MODES)}")
    for f in ("max_seq", "cap", "slots", "tile_bytes", "m_tile"):
        v = h[f]
        if type(v) is not int or v <= 0:
            raise bad(f, "is not a positive integer")
    if h["max_seq"] > h["cap"]:
        raise bad("max_seq", f"exceeds the cache capacity cap = {h['cap']}")
    if not isinstance(h.get("tile_fixed", False), bool):
        raise bad("tile_fixed", "is not a boolean")
    w = h["weights"]
    ok = isinstance(w, dict) and (
        (w.get("kind") == "synthetic" and type(w.get("seed")) is int)
        or (w.get("kind") == "gguf" and isinstance(w.get("path"), str))
        or (w.get("kind") == "safetensors" and (
            isinstance(w.get("paths"), str) or (
                isinstance(w.get("paths"), list)
                and all(isinstance(x, str) for x in w["paths"])))))
    if not ok:
        raise CompileError(f"compiled model header: weights = {w!r} is none of "
                           "{'kind': 'synthetic', 'seed': int}, "
                           "{'kind': 'safetensors', 'paths': str | [str, ...]}, "
                           "{'kind': 'gguf', 'path': str}")


__all__ = ["CompiledModel", "CompileError", "HardwareTarget", "compile_model", "CORE_MODES",
           "DeviceError"]

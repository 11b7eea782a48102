"""The compiled-model file (``.kvm``): a zip archive with ``header.json`` (format name and
version, configs, memory map, scalar parameters), ``arrays.npz`` (integer parameter
arrays) and ``programs/*.bin`` (ISA binaries); reading it checks every part against the
others and refuses files of other versions (a file of an older kvsim: recompile it).
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

from isa import kvformats
from isa.encoding import decode_program, encode_program
from isa.errors import DecodeError
from isa.instructions import Program
from kvsim.errors import KvsimError

from ..bits import build_bit_config
from ..config import build_model
from .blocks.moe_file import moe_from_header, moe_ints, moe_scalars, moe_to_header, moe_vectors
from .builder import CORE_MODES
from .dram import build_memory_map, dram_problem
from .errors import CompileError
from .memmap import MemoryMap
from .numerics import AddQ, AttnQ, GemmQ, LayerQ, MlaQ, NormQ, Numerics, SiluQ

if TYPE_CHECKING:
    from .compiled import CompiledModel

FILE_FORMAT = "kvsim-compiled-model"
#: 2: the frozen compiled model with its big-tile bound (``big_tile_tokens``).
#: 3: the decode pass's weight tile (``big_tile``), searched by the compiler.
FILE_VERSION = 3



#: Norms of the per-layer features (QK norm, post norms: models.layer_features), stored
#: only for the models whose layers have them, so other models' files stay as they were.
EXTRA_NORMS = ("q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")


def _layer_norms(cfg, layer: int) -> tuple[str, ...]:
    """The norm entries of a layer's numerics in a file: attention and MLP norms, then the
    extra ones its tensors have."""
    have = {t.name for t in cfg.layer_tensors(layer)}
    return ("attn_norm", "mlp_norm") + tuple(
        f for f in EXTRA_NORMS if f"layers.{layer}.{f}" in have)

#: zlib level of the file's members: 1, the fastest (measured on the 26 MB of Qwen2.5-0.5B's
#: 512-token prefill program: 0.20 s to 3.6 MB, against 0.61 s to 2.7 MB at zlib's default
#: 6); any level reads back the same.
DEFLATE_LEVEL = 1


def write_kvm(cm: CompiledModel, path: str | Path) -> None:
    """Write ``cm`` to ``path`` (atomically)."""
    from kvsim.files import atomic_write_bytes

    atomic_write_bytes(path, kvm_bytes(cm))


def kvm_bytes(cm: CompiledModel) -> bytes:
    """The bytes of ``cm``'s file (what :func:`write_kvm` writes)."""
    header, arrays = to_header(cm)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED,
                         compresslevel=DEFLATE_LEVEL) as z:
        z.writestr("header.json", json.dumps(header, indent=1))
        npz = io.BytesIO()
        np.savez(npz, **arrays)
        z.writestr("arrays.npz", npz.getvalue())
        for name, prog in cm.programs.items():
            z.writestr(f"programs/{name}.bin", encode_program(prog))
    return buf.getvalue()


def read_kvm(path: str | Path) -> tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Program]]:
    """The header, arrays and programs of the file at ``path``; :class:`CompileError`
    naming the file when it is not a compiled model of this version."""
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
    version = header.get("version")
    if type(version) is int and 1 <= version < FILE_VERSION:
        raise CompileError(f"{p}: compiled with an older kvsim (compiled-model version "
                           f"{version}; this kvsim reads version {FILE_VERSION}); recompile "
                           "it (kvsim compile)")
    if version != FILE_VERSION:
        raise CompileError(f"{p}: compiled-model version {version} is not "
                           f"supported (this kvsim reads version {FILE_VERSION})")
    return header, arrays, progs


def to_header(cm: CompiledModel) -> tuple[dict, dict[str, np.ndarray]]:
    arrays: dict[str, np.ndarray] = {}
    nq = cm.numerics

    def gemm(key: str, g: GemmQ) -> dict:
        if g.mult is not None:
            arrays[f"{key}.mult"] = g.mult
        if g.bias is not None:
            arrays[f"{key}.bias"] = g.bias
        d: dict[str, Any] = {"shift": g.shift}
        if nq.wide:  # the wide pipeline's GemmRow fields
            d.update(row_shift=g.row_shift, out_bits=g.out_bits)
        return d

    def norm(key: str, n: NormQ) -> dict:
        if n.gamma is not None:
            arrays[f"{key}.gamma"] = n.gamma
        return {"eps_q": n.eps_q, "shift": n.shift}

    layers = []
    for i, L in enumerate(nq.layers):
        d: dict[str, Any] = {}
        for f in ("q", "k", "v", "o", "gate", "up", "down"):
            d[f] = gemm(f"{i}.{f}", getattr(L, f))
        for f in _layer_norms(cm.model, i):
            d[f] = norm(f"{i}.{f}", getattr(L, f))
        if L.mla is not None:  # an MLA layer's own parameters (numerics.MlaQ)
            m = L.mla
            d["mla"] = {"q_a": gemm(f"{i}.q_a", m.q_a), "k_b": gemm(f"{i}.k_b", m.k_b),
                        "q_a_norm": norm(f"{i}.q_a_norm", m.q_a_norm),
                        "kv_a_norm": norm(f"{i}.kv_a_norm", m.kv_a_norm)}
        if L.moe is not None:  # a MoE layer's own parameters (numerics.MoeQ)
            d["moe"] = moe_to_header(i, L.moe, gemm)
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
    if nq.wide or nq.rotated:
        numerics.update(residual_bits=nq.residual_bits, rotated=nq.rotated)
    header = {
        "format": FILE_FORMAT, "version": FILE_VERSION,
        "model": cm.model.model_dump(mode="json"),
        "bits": cm.bits.model_dump(mode="json"),
        "kv": cm.kv, "hw": vars(cm.hw), "core_mode": cm.core_mode, "max_seq": cm.max_seq,
        "cap": cm.cap, "slots": cm.slots, "tile_bytes": cm.tile_bytes, "m_tile": cm.m_tile,
        "tile_fixed": cm.tile_fixed, "big_tile_tokens": cm.big_tile_tokens,
        "big_tile": cm.big_tile,
        "memory_map": cm.mm.to_json(), "numerics": numerics, "weights": cm.weights,
    }
    return header, arrays



def fields_from_header(h: dict, arrays: dict[str, np.ndarray]) -> dict[str, Any]:
    """The constructor arguments of the compiled model a header describes."""
    try:
        n = h["numerics"]

        def gemm(key: str, d: dict) -> GemmQ:
            wide = {k: d[k] for k in ("row_shift", "out_bits") if k in d}
            return GemmQ(shift=d["shift"], mult=arrays.get(f"{key}.mult"),
                         bias=arrays.get(f"{key}.bias"), **wide)

        def norm(key: str, d: dict) -> NormQ:
            return NormQ(eps_q=d["eps_q"], shift=d["shift"], gamma=arrays.get(f"{key}.gamma"))

        layers = []
        for i, d in enumerate(n["layers"]):
            L = LayerQ(attn=AttnQ(**d["attn"]), add1=AddQ(**d["add1"]), add2=AddQ(**d["add2"]),
                       silu=SiluQ(**d["silu"]))
            for f in ("q", "k", "v", "o", "gate", "up", "down"):
                setattr(L, f, gemm(f"{i}.{f}", d[f]))
            for f in ("attn_norm", "mlp_norm") + EXTRA_NORMS:
                if f in d or f in ("attn_norm", "mlp_norm"):
                    setattr(L, f, norm(f"{i}.{f}", d[f]))
            if "mla" in d:
                m = d["mla"]
                L.mla = MlaQ(q_a=gemm(f"{i}.q_a", m["q_a"]), k_b=gemm(f"{i}.k_b", m["k_b"]),
                             q_a_norm=norm(f"{i}.q_a_norm", m["q_a_norm"]),
                             kv_a_norm=norm(f"{i}.kv_a_norm", m["kv_a_norm"]))
            if "moe" in d:
                L.moe = moe_from_header(i, d["moe"], gemm)
            layers.append(L)
        numerics = Numerics(input_scale=n["input_scale"], layers=layers,
                            final_norm=norm("final_norm", n["final_norm"]),
                            head=gemm("head", n["head"]),
                            head_row_scale=arrays.get("head_row_scale"), scales=n["scales"],
                            functional=n["functional"],
                            residual_bits=n.get("residual_bits", 8),
                            rotated=n.get("rotated", False))
        _check_scalars(h)
        return dict(
            model=build_model(h["model"]), bits=build_bit_config(h["bits"]), kv=h["kv"],
            hw=dict(h["hw"]), core_mode=h["core_mode"], max_seq=h["max_seq"],
            cap=h["cap"], slots=h["slots"], tile_bytes=h["tile_bytes"], m_tile=h["m_tile"],
            tile_fixed=h["tile_fixed"], big_tile_tokens=h["big_tile_tokens"],
            big_tile=h["big_tile"], mm=MemoryMap.from_json(h["memory_map"]),
            numerics=numerics, weights=h["weights"],
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CompileError(f"compiled model header is incomplete or invalid: {err!r}") from None


_I32 = (-(1 << 31), (1 << 31) - 1)
_GEMMS = (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj"),
          ("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj"))


def _mla_gemms(cfg) -> tuple[tuple[str, str], ...]:
    """(numerics key, tensor) of an MLA layer's GEMMs (the absorption's ``k_b`` has
    ``num_heads * kv_lora_rank`` rows: :class:`.numerics.MlaQ`)."""
    q = (("q", "q_b_proj"), ("q_a", "q_a_proj")) if cfg.q_lora_rank else (("q", "q_proj"),)
    return q + (("k", "kv_a_proj"), ("v", "v_b_proj"), ("o", "o_proj"),
                ("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj"))


def check_consistent(cm: CompiledModel, arrays: dict[str, np.ndarray]) -> None:
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
        why = dram_problem(cm.model, cm.bits, cm.kv, cap=cm.cap, slots=cm.slots,
                           max_seq=cm.max_seq, dram_bytes=hw.dram_bytes, hw_name=hw.name)
        expect = None if why is not None else build_memory_map(
            cm.model, cm.bits, cm.kv, cap=cm.cap, slots=cm.slots, max_seq=cm.max_seq,
            m_tile=cm.m_tile)
    except KvsimError as err:
        raise CompileError(f"compiled model header: {err}") from None
    if why is not None or expect is None:  # raised here: the prefix once
        raise CompileError(f"compiled model header: the model {cm.model.name!r} {why}")
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
    if nq.functional and any(cfg.layer_is_moe(i) != (L.moe is not None)
                             for i, L in enumerate(nq.layers)):
        raise bad("layers", "of a functional MoE model lack their MoE parameters (moe), or "
                            "a dense layer has them")
    if nq.functional and cfg.is_mla and any(L.mla is None for L in nq.layers):
        raise bad("layers", "of a functional MLA model lack their MLA parameters (mla)")
    for i, L in enumerate(nq.layers):
        for f in ("attn_norm", "q", "k", "v", "attn", "o", "add1", "mlp_norm", "gate", "up",
                  "silu", "down", "add2") + EXTRA_NORMS:
            ints(f"layers[{i}].{f}", getattr(L, f))
        if L.moe is not None:
            ints(f"layers[{i}].moe", SimpleNamespace(**moe_ints(L.moe)))
            for where, obj in moe_scalars(L.moe):
                ints(f"layers[{i}].moe.{where}", obj)
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
    names = {t.name for t in cfg.tensors()}
    for i in range(cfg.num_layers):
        moe = nq.layers[i].moe
        if moe is not None:
            try:
                want = moe_vectors(cfg, i, moe)
            except ValueError as err:
                raise bad(f"layers[{i}].moe", str(err)) from None
            for key, n in want:
                vector(key, np.int32, n)
        for f, name in _mla_gemms(cfg) if cfg.is_mla else _GEMMS:
            if moe is not None and f in ("gate", "up", "down"):
                continue  # a MoE layer's MLP: its moe entries
            n = cfg.tensor_spec(f"layers.{i}.{name}").shape[0]
            vector(f"{i}.{f}.mult", np.int32, n)
            if f"{i}.{f}.bias" in arrays:
                vector(f"{i}.{f}.bias", np.int32, n)
        if cfg.is_mla:  # the absorption's multipliers and the latents' norm gains
            vector(f"{i}.k_b.mult", np.int32, cfg.num_heads * (cfg.kv_lora_rank or 0))
            vector(f"{i}.kv_a_norm.gamma", np.int16, cfg.kv_lora_rank or 0)
            if cfg.q_lora_rank:
                vector(f"{i}.q_a_norm.gamma", np.int16, cfg.q_lora_rank)
        for f in _layer_norms(cfg, i):  # the gains of the norms the layer has
            if f"layers.{i}.{f}" in names:
                vector(f"{i}.{f}.gamma", np.int16, cfg.tensor_spec(f"layers.{i}.{f}").shape[0])
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
    if not isinstance(h["tile_fixed"], bool):
        raise bad("tile_fixed", "is not a boolean")
    if type(h["big_tile_tokens"]) is not int or not 0 <= h["big_tile_tokens"] <= h["m_tile"]:
        raise bad("big_tile_tokens", f"is not an integer in 0..m_tile = {h['m_tile']}")
    if type(h["big_tile"]) is not int or h["big_tile"] < 0:
        raise bad("big_tile", "is not an integer >= 0")
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



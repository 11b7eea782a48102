"""Bad input, everywhere: one table of cases over run configs, compiled-model files, ISA
programs, cache blobs and files, and runtime misuse.

Every case asserts three things: the error is of a documented type (a subclass of
``kvsim.errors.KvsimError`` from the documented list below), its message holds a given
substring, and nothing changed: the config and output files on disk (results of an earlier
run), the compiled-model file, the ISA input, the device's KV cache (its DRAM bytes, read
directly), the cache files on disk, and the simulated clock. Run configs are also given to
``kvsim run`` (``sim.app.cli.main.main``), which must exit 2 with one line and leave the earlier
outputs as they were.

A case that crashes with an undocumented exception today is marked ``xfail(strict=True,
raises=...)`` with the bug in its reason: when the bug is fixed, the mark must go.
(tests/sim/test_runtime.py and tests/isa/ hold further cases of the same kinds.)
"""

from __future__ import annotations

import io
import json
import random
import shutil
import struct
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from isa.asm import assemble
from isa.encoding import decode_program, encode_program
from isa.errors import AssembleError, DecodeError, FormatError, IsaError, ProgramError
from isa.instructions import (
    Attn,
    AttnDq,
    DmaCopy,
    DmaLoad,
    Gemm,
    GemmGroup,
    GemmRowGroup,
    HostWrite,
    KvRead,
    MemoryLayout,
    Nop,
    Program,
    Vec,
    VecFunc,
    f32_bits,
)
from isa.validate import validate_program
from kvsim.errors import ConfigError, DeviceError, KvsimError, OutputError
from models.bits import build_bit_config
from models.compiler import CompiledModel, CompileError, HardwareTarget, compile_model
from models.source import load_preset
from sim.app.cli.main import main as cli_main
from sim.app.config import load_run_config
from sim.app.regress.regress import RegressError
from sim.app.run import run, write_outputs
from sim.device.hw import load_hardware
from sim.runtime import Accelerator, BatchParam, Model, ModelConfig, RuntimeApiError
from sim.runtime.cacheops import CacheOpError
from sim.runtime.cacheops import evict_positions as _evict_positions
from sim.runtime.cacheops import requantize_through as _requantize_through
from sim.runtime.cacheops import score_eviction as _score_eviction

#: The documented exception types (README, isa/errors.py, and the modules that define them).
DOCUMENTED = (KvsimError, ConfigError, IsaError, DecodeError, AssembleError, ProgramError,
              FormatError, DeviceError, CompileError, CacheOpError, RuntimeApiError,
              RegressError, OutputError)

TINY_HW = load_hardware("tiny")
TINY = load_preset("tiny")
CAP, MAX_SEQ, FILLED = 64, 16, 32  # cache capacity, tokens per call, tokens in the cache


@dataclass(frozen=True)
class Case:
    kind: str  # config | compiled | isa | cache | runtime
    id: str
    act: Callable[[Any], Any]  # the bad call (gets the kind's context)
    exc: type[KvsimError]
    needle: str  # a substring of the message
    prepare: Callable[[Any], Any] | None = None  # sets the bad input up before the snapshot
    sets: tuple[str, ...] = ()  # config: --set overrides
    costs_time: bool = False  # runtime: the call did work (a dump) before refusing
    xfail: tuple[type[BaseException], str] | None = None  # (what it raises now, the bug)
    extra: dict = field(default_factory=dict)
    absent: tuple[str, ...] = ()  # substrings the message must not hold (a wrong wording)


CASES: list[Case] = []


def case(kind: str, id: str, act, exc, needle, **kw) -> None:
    CASES.append(Case(kind, id, act, exc, needle, **kw))


# --- run configs -----------------------------------------------------------------------------

BASE_TOML = """\
[hardware]
preset = "tiny"

[model]
preset = "tiny"

[compile]
core_mode = "single"

[workload]
prompt_tokens = 8
output_tokens = 2

[outputs]
trace = "ops"
"""


def _cfg(id: str, needle: str, *sets: str, toml: str | bytes | None = None,
         files: dict[str, bytes] | None = None, exc=ConfigError, xfail=None,
         absent: tuple[str, ...] = ()) -> None:
    """A run config case: the config file (``BASE_TOML`` or ``toml``), ``--set`` overrides
    (``{dir}`` stands for the case's folder), extra ``files`` in that folder."""
    def act(ctx):
        return run(load_run_config(ctx.config, ctx.sets))

    case("config", id, act, exc, needle, sets=sets, xfail=xfail,
         extra={"toml": toml, "files": files or {}}, absent=absent)


_cfg("unknown section", "modle: unknown key", toml=BASE_TOML + "[modle]\nx = 1\n")
_cfg("unknown key", "workload.prompt_token: unknown key", "workload.prompt_token=8")
_cfg("unknown hardware key", "hardware.dram.speed: unknown key", "hardware.dram.speed=2")
_cfg("wrong type", "workload.prompt_tokens: Input should be a valid integer",
     "workload.prompt_tokens='many'")
_cfg("negative size", "workload.prompt_tokens: Input should be greater than or equal to 1",
     "workload.prompt_tokens=-5")
_cfg("zero tokens per call", "compile.max_sequence_length: Input should be greater",
     "compile.max_sequence_length=0")
_cfg("bits=3 (gemv)", "workload.w_bits: Input should be 4 or 8", "workload.kind='gemv'",
     "workload.w_bits=3")
_cfg("bits=3 (KV format)", "kv.format: KV format: bits must be one of", "kv.format='b3.token'")
_cfg("odd k for 4-bit", "k must be even for 4-bit packed weights", "workload.kind='gemv'",
     "workload.w_bits=4", "workload.k=7")
_cfg("unknown hardware preset", "unknown preset 'nosuch'; valid: aries, regulus, tiny",
     "hardware.preset='nosuch'")
_cfg("unknown model preset", "model.preset: unknown model preset 'nosuch'",
     "model.preset='nosuch'")
_cfg("unknown bits preset", "bits.preset: unknown weight-bit preset 'W3'", "bits.preset='W3'")
_cfg("unknown KV format", "kv.format: unknown KV format 'int7'", "kv.format='int7'")
_cfg("unknown core mode", "compile.core_mode: Input should be", "compile.core_mode='global16'")
_cfg("unknown trace level", "outputs.trace: Input should be", "outputs.trace='all'")
_cfg("unknown workload", "workload.kind: Input should be", "workload.kind='train'")
_cfg("a Hugging Face Hub id", "model: 'HuggingFaceTB/SmolLM2-135M-Instruct' is not a local file "
     "or folder; it looks like a Hugging Face Hub id, and kvsim is offline",
     "model.preset='HuggingFaceTB/SmolLM2-135M-Instruct'", absent=("does not exist",))
_cfg("a Hub id as hf_config", "model.hf_config: 'Qwen/Qwen2.5-0.5B' is not a local file or "
     "folder; it looks like a Hugging Face Hub id", "model.hf_config='Qwen/Qwen2.5-0.5B'")
_cfg("missing hf_config", "missing.json",
     "model.hf_config='{dir}/missing.json'")
_cfg("hf_config not JSON", "bad.json: not valid JSON", "model.hf_config='{dir}/bad.json'",
     files={"bad.json": b"{nope"})
_cfg("hf_config unsupported", "unsupported model_type 'gpt2'",
     "model.hf_config='{dir}/gpt2.json'", files={"gpt2.json": b'{"model_type": "gpt2"}'})
_cfg("preset and hf_config", "give exactly one of 'preset' and 'hf_config'",
     toml=BASE_TOML.replace('preset = "tiny"\n\n[compile]',
                            'preset = "tiny"\nhf_config = "x.json"\n\n[compile]'))
_cfg("bad TOML", "not valid TOML", toml=BASE_TOML + "[workload\n")
_cfg("not UTF-8", "not a UTF-8 text file", toml=b"\xff\xfe" + BASE_TOML.encode())
_cfg("hardware not a table", "hardware: must be a table with a 'preset' key",
     toml=BASE_TOML.replace('[hardware]\npreset = "tiny"', 'hardware = "tiny"'))
_cfg("efficiency > 1", "hardware.dram.efficiency: Input should be less than or equal to 1",
     "hardware.dram.efficiency=1.5")
_cfg("zero DRAM channels", "hardware.dram.channels: Input should be greater than or equal",
     "hardware.dram.channels=0")
_cfg("set without =", "expected key=value", "nonsense")
_cfg("set with empty key part", "bad key 'workload..k'", "workload..k=1")
_cfg("set through a value", "workload.prompt_tokens: is a value, not a table",
     "workload.prompt_tokens.x=1")
_cfg("model too big for DRAM", "needs 336 KiB of DRAM (weights 107 KiB, KV cache 32 KiB); "
     "tiny has 4 KiB", "hardware.dram.capacity_bytes=4096")
_cfg("model too big for SRAM", "does not fit tiny's SRAM", "hardware.sram.bytes_per_core=1024",
     exc=CompileError)
_cfg("infinite call overhead", "hardware.host.call_overhead_ns",
     "hardware.host.call_overhead_ns=inf")
_cfg("gemv n not a multiple of the cores", "workload.n: 3 must be a multiple of the",
     "workload.kind='gemv'", "workload.n=3")
_cfg("cache shorter than the prompt", "compile.cache_length: 4 tokens cannot hold",
     "compile.cache_length=4")
_cfg("cache shorter than context + prompt", "compile.cache_length: 64 tokens cannot hold the "
     "65 tokens the workload feeds (context_tokens 56", "compile.cache_length=64",
     "workload.context_tokens=56")
_cfg("negative context", "workload.context_tokens: Input should be greater than or equal to 0",
     "workload.context_tokens=-1")
_cfg("context past the model's positions", "workload.context_tokens: context_tokens 100000",
     "workload.context_tokens=100000")
_cfg("weight group with only 8-bit weights", "numerics.weight_group 'g32' scales 4-bit weights",
     "bits.numerics.weight_group='g32'")
_cfg("dequant read of an MLA model", "kv.read: the dequantize-on-read path",
     "model.preset='tiny-mla'", "kv.read='dequant'", exc=CompileError)
_cfg("NaN DRAM efficiency", "hardware.dram.efficiency", "hardware.dram.efficiency=nan")
_cfg("boolean prompt length", "workload.prompt_tokens: expected a number, got the boolean",
     "workload.prompt_tokens=true")


# --- model files (GGUF files, Hugging Face folders) named by model.preset ---------------------


def _model_files() -> dict[str, dict[str, bytes]]:
    """Small bad model files, by case: {relative path: bytes} (built once, at import)."""
    import tempfile

    import gguf

    from models.weights import SyntheticWeights
    from tests.models.model_files import TINY_LLAMA, hf_config_json, write_gguf, write_hf_folder

    w = SyntheticWeights(TINY_LLAMA, seed=0)
    q = gguf.GGMLQuantizationType
    out: dict[str, dict[str, bytes]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)

        def gg(key: str, **kw) -> bytes:
            return write_gguf(root / f"{key}.gguf", TINY_LLAMA, w, **kw).read_bytes()

        def folder(key: str, **kw) -> dict[str, bytes]:
            d = write_hf_folder(root / key, TINY_LLAMA, w, **kw)
            return {f"hf/{f.name}": f.read_bytes() for f in sorted(d.iterdir())}

        good = gg("good")
        out["good"] = {"m.gguf": good}
        out["chat bomb"] = {"m.gguf": gg("chat bomb", edit=lambda g: g.add_chat_template(
            "{{ 'x' * 3000000000 }}"))}
        out["truncated"] = {"m.gguf": good[: len(good) // 2]}
        # cut in the header: numpy's own words came through ("index 0 is out of bounds",
        # "When changing to a larger dtype", "not enough values to unpack")
        for n in (4, 5, 8):
            out[f"cut at {n}"] = {"m.gguf": good[:n]}
        out["string hidden_size"] = {"hf/config.json": json.dumps(
            {**{k: v for k, v in hf_config_json(TINY_LLAMA).items() if k != "head_dim"},
             "hidden_size": "64"}).encode()}
        out["magic"] = {"m.gguf": b"GGML" + good[4:]}
        out["arch"] = {"m.gguf": gg("arch", arch="falcon")}
        out["type"] = {"m.gguf": gg("type", types={"blk.0.attn_v.weight": q.I32})}
        out["missing"] = {"m.gguf": gg("missing", skip=["blk.1.ffn_down.weight"])}
        out["shape"] = {"m.gguf": gg("shape", replace={
            "blk.0.ffn_up.weight": np.ones((64, 128), np.float32)})}
        out["vocab"] = {"m.gguf": gg("vocab", tokens=[chr(0x41 + i % 26) * (1 + i // 26)
                                                      for i in range(200)])}
        out["metadata"] = {"m.gguf": gg("metadata", meta={"llama.block_count": None})}
        out["meta type"] = {"m.gguf": gg("meta type", meta={"llama.block_count": None},
                                         edit=lambda g: g.add_string("llama.block_count", "two"))}
        two = folder("two", shards=2)
        out["shard"] = {k: v for k, v in two.items() if not k.startswith("hf/model-00002")}
        out["not json"] = {**folder("nj"), "hf/config.json": b"{not json"}
        out["no weights"] = {"hf/config.json": json.dumps(hf_config_json(TINY_LLAMA)).encode()}
        one = folder("one")
        out["st truncated"] = {**one, "hf/model.safetensors":
                               one["hf/model.safetensors"][:-100]}
        out["st missing"] = folder("stm", skip=["model.layers.1.mlp.up_proj.weight"])
        out["st vocab"] = {**one, "hf/config.json": json.dumps(
            {**hf_config_json(TINY_LLAMA), "vocab_size": 300}).encode()}
        out["tokenizer"] = {**one, "hf/tokenizer.json": b'{"version": "1.0"}'}
        out["not a model"] = {"model.bin": good}
    return out


_MODEL_FILES = _model_files()


def _model(id: str, needle: str, key: str, name: str = "m.gguf",
           absent: tuple[str, ...] = ()) -> None:
    _cfg(id, needle, f"model.preset='{{dir}}/{name}'", files=_MODEL_FILES[key], absent=absent)


_model("GGUF truncated", "m.gguf: unreadable GGUF file (truncated or corrupt)", "truncated")
for _n in (4, 5, 8):
    _model(f"GGUF cut after {_n} bytes", f"m.gguf: unreadable GGUF file (truncated or corrupt): "
           f"it ends or breaks inside its header, metadata or tensor index (the file has {_n} "
           f"bytes)", f"cut at {_n}", absent=("index 0", "dtype", "unpack"))
_model("HF hidden_size a string", "config.json: hidden_size must be a positive integer, got "
       "'64'", "string hidden_size", "hf", absent=("not a multiple",))
_model("GGUF wrong magic", "m.gguf: not a GGUF file (magic b'GGML'", "magic")
_model("GGUF unsupported architecture", "m.gguf: unsupported architecture 'falcon'", "arch")
_model("GGUF unsupported tensor type", "m.gguf: tensor 'blk.0.attn_v.weight' has unsupported "
       "type I32", "type")
_model("GGUF missing tensor", "m.gguf: missing tensor 'blk.1.ffn_down.weight'", "missing")
_model("GGUF wrong shape", "m.gguf: tensor 'blk.0.ffn_up.weight' has shape (64, 128); the "
       "model expects (128, 64)", "shape")
_model("GGUF vocabulary disagrees", "m.gguf: vocabulary disagrees with the weights: "
       "tokenizer.ggml.tokens gives 200 tokens, token_embd.weight has 256 rows", "vocab")
_model("GGUF metadata incomplete", "m.gguf: metadata lacks llama.block_count", "metadata")
_model("GGUF metadata of the wrong type", "m.gguf: bad llama.* metadata value: invalid "
       "literal for int()", "meta type")
_model("HF index names a missing shard", "model.safetensors.index.json: names shard "
       "'model-00002-of-00002.safetensors', which is missing", "shard", "hf")
_model("HF config.json not JSON", "hf/config.json: not valid JSON", "not json", "hf")
_model("HF folder without weights", "hf: no weights in this model folder", "no weights", "hf")
_model("HF safetensors truncated", "model.safetensors: not a valid safetensors file",
       "st truncated", "hf")
_model("HF missing tensor", "no tensor 'model.layers.1.mlp.up_proj.weight'", "st missing", "hf")
_model("HF vocab_size disagrees with the weights", "tensor 'model.embed_tokens.weight' has "
       "shape (256, 64); model expects (300, 64)", "st vocab", "hf")
_model("HF tokenizer.json invalid", "tokenizer.json: not a valid tokenizer.json", "tokenizer",
       "hf")
_model("not a model file", "model.bin: not a model (expected a .gguf file", "not a model",
       "model.bin")


# a prompt text is checked at its real token count (the tiny GGUF's byte vocabulary: one
# token per character; its context is 512 positions), before anything is compiled
_LONG = "a" * 600
_cfg("prompt text past the model's context", "workload.prompt: the prompt text's 600 tokens "
     "+ output_tokens 2 - 1 = 601 tokens exceed the max_position_embeddings (512) of model 'm'",
     "model.preset='{dir}/m.gguf'", f"workload.prompt='{_LONG}'", files=_MODEL_FILES["good"])
_cfg("GGUF chat template asking for 3 GB", "m.gguf: chat template fails: '*' would make "
     "3,000,000,000 characters or items, more than the", "model.preset='{dir}/m.gguf'",
     "workload.prompt='hi'", "workload.chat=true", files=_MODEL_FILES["chat bomb"])
_cfg("prompt text longer than the cache", "compile.cache_length: 64 tokens cannot hold the 101 "
     "tokens the workload feeds (the prompt text's 100 tokens + output_tokens 2 - 1)",
     "model.preset='{dir}/m.gguf'", f"workload.prompt='{_LONG[:100]}'",
     "compile.cache_length=64", files=_MODEL_FILES["good"])


# --- compiled-model files ----------------------------------------------------------------------


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, d in members.items():
            z.writestr(n, d)
    return buf.getvalue()


def _header(change: Callable[[dict], Any]) -> Callable[[bytes], bytes]:
    def mutate(data: bytes) -> bytes:
        m = _members(data)
        h = json.loads(m["header.json"])
        out = change(h)
        m["header.json"] = json.dumps(h if out is None else out).encode()
        return _zip(m)
    return mutate


def _arrays(change: Callable[[dict], Any]) -> Callable[[bytes], bytes]:
    def mutate(data: bytes) -> bytes:
        m = _members(data)
        arrays = dict(np.load(io.BytesIO(m["arrays.npz"])))
        change(arrays)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        m["arrays.npz"] = buf.getvalue()
        return _zip(m)
    return mutate


def _member(name: str, new: bytes | None) -> Callable[[bytes], bytes]:
    def mutate(data: bytes) -> bytes:
        m = _members(data)
        if new is None:
            del m[name]
        else:
            m[name] = new
        return _zip(m)
    return mutate


def _member_data_offset(data: bytes, name: str) -> int:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = z.getinfo(name)
    # the local file header: 30 bytes, the name, the extra field (lengths at 26 and 28)
    n, extra = struct.unpack("<HH", data[info.header_offset + 26:info.header_offset + 30])
    return info.header_offset + 30 + n + extra


def _flip_in_member(name: str, *, at: float = 0.5) -> Callable[[bytes], bytes]:
    """Flip one bit in a member's compressed bytes: zlib refuses the stream or the zip's
    CRC-32 catches it (which of the two depends on where the bit lands in the deflate data,
    so the case checks the refusal, not zlib's wording)."""
    def mutate(data: bytes) -> bytes:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            size = z.getinfo(name).compress_size
        b = bytearray(data)
        b[_member_data_offset(data, name) + int(size * at)] ^= 0x10
        return bytes(b)
    return mutate


def _bad_deflate_block(name: str) -> Callable[[bytes], bytes]:
    """Make a member's first deflate block of the reserved type 3 (zlib refuses it)."""
    def mutate(data: bytes) -> bytes:
        b = bytearray(data)
        b[_member_data_offset(data, name)] = 0b111  # BFINAL=1, BTYPE=11 (reserved)
        return bytes(b)
    return mutate


def _compression_method(method: int) -> Callable[[bytes], bytes]:
    """Set every central-directory entry's compression method to ``method``."""
    def mutate(data: bytes) -> bytes:
        b = bytearray(data)
        at = b.find(b"PK\x01\x02")
        while at >= 0:
            b[at + 10:at + 12] = struct.pack("<H", method)
            at = b.find(b"PK\x01\x02", at + 4)
        return bytes(b)
    return mutate


def _kvm(id: str, needle: str, mutate: Callable[[bytes], bytes] | None, *, path: str = "m.kvm",
         exc=CompileError, xfail=None, absent: tuple[str, ...] = ()) -> None:
    """A compiled-model case: the valid tiny model's file, changed by ``mutate`` (None: the
    file is not written), loaded from ``path``."""
    def act(ctx):
        return CompiledModel.load(ctx.dir / path)

    case("compiled", id, act, exc, needle, xfail=xfail, extra={"mutate": mutate, "path": path},
         absent=absent)


_kvm("not a zip", "not a kvsim compiled model",
     lambda d: random.Random(1).randbytes(len(d)))
_kvm("empty file", "not a kvsim compiled model", lambda d: b"")
_kvm("truncated to half", "not a kvsim compiled model (File is not a zip file)",
     lambda d: d[: len(d) // 2])
_kvm("last 10 bytes cut", "not a kvsim compiled model", lambda d: d[:-10])
_kvm("no header.json", "There is no item named 'header.json'", _member("header.json", None))
_kvm("no arrays.npz", "There is no item named 'arrays.npz'", _member("arrays.npz", None))
_kvm("header not JSON", "not a kvsim compiled model", _member("header.json", b"{oops"))
_kvm("arrays not npz", "not a kvsim compiled model", _member("arrays.npz", b"garbage" * 9))
_kvm("program corrupt", "not a kvsim compiled model",
     _member("programs/decode.bin", b"KVSI\x01\x00\x05\x00\x00\x00"))
_kvm("wrong format name", "not a kvsim compiled model",
     _header(lambda h: h.update(format="something-else")))
_kvm("wrong version", "compiled-model version 4 is not supported",
     _header(lambda h: h.update(version=4)))
_kvm("older version", "compiled with an older kvsim (compiled-model version 1; this kvsim "
     "reads version 3); recompile it", _header(lambda h: h.update(version=1)))
_kvm("big-tile bound beyond the token tile", "big_tile_tokens = 100000 is not an integer in "
     "0..m_tile", _header(lambda h: h.update(big_tile_tokens=100000)))
_kvm("missing numerics", "header is incomplete or invalid",
     _header(lambda h: h.pop("numerics") and None))
_kvm("missing model", "header is incomplete or invalid", _header(lambda h: h.pop("model") and None))
_kvm("invalid model config", "header is incomplete or invalid",
     _header(lambda h: h["model"].update(num_layers=-1)))
_kvm("memory map not a list", "header is incomplete or invalid",
     _header(lambda h: h.update(memory_map=5)))
_kvm("missing file", "does not exist", None, path="nope.kvm")
_kvm("a directory", "does not exist", None, path=".")
_kvm("header is a list", "not a kvsim compiled model", _header(lambda h: [h]))
_kvm("flipped bit in a compressed member", "not a kvsim compiled model",
     _flip_in_member("arrays.npz"))
_kvm("invalid deflate block", "not a kvsim compiled model", _bad_deflate_block("header.json"))
_kvm("unknown compression method", "not a kvsim compiled model", _compression_method(99))
_kvm("unknown KV format in header", "kv = 'int7' is not a KV format",
     _header(lambda h: h.update(kv="int7")))
_kvm("unknown core mode in header", "core_mode = 'x' is not one of",
     _header(lambda h: h.update(core_mode="x")))
_kvm("fractional cache capacity in header", "cap = 64.5 is not a positive integer",
     _header(lambda h: h.update(cap=64.5)))
_kvm("max_seq beyond the capacity in header", "max_seq = 100000 exceeds the cache capacity",
     _header(lambda h: h.update(max_seq=100000)))
_kvm("zero cache slots in header", "slots = 0 is not a positive integer",
     _header(lambda h: h.update(slots=0)))
_kvm("unknown weight source in header", "weights = {'kind': 'pickle'}",
     _header(lambda h: h.update(weights={"kind": "pickle"})))
_kvm("memory map edited", "memory_map is not the one model, bits, kv",
     _header(lambda h: h["memory_map"][0].update(size=h["memory_map"][0]["size"] + 4096)))
_kvm("a layer missing from the numerics", "numerics.layers has 1 entries; the model has 2",
     _header(lambda h: h["numerics"].update(layers=h["numerics"]["layers"][:1])))
_kvm("core mode beyond the target's cores", "core_mode 'global8' needs 8 cores; hw has 2",
     _header(lambda h: h.update(core_mode="global8")))
_kvm("shift beyond 32 bits", "numerics.layers[0].q.shift = 1099511627776 is not a 32-bit",
     _header(lambda h: h["numerics"]["layers"][0]["q"].update(shift=2**40)))
_kvm("norm gains of the wrong length", "numerics.0.attn_norm.gamma must be int16[64], got "
     "int16[63]", _arrays(lambda a: a.update({"0.attn_norm.gamma": a["0.attn_norm.gamma"][:63]})))
_kvm("a model too big for the header's DRAM", "compiled model header: the model 'tiny' needs",
     _header(lambda h: h["hw"].update(dram_bytes=4096)),
     absent=("compiled model header: compiled model header",))
_kvm("requantization multipliers missing", "numerics.1.down.mult must be int32[64], got missing",
     _arrays(lambda a: a.pop("1.down.mult")))


# --- ISA programs ------------------------------------------------------------------------------

LAYOUT = MemoryLayout(dram_bytes=1 << 20, sram_bytes=1 << 16, host_bytes=1 << 20, num_cores=2)
GOOD = Program((DmaLoad(core=1, src=0, dst=0, nbytes=64, signal=(1,)),
                Nop(core=1, on=0, wait=(1,))), name="ok")
GOOD_BYTES = encode_program(GOOD)


def _decode(id: str, needle: str, data: bytes) -> None:
    case("isa", id, lambda buf: decode_program(buf), DecodeError, needle,
         extra={"input": data})


def _with(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new):]


HEAD = 4 + 2 + 4 + 2 + 2 + len(b"ok")  # magic, version, count, formats, name
_decode("empty", "bad magic", b"")
_decode("wrong magic", "bad magic b'KVSX'", b"KVSX" + GOOD_BYTES[4:])
_decode("version 2", "unsupported format version 2", _with(GOOD_BYTES, 4, b"\x02\x00"))
_decode("header cut", "truncated data: program header", GOOD_BYTES[:7])
_decode("unknown opcode", "unknown opcode 0xee", _with(GOOD_BYTES, HEAD, b"\xee"))
_decode("body cut", "truncated data", GOOD_BYTES[:-1])
_decode("trailing bytes", "2 trailing bytes", GOOD_BYTES + b"\x00\x00")
_decode("count beyond the data", "truncated data: instruction 2 header",
        _with(GOOD_BYTES, 6, struct.pack("<I", 3)))
_decode("name not UTF-8", "not valid utf-8", _with(GOOD_BYTES, HEAD - 2, b"\xff\xfe"))
_decode("bad enum", "is not a valid Engine",
        encode_program(Program((Nop(core=1, on=1),)))[:-1] + b"\xfe")
_decode("random bytes", "bad magic", random.Random(7).randbytes(300))


def _validate(id: str, needle: str, *instructions, formats=()) -> None:
    prog = Program(tuple(instructions), formats=formats, name=id)
    case("isa", id, lambda p: validate_program(p, LAYOUT), ProgramError, needle,
         extra={"input": prog})


_validate("core out of range", "instruction 0: core 5 out of range",
          DmaLoad(core=5, src=0, dst=0, nbytes=64))
_validate("device engine on core 1", "requires core 0",
          DmaCopy(core=1, src=0, dst=4096, nbytes=64))
_validate("gemm w_bits 3", "w_bits must be one of (2, 4, 8), got 3",
          Gemm(m=1, k=64, n=64, w_bits=3, a=0, w=4096, out=8192))
_validate("gemm misaligned 4-bit k", "misaligned packed weights",
          Gemm(m=1, k=63, n=64, w_bits=4, a=0, w=4096, out=8192))
_validate("gemm.g with 8-bit weights", "w_bits must be 4",
          GemmGroup(m=1, k=64, n=64, w_bits=8, a=0, w=4096, out=16384, group=32))
_validate("gemm.g odd group", "even number >= 2",
          GemmGroup(m=1, k=64, n=64, w_bits=4, a=0, w=4096, out=16384, group=3))
_validate("gemm.gr without multipliers", "gemm.row needs scale",
          GemmRowGroup(m=1, k=64, n=64, w_bits=4, a=0, w=4096, out=16384, group=32))
_validate("gemm.gr with 8-bit weights", "w_bits must be 4",
          GemmRowGroup(m=1, k=64, n=64, w_bits=8, a=0, w=4096, out=16384, group=32,
                       scale=32768))
_validate("attn.dq NaN scale", "k_scale_f32 holds nan",
          AttnDq(q_len=1, ctx=8, heads=2, kv_heads=2, head_dim=16, k_fmt=0, v_fmt=0, q=0,
                 k=0, v=4096, out=1024, k_nbytes=128, v_nbytes=128, q_scale_f32=f32_bits(1.0),
                 k_scale_f32=f32_bits(float("nan")), v_scale_f32=f32_bits(1.0),
                 softmax_scale_f32=f32_bits(0.25), out_scale_f32=f32_bits(1.0)),
          formats=("int8",))
_validate("attn heads", "heads (3) must be a multiple of kv_heads (2)",
          Attn(q_len=1, ctx=8, heads=3, kv_heads=2, head_dim=16, k_fmt=0, v_fmt=0, q=0,
               k=0, v=4096, out=1024, k_nbytes=128, v_nbytes=128), formats=("int8",))
_validate("attn ctx 0", "ctx must be >= 1",
          Attn(q_len=1, ctx=0, heads=2, kv_heads=2, head_dim=16, k_fmt=0, v_fmt=0, q=0,
               k=0, v=4096, out=1024, k_nbytes=128, v_nbytes=128), formats=("int8",))
_validate("format index", "fmt 0 is not an index into the program's 0 formats",
          KvRead(fmt=0, tokens=1, width=16, src=0, dst=0, nbytes=64))
_validate("zero-byte transfer", "zero-byte transfer", HostWrite(src=0, dst=0, nbytes=0))
_validate("DRAM overflow", "overflows the 1048576-byte DRAM",
          DmaLoad(src=(1 << 20) - 8, dst=0, nbytes=64))
_validate("deadlock", "waits on flag 9 (1 time) but it is never signalled (deadlock)",
          Vec(func=VecFunc(0), rows=1, cols=16, src0=0, dst=64, wait=(9,)))


def _asm(id: str, needle: str, text: str) -> None:
    case("isa", id, lambda t: assemble(t), AssembleError, needle, extra={"input": text})


_asm("unknown mnemonic", "line 2: unknown mnemonic 'jump'", "nop on=0\njump core=1\n")
_asm("missing field", "missing required field(s) src, dst, nbytes", "dma.load core=1")
_asm("duplicate field", "duplicate field 'core'", "nop on=0 core=1 core=1")
_asm("bad number", "bad number '12z'", "dma.load src=12z dst=0 nbytes=1")
_asm("out of range", "is out of range for u8", "nop on=0 core=256")
_asm("unknown directive", "unknown directive '.align'", ".align 4")


# --- cache blobs and files ---------------------------------------------------------------------


def _files(ctx) -> list[Path]:
    return sorted(ctx.snap.glob("cache_*.bin"))


def _rewrite(i: int, change: Callable[[bytes], bytes]) -> Callable[[Any], None]:
    def prepare(ctx):
        p = _files(ctx)[i]
        p.write_bytes(change(p.read_bytes()))
    return prepare


HDR = struct.calcsize("<8sHII")


def _repack(change_meta: Callable[[dict], Any]) -> Callable[[bytes], bytes]:
    """Rewrite a cache file's JSON header (keeping the payload and its CRC)."""
    def change(data: bytes) -> bytes:
        magic, version, jlen, crc = struct.unpack("<8sHII", data[:HDR])
        meta = json.loads(data[HDR:HDR + jlen])
        out = change_meta(meta)
        js = json.dumps(meta if out is None else out).encode()
        return struct.pack("<8sHII", magic, version, len(js), crc) + js + data[HDR + jlen:]
    return change


def _flip(offset_of: Callable[[bytes], int], bit: int = 0) -> Callable[[bytes], bytes]:
    def change(data: bytes) -> bytes:
        b = bytearray(data)
        b[offset_of(data)] ^= 1 << bit
        return bytes(b)
    return change


def _load_from(ctx):
    return ctx.model.load_cache_memory_from(ctx.snap)


def _load_bufs(make: Callable[[Any], Any]) -> Callable[[Any], None]:
    return lambda ctx: ctx.model.load_cache_memory(make(ctx))


def _cache(id: str, needle: str, act, prepare=None, *, exc=CacheOpError, xfail=None) -> None:
    case("cache", id, act, exc, needle, prepare=prepare, xfail=xfail)


_cache("one buffer too many", "got 5 buffers, the model has 4",
       _load_bufs(lambda ctx: ctx.bufs + [ctx.bufs[0]]))
_cache("a dict of buffers", "expected a list of 4 buffers, got dict",
       _load_bufs(lambda ctx: dict(enumerate(ctx.bufs))))
_cache("one bytes object", "expected a list of 4 buffers, got bytes",
       _load_bufs(lambda ctx: b"".join(ctx.bufs)))
_cache("buffer one byte long", "buffer 2 (l1.k) has 2049 bytes, the cache takes 2048",
       _load_bufs(lambda ctx: ctx.bufs[:2] + [ctx.bufs[2] + b"\x00"] + ctx.bufs[3:]))
_cache("blobs of another model", "has 3072 bytes, the cache takes 2048",
       _load_bufs(lambda ctx: ctx.other_bufs))
_cache("a None buffer", "buffer 0 (l0.k) is not bytes-like",
       _load_bufs(lambda ctx: [None] + ctx.bufs[1:]))
_cache("a str buffer", "is not bytes-like",
       _load_bufs(lambda ctx: ["x" * 2048] + ctx.bufs[1:]))
_cache("file payload truncated", "holds 1948 bytes, its header says 2048", _load_from,
       _rewrite(0, lambda d: d[:-100]))
_cache("file empty", "truncated header (0 bytes)", _load_from, _rewrite(1, lambda d: b""))
_cache("file cut inside the header", "corrupt header", _load_from,
       _rewrite(1, lambda d: d[:HDR + 5]))
_cache("file bit flipped in the payload", "checksum mismatch", _load_from,
       _rewrite(2, _flip(lambda d: len(d) - 1000, bit=5)))
_cache("file bit flipped in the magic", "not a kvsim cache file", _load_from,
       _rewrite(3, _flip(lambda d: 2)))
_cache("file bit flipped in the version", "cache file version 3", _load_from,
       _rewrite(0, _flip(lambda d: 8, bit=1)))
_cache("file bit flipped in the JSON header", "corrupt header", _load_from,
       _rewrite(0, _flip(lambda d: HDR, bit=0)))
_cache("file header length too large", "corrupt header", _load_from,
       _rewrite(0, lambda d: d[:10] + struct.pack("<I", len(d)) + d[14:]))
_cache("file header size lies", "holds 2048 bytes, its header says 2049", _load_from,
       _rewrite(0, _repack(lambda m: m.update(size=m["size"] + 1))))
_cache("file trailing garbage", "holds 2052 bytes, its header says 2048", _load_from,
       _rewrite(3, lambda d: d + b"junk"))
_cache("file of random bytes", "not a kvsim cache file", _load_from,
       _rewrite(2, lambda d: random.Random(3).randbytes(len(d))))
_cache("files swapped (K and V)", "holds cache 'l0.v', expected 'l0.k'",
       _load_from, lambda ctx: _swap(_files(ctx)[0], _files(ctx)[1]))
_cache("files of another model", "dumped from another model or KV format",
       lambda ctx: ctx.model.load_cache_memory_from(ctx.other_snap))
_cache("files of the same shape with other weights", "dumped from another model or KV format: "
       "its weights differ ('tiny|L2|H64|kv2x16|synthetic:seed=1|",
       lambda ctx: ctx.model.load_cache_memory_from(ctx.reseeded_snap))
_cache("a folder named like a cache file", "cache_0000k.bin is missing", _load_from,
       lambda ctx: (_files(ctx)[0].unlink(), (ctx.snap / "cache_0000k.bin").mkdir()))
_cache("a file, not a folder", "is not a directory",
       lambda ctx: ctx.model.load_cache_memory_from(_files(ctx)[0]))
_cache("file header not an object", "corrupt header", _load_from,
       _rewrite(1, _repack(lambda m: [m])))


def _swap(a: Path, b: Path) -> None:
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)


# --- runtime misuse ------------------------------------------------------------------------------


def _rt(id: str, needle: str, act, prepare=None, *, exc=RuntimeApiError, costs_time=False,
        xfail=None, absent: tuple[str, ...] = ()) -> None:
    case("runtime", id, act, exc, needle, prepare=prepare, costs_time=costs_time, xfail=xfail,
         absent=absent)


def _infer(x: Callable[[Any], Any], **kw) -> Callable[[Any], Any]:
    return lambda ctx: ctx.model.infer(x(ctx), **kw)


def _one(ctx):
    return ctx.emb[FILLED:FILLED + 1]


def _dispose(ctx):
    ctx.model.dispose()


_rt("cache_size beyond capacity", "cache_size 56 + 16 tokens exceed the cache capacity of 64",
    _infer(lambda ctx: ctx.emb[:16], cache_size=56))
_rt("negative cache_size", "cache_size must be an integer >= 0, got -1",
    _infer(_one, cache_size=-1), absent=("+ 1 tokens",))
_rt("a 4-D array of the wrong width in a list", "inputs[0]: shape (1, 1, 4, 65), expected "
    "(1, 1, seq, 64)", _infer(lambda ctx: [np.zeros((1, 1, 4, 65), np.float32)],
                              cache_size=FILLED), absent=("(1, 1, 1, 4, 65)",))
_rt("inputs of the wrong width", "inputs: shape (1, 32), expected (seq, 64)",
    _infer(lambda ctx: ctx.emb[:1, :32], cache_size=FILLED))
_rt("inputs 1-D", "inputs: shape (64,)", _infer(lambda ctx: ctx.emb[0], cache_size=FILLED))
_rt("inputs 4-D not (1, 1, ...)", "expected (1, 1, seq, hidden)",
    _infer(lambda ctx: ctx.emb[:2].reshape(2, 1, 1, 64), cache_size=FILLED))
_rt("no tokens", "inputs: shape (0, 64)", _infer(lambda ctx: ctx.emb[:0], cache_size=FILLED))
_rt("more tokens than max_sequence_length", "17 tokens exceed max_sequence_length 16",
    _infer(lambda ctx: ctx.emb[:17], cache_size=0))
_rt("cache_id out of range", "cache_id 1 out of range 0..0",
    _infer(_one, cache_size=FILLED, cache_id=1))
_rt("batch_param disagrees", "batch_param.sequence_length 2 does not match the 1 input",
    _infer(_one, batch_param=BatchParam(sequence_length=2, cache_size=FILLED)))
_rt("inputs of text", "inputs",
    _infer(lambda ctx: np.full((1, 64), "a"), cache_size=FILLED))
_rt("fractional cache_size", "cache_size must be an integer, got 32.5",
    _infer(_one, cache_size=FILLED + 0.5))
_rt("boolean cache_size", "cache_size must be an integer, got True",
    _infer(_one, cache_size=True))
_rt("fractional cache_id", "cache_id must be an integer, got 0.5",
    _infer(_one, cache_size=FILLED, cache_id=0.5))
_rt("fractional cache_id on filter", "cache_id 0.5 out of range",
    lambda ctx: ctx.model.filter_cache_tail(FILLED, 2, [True, False], cache_id=0.5),
    exc=CacheOpError)
_rt("mask of fractions", "mask must hold booleans (or 0/1)",
    lambda ctx: ctx.model.filter_cache_tail(FILLED, 2, [0.5, 1.0]), exc=CacheOpError)
_rt("mask None", "mask has shape (), expected (2,)",
    lambda ctx: ctx.model.filter_cache_tail(FILLED, 2, None), exc=CacheOpError)
_rt("tail_size 0", "tail_size 0 must be 1..32",
    lambda ctx: ctx.model.filter_cache_tail(FILLED, 0, np.zeros(0, bool)), exc=CacheOpError)
_rt("filter beyond capacity", "cache_size 65 must be an integer in 0..64",
    lambda ctx: ctx.model.filter_cache_tail(CAP + 1, 2, [True, False]), exc=CacheOpError)
_rt("filter with a float cache_size", "cache_size 32.0 must be an integer",
    lambda ctx: ctx.model.filter_cache_tail(32.0, 2, [True, False]), exc=CacheOpError)
_rt("move more than the cache", "num_head 20 + num_tail 20 exceed cache_size 32",
    lambda ctx: ctx.model.move_cache_tail(20, 20, FILLED), exc=CacheOpError)
_rt("move a negative tail", "num_tail must be an integer >= 0, got -1",
    lambda ctx: ctx.model.move_cache_tail(2, -1, FILLED), exc=CacheOpError)
_rt("move in a slot that does not exist", "cache_id 3 out of range",
    lambda ctx: ctx.model.move_cache_tail(2, 2, FILLED, cache_id=3), exc=CacheOpError)
_rt("evict positions outside the cache", "positions must lie in 0..31",
    lambda ctx: ctx.model.evict_on_device([3, 40], cache_size=FILLED), exc=CacheOpError)
_rt("evict nothing", "no positions to drop",
    lambda ctx: ctx.model.evict_on_device([], cache_size=FILLED), exc=CacheOpError)
_rt("host edit in an unknown mode", "mode must be 'model' or 'in_the_loop'",
    lambda ctx: ctx.model.edit_cache_on_host(lambda v: None, cache_size=FILLED, mode="fast"),
    exc=CacheOpError)
_rt("host edit returns floats", "the edit returned float64",
    lambda ctx: ctx.model.edit_cache_on_host(
        lambda views: [v.values.astype(float) for v in views], cache_size=FILLED),
    exc=CacheOpError, costs_time=True)
_rt("host edit returns too few caches", "the edit returned 3 caches, expected 4",
    lambda ctx: ctx.model.edit_cache_on_host(lambda views: [v.values for v in views[:3]],
                                             cache_size=FILLED),
    exc=CacheOpError, costs_time=True)
_rt("host edit returns ragged caches", "caches of different lengths [31, 32]",
    lambda ctx: ctx.model.edit_cache_on_host(
        lambda views: [v.values[1:] if i == 0 else v.values for i, v in enumerate(views)],
        cache_size=FILLED),
    exc=CacheOpError, costs_time=True)
_rt("host edit grows past the capacity", "70 tokens exceed the capacity 64",
    lambda ctx: ctx.model.edit_cache_on_host(
        lambda views: [np.resize(v.values, (70, *v.values.shape[1:])) for v in views],
        cache_size=FILLED),
    exc=CacheOpError, costs_time=True)
_rt("requantize beyond capacity", "cache_size 65 must be an integer in 0..64",
    lambda ctx: ctx.model.requantize_on_device("int8", cache_size=CAP + 1), exc=CacheOpError)
_rt("infer after dispose", "the model was disposed", _infer(_one, cache_size=FILLED), _dispose)
_rt("dump after dispose", "the model was disposed",
    lambda ctx: ctx.model.dump_cache_memory(), _dispose)
_rt("load after dispose", "the model was disposed",
    lambda ctx: ctx.model.load_cache_memory(ctx.bufs), _dispose)
_rt("filter after dispose", "the model was disposed",
    lambda ctx: ctx.model.filter_cache_tail(FILLED, 1, [True]), _dispose)
_rt("cache infos after dispose", "the model was disposed",
    lambda ctx: ctx.model.get_cache_infos(), _dispose)
_rt("dispose twice", "the model was disposed", lambda ctx: ctx.model.dispose(), _dispose)
_rt("launch after dispose", "the model was disposed",
    lambda ctx: ctx.model.launch(ctx.acc), _dispose)
_rt("launching twice", "the model is already launched on an accelerator",
    lambda ctx: ctx.model.launch(ctx.acc))
_rt("a second model on the card", "this accelerator already runs a model",
    lambda ctx: Model(ctx.cm).launch(ctx.acc))
_rt("core mode mismatch", "ModelConfig.core_mode 'global8' does not match the compiled "
    "model's 'single'", lambda ctx: Model(ctx.cm, ModelConfig(core_mode="global8")))
_rt("model compiled for a bigger chip", "the model was compiled for 'aries', which this "
    "accelerator ('tiny') cannot run", lambda ctx: Model(ctx.aries_cm).launch(ctx.acc))
_rt("dump into a path that is a file", "dump_cache_memory_to",
    lambda ctx: ctx.model.dump_cache_memory_to(_files(ctx)[0]), exc=CacheOpError)
_rt("launch a launched model on a second card", "already launched",
    lambda ctx: ctx.model.launch(Accelerator(hw=TINY_HW)))
_rt("launch on something else", "expected an Accelerator, got str",
    lambda ctx: Model(ctx.cm).launch("aries"))

# item-by-item fixes of crashes a review found (each refused before any work)
_rt("host edit is not callable", "fn must be callable",
    lambda ctx: ctx.model.edit_cache_on_host(None, cache_size=FILLED), exc=CacheOpError)
_rt("host edit returns a list of ints", "the edit returned int; expected a list of 4 int8 "
    "arrays (tokens, heads, width) or None",
    lambda ctx: ctx.model.edit_cache_on_host(lambda views: [0, 0, 0, 0], cache_size=FILLED),
    exc=CacheOpError, costs_time=True)
_rt("host edit returns a generator", "the edit returned generator; expected a list of 4",
    lambda ctx: ctx.model.edit_cache_on_host(lambda views: (v.values for v in views),
                                             cache_size=FILLED),
    exc=CacheOpError, costs_time=True)
_rt("host edit returns ragged lists", "the edit returned ragged list",
    lambda ctx: ctx.model.edit_cache_on_host(lambda views: [[[1, 2], [3]]] * 4,
                                             cache_size=FILLED),
    exc=CacheOpError, costs_time=True)
_rt("requantize through an unknown format", "via: unknown KV format 'int7'; valid names",
    lambda ctx: ctx.model.requantize_on_device("int7", cache_size=FILLED), exc=CacheOpError)
_rt("requantize through None", "via: expected a KV format or its name, got NoneType",
    lambda ctx: ctx.model.requantize_on_device(None, cache_size=FILLED), exc=CacheOpError)
_rt("requantize_through a K/V pair name", "requantize_through: KV layout 'kivi-4' has "
    "different K and V formats", lambda ctx: _requantize_through("kivi-4"), exc=CacheOpError)
_rt("outputs a tuple", "outputs must be a list (the logits are put in it) or None, got tuple",
    _infer(_one, outputs=(), cache_size=FILLED))
_rt("evict a fractional position", "evict: positions must be integers in 0..31, got 1.7",
    lambda ctx: ctx.model.evict_on_device([1.7], cache_size=FILLED), exc=CacheOpError)
_rt("evict a bare int", "positions must be a sequence of integers in 0..31, got int",
    lambda ctx: ctx.model.evict_on_device(3, cache_size=FILLED), exc=CacheOpError)
_rt("evict with a boolean mask", "pass np.flatnonzero(mask)",
    lambda ctx: ctx.model.evict_on_device(np.ones(FILLED, bool), cache_size=FILLED),
    exc=CacheOpError)
_rt("evict_positions of NaN", "evict_positions: positions must be integers >= 0, got nan",
    lambda ctx: _evict_positions([float("nan")]), exc=CacheOpError)
_rt("uint8 cache_size past the capacity", "cache_size 255 + 1 tokens exceed",
    _infer(_one, cache_size=np.uint8(255)))
_rt("uint64 cache_size does not wrap", "cache_size 18446744073709551615 + 1 tokens exceed",
    _infer(_one, cache_size=np.uint64(2**64 - 1)))
_rt("uint64 move does not wrap", "num_head 18446744073709551615 + num_tail 2 exceed",
    lambda ctx: ctx.model.move_cache_tail(np.uint64(2**64 - 1), np.uint64(2), FILLED),
    exc=CacheOpError)
_rt("fractional tail_size", "filter_cache_tail: tail_size must be an integer 1..32, got 2.0",
    lambda ctx: ctx.model.filter_cache_tail(FILLED, 2.0, [True, False]), exc=CacheOpError)
_rt("boolean tail_size", "tail_size must be an integer 1..32, got True",
    lambda ctx: ctx.model.filter_cache_tail(FILLED, True, [True]), exc=CacheOpError)
_rt("ragged mask", "mask must be a 1-D sequence of 2 booleans",
    lambda ctx: ctx.model.filter_cache_tail(FILLED, 2, [[1], 2]), exc=CacheOpError)
_rt("hardware of the wrong type", "hw must be a hardware preset name (str) or a "
    "HardwareConfig, got dict", lambda ctx: Accelerator(hw={"preset": "tiny"}))
_rt("negative keep_calls", "keep_calls must be an integer >= 0 or None, got -1",
    lambda ctx: Accelerator(hw=TINY_HW, keep_calls=-1))
_rt("model path None", "Model: path must be a compiled-model file", lambda ctx: Model(None))
_rt("model config a string", "model_config must be a ModelConfig or None, got str",
    lambda ctx: Model(ctx.cm, "single"))
_rt("batch_param a tuple", "batch_param must be a BatchParam",
    _infer(_one, batch_param=(1, FILLED, 0)))
_rt("calls_since a string", "calls_since: count must be an integer, got 'x'",
    lambda ctx: ctx.acc.calls_since("x"))
_rt("load from None", "load_cache_memory_from: directory must be a path",
    lambda ctx: ctx.model.load_cache_memory_from(None), exc=CacheOpError)
_rt("dump to None", "dump_cache_memory_to: directory must be a path",
    lambda ctx: ctx.model.dump_cache_memory_to(None), exc=CacheOpError)
_rt("NaN embeddings", "inputs: contain NaN or inf",
    _infer(lambda ctx: np.full((1, 64), np.nan), cache_size=FILLED))
_rt("embeddings beyond float32", "inputs: contain NaN or inf",
    _infer(lambda ctx: np.full((1, 64), 1e300), cache_size=FILLED))
_rt("complex embeddings", "inputs: complex values",
    _infer(lambda ctx: np.full((1, 64), 1 + 1j), cache_size=FILLED))
_rt("score_eviction negative", "score_eviction: keep_sinks must be an integer >= 0, got -1",
    lambda ctx: _score_eviction(-1, -1, -1), exc=CacheOpError)
_rt("score_eviction None budget", "score_eviction: budget must be an integer >= 0, got None",
    lambda ctx: _score_eviction(2, 4, None), exc=CacheOpError)


# --- commands: kvsim as a user runs it (exit 2, one line, the earlier outputs untouched) -------


def _cli(id: str, needle: str, *argv: str, files: dict[str, bytes] | None = None,
         patch: Callable[[Any, Path], None] | None = None, absent: tuple[str, ...] = (),
         xfail=None) -> None:
    """A command case: ``argv`` (``{dir}`` is the case's folder, which holds ``files``, the
    config ``base.toml`` and an earlier run's outputs in ``out/``); ``patch(monkeypatch,
    folder)`` sets up a failure the command meets (a full disk) before it runs."""
    case("cli", id, None, KvsimError, needle, xfail=xfail, absent=absent,
         extra={"argv": argv, "files": files or {}, "patch": patch})


_cli("check: a prompt text past the context", "workload.prompt: the prompt text's 600 tokens",
     "check", "{dir}/base.toml", "--set", "model.preset='{dir}/m.gguf'", "--set",
     f"workload.prompt='{_LONG}'", files=_MODEL_FILES["good"])
_cli("generate: a prompt past the context", "--prompt: 600 tokens + --max-new-tokens 4 - 1 = 603 "
     "tokens exceed the 512-token context of model 'm' (max_position_embeddings)",
     "generate", "--model", "{dir}/m.gguf", "--prompt", _LONG, "--max-new-tokens", "4",
     files=_MODEL_FILES["good"])
_cli("eval: a text past the context", "long.txt: 600 tokens exceed the 512-token context of "
     "model 'm' (max_position_embeddings); --max-tokens 512 uses its first 512",
     "eval", "--model", "{dir}/m.gguf", "--text", "{dir}/long.txt",
     files={**_MODEL_FILES["good"], "long.txt": _LONG.encode()})


# kvsim serve with a workload trace (JSONL: arrival_s, prompt_tokens, output_tokens a line)
_SERVE_BASE = ("serve", "--set", "hardware.preset=tiny", "--set", "model.preset=tiny", "--set",
               "compile.core_mode=single", "--set", "serving.max_num_seqs=2", "--set",
               "serving.max_num_batched_tokens=16", "--set", "serving.workload.requests=2")
_SERVE = (*_SERVE_BASE, "--set", "serving.workload.trace='{dir}/t.jsonl'", "--out", "{dir}/out")


def _trace(*lines: str) -> dict[str, bytes]:
    return {"t.jsonl": "".join(f"{x}\n" for x in lines).encode()}


_OK_LINE = '{"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 2}'
_cli("serve: a binary workload trace", "serving.workload.trace: '{dir}/t.jsonl' is not a UTF-8 "
     "text file (byte 0xff at offset 0)", *_SERVE, files={"t.jsonl": b"\xff\xfe\x00\x01"})
_cli("serve: a NaN arrival", "t.jsonl:2: arrival_s must be a finite number >= 0, got NaN",
     *_SERVE, files=_trace(_OK_LINE, '{"arrival_s": NaN, "prompt_tokens": 4, '
                                     '"output_tokens": 2}'), absent=("arrives at nan",))
_cli("serve: an infinite arrival", "t.jsonl:1: arrival_s must be a finite number >= 0, got "
     "Infinity", *_SERVE, files=_trace('{"arrival_s": Infinity, "prompt_tokens": 4, '
                                       '"output_tokens": 2}'))
_cli("serve: a fractional prompt length", "t.jsonl:1: prompt_tokens must be an integer >= 1, "
     "got 16.9", *_SERVE, files=_trace('{"arrival_s": 0, "prompt_tokens": 16.9, '
                                       '"output_tokens": 2}'))
_cli("serve: a prompt length as text", "t.jsonl:1: prompt_tokens must be an integer >= 1, got "
     "'16'", *_SERVE, files=_trace('{"arrival_s": 0, "prompt_tokens": "16", '
                                   '"output_tokens": 2}'))
_cli("serve: a boolean output length", "t.jsonl:1: output_tokens must be an integer >= 1, got "
     "true", *_SERVE, files=_trace('{"arrival_s": 0, "prompt_tokens": 4, '
                                   '"output_tokens": true}'))


# outputs that cannot be written: a folder nothing can be made in (``/proc``: refused before
# any work, whoever runs it, root too), and a disk that fills while the outputs are written
# (after the work: the command says where they could not go, exit 2, the earlier outputs
# and the folders as they were)
_SWEEP = (b"base = \"base.toml\"\n[axes]\n\"kv.format\" = [\"int8\", \"kivi-4\"]\n"
          b"[outputs]\nsave_points = true\n")
_COMPILE = ("compile", "--model", "tiny", "--hw", "tiny", "--core-mode", "single")
_SERVE_OUT = (*_SERVE_BASE, "--set", "serving.workload.prompt_tokens=4", "--set",
              "serving.workload.output_tokens=2")


def _full_disk(monkeypatch, folder: Path) -> None:
    import kvsim.files as tio

    def enospc(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tio, "_write_all", enospc)


for _cmd, _argv in (("run", ("run", "{dir}/base.toml")), ("sweep", ("sweep", "{dir}/sweep.toml")),
                    ("serve", _SERVE_OUT)):
    _cli(f"{_cmd} --out a folder that cannot be made", "--out: cannot make the folder "
         "'/proc/kvsim' in '/proc' (", *_argv, "--out", "/proc/kvsim",
         files={"sweep.toml": _SWEEP})
    _cli(f"{_cmd} onto a full disk", "--out: could not write", *_argv, "--out", "{dir}/out",
         files={"sweep.toml": _SWEEP}, patch=_full_disk)
    _cli(f"{_cmd} onto a full disk, into a new folder", "into '{dir}/new/deeper' (No space left "
         "on device); nothing was written", *_argv, "--out", "{dir}/new/deeper",
         files={"sweep.toml": _SWEEP}, patch=_full_disk)
_cli("compile -o a file that cannot be made", "-o/--output: cannot write in the folder '/proc'",
     *_COMPILE, "-o", "/proc/kvsim.kvm")
_cli("compile onto a full disk", "-o/--output: could not write '{dir}/m.kvm' (No space left on "
     "device)", *_COMPILE, "-o", "{dir}/m.kvm", patch=_full_disk)
# the vendor folder is one set too; kvsim exec's call record is written at the program's exit
_FOLDER = ("vendor", "folder", "--model", "tiny", "--hw", "tiny", "--core-mode", "single",
           "--max-seq", "8", "--cache-length", "64", "--timing-only")
_cli("vendor folder --out a folder that cannot be made", "--out: cannot make the folder "
     "'/proc/kvsim' in '/proc' (", *_FOLDER, "--out", "/proc/kvsim")
_cli("vendor folder onto a full disk", "--out: could not write", *_FOLDER, "--out",
     "{dir}/new/deeper", patch=_full_disk)
_cli("exec --trace-calls in a folder that cannot be written", "--trace-calls: cannot write "
     "in the folder '/proc'", "exec", "--trace-calls", "/proc/calls.json", "--", "true")


# --- fixtures: one compiled tiny model and an earlier run's outputs ------------------------------


def _compile(cap=CAP, **kw):
    return compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(TINY_HW),
                         kv="int8", core_mode="single", max_seq=MAX_SEQ, cap=cap, **kw)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-input")
    cm = _compile()
    other = _compile(cap=96)
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((48, TINY.hidden_size)).astype(np.float32)
    kvm = root / "tiny.kvm"
    cm.save(kvm)
    # an earlier run's complete outputs (what a refused run must leave alone)
    prior = root / "prior"
    cfg = root / "base.toml"
    cfg.write_text(BASE_TOML)
    write_outputs(run(load_run_config(cfg)), prior)
    aries = load_hardware("aries")
    aries_cm = compile_model(TINY, build_bit_config({}), HardwareTarget.from_hw(aries),
                             core_mode="global8", max_seq=MAX_SEQ, cap=CAP, functional=False)
    _, o = _launched(other, emb)
    other_snap = root / "other"
    o.dump_cache_memory_to(other_snap)
    # the same model, bits, format and sizes, other weights (synthetic seed 1)
    _, r = _launched(_compile(weights={"kind": "synthetic", "seed": 1}), emb)
    reseeded_snap = root / "reseeded"
    r.dump_cache_memory_to(reseeded_snap)
    return SimpleNamespace(cm=cm, other=other, emb=emb, kvm=kvm.read_bytes(), prior=prior,
                           aries_cm=aries_cm, other_bufs=o.dump_cache_memory(),
                           other_snap=other_snap, reseeded_snap=reseeded_snap)


def _launched(cm, emb):
    acc = Accelerator(hw=TINY_HW)
    model = Model(cm)
    model.launch(acc)
    for a in range(0, FILLED, MAX_SEQ):
        model.infer(emb[a:a + MAX_SEQ], cache_size=a)
    return acc, model


def _tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path -> bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _device_cache(acc, cm) -> list[bytes]:
    """The KV cache regions as the device DRAM holds them (read directly: no simulated
    cost, works after dispose)."""
    dram = acc.device.mem.dram
    return [dram.read(c.region.base, c.region.size).tobytes() for c in cm.kv_caches()]


# --- the harnesses: build the context, snapshot, call, compare -----------------------------------


def _raises(c: Case, call: Callable[[], Any]) -> KvsimError:
    with pytest.raises(KvsimError) as info:
        call()
    err = info.value
    assert isinstance(err, c.exc), f"{type(err).__name__} is not a {c.exc.__name__}: {err}"
    assert type(err) in DOCUMENTED, f"{type(err).__name__} is not a documented type"
    assert c.needle in str(err), f"{c.needle!r} not in {str(err)!r}"
    for bad in c.absent:
        assert bad not in str(err), f"{bad!r} in {str(err)!r}"
    return err


def _run_config(c: Case, world, tmp_path, capsys) -> None:
    toml = c.extra["toml"] if c.extra["toml"] is not None else BASE_TOML
    config = tmp_path / "config.toml"
    config.write_bytes(toml if isinstance(toml, bytes) else toml.encode())
    for name, data in c.extra["files"].items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    out = tmp_path / "out"
    shutil.copytree(world.prior, out)
    sets = [s.replace("{dir}", str(tmp_path)) for s in c.sets]
    before = _tree(tmp_path)
    _raises(c, lambda: c.act(SimpleNamespace(config=config, sets=sets)))
    assert _tree(tmp_path) == before
    args = ["run", str(config), "--out", str(out), "-q"]
    for s in sets:
        args += ["--set", s]
    capsys.readouterr()
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert c.needle in err and "\n" not in err and "Traceback" not in err
    assert not any(bad in err for bad in c.absent), err
    assert _tree(tmp_path) == before  # the earlier run's outputs are untouched


def _run_compiled(c: Case, world, tmp_path, capsys) -> None:
    if c.extra["mutate"] is not None:
        (tmp_path / "m.kvm").write_bytes(c.extra["mutate"](world.kvm))
    before = _tree(tmp_path)
    ctx = SimpleNamespace(dir=tmp_path)
    _raises(c, lambda: c.act(ctx))
    assert _tree(tmp_path) == before
    _raises(c, lambda: Model(tmp_path / c.extra["path"]))  # the runtime refuses it the same way
    assert _tree(tmp_path) == before


def _run_isa(c: Case, world, tmp_path, capsys) -> None:
    data = c.extra["input"]
    if isinstance(data, bytes):
        buf = bytearray(data)
        _raises(c, lambda: c.act(buf))
        assert bytes(buf) == data
    elif isinstance(data, Program):
        before = (data, encode_program(data))
        _raises(c, lambda: c.act(data))
        assert (data, encode_program(data)) == before
    else:
        _raises(c, lambda: c.act(data))


def _run_device(c: Case, world, tmp_path, capsys) -> None:
    acc, model = _launched(world.cm, world.emb)
    snap = tmp_path / "snap"
    model.dump_cache_memory_to(snap)
    ctx = SimpleNamespace(acc=acc, model=model, cm=world.cm, emb=world.emb, snap=snap,
                          bufs=model.dump_cache_memory(), other_bufs=world.other_bufs,
                          other_snap=world.other_snap, aries_cm=world.aries_cm,
                          reseeded_snap=world.reseeded_snap)
    if c.prepare is not None:
        c.prepare(ctx)
    cache, files, now = _device_cache(acc, world.cm), _tree(tmp_path), acc.device.env.now
    calls = len(acc.calls)
    _raises(c, lambda: c.act(ctx))
    assert _device_cache(acc, world.cm) == cache  # the device cache is as it was
    assert _tree(tmp_path) == files  # and so are the files on disk
    if not c.costs_time:  # refused before any work: no simulated time, no call record
        assert acc.device.env.now == now and len(acc.calls) == calls


def _run_cli(c: Case, world, tmp_path, capsys, monkeypatch) -> None:
    for name, data in c.extra["files"].items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    (tmp_path / "base.toml").write_text(BASE_TOML)
    shutil.copytree(world.prior, tmp_path / "out")
    if c.extra["patch"] is not None:
        c.extra["patch"](monkeypatch, tmp_path)
    before = _tree(tmp_path)
    capsys.readouterr()
    try:
        rc = cli_main([a.replace("{dir}", str(tmp_path)) for a in c.extra["argv"]])
    except SystemExit as e:  # argparse's own usage errors
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "Traceback" not in err and err.startswith("kvsim: error: "), err
    last = err.splitlines()[-1].replace(str(tmp_path), "{dir}")
    assert c.needle in last, f"{c.needle!r} not in {last!r}"
    assert not any(bad in err for bad in c.absent), err
    assert _tree(tmp_path) == before  # no file made, changed or removed


HARNESS = {"config": _run_config, "compiled": _run_compiled, "isa": _run_isa,
           "cache": _run_device, "runtime": _run_device, "cli": _run_cli}


def _param(c: Case):
    marks = ()
    if c.xfail is not None:
        raises, reason = c.xfail
        marks = (pytest.mark.xfail(strict=True, raises=raises, reason=reason),)
    return pytest.param(c, id=f"{c.kind}: {c.id}", marks=marks)


@pytest.mark.parametrize("c", [_param(c) for c in CASES])
def test_bad_input_is_refused_with_a_documented_error_and_changes_nothing(c, world, tmp_path,
                                                                         capsys, monkeypatch):
    if c.kind == "cli":
        _run_cli(c, world, tmp_path, capsys, monkeypatch)
    else:
        HARNESS[c.kind](c, world, tmp_path, capsys)


def test_the_table_covers_every_kind():
    kinds = {k: sum(c.kind == k for c in CASES) for k in HARNESS}
    assert all(n >= 5 for n in kinds.values()), kinds
    assert sum(c.xfail is None for c in CASES) >= 40

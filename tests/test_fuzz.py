"""Fuzzing: no input may crash the ISA decoder and assembler, the run-config loader, the
cache-file reader or the compiled-model reader with anything but their documented errors.

Every property runs with the active Hypothesis profile (tests/conftest.py): briefly in
every test run and in CI (profile ``ci``: 100 examples each), at length with::

    HYPOTHESIS_PROFILE=fuzz python -m pytest tests/test_fuzz.py --hypothesis-show-statistics

(50,000 examples per property, about an hour on two cores; a failure is saved in
``.hypothesis/`` and replayed first on the next run; ``--hypothesis-seed=N`` varies the
search).

Inputs that parse must also mean what they say: decoded bytes re-encode to the same bytes,
assembled text survives a disassemble/assemble round trip.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from isa.asm import assemble, disassemble
from isa.encoding import decode_program, encode_program
from isa.errors import AssembleError, DecodeError
from isa.instructions import BY_MNEMONIC, Program
from kvsim.errors import ConfigError, KvsimError
from models.compiler import CompiledModel, CompileError
from sim.app.config import build_run_config, load_run_config
from sim.runtime.cacheops import CacheOpError, pack_file, unpack_file
from tests.isa.strategies import programs

# Every property: no deadline (the first examples pay for imports and caches); the number
# of examples comes from the profile.
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                      HealthCheck.data_too_large])

# --- the ISA decoder -----------------------------------------------------------------------


@st.composite
def mutated_encodings(draw) -> bytes:
    """A valid encoding, then 1-4 mutations: bit flips, overwrites, inserts, deletes,
    truncation, duplicated slices, a spliced second program, a rewritten count."""
    data = bytearray(encode_program(draw(programs(max_instructions=6))))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "byte", "insert", "delete", "truncate",
                                     "duplicate", "splice", "count"]))
        n = len(data)
        at = draw(st.integers(0, max(0, n - 1)))
        if kind == "flip" and n:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and n:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete" and n:
            del data[at:at + draw(st.integers(1, 8))]
        elif kind == "truncate":
            del data[at:]
        elif kind == "duplicate" and n:
            data[at:at] = data[at:at + draw(st.integers(1, 16))]
        elif kind == "splice":
            other = encode_program(draw(programs(max_instructions=3)))
            data[at:] = other[draw(st.integers(0, len(other))):]
        elif kind == "count" and n >= 10:
            data[6:10] = struct.pack("<I", draw(st.integers(0, 2**32 - 1)))
    return bytes(data)


def _decodes_canonically(data: bytes) -> None:
    try:
        program = decode_program(data)
    except DecodeError:
        return
    # accepted bytes are the one encoding of what they decode to
    assert encode_program(program) == data


@FUZZ
@given(st.binary(max_size=512))
@example(b"KVSI\x01\x00\xff\xff\xff\xff\x00\x00\x00\x00")  # a count of 2**32-1, no body
def test_decoder_random_bytes(data):
    _decodes_canonically(data)


@FUZZ
@given(mutated_encodings())
def test_decoder_mutated_encodings(data):
    _decodes_canonically(data)


# --- the assembler ----------------------------------------------------------------------------

FIELDS = sorted({f for cls in BY_MNEMONIC.values() for f in cls.__dataclass_fields__}
                | {"core", "wait", "signal", "x", ""})
NUMBERS = st.one_of(
    st.integers(-2**70, 2**70).map(str),
    st.integers(0, 2**70).map(hex),
    st.sampled_from(["0x", "-0x1", "+7", "1e3", "1.5", "0b101", "--1", "0xFFFFFFFFFFFFFFFF"]),
    st.from_regex(r"[a-z_]{1,8}", fullmatch=True),  # enum names and junk words
    st.text(max_size=6),
)


@st.composite
def assembly_lines(draw) -> str:
    kind = draw(st.sampled_from(["instr", "instr", "instr", "directive", "comment", "junk"]))
    if kind == "instr":
        mnemonic = draw(st.one_of(st.sampled_from(sorted(BY_MNEMONIC)),
                                  st.from_regex(r"[a-z.]{1,8}", fullmatch=True)))
        parts = [mnemonic]
        for _ in range(draw(st.integers(0, 8))):
            key = draw(st.sampled_from(FIELDS))
            if key in ("wait", "signal"):
                value = ",".join(draw(st.lists(NUMBERS, min_size=0, max_size=4)))
            else:
                value = draw(NUMBERS)
            parts.append(f"{key}={value}" if draw(st.booleans()) or key else value)
        return " ".join(parts).replace("\n", " ")
    if kind == "directive":
        head = draw(st.sampled_from([".name", ".format", ".align", "."]))
        arg = draw(st.one_of(st.text(max_size=12), st.just('"a # b"'), st.just('"x'),
                             st.just('"ok" tail')))
        return f"{head} {arg}".replace("\n", " ")
    if kind == "comment":
        return "# " + draw(st.text(max_size=20)).replace("\n", " ")
    return draw(st.text(max_size=30))


def _assembles_faithfully(text: str) -> None:
    try:
        program = assemble(text)
    except AssembleError:
        return
    assert isinstance(program, Program)
    assert assemble(disassemble(program)) == program


@FUZZ
@given(st.text(max_size=300))
def test_assembler_random_text(text):
    _assembles_faithfully(text)


@FUZZ
@given(st.lists(assembly_lines(), max_size=12).map("\n".join))
def test_assembler_instruction_like_text(text):
    _assembles_faithfully(text)


# --- the run-config loader ----------------------------------------------------------------------


@cache
def _config_paths() -> tuple[str, ...]:
    """Every field path of the resolved default config, and their tables."""
    out: set[str] = set()

    def walk(tree: dict, prefix: str) -> None:
        for k, v in tree.items():
            path = f"{prefix}.{k}" if prefix else k
            out.add(path)
            if isinstance(v, dict):
                walk(v, path)

    walk(load_run_config(None).resolved(), "")
    out |= {"hardware.preset", "model.preset", "bits.preset", "hardware.dram.x", "nosuch",
            "hardware.host_link.shared_dram.latency_ns", "cores.macs_per_cycle.w9a9"}
    return tuple(sorted(out))


TOML_VALUES = st.one_of(
    st.integers(-2**65, 2**65).map(str),
    st.floats(allow_nan=True).map(repr).map(lambda r: {"inf": "inf", "-inf": "-inf",
                                                         "nan": "nan"}.get(r, r)),
    st.sampled_from(["true", "false", "'aries'", "'tiny'", "'qwen2.5-0.5b'", "'W4V8'",
                     "'kivi-4'", "'gemv'", "'functional'", "'off'", "[]", "[1, 'a']", "{}",
                     "{preset='tiny'}", "{w8a8=0}", "1979-05-27", "07:32:00", "'''x'''",
                     "\"\\u00e9\"", "0x10", "1_000", "+inf", "-0.0", "", "=", "[", "{a=",
                     "1\nw = 2", "'a'\n[x]"]),
    st.text(max_size=12),
)


@st.composite
def set_strings(draw) -> str:
    key = draw(st.one_of(st.sampled_from(_config_paths()),
                         st.from_regex(r"[a-z_.]{0,20}", fullmatch=True)))
    if draw(st.integers(0, 9)) == 0:
        return key  # no '='
    return f"{key}={draw(TOML_VALUES)}"


@FUZZ
@given(st.lists(set_strings(), max_size=6))
def test_config_loader_random_sets(sets):
    try:
        cfg = load_run_config(None, sets)
    except ConfigError:
        return
    assert cfg.hardware.dram.effective_bytes_per_s > 0


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
              st.floats(allow_nan=False), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=8,
)


@st.composite
def config_trees(draw) -> dict:
    """A config tree as TOML parses it: the embedded default with random fields set, added
    or removed (values of any TOML-ish type)."""
    tree = json.loads(json.dumps(load_run_config(None).resolved()))
    tree["hardware"] = {"preset": draw(st.sampled_from(["aries", "tiny", "regulus", "x"]))}
    for _ in range(draw(st.integers(1, 5))):
        path = draw(st.sampled_from(_config_paths())).split(".")
        node = tree
        for part in path[:-1]:
            nxt = node.get(part) if isinstance(node, dict) else None
            if not isinstance(nxt, dict):
                nxt = {}
                if isinstance(node, dict):
                    node[part] = nxt
            node = nxt
        if draw(st.integers(0, 4)) == 0:
            node.pop(path[-1], None)
        else:
            node[path[-1]] = draw(JSONISH)
    return tree


@FUZZ
@given(config_trees())
def test_config_loader_random_trees(tree):
    try:
        build_run_config(tree)
    except ConfigError:
        pass


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_config_loader_random_files(scratch, data):
    path = scratch / "c.toml"
    path.write_bytes(data)
    try:
        load_run_config(path)
    except ConfigError:
        pass


# --- cache files and compiled-model files ----------------------------------------------------


@st.composite
def cache_files(draw) -> bytes:
    """Headed cache files with random (object) headers and payloads, often corrupted."""
    payload = draw(st.binary(max_size=64))
    meta = draw(st.dictionaries(st.sampled_from(["size", "name", "model", "layer_hash", "x"]),
                                JSONISH, max_size=4))
    if draw(st.booleans()):
        meta["size"] = len(payload)
    data = bytearray(pack_file(meta, payload))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))]) if draw(st.booleans()) else bytes(data)


@FUZZ
@given(st.one_of(cache_files(), st.binary(max_size=100)))
def test_cache_file_reader(data):
    try:
        meta, payload = unpack_file(data, "cache.bin")
    except CacheOpError:
        return
    assert len(payload) == meta["size"] and zlib.crc32(payload) == struct.unpack(
        "<8sHII", data[:18])[3]


@pytest.fixture(scope="module")
def kvm(tmp_path_factory):
    """The members of a small compiled model's file, and a folder to write variants to."""
    from models.bits import build_bit_config
    from models.compiler import HardwareTarget, compile_model
    from models.source import load_preset
    from sim.device.hw import load_hardware

    cm = compile_model(load_preset("tiny"), build_bit_config({}),
                       HardwareTarget.from_hw(load_hardware("tiny")), core_mode="single",
                       max_seq=8, cap=32, functional=False)
    folder = tmp_path_factory.mktemp("kvm")
    cm.save(folder / "tiny.kvm")
    with zipfile.ZipFile(folder / "tiny.kvm") as z:
        return _Kvm({n: z.read(n) for n in z.namelist()}, folder)


class _Kvm(tuple):
    """(members, folder), with a short repr for Hypothesis' failure reports."""

    def __new__(cls, members, folder):
        return super().__new__(cls, (members, folder))

    def __repr__(self):
        return f"<tiny.kvm members {sorted(self[0])}>"


@FUZZ
@given(data=st.data())
def test_compiled_model_reader_header_fields(kvm, data):
    members, folder = dict(kvm[0]), kvm[1]
    header = json.loads(members["header.json"])
    key = data.draw(st.sampled_from(sorted(header)))
    value = data.draw(JSONISH)
    assume(value != header[key])
    header[key] = value
    members["header.json"] = json.dumps(header).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, blob in members.items():
            z.writestr(name, blob)
    path = folder / "fuzz.kvm"
    path.write_bytes(buf.getvalue())
    try:
        cm = CompiledModel.load(path)
    except CompileError:
        return
    # What loads must work, or refuse with a documented error, when it is used.
    from sim.runtime import Accelerator, Model

    try:
        model = Model(cm)
        model.launch(Accelerator(hw="tiny", functional=False))
        model.infer(np.zeros((1, cm.model.hidden_size), np.float32), cache_size=0)
    except KvsimError:
        pass


def test_documented_errors_are_kvsim_errors():
    for err in (DecodeError, AssembleError, ConfigError, CacheOpError, CompileError):
        assert issubclass(err, KvsimError)

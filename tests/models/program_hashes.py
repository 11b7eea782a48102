"""SHA-256 of the encoded programs the compiler produces, for a fixed set of models, KV
formats, call shapes, batched serving steps and cache-op programs.

A change to the compiler's structure must not change one program: ``test_program_hashes``
recomputes these hashes and compares them with the committed golden file
(``program_hashes.json``). Regenerate it (only for a change that is meant to move
programs) with::

    python -m tests.models.program_hashes --write
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from isa import kvformats
from isa.encoding import encode_program
from isa.instructions import Program
from models.bits import BitConfig
from models.compiler import CompiledModel, HardwareTarget, compile_model
from models.compiler.driver import StepSeq, lower_step
from models.source import load_model
from sim.app.serve.run import compile_for_serving
from sim.device.hw import load_hardware
from sim.runtime.cacheops import rearrange_program, requantize_program

GOLDEN = Path(__file__).with_name("program_hashes.json")

#: (model, hardware, core mode, max_seq, cap, KV formats, functional too, tile bytes).
#: The tiny models' 28 KiB weight tiles leave SRAM for fewer tokens than a call has, so
#: their prefill runs in several token tiles.
FAST_CASES = (
    ("tiny", "tiny", "single", 48, 256, ("int8", "kivi-4", "qserve-kv4"), True, None),
    ("tiny", "tiny", "single", 48, 256, ("int8", "kivi-4"), False, 28672),
    ("tiny-mla", "tiny", "single", 48, 256, ("bf16", "int8"), False, None),
    ("tiny-mla", "tiny", "single", 48, 256, ("bf16",), False, 28672),
)
#: The real-size models (minutes on a busy machine: the slow test and the script only).
SLOW_CASES = (
    ("qwen2.5-0.5b", "aries", "global8", 8, 512, ("int8", "kivi-4", "qserve-kv4"), False,
     None),
    ("llama-3.2-1b", "aries", "global4", 8, 512, ("int8", "kivi-4", "qserve-kv4"), False,
     None),
    ("deepseek-v2-lite", "aries", "global8", 4, 256, ("quantmla-c4r4",), False, None),
)
#: Batched serving steps: (model, hardware, core mode, KV format, slow)
STEP_CASES = (
    ("tiny", "tiny", "single", "int8", False),
    ("tiny", "tiny", "single", "kivi-4", False),
    ("tiny-mla", "tiny", "single", "bf16", False),
    ("qwen2.5-0.5b", "aries", "global8", "int8", True),
)


def digest(prog: Program) -> str:
    return hashlib.sha256(encode_program(prog)).hexdigest()


@cache
def _compiled(model: str, hw: str, core_mode: str, max_seq: int, cap: int, kv: str,
              functional: bool, slots: int = 1,
              tile_bytes: int | None = None) -> CompiledModel:
    return compile_model(load_model(model), BitConfig(),
                         HardwareTarget.from_hw(load_hardware(hw)), kv=kv,
                         core_mode=core_mode, max_seq=max_seq, cap=cap, slots=slots,
                         functional=functional, tile_bytes=tile_bytes)


def _calls(cm: CompiledModel) -> Iterator[tuple[str, Program]]:
    """The stored prefill and decode programs (lowered again too), a mid-cache decode and
    a prefill of several token tiles at an offset."""
    for name, prog in sorted(cm.programs.items()):
        yield f"stored.{name}", prog
    yield "prefill", cm.program(tokens=cm.max_seq, cache_size=0)
    yield "decode", cm.program(tokens=1, cache_size=min(cm.max_seq, cm.cap - 1))
    mid = cm.cap // 2 + 3
    yield f"decode@{mid}", cm.program(tokens=1, cache_size=mid)
    n = min(cm.max_seq, 2 * cm.m_tile + 3)
    yield f"prefill{n}@5", cm.program(tokens=n, cache_size=5)
    if cm.slots > 1:
        yield "decode.slot1", cm.program(tokens=1, cache_size=7, slot=1)


def _steps(model: str, hw: str, core_mode: str, kv: str) -> Iterator[tuple[str, Program]]:
    """Batched serving steps built as sim/serving/costs.py builds them."""
    cm = compile_for_serving(load_model(model), BitConfig(), load_hardware(hw), kv=kv,
                             core_mode=core_mode, cap=256, max_tokens=64, max_seqs=8)
    lw = cm.lowering()
    few = (0, 1) if cm.model.num_layers > 2 else None
    mixes = {
        "decode4": [StepSeq(0, 1, 30 + 7 * i, True, i + 1) for i in range(4)],
        "decode3.keyed": [StepSeq(0, 1, 99, False, i + 1, (i + 1) << 32) for i in range(3)],
        "prefill.chunk": [StepSeq(0, 20, 10, False, 1, 1 << 32)],
        "mix": [StepSeq(0, 1, 50, True, 1), StepSeq(0, 1, 70, True, 2),
                StepSeq(0, 13, 0, True, 3)],
        "mix.nologits": [StepSeq(0, 9, 40, False, 1), StepSeq(0, 1, 12, False, 2)],
        "io": [StepSeq(0, 33, 0, False)],
        "head": [StepSeq(0, 1, 0, True, i + 1) for i in range(5)],
    }
    for name, seqs in mixes.items():
        yield f"step.{name}", lower_step(lw, seqs)
        if few is not None:
            yield f"step.{name}.layers01", lower_step(lw, seqs, layers=few)
    yield "step.io.nolayers", lower_step(lw, mixes["io"], layers=())
    yield "step.head.nolayers", lower_step(lw, mixes["head"], layers=())


def _cacheops(cm: CompiledModel) -> Iterator[tuple[str, Program]]:
    yield "rearrange", rearrange_program(cm, slot=0, keep=[3, 4, 5, 9, 20, 21], dst=2)
    yield "rearrange.empty", rearrange_program(cm, slot=0, keep=[], dst=4)
    yield "requantize", requantize_program(cm, slot=0, tokens=24,
                                           via=kvformats.pair("kivi-2").k)


def programs(*, slow: bool, first_format_only: bool = False, model: str | None = None,
             steps: bool | None = None) -> Iterator[tuple[str, Program]]:
    """Every (case name, program) of the fast set, or of the slow set; with
    ``first_format_only``, each case's first KV format only (the slow set's part that the
    test suite checks: one compile per real-size model; the script checks them all).
    ``model`` keeps that model's cases only; ``steps`` keeps the batched serving steps
    only (True) or everything but them (False): the parts the test suite checks as
    separate tests, so that the workers share them."""
    for case_model, hw, mode, max_seq, cap, kvs, functional, tile in (
            SLOW_CASES if slow else FAST_CASES):
        if steps or model not in (None, case_model):
            continue
        for kv in kvs[:1] if first_format_only else kvs:
            for fn in (False, True) if functional else (False,):
                cm = _compiled(case_model, hw, mode, max_seq, cap, kv, fn, 1, tile)
                tag = (f"{case_model}.{kv}.{'functional' if fn else 'timing'}"
                       + (f".tile{tile}" if tile else ""))
                for name, prog in _calls(cm):
                    yield f"{tag}.{name}", prog
                if hw == "tiny":
                    for name, prog in _cacheops(cm):
                        yield f"{tag}.{name}", prog
    if not slow and not steps and model in (None, "tiny"):
        two = _compiled("tiny", "tiny", "single", 16, 64, "int8", False, 2)
        for name, prog in _calls(two):
            yield f"tiny.int8.slots2.{name}", prog
        for name, prog in _cacheops(two):
            yield f"tiny.int8.slots2.{name}", prog
    for case_model, hw, mode, kv, is_slow in STEP_CASES:
        if is_slow == slow and steps is not False and model in (None, case_model):
            for name, prog in _steps(case_model, hw, mode, kv):
                yield f"{case_model}.{kv}.{name}", prog


def slow_parts() -> list[tuple[str, bool]]:
    """``(model, steps)`` of the slow set's parts: each real-size model's calls, and each
    real-size model's batched serving steps (a compile of their own)."""
    return ([(case[0], False) for case in SLOW_CASES]
            + [(case[0], True) for case in STEP_CASES if case[4]])


def compute(*, slow: bool, first_format_only: bool = False, model: str | None = None,
            steps: bool | None = None) -> dict[str, str]:
    """``{case: sha256 of the encoded program}`` of the fast or the slow set (or of its
    part: :func:`programs`)."""
    out: dict[str, str] = {}
    for name, prog in programs(slow=slow, first_format_only=first_format_only, model=model,
                               steps=steps):
        if name in out:
            raise AssertionError(f"case {name!r} twice")
        out[name] = digest(prog)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"rewrite {GOLDEN.name}")
    ap.add_argument("--fast", action="store_true", help="the fast set only")
    args = ap.parse_args(argv)
    sets = ("fast",) if args.fast else ("fast", "slow")
    got = {s: compute(slow=s == "slow") for s in sets}
    if args.write:
        old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        GOLDEN.write_text(json.dumps(old | got, indent=1, sort_keys=True) + "\n")
        print(f"wrote {sum(map(len, got.values()))} hashes to {GOLDEN}")
        return 0
    stored = json.loads(GOLDEN.read_text())
    want = {f"{s}:{k}": v for s in sets for k, v in stored[s].items()}
    got = {f"{s}:{k}": v for s in sets for k, v in got[s].items()}
    bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
    for k in bad:
        print(f"differs: {k}")
    print(f"{len(got)} programs, {len(bad)} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

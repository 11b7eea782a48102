"""Bad command-line arguments of every kvsim command: exit 2 with an error naming the
argument, before any work, and no file written (argparse type errors print the usage line
first, as argparse does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.app.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--set", "hardware.preset=tiny", "--set", "model.preset=tiny",
        "--set", "compile.core_mode=single"]
SERVE_TINY = [*TINY, "--set", "serving.max_num_seqs=2", "--set",
              "serving.max_num_batched_tokens=16", "--set", "serving.workload.requests=2",
              "--set", "serving.workload.prompt_tokens=4",
              "--set", "serving.workload.output_tokens=2"]
COMPILE = ["compile", "--model", "tiny", "--hw", "tiny", "--core-mode", "single"]

# (id, argv with {f} for an existing file and {d} for a folder, what the error says)
CASES = [
    ("kv context 0", ["kv", "--model", "tiny", "--format", "int8", "--context", "0"],
     "argument --context: must be >= 1, got 0"),
    ("kv context text", ["kv", "--model", "tiny", "--format", "int8", "--context", "x"],
     "argument --context: not an integer: 'x'"),
    ("compile no slots", [*COMPILE, "--cache-slots", "0", "-o", "{d}/m.kvm"],
     "argument --cache-slots: must be >= 1, got 0"),
    ("compile onto a folder", [*COMPILE, "-o", "{d}"], "is a folder, not a file"),
    ("compile into a missing folder", [*COMPILE, "-o", "{d}/no/m.kvm"], "does not exist"),
    ("compile a million slots", [*COMPILE, "--hw", "aries", "--cache-slots", "1000000", "-o",
                                 "{d}/m.kvm"],
     "model 'tiny' needs 488 GiB of DRAM (weights 227 KiB, KV cache 488 GiB); aries has 16 GiB"),
    ("run --out a file", ["run", *TINY, "--out", "{f}"], "--out: '{f}' is a file, not a folder"),
    ("run --out under a file", ["run", *TINY, "--out", "{f}/x"],
     "--out: '{f}' is a file, not a folder"),
    ("sweep --out a file", ["sweep", str(ROOT / "configs" / "kv-bits-sweep.toml"), "--out",
                            "{f}"], "--out: '{f}' is a file, not a folder"),
    ("serve --out a file", ["serve", *SERVE_TINY, "--out", "{f}"],
     "--out: '{f}' is a file, not a folder"),
    ("run a folder", ["run", "{d}"], "config file '{d}' is a folder"),
    ("serve a folder", ["serve", "{d}"], "config file '{d}' is a folder"),
    ("serve a binary file", ["serve", "{b}"], "not a UTF-8 text file"),
    ("serve arrivals past the clock", ["serve", *SERVE_TINY, "--set",
                                       "serving.workload.arrival='poisson'", "--set",
                                       "serving.workload.rate_per_s=1e-300"],
     "serving.workload.rate_per_s: the last request arrives at"),
    ("needle contexts text", ["needle", "--contexts", "1k", "--out", "{d}/n"],
     "--contexts: '1k' is not a comma-separated list of integers"),
    ("needle depth past 100", ["needle", "--depths", "0,150", "--out", "{d}/n"],
     "--depths: '0,150' must list percentages in 0..100"),
    ("needle no trials", ["needle", "--trials", "0", "--out", "{d}/n"],
     "--trials: must be >= 1, got 0"),
]


@pytest.mark.parametrize("argv, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_exits_2_naming_it(tmp_path, capsys, argv, needle):
    f = tmp_path / "a-file.txt"
    f.write_text("not a folder\n")
    b = tmp_path / "binary.toml"
    b.write_bytes(b"\xff\xfe\x00")
    d = tmp_path / "folder"
    d.mkdir()
    subst = {"{f}": str(f), "{d}": str(d), "{b}": str(b)}

    def fill(s: str) -> str:
        for k, v in subst.items():
            s = s.replace(k, v)
        return s

    before = sorted(p.name for p in tmp_path.rglob("*"))
    try:
        rc = main([fill(a) for a in argv])
    except SystemExit as e:  # argparse's own usage errors
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert fill(needle) in err.splitlines()[-1], err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_serving_with_one_sequence_at_a_time(tmp_path, capsys):
    """max_num_seqs = 1 once divided by zero building the step-cost grid."""
    assert main(["serve", *SERVE_TINY, "--set", "serving.max_num_seqs=1", "-q",
                 "--out", str(tmp_path / "o")]) == 0
    metrics = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert metrics["serving"]["finished_requests"] == 2
    assert metrics["serving"]["mean_decode_batch"] <= 1

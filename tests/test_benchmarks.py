"""The benchmarks still run (tiny sizes; their figures are not asserted: wall time and
memory belong to the machine, not to kvsim). Each prints its human-readable summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

CASES = {
    "long_run_memory": ["--steps", "16", "--requests", "8", "--max-trace-events", "500"],
    "sim_speed": ["--k", "256", "--n", "256", "--tile-bytes", "4096"],
    "kv_accuracy": ["--tokens", "64"],
    "model_speed": ["--model", "tiny", "--hw", "aries", "--prompt", "4", "--tokens", "2"],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_benchmark_runs_and_prints_its_summary(name):
    out = subprocess.run([sys.executable, str(BENCH / f"{name}.py"), *CASES[name]],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip(), "no figures printed"
    assert "Traceback" not in out.stderr and "error" not in out.stdout.lower()

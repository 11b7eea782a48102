"""Outputs are written atomically (kvsim/files.py): a run killed at any moment leaves, in its
output folder, only complete files (each the earlier run's, or this run's) and no
temporary file that the next write would not remove. Long runs keep the trace bounded.

The killed runs are real ``kvsim run`` processes over an output folder that holds a
complete earlier run. Two kinds of kill: at a moment chosen by the clock (black box), and
in the middle of writing ``report.html`` (the child stalls its writer half-way and says so,
so the signal lands there every time).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvsim.files as tio
from sim.app.config import load_run_config
from sim.app.run import run, write_outputs

FILES = ("metrics.json", "report.html", "trace.json")
OLD = ["hardware.preset=tiny", "model.preset=tiny", "compile.core_mode=single",
       "workload.prompt_tokens=8", "workload.output_tokens=2", "outputs.trace=ops"]
NEW_TOML = """\
[hardware]
preset = "tiny"

[model]
preset = "tiny"

[compile]
core_mode = "single"

[workload]
prompt_tokens = 32
output_tokens = 32

[outputs]
trace = "tiles"
"""
#: The child of the white-box kills: writes half of its first file, says so, and waits.
STALLING_CHILD = """\
import os, sys, time
import kvsim.files as tio
mode, marker, cfg, out = sys.argv[1:5]
if mode == "named":  # as where the platform has no O_TMPFILE
    tio._write_anonymous = lambda folder, tmp, data: False
write_all = tio._write_all
def stalled(fd, data):
    write_all(fd, data[: len(data) // 2])
    os.fsync(fd)
    open(marker, "w").close()
    time.sleep(120)
tio._write_all = stalled
from sim.app.cli.main import main
sys.exit(main(["run", cfg, "--out", out, "-q"]))
"""


def _kvsim() -> list[str]:
    script = Path(sys.executable).with_name("kvsim")
    return [str(script)] if script.exists() else [sys.executable, "-m", "sim.app.cli.main"]


def _read(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.fixture(autouse=True)
def _python_sigint_handler():
    """Each test starts as the command line does, with Python's own SIGINT handler (which
    raises KeyboardInterrupt): another test in the same worker process (a server, a dask
    cluster) may have left a different one behind."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """An earlier run's complete outputs (``old``), the new config, and the complete
    outputs of the new config written by an uninterrupted ``kvsim run`` (``new``), with
    the time that child took to start writing."""
    root = tmp_path_factory.mktemp("kill")
    old = root / "old"
    write_outputs(run(load_run_config(None, OLD)), old)
    cfg = root / "new.toml"
    cfg.write_text(NEW_TOML)
    ref = root / "ref"
    t0 = time.monotonic()
    proc = subprocess.Popen([*_kvsim(), "run", str(cfg), "--out", str(ref), "-q"])
    while proc.poll() is None and not (ref / "report.html").exists():
        time.sleep(0.002)
    t_write = time.monotonic() - t0
    assert proc.wait(timeout=120) == 0
    old_files, new_files = _read(old), _read(ref)
    assert sorted(old_files) == sorted(new_files) == sorted(FILES)
    assert all(old_files[n] != new_files[n] for n in FILES)
    quick = root / "quick.toml"  # for the children killed as they write: soon there
    quick.write_text(NEW_TOML.replace("= 32", "= 4"))
    return {"old": old, "old_files": old_files, "new_files": new_files, "cfg": cfg,
            "quick": quick, "t_write": t_write}


def _folder(tmp_path: Path, outputs) -> Path:
    out = tmp_path / "out"
    shutil.copytree(outputs["old"], out)
    return out


def _check_complete(out: Path, outputs) -> dict[str, str]:
    """Every output file is byte for byte the old one or the new one; returns which."""
    which = {}
    for name in FILES:
        data = (out / name).read_bytes()
        if data == outputs["old_files"][name]:
            which[name] = "old"
        elif data == outputs["new_files"][name]:
            which[name] = "new"
        else:
            pytest.fail(f"{name}: neither the old file nor the complete new one "
                        f"({len(data)} bytes)")
    return which


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name not in FILES)


def _check_no_temps(out: Path, outputs) -> list[str]:
    """No stray files; a temporary of the named fallback (kill while writing it) is
    recognisable, and the next write into the folder removes it."""
    left = _leftovers(out)
    assert all(tio.TEMP_PATTERN.match(n) for n in left), left
    tio.atomic_write_bytes(out / "metrics.json", outputs["new_files"]["metrics.json"])
    assert _leftovers(out) == []
    return left


def _kill(proc: subprocess.Popen, sig: int) -> None:
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == -sig


# --- black box: a kill at a moment chosen by the clock -----------------------------------


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_run_killed_mid_simulation_leaves_complete_files(tmp_path, outputs, sig):
    out = _folder(tmp_path, outputs)
    proc = subprocess.Popen([*_kvsim(), "run", str(outputs["cfg"]), "--out", str(out), "-q"])
    time.sleep(0.6 * outputs["t_write"])  # most likely simulating (or compiling) by now
    _kill(proc, sig)
    _check_complete(out, outputs)
    _check_no_temps(out, outputs)


def test_a_run_killed_as_it_writes_leaves_only_complete_files(tmp_path, outputs):
    out = _folder(tmp_path, outputs)
    ino = (out / "report.html").stat().st_ino
    proc = subprocess.Popen([*_kvsim(), "run", str(outputs["cfg"]), "--out", str(out), "-q"])
    while proc.poll() is None and (out / "report.html").stat().st_ino == ino:
        time.sleep(0.0005)
    proc.send_signal(signal.SIGKILL)  # the new report is in: the trace is being written
    proc.wait(timeout=30)
    which = _check_complete(out, outputs)
    assert which["report.html"] == "new"
    _check_no_temps(out, outputs)


# --- white box: a kill while a file is half written --------------------------------------


@pytest.mark.parametrize("mode", ["anonymous", "named"])
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_run_killed_half_way_through_a_file_leaves_the_old_files(tmp_path, outputs, sig,
                                                                    mode):
    if mode == "anonymous" and not tio._write_anonymous(tmp_path, tmp_path / "probe", b"x"):
        pytest.skip("no nameless temporary files (O_TMPFILE + linkat) on this file system")
    out = _folder(tmp_path, outputs)
    marker = tmp_path / "half-written"
    proc = subprocess.Popen([sys.executable, "-c", STALLING_CHILD, mode, str(marker),
                             str(outputs["quick"]), str(out)])
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, "the child ended before it began to write"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    _kill(proc, sig)
    assert set(_check_complete(out, outputs).values()) == {"old"}
    left = _check_no_temps(out, outputs)
    if mode == "anonymous":
        assert left == []  # the half-written bytes had no name: the kernel freed them
    else:
        (name,) = left  # the half-written report, under a temporary name, until the next write
        m = tio.TEMP_PATTERN.match(name)
        assert m["name"] == "report.html" and int(m["pid"]) == proc.pid


# --- Ctrl-C: the output set is replaced as a whole, or not at all ---------------------------


def test_ctrl_c_while_the_outputs_are_written_leaves_the_old_set(tmp_path, outputs,
                                                                  monkeypatch, capsys):
    from sim.app.cli.main import main

    out = _folder(tmp_path, outputs)
    write_all, calls = tio._write_all, []

    def interrupted(fd, data):
        calls.append(len(data))
        if len(calls) == 2:  # Ctrl-C while the second file of the set is written
            raise KeyboardInterrupt
        write_all(fd, data)

    monkeypatch.setattr(tio, "_write_all", interrupted)
    assert main(["run", str(outputs["quick"]), "--out", str(out), "-q"]) == 130
    assert _read(out) == outputs["old_files"]  # not a new report beside the old metrics
    assert _leftovers(out) == []


def test_ctrl_c_as_the_set_is_put_in_place_waits_until_it_is_whole(tmp_path, outputs,
                                                                    monkeypatch, capsys):
    from sim.app.cli.main import main

    ref = tmp_path / "ref"
    assert main(["run", str(outputs["quick"]), "--out", str(ref), "-q"]) == 0
    out = _folder(tmp_path, outputs)
    put, sent = tio._put_in_place, []

    def put_then_interrupt(src, dst):
        put(src, dst)
        if not sent:  # Ctrl-C right after the first file of the set is in place
            sent.append(dst)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(tio, "_put_in_place", put_then_interrupt)
    assert main(["run", str(outputs["quick"]), "--out", str(out), "-q"]) == 130
    assert sent and _read(out) == _read(ref)  # the whole new set, then the interrupt
    assert _leftovers(out) == []


def test_a_set_without_a_trace_removes_the_earlier_trace(tmp_path, outputs, capsys):
    from sim.app.cli.main import main

    out = _folder(tmp_path, outputs)
    assert main(["run", str(outputs["quick"]), "--out", str(out), "-q", "--set",
                 "outputs.trace=off"]) == 0
    assert sorted(_read(out)) == ["metrics.json", "report.html"]  # no old trace beside it


# --- the writer itself ---------------------------------------------------------------------


@pytest.mark.parametrize("anonymous", [True, False])
def test_a_failed_write_keeps_the_old_file_and_leaves_nothing(tmp_path, monkeypatch, anonymous):
    if not anonymous:
        monkeypatch.setattr(tio, "_write_anonymous", lambda folder, tmp, data: False)
    path = tmp_path / "metrics.json"
    tio.atomic_write_bytes(path, b"old")
    assert oct(path.stat().st_mode & 0o777) == oct(0o666 & ~_umask())

    def broken(fd, data):
        os.write(fd, data[:2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tio, "_write_all", broken)
    with pytest.raises(OSError, match="No space left"):
        tio.atomic_write_bytes(path, b"new contents")
    assert path.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["metrics.json"]


def test_only_stale_temporaries_of_this_host_are_removed(tmp_path):
    host = tio._host()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    names = {
        f".a.json.kvsim-{host}-{dead}-0a.tmp": False,  # its writer has exited: stale
        f".a.json.kvsim-{host}-{os.getpid()}-0b.tmp": True,  # being written by us
        f".a.json.kvsim-otherhost-{dead}-0c.tmp": True,  # another host's (shared folder)
        ".a.json.x1y2.tmp": True,  # not ours
        "a.json": True,
    }
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    removed = tio.clean_stale_temps(tmp_path)
    assert [p.name for p in removed] == [n for n, keep in names.items() if not keep]
    assert sorted(os.listdir(tmp_path)) == sorted(n for n, keep in names.items() if keep)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- long runs keep the trace bounded ------------------------------------------------------


def test_the_trace_of_a_long_run_is_bounded_by_max_trace_events(tmp_path):
    cfg = load_run_config(None, [*OLD[:-1], "outputs.trace=tiles", "workload.output_tokens=16",
                                 "outputs.max_trace_events=300"])
    result = run(cfg)
    rec = result.recorder
    assert len(rec.spans) + len(rec.bytes) == 300
    assert rec.dropped > 0 and result.metrics.trace.dropped_events == rec.dropped
    paths = write_outputs(result, tmp_path)
    assert paths["trace"].stat().st_size < 200_000

"""Atomic output files: a reader (or a run killed in the middle) sees either the complete
old file or the complete new one, never part of one, and no temporary files pile up.

How :func:`atomic_write_bytes` writes ``DIR/NAME``:

1. The bytes go into a file with no name in ``DIR`` (Linux ``open(DIR, O_TMPFILE)``). A
   process killed while writing (SIGKILL, SIGTERM without a handler, a crash) leaves
   nothing behind: the kernel frees a file without a name when its last descriptor closes.
2. When the bytes are complete and flushed to disk (``fsync``), the file gets a temporary
   name, ``DIR/.NAME.kvsim-HOST-PID-RANDOM.tmp`` (``linkat``, see :func:`_link_fd`), and
   is renamed over ``NAME`` (``os.replace``: atomic on POSIX). The folder is flushed too,
   so the rename survives a power loss. Only a kill in the microseconds between the link
   and the rename can leave the temporary name behind.
3. Where there is no ``O_TMPFILE`` (macOS, Windows, some network and overlay file
   systems, no ``/proc``), the bytes go straight into the named temporary file; a kill
   while writing leaves it.

Temporary names are recognisable (:data:`TEMP_PATTERN`: hidden, ``.kvsim-``, the writer's
host and process id, ``.tmp``), and every write first removes the stale ones in its folder
(:func:`clean_stale_temps`: written on this host by a process that is no longer running).
So after a killed run, the next run into the same folder leaves no temporary behind; a
reader never opens one, since it looks for ``NAME`` only.

A command's outputs are a set (``metrics.json`` with the ``trace.json`` and ``report.html``
of the same run): :func:`write_output_set` writes every file of the set completely
(nameless or temporary files, as above) before it puts any in place, then puts them all in
place with Ctrl-C (SIGINT) and SIGTERM held until the last is in, so an interrupted command
leaves the earlier set whole, or the new set whole, never new files beside old ones. A
write that fails (a full disk) leaves the earlier set and the folders as they were and is
one :class:`kvsim.errors.OutputError` naming the file and the folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

#: Names of this module's temporary files: ``.NAME.kvsim-HOST-PID-RANDOM.tmp``.
TEMP_PATTERN = re.compile(
    r"^\.(?P<name>.+)\.kvsim-(?P<host>[A-Za-z0-9]*)-(?P<pid>\d+)-[0-9a-f]+\.tmp$"
)
#: linkat(2) constants (Linux uapi fcntl.h).
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
#: Without a way to ask whether a process runs (Windows), a temporary this old is stale.
STALE_AGE_S = 24 * 3600


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32]


def temp_path(path: Path) -> Path:
    """A fresh temporary name for ``path``, in its folder (see :data:`TEMP_PATTERN`)."""
    return path.with_name(f".{path.name}.kvsim-{_host()}-{os.getpid()}-"
                          f"{secrets.token_hex(6)}.tmp")


def _pid_running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # e.g. PermissionError: it exists, under another user
        return True
    return True


def clean_stale_temps(folder: str | os.PathLike) -> list[Path]:
    """Remove this module's temporary files in ``folder`` that no running process will
    finish (written on this host by a process that has exited); return what was removed.
    Files of other hosts (a shared network folder) are left alone."""
    removed = []
    host = _host()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = TEMP_PATTERN.match(entry.name)
        if m is None or m["host"] != host:
            continue
        if os.name == "nt":  # os.kill(pid, 0) would terminate the process on Windows
            try:
                stale = time.time() - entry.stat().st_mtime > STALE_AGE_S
            except OSError:
                continue
        else:
            stale = not _pid_running(int(m["pid"]))
        if stale:
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):  # a probe folder (check_out_folder)
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
                removed.append(Path(entry.path))
    return removed


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_anonymous(folder: Path, tmp: Path, data: bytes) -> bool:
    """Write ``data`` into a nameless file in ``folder``, flush it and link it at ``tmp``;
    False where the platform or file system cannot (nothing is left behind then)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return False
    try:
        fd = os.open(folder, flag | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError:
        return False
    try:
        _write_all(fd, data)
        os.fsync(fd)
        return _link_fd(fd, tmp)
    finally:
        os.close(fd)


def _link_fd(fd: int, tmp: Path) -> bool:
    """Give the nameless file open at ``fd`` the name ``tmp``: ``linkat`` through
    ``/proc/self/fd`` (the documented way), else ``linkat(fd, "", AT_EMPTY_PATH)`` (allowed
    to root, and to a file's creator since Linux 6.10; some sandboxes allow only this)."""
    try:
        os.link(f"/proc/self/fd/{fd}", tmp)
        return True
    except OSError:
        pass
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        linkat = libc.linkat
    except (OSError, AttributeError):
        return False
    linkat.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_int)
    return linkat(fd, b"", _AT_FDCWD, os.fsencode(tmp), _AT_EMPTY_PATH) == 0


def _write_named(tmp: Path, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(tmp, flags | getattr(os, "O_BINARY", 0), 0o666)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # Windows cannot open a folder; its rename is flushed by the file system
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically (see the module docstring); the file gets
    the usual mode (``0o666`` less the umask)."""
    path = Path(path)
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(folder)
    tmp = temp_path(path)
    try:
        if not _write_anonymous(folder, tmp, data):
            _write_named(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(folder)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 1,
                      sort_keys: bool = False) -> None:
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys) + "\n")


def _why(err: OSError) -> str:
    return err.strerror or str(err)


def probe_writable(folder: Path, *, make: bool) -> None:
    """Make (and remove) a file in ``folder``, or with ``make`` a folder in it: the real
    test of writing there (``os.access`` answers yes to root on a read-only file system,
    and ``/proc``)."""
    probe = temp_path(folder / "write-check")
    if make:
        os.mkdir(probe)
        os.rmdir(probe)
    else:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)


def check_out_folder(path: str | os.PathLike, flag: str) -> None:
    """Refuse, before any work, an output folder that cannot be one: an existing file, a
    path under a file, a folder in which nothing can be written, or one that cannot be
    made (tested for real, by making and removing a file or a folder there).
    :class:`kvsim.errors.ConfigError` naming ``flag``."""
    from kvsim.errors import ConfigError

    p = Path(path)
    for q in (p, *p.parents):
        if q.exists() and not q.is_dir():
            raise ConfigError(f"{flag}: {str(q)!r} is a file, not a folder")
        if q.is_dir():
            try:
                probe_writable(q, make=q != p)
            except OSError as err:
                what = (f"cannot write in the folder {str(q)!r}" if q == p else
                        f"cannot make the folder {str(p)!r} in {str(q)!r}")
                raise ConfigError(f"{flag}: {what} ({_why(err)})") from None
            return


def check_out_file(path: str | os.PathLike, flag: str) -> None:
    """Refuse, before any work, an output file path that cannot be written: empty, an
    existing folder, or in a folder that does not exist or in which nothing can be written
    (tested for real)."""
    from kvsim.errors import ConfigError

    if not str(path):
        raise ConfigError(f"{flag}: an empty path")
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{flag}: {str(p)!r} is a folder, not a file")
    parent = p.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag}: the folder {str(parent)!r} does not exist")
    try:
        probe_writable(parent, make=False)
    except OSError as err:
        raise ConfigError(f"{flag}: cannot write in the folder {str(parent)!r} "
                          f"({_why(err)})") from None


# --- a command's output set, whole or not at all ----------------------------------------


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) and SIGTERM for the block, and deliver them after it: a few
    renames must not be split. Outside the main thread (no signal handlers there), a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    before: dict[int, Any] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) in (signal.SIG_IGN, None):
            continue
        before[sig] = signal.signal(sig, lambda signum, frame: got.append(signum))
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)
        for sig in dict.fromkeys(got):
            old = before[sig]
            if callable(old):
                old(sig, None)  # Python's own SIGINT handler raises KeyboardInterrupt
            else:
                os.kill(os.getpid(), sig)  # the default action, now that it is allowed


def _put_in_place(src: Path, dst: Path) -> None:
    """Rename ``src`` over ``dst`` (atomic on POSIX); its own function so that a test can
    interrupt between two files of a set."""
    os.replace(src, dst)


def _make_folders(folder: Path) -> list[Path]:
    """Make ``folder`` and its missing parents; return those made, deepest first."""
    made = []
    for q in (folder, *folder.parents):
        if q.is_dir():
            break
        made.append(q)
    folder.mkdir(parents=True, exist_ok=True)
    return made


class _Prepared:
    """One file of a set, complete on disk under a temporary name, not yet in place
    (written as :func:`atomic_write_bytes` writes: nameless until complete where the file
    system allows)."""

    def __init__(self, path: Path, data: bytes):
        self.path = path
        self.tmp: Path | None = temp_path(path)
        try:
            if not _write_anonymous(path.parent, self.tmp, data):
                _write_named(self.tmp, data)
        except BaseException:
            self.discard()
            raise

    def commit(self) -> None:
        assert self.tmp is not None
        _put_in_place(self.tmp, self.path)
        self.tmp = None

    def discard(self) -> None:
        if self.tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
            self.tmp = None


def write_output_set(folder: str | os.PathLike, files: dict[str, str | bytes], *,
                     flag: str = "--out", members: Iterable[str] = ()) -> dict[str, Path]:
    """Write a command's output set ``files`` (name -> text or bytes) into ``folder``, in
    their order, as a whole (see the module docstring); ``members``: every name the set
    may hold, so a file of an earlier set that this one lacks (a ``trace.json`` when the
    trace is off) goes too. Returns the paths by name.

    A failure to make the folder or write a file is a :class:`kvsim.errors.OutputError`
    naming ``flag``, the file and the folder; the earlier set is left whole and the
    folders this call made are removed."""
    from kvsim.errors import OutputError

    out = Path(folder)
    data = {n: d.encode("utf-8") if isinstance(d, str) else d for n, d in files.items()}
    try:
        made = _make_folders(out)
    except OSError as err:
        raise OutputError(f"{flag}: cannot make the folder {str(out)!r} ({_why(err)}); "
                          f"nothing was written") from None
    clean_stale_temps(out)
    prepared: list[_Prepared] = []
    name, placed = "", 0
    try:
        for name, blob in data.items():  # every file complete before any is in place
            prepared.append(_Prepared(out / name, blob))
        with _signals_held():
            for p in prepared:
                name = p.path.name
                p.commit()
                placed += 1
            for old in members:
                if old not in data:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(out / old)
    except BaseException as err:
        for p in prepared[placed:]:
            p.discard()
        if not placed:
            for q in made:  # empty: nothing was put in them
                with contextlib.suppress(OSError):
                    q.rmdir()
        if isinstance(err, OSError):
            where = f"{flag}: could not write {name} into {str(out)!r} ({_why(err)})"
            if placed:  # a rename failed half way: rare, and said
                raise OutputError(f"{where}; only {placed} of the {len(data)} files of "
                                  f"the set were put in place") from None
            raise OutputError(f"{where}; nothing was written, an earlier run's outputs "
                              f"there are as they were") from None
        raise
    _fsync_folder(out)
    return {n: out / n for n in data}

"""Open a report in headless Chromium: check that every figure rendered and that the page
logged nothing to the console (no JavaScript error), or take a screenshot.

Drives the system's Chromium binary directly (Debian: ``apt-get install chromium``); no
browser is downloaded. ::

    python -m traces.browser check kvsim-out/report.html
    python -m traces.browser screenshot kvsim-out/report.html report.png
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: Binaries tried in order (Debian's package installs /usr/bin/chromium).
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Flags for a quiet, offline, sandbox-free headless run (CI runs as root in a container).
HEADLESS_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
    "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-extensions",
    "--hide-scrollbars", "--mute-audio",
)
#: Console lines in Chromium's stderr log (``--enable-logging=stderr``).
CONSOLE_LINE = re.compile(r":CONSOLE(?:\(\d+\)|:\d+)\]\s*(.*)$")
#: Simulated time the page may take to load and draw (virtual time: fast when idle).
VIRTUAL_TIME_MS = 30_000


@dataclass(frozen=True)
class Rendered:
    """What Chromium made of a page: the DOM after scripts ran, and the console lines."""

    dom: str
    console: list[str]

    def figures(self) -> dict[str, bool]:
        """Each plotly figure div (``id="figN"``) and whether it holds a drawn SVG."""
        marks = [(m.group(1), m.start()) for m in re.finditer(r'<div id="(fig\d+)"', self.dom)]
        out = {}
        for i, (name, start) in enumerate(marks):
            end = marks[i + 1][1] if i + 1 < len(marks) else len(self.dom)
            out[name] = 'class="main-svg"' in self.dom[start:end]
        return out


def find_chromium() -> str | None:
    """The Chromium binary (``$CHROMIUM`` first), or None."""
    env = os.environ.get("CHROMIUM")
    if env:
        return env if shutil.which(env) else None
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _chromium(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no Chromium binary found (apt-get install chromium, or set "
                                "CHROMIUM to its path)")
    with tempfile.TemporaryDirectory(prefix="kvsim-chromium-") as profile:
        return subprocess.run(
            [exe, *HEADLESS_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
             "--v=0", *args],
            capture_output=True, text=True, timeout=timeout_s, check=False,
            stdin=subprocess.DEVNULL,
        )


def render(page: str | Path, *, timeout_s: float = 180.0) -> Rendered:
    """Load ``page`` (a local HTML file) and return its DOM and console lines."""
    url = Path(page).resolve().as_uri()
    proc = _chromium([f"--virtual-time-budget={VIRTUAL_TIME_MS}", "--dump-dom", url],
                     timeout_s)
    console = [m.group(1) for line in proc.stderr.splitlines()
               if (m := CONSOLE_LINE.search(line))]
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"chromium exited {proc.returncode} without a DOM: "
                           f"{proc.stderr.strip()[-2000:]}")
    return Rendered(proc.stdout, console)


def screenshot(page: str | Path, png: str | Path, *, width: int = 1400, height: int = 5000,
               timeout_s: float = 180.0) -> Path:
    """A PNG of ``page`` (``width`` x ``height`` pixels of it)."""
    out = Path(png).resolve()
    proc = _chromium([f"--virtual-time-budget={VIRTUAL_TIME_MS}", f"--screenshot={out}",
                      f"--window-size={width},{height}", Path(page).resolve().as_uri()],
                     timeout_s)
    if not out.is_file():
        raise RuntimeError(f"chromium exited {proc.returncode} without a screenshot: "
                           f"{proc.stderr.strip()[-2000:]}")
    return out


def check(page: str | Path) -> tuple[int, list[str]]:
    """``(figures, problems)`` of a report page: how many figures it has, and those that
    did not render and every console message."""
    r = render(page)
    figs = r.figures()
    problems = [f"figure {name} did not render" for name, ok in figs.items() if not ok]
    if not figs:
        problems.append("the page has no figures")
    problems += [f"console: {line}" for line in r.console]
    return len(figs), problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m traces.browser", description=__doc__.split(
        "\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="every figure rendered, nothing logged to the console")
    c.add_argument("page")
    s = sub.add_parser("screenshot", help="a PNG of the page")
    s.add_argument("page")
    s.add_argument("png")
    s.add_argument("--width", type=int, default=1400)
    s.add_argument("--height", type=int, default=5000)
    a = p.parse_args(argv)
    try:
        if a.cmd == "screenshot":
            print(screenshot(a.page, a.png, width=a.width, height=a.height))
            return 0
        count, problems = check(a.page)
    except (FileNotFoundError, RuntimeError, subprocess.TimeoutExpired) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in problems:
        print(line)
    if not problems:
        print(f"ok: {count} figures rendered, no console messages")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

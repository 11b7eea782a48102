"""Open a report in headless Chromium through Playwright: check that every figure drew and
that the page logged nothing to the console (no JavaScript error), or take screenshots.

Playwright drives the system's Chromium binary (Debian: ``apt-get install chromium``) via
``executable_path``; no browser is ever downloaded (never run ``playwright install``). ::

    python -m traces.browser check kvsim-out/report.html
    python -m traces.browser screenshot kvsim-out/report.html report.png

``screenshot`` writes the whole page to ``report.png`` and the first screenful (what a
reader sees before scrolling) to ``report.fold.png``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Binaries tried in order (Debian's package installs /usr/bin/chromium).
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Flags for a quiet, offline, sandbox-free headless run (CI runs as root in a container).
HEADLESS_FLAGS = (
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
)
#: The browser window: a laptop screen (the "fold" is its height).
VIEWPORT = {"width": 1400, "height": 900}
#: Longest wait for a page to load and its figures to draw (wall time, not asserted).
LOAD_TIMEOUT_MS = 120_000

#: Script run in the page: each figure div (``id="figN"``) and whether plotly drew it.
_FIGURES_JS = """() => Array.from(document.querySelectorAll('div[id^="fig"]'))
  .filter(d => /^fig\\d+$/.test(d.id))
  .map(d => [d.id, d.querySelector('svg.main-svg') !== null
                 && d.querySelectorAll('.trace, .bars, .scatterlayer path').length > 0])"""


def find_chromium() -> str | None:
    """The Chromium binary (``$CHROMIUM`` first), or None."""
    env = os.environ.get("CHROMIUM")
    if env:
        return shutil.which(env)
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def playwright_missing() -> str | None:
    """Why the browser checks cannot run here (no Playwright, no Chromium), or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is not installed (pip install -e '.[test]')"
    if find_chromium() is None:
        return ("no Chromium binary found: install the OS package (apt-get install chromium) "
                "or set CHROMIUM to a Chrome binary")
    return None


@dataclass
class Page:
    """A report loaded in the browser: the Playwright page, and what it logged."""

    page: Any  # playwright.sync_api.Page
    console: list[str]

    def figures(self) -> dict[str, bool]:
        """Each plotly figure div (``id="figN"``) and whether it drew any data."""
        return dict(self.page.evaluate(_FIGURES_JS))


@contextmanager
def open_page(page: str | Path, *, viewport: dict[str, int] | None = None) -> Iterator[Page]:
    """Load ``page`` (a local HTML file) in headless Chromium and wait until the network is
    idle; yields a :class:`Page`. Console messages and uncaught errors are collected."""
    from playwright.sync_api import sync_playwright

    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no Chromium binary found (apt-get install chromium, or set "
                                "CHROMIUM to its path)")
    path = Path(page).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such page")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, headless=True,
                                     args=list(HEADLESS_FLAGS))
        try:
            ctx = browser.new_context(viewport=viewport or VIEWPORT)
            p = ctx.new_page()
            console: list[str] = []
            p.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            p.on("pageerror", lambda e: console.append(f"uncaught: {e}"))
            p.goto(path.as_uri(), wait_until="load", timeout=LOAD_TIMEOUT_MS)
            p.wait_for_load_state("networkidle", timeout=LOAD_TIMEOUT_MS)
            yield Page(p, console)
        finally:
            browser.close()


def check(page: str | Path) -> tuple[int, list[str]]:
    """``(figures, problems)`` of a report page: how many figures it has, and those that
    did not draw and every console message."""
    with open_page(page) as p:
        figs = p.figures()
        console = list(p.console)
    problems = [f"figure {name} did not draw" for name, ok in figs.items() if not ok]
    if not figs:
        problems.append("the page has no figures")
    problems += [f"console: {line}" for line in console]
    return len(figs), problems


def screenshot(page: str | Path, png: str | Path, *,
               width: int = VIEWPORT["width"], height: int = VIEWPORT["height"]) -> list[Path]:
    """PNGs of ``page``: the whole page at ``png`` and the first ``width`` x ``height``
    screenful beside it (``NAME.fold.png``)."""
    out = Path(png).resolve()
    fold = out.with_suffix(".fold.png")
    with open_page(page, viewport={"width": width, "height": height}) as p:
        p.page.screenshot(path=str(out), full_page=True)
        p.page.screenshot(path=str(fold), full_page=False)
    return [out, fold]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m traces.browser", description=__doc__.split(
        "\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="every figure drew, nothing logged to the console")
    c.add_argument("page")
    s = sub.add_parser("screenshot", help="PNGs of the whole page and of its first screenful")
    s.add_argument("page")
    s.add_argument("png")
    s.add_argument("--width", type=int, default=VIEWPORT["width"])
    s.add_argument("--height", type=int, default=VIEWPORT["height"],
                   help="height of the first screenful (pixels)")
    a = p.parse_args(argv)
    why = playwright_missing()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    from playwright.sync_api import Error as PlaywrightError

    try:
        if a.cmd == "screenshot":
            for path in screenshot(a.page, a.png, width=a.width, height=a.height):
                print(path)
            return 0
        count, problems = check(a.page)
    except (FileNotFoundError, PlaywrightError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in problems:
        print(line)
    if not problems:
        print(f"ok: {count} figures drawn, no console messages")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

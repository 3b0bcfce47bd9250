"""Rendering a page in headless Chromium, for the report's browser test and the docs'
screenshots: the DOM after scripts ran, console errors, and a PNG screenshot. No network."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
# Chromium's stderr lines for a page's console errors and uncaught exceptions.
CONSOLE_ERROR_RE = re.compile(r"(?:CONSOLE\(\d+\)|console).*?(?:error|Uncaught)|Uncaught ",
                              re.IGNORECASE)


def find_chromium() -> str | None:
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


def _run(binary: str, page: Path, extra: list[str], timeout: float) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="ranktrace-chromium-") as profile:
        command = [binary, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=3000",
                   *extra, page.resolve().as_uri()]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def dump_dom(page: Path, binary: str | None = None, timeout: float = 120
             ) -> tuple[str, list[str]]:
    """(the DOM after the page's scripts ran, console error lines)."""
    done = _run(binary or find_chromium(), page, ["--dump-dom"], timeout)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr[-2000:]}")
    errors = [line for line in done.stderr.splitlines() if CONSOLE_ERROR_RE.search(line)]
    return done.stdout, errors


def screenshot(page: Path, png: Path, size: tuple[int, int] = (1200, 1600),
               binary: str | None = None, timeout: float = 120) -> Path:
    done = _run(binary or find_chromium(), page,
                [f"--screenshot={png.resolve()}", f"--window-size={size[0]},{size[1]}"], timeout)
    if done.returncode != 0 or not png.is_file():
        raise RuntimeError(f"chromium made no screenshot ({done.returncode}): "
                           f"{done.stderr[-2000:]}")
    return png

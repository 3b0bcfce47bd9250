"""Text from files made safe to print: a run folder is data, and a name or message in it must
not move the cursor, retitle or clear the terminal, or reorder what the reader sees. And long
text shown through a pager, as git does, where it is shown on a terminal."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping
from typing import TextIO

# C0 controls but tab and newline, DEL, C1 controls (ESC's 8-bit forms among them), and the
# bidirectional overrides and isolates that reorder a line as it is shown.
_UNSAFE = ([c for c in range(0x20) if c not in (0x09, 0x0A)] + [0x7F] + list(range(0x80, 0xA0))
           + [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])
# `\uXXXX`: readable in text, and the same character again in a JSON string.
_ESCAPES = {c: f"\\u{c:04x}" for c in _UNSAFE}


def terminal_safe(text: str) -> str:
    """`text` with each control character written as its `\\uXXXX` escape."""
    return text.translate(_ESCAPES)


def pager_command(environ: Mapping[str, str]) -> list[str] | None:
    """The pager to run, as git picks it: $PAGER, else `less`; None where PAGER is empty or
    `cat` (no pager)."""
    chosen = environ.get("PAGER", "less")
    words = shlex.split(chosen) if chosen.strip() else []
    if not words or words == ["cat"]:
        return None
    return words


def fits_screen(text: str, size: os.terminal_size) -> bool:
    """Whether `text` fits a screen of `size`, its last row left for the prompt."""
    lines = text.splitlines()
    return len(lines) < size.lines and all(len(line) <= size.columns for line in lines)


def show(text: str, use_pager: bool = True, stream: TextIO | None = None,
         environ: Mapping[str, str] | None = None) -> None:
    """Write `text` to `stream` (stdout), through a pager as git does: only where the stream is
    a terminal, `use_pager` is on and the text does not fit the screen. The pager is $PAGER
    (else less) with LESS=FRX unless LESS is set: it quits at once on a screenful and keeps
    colours. Where the pager cannot start, the text is written as it is."""
    stream = sys.stdout if stream is None else stream
    environ = os.environ if environ is None else environ
    command = pager_command(environ) if use_pager else None
    if command is None or not _is_terminal(stream) or fits_screen(text, _screen_size()):
        stream.write(text)
        return
    stream.flush()
    import subprocess  # here, as shutil in _screen_size: see there

    env = {**environ, "LESS": environ.get("LESS", "FRX"), "LV": environ.get("LV", "-c")}
    try:
        pager = subprocess.Popen(command, stdin=subprocess.PIPE, env=env,
                                 encoding=getattr(stream, "encoding", None) or "utf-8",
                                 errors="replace")
    except OSError:
        stream.write(text)
        return
    try:
        pager.stdin.write(text)
        pager.stdin.close()
    except BrokenPipeError:  # the reader quit the pager before the end
        pass
    pager.wait()


def _screen_size() -> os.terminal_size:
    # shutil and subprocess are imported only where a pager may run: every command imports this
    # module before it forks its decoder (analysis.ingest.parse_ahead), and they took 5 ms there.
    import shutil

    return shutil.get_terminal_size()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False

"""Decoding a run's one trace file in a forked process while the command imports pandas.

Importing pandas and the analysis takes the command about as long as decoding a large trace
(0.3 s each for a 50 MB trace on a typical core). When a run has one trace file to parse, the
command forks a child before those imports (`start`); the child decodes the file with
analysis.ingest.kineto.decode_trace, which needs neither, and hands the columns back, through
memory shared with the command, when the command gets to the file (`DecodeAhead.take`, called
by analysis.ingest.cache.read_trace; the child is an analysis.core.forked.ForkedChild). The
result, and any refusal of the file, is what decoding it in the command would give: a child
that fails any other way just leaves the file to be decoded there. Only what the child pickled
is unpickled; nothing read from a file ever is.

The command imports numpy and the decoder before it forks (importing this module does): a child
that imported them itself, at the same time as the command's own imports, finished later.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from analysis.core.forked import ForkedChild
from analysis.core.heap import fault_in_while, keep_freed_memory
from analysis.ingest.kineto import DecodedTrace, TraceReadError, decode_trace
from analysis.ingest.runs import cache_file

# Larger files are decoded where they are analysed: the child's columns, pickled and sent, would
# sit in memory twice beside the command's own copy, and the imports are a small share of their
# time. A gzipped file counts as GZIP_RATIO times its size (Kineto's JSON compresses ~18:1).
MAX_JSON_BYTES = 256 << 20
GZIP_RATIO = 20


def start(files: list[Path], max_bytes: int, use_cache: bool, jobs: int | None,
          scheduler: str | None, ready_memory: bool = False) -> DecodeAhead | None:
    """A DecodeAhead of the one file in `files` when it pays: a local run (no scheduler) of one
    trace file, not read from the cache, of at most MAX_JSON_BYTES of JSON, on a Linux machine
    with more than one core that --jobs does not limit to one process; else None.
    `ready_memory`: the memory its events frame will take is faulted in while the command
    waits for it (DecodeAhead's `json_bytes`), for a process that is the command's alone."""
    if (scheduler or len(files) != 1 or not sys.platform.startswith("linux")
            or not hasattr(os, "fork") or (jobs or os.cpu_count() or 1) < 2):
        return None
    path = files[0]
    try:
        json_bytes = path.stat().st_size * (GZIP_RATIO if path.name.endswith(".gz") else 1)
        if json_bytes > MAX_JSON_BYTES or (use_cache and cache_file(path).exists()):
            return None
    except OSError:
        return None  # decoding it in the command says what is wrong with it
    try:
        return DecodeAhead(path, max_bytes, json_bytes if ready_memory else 0)
    except OSError:
        return None  # no process or pipe to spare: the command decodes it itself


class DecodeAhead:
    """One trace file being decoded in a child process (analysis.core.forked)."""

    def __init__(self, path: Path, max_bytes: int, json_bytes: int = 0):
        """`json_bytes`: the file's JSON, as start estimates it, to fault in the memory its
        events frame will take while the child decodes it (0: none)."""
        self.path = path
        self.max_bytes = max_bytes
        self.json_bytes = json_bytes
        self._child = ForkedChild(lambda: _decoded(path, max_bytes))

    def take(self, path: Path, max_bytes: int) -> DecodedTrace | None:
        """The child's columns of `path` decoded within `max_bytes`; None when it decoded
        another file (or limit), failed, or was taken already. Raises the TraceReadError that
        decoding the file here would raise."""
        if not self._child.waiting or Path(path) != self.path or max_bytes != self.max_bytes:
            return None
        # The memory the columns and their events frame will take (about half the JSON's
        # bytes), faulted in while the child decodes (analysis.core.heap).
        frame_bytes = self.json_bytes // 2
        if frame_bytes and not self._child.answered() and keep_freed_memory():
            fault_in_while(lambda: not self._child.answered(), frame_bytes)
        answer = self._child.answer()
        if answer is None:  # the child died before it could answer
            return None
        kind, value = answer
        if kind == "refused":
            raise TraceReadError(path, value)
        return value if kind == "decoded" else None

    def close(self) -> None:
        """Stop the child if nobody took its result (the command failed before the file)."""
        self._child.close()


def _decoded(path: Path, max_bytes: int) -> tuple:
    """The child's answer: ("decoded", the columns), ("refused", why), or ("failed", None) for
    any other failure, which decoding the file in the command then reports."""
    try:
        return ("decoded", decode_trace(path, max_bytes=max_bytes))
    except TraceReadError as exc:
        return ("refused", exc.reason)
    except Exception:  # noqa: BLE001
        return ("failed", None)

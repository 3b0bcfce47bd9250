"""Append-only JSON-lines files that survive crashes and never break training.

Each writer appends msgspec records to `<name>.tmp`, flushes at least every `flush_s` seconds,
and renames to `<name>` on close, so a reader never mistakes a half-written file for a finished
one; after a crash the `.tmp` file still holds everything up to the last flush. A write error
(disk full, folder removed) switches the writer off with one line on stderr and a note in
`error`; training goes on.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from tracer import schema


def say(line: str) -> None:
    """One line on stderr, in the tracer's "ranktrace: rank{R} part: ..." form."""
    rank = os.environ.get("RANK")
    print(f"ranktrace: rank{rank} {line}" if rank is not None else f"ranktrace: {line}",
          file=sys.stderr, flush=True)


class JsonlWriter:
    def __init__(self, path: str, part: str, flush_s: float = 1.0):
        self.path = path
        self.part = part
        self.flush_s = flush_s
        self.records = 0
        self.bytes_written = 0
        self.error: str | None = None
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._last_flush = time.monotonic()
        self._file = open(path + schema.TEMP_SUFFIX, "ab")

    @property
    def closed(self) -> bool:
        return self._file is None

    def write(self, record) -> None:
        if self._file is None:
            return
        line = schema.ENCODER.encode(record) + b"\n"
        with self._lock:
            self._buffer += line
            self.records += 1
            if time.monotonic() - self._last_flush >= self.flush_s:
                self._flush_locked()

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        self._last_flush = time.monotonic()
        if self._file is None or not self._buffer:
            return
        try:
            self._file.write(self._buffer)
            self._file.flush()
            self.bytes_written += len(self._buffer)
        except OSError as exc:
            self._fail(exc)
        finally:
            self._buffer.clear()

    def _fail(self, exc: OSError) -> None:
        self.error = f"{self.part}: writing {self.path} failed ({exc}); {self.part} recording is off"
        say(self.error)
        try:
            self._file.close()
        except OSError:
            pass
        self._file = None

    def close(self) -> None:
        with self._lock:
            self._flush_locked()
            if self._file is None:
                return
            try:
                self._file.close()
                os.replace(self.path + schema.TEMP_SUFFIX, self.path)
            except OSError as exc:
                self._fail(exc)
            self._file = None

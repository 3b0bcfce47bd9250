"""The buffered file under the JSONL record writers and the TensorBoard event writer.

Encoded records are appended to a buffer and written at least every `flush_s` seconds, so a
crash loses about that much; a RecordBudget shared by several files caps their total size. A
write error (disk full, folder removed) fails the part once (one stderr line, `error`) and
closes the file; training goes on. Safe across threads.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from tracer.parts.part import Part


class RecordBudget:
    """A byte budget shared by a rank's record files (--max-record-mb), safe across threads.

    Records are charged with the training step they belong to. The first record that does not
    fit sets `cap_step` to its step and calls `on_reached(step)` once; from then on records of
    that step and later ones are refused, while records of earlier steps that are still on
    their way (written up to 0.2 s after their step) are let through, so that every step before
    `cap_step` keeps all of its records. The files may thus end a little above the limit.
    """

    def __init__(self, limit_bytes: int, on_reached: Callable[[int], None]):
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.cap_step: int | None = None
        self._on_reached = on_reached
        self._lock = threading.Lock()

    def charge(self, nbytes: int, step: int) -> bool:
        with self._lock:
            reached_now = self.cap_step is None and self.used_bytes + nbytes > self.limit_bytes
            if reached_now:
                self.cap_step = step
            if self.cap_step is None or step < self.cap_step:
                self.used_bytes += nbytes
                return True
        if reached_now:
            self._on_reached(step)
        return False


class BufferedFile(Part):
    """A part that writes one file: `open_file()`, `append(data, step)`, `flush()`, `close()`.

    The file is written at `write_path`; given a `final_path`, it is renamed there once closed,
    so that a reader never mistakes a half-written file for a finished one."""

    off_what = ""  # the end of its failure line (default: "<name> recording is off")

    def __init__(self, flush_s: float = 1.0, budget: RecordBudget | None = None):
        self.flush_s = flush_s
        self.budget = budget
        self.path = ""
        self._renames: tuple[str, str] | None = None
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._last_flush = time.monotonic()
        self._file = None

    def open_file(self, write_path: str, mode: str, final_path: str | None = None) -> None:
        """Raises OSError when the file cannot be opened."""
        self.path = final_path or write_path
        self._renames = (write_path, final_path) if final_path is not None else None
        self._file = open(write_path, mode)

    @property
    def closed(self) -> bool:
        return self._file is None

    def append(self, data: bytes, step: int | None) -> bool:
        """Buffer one encoded record of training step `step` (charged to the budget when not
        None); False if it was refused."""
        if self._file is None:
            return False
        if self.budget is not None and step is not None and not self.budget.charge(len(data), step):
            return False
        with self._lock:
            self._buffer += data
            if time.monotonic() - self._last_flush >= self.flush_s:
                self._flush_locked()
        return True

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

    def _fail(self, exc: BaseException) -> None:
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass
        self.fail(f"writing {self.path} failed ({type(exc).__name__}: {exc}); "
                  f"{self.off_what or self.name + ' recording is off'}")

    def close(self) -> None:
        with self._lock:
            self._flush_locked()
            file, self._file = self._file, None
            if file is None:
                return
            try:
                file.close()
                if self._renames is not None:
                    os.replace(*self._renames)
            except OSError as exc:
                self._fail(exc)

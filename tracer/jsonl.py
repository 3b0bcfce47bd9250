"""Append-only JSON-lines files that survive crashes and never break training.

Each writer appends msgspec records to `<name>.tmp`, flushes at least every `flush_s` seconds,
and renames to `<name>` on close, so a reader never mistakes a half-written file for a finished
one; after a crash the `.tmp` file still holds everything up to the last flush. A write error
(disk full, folder removed) switches the writer off with one line on stderr and a note in
`error`; training goes on. A RecordBudget shared by several writers caps their total size.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from collections.abc import Callable

from tracer import schema


def say(line: str) -> None:
    """One line on stderr, in the tracer's "ranktrace: rank{R} part: ..." form."""
    rank = os.environ.get("RANK")
    print(f"ranktrace: rank{rank} {line}" if rank is not None else f"ranktrace: {line}",
          file=sys.stderr, flush=True)


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


class JsonlWriter:
    def __init__(self, path: str, part: str, flush_s: float = 1.0,
                 budget: RecordBudget | None = None):
        self.path = path
        self.part = part
        self.flush_s = flush_s
        self.records = 0
        self.bytes_written = 0
        self.error: str | None = None
        self.budget = budget
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._last_flush = time.monotonic()
        self._file = open(path + schema.TEMP_SUFFIX, "ab")

    @property
    def closed(self) -> bool:
        return self._file is None

    def write(self, record, step: int | None = None) -> None:
        """`step`: the training step the record belongs to (default: `record.step`), which only
        a budget needs."""
        if self._file is None:
            return
        line = schema.ENCODER.encode(record) + b"\n"
        if self.budget is not None and not self.budget.charge(
                len(line), record.step if step is None else step):
            return
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


class CommsWriter(JsonlWriter):
    """The comms file's writer; also totals each step's bytes and op time for its algbw."""

    def __init__(self, path: str, part: str, budget: RecordBudget | None = None):
        super().__init__(path, part, budget=budget)
        self._per_step: dict[int, list] = {}  # step -> [bytes, summed duration in us]

    def write(self, record) -> None:
        super().write(record)
        totals = self._per_step.get(record.step)
        if totals is None:
            self._per_step[record.step] = [record.bytes, record.duration_us]
        else:
            totals[0] += record.bytes
            totals[1] += record.duration_us

    def take_algbw(self, step: int) -> float | None:
        """GB/s of the ops of `step` written so far: their bytes over their summed durations.

        Forgets that step and every earlier one.
        """
        totals = self._per_step.pop(step, None)
        for old in [s for s in self._per_step if s < step]:
            del self._per_step[old]
        if totals is None or totals[0] <= 0 or totals[1] <= 0:
            return None
        return totals[0] / totals[1] / 1e3


class SamplesWriter(JsonlWriter):
    """The samples file's writer; also keeps each sample, with the step it fell in, for scalars."""

    def __init__(self, path: str, part: str, current_step, budget: RecordBudget | None = None):
        super().__init__(path, part, budget=budget)
        self.current_step = current_step
        self.pending: collections.deque = collections.deque()

    def write(self, record) -> None:
        step = self.current_step()
        super().write(record, step)
        self.pending.append((record, step))

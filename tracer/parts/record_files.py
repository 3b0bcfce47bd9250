"""Append-only JSON-lines record files that survive crashes and never break training.

Each writer appends msgspec records to `<name>.tmp` and renames it to `<name>` on close, so a
reader never mistakes a half-written file for a finished one; after a crash the `.tmp` file
still holds everything up to the last flush (tracer.parts.buffered_file: flushing, the record
budget and what a write error does).
"""

from __future__ import annotations

import collections

from tracer import schema
from tracer.parts.buffered_file import BufferedFile, RecordBudget

__all__ = ["CommsWriter", "JsonlWriter", "SamplesWriter"]


class JsonlWriter(BufferedFile):
    def __init__(self, path: str, part: str, flush_s: float = 1.0,
                 budget: RecordBudget | None = None):
        """`part`: the name its failure is reported under. Raises OSError if it cannot open."""
        super().__init__(flush_s, budget)
        self.name = part
        self.records = 0
        self.open_file(path + schema.TEMP_SUFFIX, "ab", final_path=path)

    def write(self, record, step: int | None = None) -> None:
        """`step`: the training step the record belongs to (default: `record.step`), which only
        a budget needs."""
        if self._file is None:
            return
        line = schema.ENCODER.encode(record) + b"\n"
        if self.append(line, (record.step if step is None else step)
                       if self.budget is not None else None):
            self.records += 1


class CommsWriter(JsonlWriter):
    """The comms file's writer; also totals each step's bytes and op time for its algbw."""

    def __init__(self, path: str, part: str, budget: RecordBudget | None = None):
        super().__init__(path, part, budget=budget)
        self._per_step: dict[int, list] = {}  # step -> [bytes, summed duration in us]

    def write(self, record) -> None:
        super().write(record)
        if record.timing == schema.TIMING_ISSUE:
            return  # its end is unknown: its bytes have no time to be divided by
        totals = self._per_step.get(record.step)
        if totals is None:
            self._per_step[record.step] = [record.bytes, record.duration_us]
        else:
            totals[0] += record.bytes
            totals[1] += record.duration_us

    def on_step_record(self, record, notes: dict) -> None:
        # Taken at every step, scalars or not, so that the totals of old steps never pile up.
        algbw = self.take_algbw(record.step)
        if algbw is not None:
            notes["comm_algbw_gbps"] = algbw

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

    def pending_samples(self) -> collections.deque:
        return self.pending

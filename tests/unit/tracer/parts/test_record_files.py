"""The JSON-lines record files (tracer.parts.record_files): the comms file's writer gives each
step's algbw once and writes every record."""

from __future__ import annotations

import pytest

from helpers.tracer_files import read_jsonl
from tracer import schema
from tracer.parts.record_files import CommsWriter


def test_comms_writer_gives_each_steps_algbw_once(tmp_path):
    writer = CommsWriter(str(tmp_path / "c.jsonl"), "comms")
    for step, nbytes, us in ((0, 5, 1.0), (1, 1_000_000, 500.0), (1, 3_000_000, 1500.0),
                             (2, 2_000_000, 100.0)):
        writer.write(schema.CommRecord(step=step, op="all_reduce", source="c10d", pg="0",
                                       pg_size=2, dtype="float32", bytes=nbytes, start_ns=0,
                                       end_ns=1, duration_us=us, timing="host", algbw_gbps=0,
                                       busbw_gbps=0))
    assert writer.take_algbw(1) == pytest.approx(2.0)  # 4 MB in 2 ms
    assert writer.take_algbw(1) is None and writer.take_algbw(0) is None  # taken, forgotten
    assert writer.take_algbw(2) == pytest.approx(20.0)
    writer.close()
    assert len(read_jsonl(tmp_path / "c.jsonl")) == 4

"""--no-issue-records: the option, and the comms recorder that then writes no issue file."""

from __future__ import annotations

import msgspec
import pytest
import torch
import torch.distributed as dist

from tracer import schema
from tracer.comms import CommsRecorder
from tracer.options import config as config_mod


class PathWriter:
    """A comms writer with a path: the issue file goes next to it."""

    def __init__(self, path):
        self.path = str(path)
        self.records = []

    def write(self, record):
        self.records.append(record)


def test_the_option_comes_from_the_command_line_or_the_environment():
    assert config_mod.resolve(["s.py"], {})[0].no_issue_records is False
    assert config_mod.resolve(["--no-issue-records", "s.py"], {})[0].no_issue_records is True
    assert config_mod.resolve(["s.py"], {"RANKTRACE_NO_ISSUE_RECORDS": "1"})[0].no_issue_records


@pytest.mark.parametrize("issue_records", [True, False])
def test_the_recorder_writes_issue_records_only_when_asked(tmp_path, one_rank, issue_records):
    writer = PathWriter(tmp_path / schema.COMMS_FILE.format(rank=0))
    recorder = CommsRecorder(writer, lambda: 0, use_cuda=False, issue_records=issue_records)
    recorder.install()
    try:
        dist.all_reduce(torch.ones(4))
        dist.all_reduce(torch.ones(8))
    finally:
        recorder.close()
    recorder.timing.drain()
    issued = tmp_path / schema.ISSUED_FILE.format(rank=0)
    if issue_records:
        records = [msgspec.json.decode(line, type=schema.IssueRecord)
                   for line in issued.read_bytes().splitlines()]
        assert [(r.op, r.bytes, r.position) for r in records] == [("all_reduce", 16, 0),
                                                                  ("all_reduce", 32, 1)]
    else:
        assert not issued.exists()
        assert not (tmp_path / (schema.ISSUED_FILE.format(rank=0) + schema.TEMP_SUFFIX)).exists()
    assert recorder.ops == 2

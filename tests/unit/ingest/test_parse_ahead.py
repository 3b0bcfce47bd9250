"""analysis.ingest.parse_ahead: a run's one trace decoded in a forked child while the command
imports
pandas gives exactly what decoding it in the command gives, refusals included."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analysis.core import forked
from analysis.core.limits import max_trace_bytes
from analysis.ingest import parse_ahead, parsed_trace
from analysis.ingest.kineto import TraceReadError
from analysis.ingest.runs import cache_file
from helpers.launch import REPO

ROOT = REPO
NCCL = ROOT / "tests/data/hta/nccl_parser_config/nccl_data.json.gz"
LIMIT = max_trace_bytes()

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the command decodes ahead on Linux only")


def _children() -> set[int]:
    """This process's children not yet reaped (zombies included), from /proc: other tests may
    have children of their own, so a test asks about its own child's pid."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid():
                found.add(int(entry.name))
    return found


@pytest.mark.parametrize("json_bytes", [0, 64 << 20])  # 64 MB: memory faulted in meanwhile
def test_columns_decoded_ahead_make_the_same_trace_as_decoding_here(json_bytes, monkeypatch):
    # The allocator left as it is (analysis.core.heap's setting would stay with this process).
    monkeypatch.setattr(parse_ahead, "keep_freed_memory", lambda: True)
    ahead = parse_ahead.DecodeAhead(NCCL, LIMIT, json_bytes)
    child = ahead._child._pid
    decoded = ahead.take(NCCL, LIMIT)
    assert decoded is not None and decoded.columns.rows > 10_000
    there = parsed_trace.parse_trace(NCCL, decoded=decoded)
    here = parsed_trace.parse_trace(NCCL)
    pd.testing.assert_frame_equal(there.events, here.events, check_exact=True)
    pd.testing.assert_frame_equal(there.steps, here.steps, check_exact=True)
    assert (there.rank, there.world_size, there.backend, there.float_timestamps,
            there.problems, there.process_groups) == (
        here.rank, here.world_size, here.backend, here.float_timestamps, here.problems,
        here.process_groups)
    assert ahead.take(NCCL, LIMIT) is None  # taken once
    forked.reap_children()
    assert child not in _children()  # reaped


def test_a_refused_file_raises_the_error_decoding_it_here_raises(tmp_path):
    corrupt = tmp_path / "rank0.json.gz"
    corrupt.write_bytes(gzip.compress(b'{"traceEvents": [' + b'{"ph": "X"},' * 5000)[:-40])
    with pytest.raises(TraceReadError) as here:
        parsed_trace.parse_trace(corrupt)
    ahead = parse_ahead.DecodeAhead(corrupt, LIMIT)
    with pytest.raises(TraceReadError) as there:
        ahead.take(corrupt, LIMIT)
    assert str(there.value) == str(here.value) and "corrupt gzip" in str(here.value)
    too_small = parse_ahead.DecodeAhead(NCCL, 1000)
    with pytest.raises(TraceReadError, match="too large to analyse"):
        too_small.take(NCCL, 1000)


def test_another_file_or_limit_is_not_answered_and_close_ends_the_child():
    ahead = parse_ahead.DecodeAhead(NCCL, LIMIT)
    child = ahead._child._pid
    assert ahead.take(NCCL.with_name("other.json.gz"), LIMIT) is None
    assert ahead.take(NCCL, LIMIT - 1) is None
    assert child in _children()
    ahead.close()
    assert child not in _children()  # stopped and reaped
    assert ahead.take(NCCL, LIMIT) is None
    ahead.close()  # twice is harmless


def test_only_the_commands_own_process_readies_memory_while_it_waits(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    for ready, json_bytes in ((False, 0), (True, NCCL.stat().st_size * parse_ahead.GZIP_RATIO)):
        ahead = parse_ahead.start([NCCL], LIMIT, False, None, None, ready_memory=ready)
        assert ahead is not None and ahead.json_bytes == json_bytes
        ahead.close()


def test_it_starts_only_for_one_local_uncached_file(tmp_path, monkeypatch):
    def started(files, use_cache=False, jobs=None, scheduler=None):
        ahead = parse_ahead.start(files, LIMIT, use_cache, jobs, scheduler)
        if ahead is None:
            return False
        ahead.close()
        return True

    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert started([NCCL])
    assert not started([NCCL, NCCL])
    assert not started([NCCL], jobs=1)
    assert not started([NCCL], scheduler="tcp://127.0.0.1:8786")
    assert not started([tmp_path / "missing.json"])
    copy = tmp_path / NCCL.name
    copy.write_bytes(NCCL.read_bytes())
    assert started([copy], use_cache=True)
    cache_file(copy).parent.mkdir()
    cache_file(copy).write_bytes(b"")
    assert not started([copy], use_cache=True)  # the cache answers instead
    assert started([copy], use_cache=False)
    gzipped_json = NCCL.stat().st_size * parse_ahead.GZIP_RATIO
    monkeypatch.setattr(parse_ahead, "MAX_JSON_BYTES", gzipped_json)
    assert started([NCCL])
    monkeypatch.setattr(parse_ahead, "MAX_JSON_BYTES", gzipped_json - 1)
    assert not started([NCCL])  # too large once decompressed
    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.decompress(NCCL.read_bytes()))
    monkeypatch.setattr(parse_ahead, "MAX_JSON_BYTES", plain.stat().st_size)
    assert started([plain])
    monkeypatch.setattr(parse_ahead, "MAX_JSON_BYTES", plain.stat().st_size - 1)
    assert not started([plain])
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    monkeypatch.setattr(parse_ahead, "MAX_JSON_BYTES", 1 << 30)
    assert not started([NCCL])


# The command, run as a user runs it: which modules it had imported when it forked, whether the
# child's columns were used, and its output.
_PROBE = """
import sys
from analysis.ingest import parse_ahead
seen = {}
init, take = parse_ahead.DecodeAhead.__init__, parse_ahead.DecodeAhead.take
def probed_init(self, *args):
    seen["pandas imported at fork"] = "pandas" in sys.modules
    init(self, *args)
def probed_take(self, *args):
    result = take(self, *args)
    seen["taken"] = type(result).__name__
    return result
parse_ahead.DecodeAhead.__init__, parse_ahead.DecodeAhead.take = probed_init, probed_take
if sys.argv[1] == "child-fails":
    def failing(*args, **kwargs):
        raise RuntimeError("a bug in the child")
    parse_ahead.decode_trace = failing  # the child only: the command keeps its own
from analysis.breakdown import main
code = main(sys.argv[2:])
print(seen, file=sys.stderr)
raise SystemExit(code)
"""


def _command(mode: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _PROBE, mode, str(NCCL), "--no-cache",
                           "--format", "json", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow  # starts Python processes
def test_the_command_forks_before_pandas_and_reports_what_one_process_reports():
    alone = _command("plain", "--jobs", "1")
    ahead = _command("plain", "--jobs", "2")
    failed = _command("child-fails", "--jobs", "2")
    for run in (alone, ahead, failed):
        assert run.returncode == 0, run.stderr
    assert alone.stderr.splitlines()[-1] == "{}"  # --jobs 1: one process, nothing forked
    assert ahead.stderr.splitlines()[-1] == str(
        {"pandas imported at fork": False, "taken": "DecodedTrace"})
    assert failed.stderr.splitlines()[-1] == str(
        {"pandas imported at fork": False, "taken": "NoneType"})
    document = json.loads(alone.stdout)
    assert document["ranks"] and document["steps"]  # a real report, not an empty one
    assert ahead.stdout == alone.stdout == failed.stdout
    assert ahead.stderr.splitlines()[:-1] == alone.stderr.splitlines()[:-1]

"""Reading a run while it is written (ranktrace.watch.tail, folders, liveness): a last line cut
short, a file that appears late, a `.tmp` renamed mid-run, a bad line, a watch joining a long
run late, a rank that dies without run_end, and which run folder a watch follows."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from ranktrace.watch import tail as tail_module
from ranktrace.watch.command import Watcher
from ranktrace.watch.folders import RunLocator
from ranktrace.watch.options import WatchOptions
from ranktrace.watch.tail import RunTail
from tracer import schema

TMP = schema.TEMP_SUFFIX


def line(record) -> bytes:
    return schema.ENCODER.encode(record) + b"\n"


def step(n: int) -> schema.StepRecord:
    return schema.StepRecord(step=n, start_ns=n * 10, end_ns=n * 10 + 10)


def start(rank: int, pid: int, world: int = 2) -> schema.RunStart:
    return schema.RunStart(schema_version=schema.SCHEMA_VERSION, run_name="run", rank=rank,
                           local_rank=rank, world_size=world, host=socket.gethostname(),
                           pid=pid, start_ns=0, argv=[], script="s.py", script_args=[],
                           torch_version="x", config={})


def end(rank: int) -> schema.RunEnd:
    return schema.RunEnd(rank=rank, end_ns=1, status="ok", exit_code=0, steps=3, windows=0,
                         samples=0, comm_ops=0, bytes_written=0, errors=0)


def steps_read(batch, rank=0) -> list[int]:
    return [r.step for k, records in batch.records["steps"] if k == rank for r in records]


def test_a_last_line_cut_short_waits_for_its_end(tmp_path):
    path = tmp_path / (schema.STEPS_FILE.format(rank=0) + TMP)
    whole = line(step(2))
    path.write_bytes(line(step(0)) + line(step(1)) + whole[:17])
    reader = RunTail([str(tmp_path)])
    first = reader.poll()
    assert steps_read(first) == [0, 1] and first.problems == []
    assert steps_read(reader.poll()) == []
    with open(path, "ab") as f:
        f.write(whole[17:] + line(step(3)))
    second = reader.poll()
    assert steps_read(second) == [2, 3] and second.problems == []


def test_a_file_that_appears_late_and_a_rename_are_read_once(tmp_path):
    reader = RunTail([str(tmp_path)])
    assert reader.poll().records["steps"] == []
    path = tmp_path / (schema.STEPS_FILE.format(rank=1) + TMP)
    path.write_bytes(line(step(0)))
    assert steps_read(reader.poll(), rank=1) == [0]
    with open(path, "ab") as f:
        f.write(line(step(1)))
    os.rename(path, tmp_path / schema.STEPS_FILE.format(rank=1))  # the rank's end
    after = reader.poll()
    assert steps_read(after, rank=1) == [1]
    assert after.grown == {1} and after.problems == []


def test_a_bad_line_is_skipped_and_named(tmp_path):
    path = tmp_path / (schema.STEPS_FILE.format(rank=3) + TMP)
    path.write_bytes(line(step(0)) + b'{"step": "x"}\n' + line(step(1)))
    batch = RunTail([str(tmp_path)]).poll()
    assert steps_read(batch, rank=3) == [0, 1]
    [problem] = batch.problems
    assert problem.startswith(f"{path}: rank 3: a line skipped")


def test_joining_a_long_run_reads_only_its_last_part(tmp_path, monkeypatch):
    monkeypatch.setattr(tail_module, "CATCH_UP_BYTES", 1000)
    path = tmp_path / (schema.STEPS_FILE.format(rank=0) + TMP)
    path.write_bytes(b"".join(line(step(n)) for n in range(100)))
    batch = RunTail([str(tmp_path)]).poll()
    read = steps_read(batch)
    assert read == list(range(100 - len(read), 100))  # whole lines, the newest ones
    assert 0 < len(read) < 1000 // len(line(step(99))) + 1
    assert "joined late" in batch.problems[0]


def test_the_same_rank_in_two_folders_is_read_from_the_first(tmp_path):
    for node in ("node0", "node1"):
        (tmp_path / node).mkdir()
        (tmp_path / node / schema.STEPS_FILE.format(rank=0)).write_bytes(line(step(0)))
    (tmp_path / "node1" / schema.STEPS_FILE.format(rank=1)).write_bytes(line(step(5)))
    batch = RunTail([str(tmp_path / "node0"), str(tmp_path / "node1")]).poll()
    assert steps_read(batch, 0) == [0] and steps_read(batch, 1) == [5]
    assert batch.problems == [f"{tmp_path / 'node1'}: rank 0: also in {tmp_path / 'node0'}; "
                              f"read from there only"]


def ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_rank_that_dies_ends_the_watch(tmp_path):
    """Rank 1 is killed: its files stay .tmp, its comms line cut short, no run_end, and its
    process is gone. Rank 0 ends normally. The watch ends, saying so."""
    run = tmp_path / "traces" / "run"
    run.mkdir(parents=True)
    (run / schema.MANIFEST_FILE.format(rank=0)).write_bytes(line(start(0, os.getpid()))
                                                            + line(end(0)))
    (run / schema.STEPS_FILE.format(rank=0)).write_bytes(line(step(1)) + line(step(2)))
    (run / (schema.MANIFEST_FILE.format(rank=1) + TMP)).write_bytes(line(start(1, ended_pid())))
    (run / (schema.STEPS_FILE.format(rank=1) + TMP)).write_bytes(line(step(1)))
    (run / (schema.COMMS_FILE.format(rank=1) + TMP)).write_bytes(b'{"step":1,"op":"all_')
    watcher = Watcher(WatchOptions(paths=(str(run),)))
    watcher.tick(0.0)  # its records read: a process that was writing
    watcher.tick(1.0)
    assert not watcher.model.ended()  # seen ended once: a run_end may still be on its way
    watcher.tick(2.0)
    view = watcher.model.view()
    assert view.ended
    assert [row.state for row in view.rows] == ["ok", "gone"]
    assert view.newest_step == 2


def test_a_rank_on_another_host_is_gone_once_silent(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    other = start(1, 1)
    other.host = "elsewhere"
    (run / schema.MANIFEST_FILE.format(rank=0)).write_bytes(line(start(0, os.getpid()))
                                                            + line(end(0)))
    (run / (schema.MANIFEST_FILE.format(rank=1) + TMP)).write_bytes(line(other))
    watcher = Watcher(WatchOptions(paths=(str(run),), silent_s=30.0))
    watcher.tick(0.0)
    watcher.tick(29.0)
    assert not watcher.model.ended()
    watcher.tick(30.0)
    assert watcher.model.ended()
    assert "nothing written for 30 s on elsewhere" in watcher.model.ranks[1].gone


def test_a_watch_started_before_the_job_skips_the_ended_run(tmp_path):
    traces = tmp_path / "traces"
    old = traces / "old-run"
    old.mkdir(parents=True)
    (old / schema.MANIFEST_FILE.format(rank=0)).write_bytes(line(start(0, 1)) + line(end(0)))
    locator = RunLocator([str(traces)])
    assert locator.find(0.0).folders == []
    assert locator.find(1.0).waiting_for == f"waiting for a run to start in {traces}"
    for node in ("node0", "node1"):  # each agent writes its own folder of the run
        new = traces / node / "new-run"
        new.mkdir(parents=True)
        (new / (schema.MANIFEST_FILE.format(rank=int(node[-1])) + TMP)).write_bytes(
            line(start(int(node[-1]), 1)))
    assert locator.find(2.0).folders == [str(traces / "node0" / "new-run"),
                                         str(traces / "node1" / "new-run")]


@pytest.mark.parametrize("live", [True, False])
def test_a_watch_started_during_a_run_follows_it(tmp_path, live):
    run = tmp_path / "run"
    run.mkdir()
    path = run / (schema.STEPS_FILE.format(rank=0) + TMP)
    path.write_bytes(line(step(0)))
    if not live:
        os.utime(path, (1e9, 1e9))  # written long ago: a run killed then
    assert RunLocator([str(tmp_path)]).find(0.0).folders == ([str(run)] if live else [])

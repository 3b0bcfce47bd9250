"""The Flight Recorder part on captured dumps: de-duplication against the hooks' calls, steps by
creation time, step records' counts, ring overruns, ops that complete later, and switching it
on (tracer.comms.flight)."""

import collections
import os

import pytest

from helpers.flight_entries import (
    MAIN_THREAD,
    T0,
    Dumps,
    FakeRecorder,
    ddp_gloo_entries,
    dump_json,
    gloo_entry,
    nccl_entry,
)
from tracer import schema
from tracer.comms import flight
from tracer.comms.flight import FlightRecorder


def part_for(*dumps, step_ends=(), now=T0 + 10**9):
    recorder = FakeRecorder()
    ends = collections.deque(step_ends)
    part = FlightRecorder(recorder, Dumps(*dumps), ends, 1024, clock_ns=lambda: now)
    return part, recorder, ends


def test_the_hooks_ops_are_left_out_and_the_rest_recorded_once():
    entries = ddp_gloo_entries()
    part, recorder, _ = part_for(dump_json(entries))
    # DDP's parameter broadcast went through a hooked _broadcast_coalesced, the barrier through
    # a hooked barrier: both were recorded by the hooks.
    recorder.issue_spans.extend([[MAIN_THREAD, T0 + 2_700_000, T0 + 2_900_000],
                                 [MAIN_THREAD, T0 + 14_700_000, T0 + 14_900_000]])
    part.drain()
    part.drain()  # the same entries again: nothing more
    written = recorder.writer.records
    assert [(r.op, r.bytes, r.position) for r in written] == [
        ("all_gather", 16, 0), ("broadcast", 48, 1), ("all_reduce", 440, 3),
        ("broadcast", 12, 4), ("broadcast", 4, 5), ("all_reduce", 440, 6)]
    assert all(r.source == "native" and r.timing == "issue" for r in written)
    assert [r.position for r in recorder.timing.issues_writer.records] == [0, 1, 3, 4, 5, 6]
    assert (part.ops, part.hooked, recorder.native_ops) == (6, 2, 6)


def test_steps_are_where_each_op_was_created_not_where_it_was_drained():
    entries = ddp_gloo_entries()
    # Step 0 ends after the first all_reduce, step 1 after the second; the drain comes later.
    part, recorder, _ = part_for(dump_json(entries), step_ends=[T0 + 6_000_000,
                                                                T0 + 12_000_000])
    part.drain()
    assert [(r.op, r.step) for r in recorder.writer.records] == [
        ("all_gather", 0), ("broadcast", 0), ("broadcast", 0), ("all_reduce", 0),
        ("broadcast", 1), ("broadcast", 1), ("all_reduce", 1), ("barrier", 2)]

    # Each step's first op, the hooks' included, for the capture watch: its creation time.
    created = {}
    for entry in sorted(entries, key=lambda e: e["record_id"]):
        step = sum(entry["time_created_ns"] > end for end in (T0 + 6_000_000, T0 + 12_000_000))
        created.setdefault(step, entry["time_created_ns"])
    assert list(part.first_issues) == sorted(created.items()) and len(created) == 3
    part.drain()
    assert len(part.first_issues) == 3  # nothing new, nothing noted twice


def test_step_records_count_native_ops_and_wait_for_the_drain_that_covers_them():
    part, _, _ = part_for(dump_json(ddp_gloo_entries()), step_ends=[T0 + 6_000_000],
                          now=T0 + 500_000_000)
    assert part.steps_known_until() == 0  # nothing drained yet: every step record waits
    part.drain()
    assert part.steps_known_until() == T0 + 500_000_000 - flight.SETTLE_NS
    step0 = schema.StepRecord(step=0, start_ns=T0, end_ns=T0 + 6_000_000, comm_ops=1,
                              comm_bytes=100)
    part.amend_step_record(step0)
    assert (step0.comm_ops, step0.comm_bytes) == (1 + 4, 100 + 16 + 48 + 440 + 440)


def test_an_overwritten_ring_is_counted_and_said_once(capsys):
    first = [gloo_entry(i, i + 1, "gloo:all_reduce", T0 + i, [[4]], ["Float"])
             for i in range(3)]
    later = [gloo_entry(i, i + 1, "gloo:all_reduce", T0 + i, [[4]], ["Float"])
             for i in range(10, 12)]
    latest = [gloo_entry(i, i + 1, "gloo:all_reduce", T0 + i, [[4]], ["Float"])
              for i in range(20, 21)]
    part, recorder, _ = part_for(dump_json(first), dump_json(later), dump_json(latest))
    part.drain()
    part.drain()
    part.drain()
    assert part.lost == 7 + 8
    assert part.run_end_fields() == {"native_ops_lost": 15}
    assert len(recorder.writer.records) == 6
    said = [line for line in capsys.readouterr().err.splitlines() if "overwritten" in line]
    assert len(said) == 1 and "7 ops" in said[0]


def test_an_op_in_flight_gets_its_issue_record_now_and_its_record_when_done():
    running = nccl_entry(0, 1, T0, state="started")
    done = nccl_entry(0, 1, T0, state="completed", duration_ms=2.0)
    part, recorder, _ = part_for(dump_json([running]), dump_json([done]))
    part.drain()
    assert len(recorder.timing.issues_writer.records) == 1
    assert recorder.writer.records == []
    part.drain()
    assert [(r.timing, r.duration_us) for r in recorder.writer.records] == [("cuda_event",
                                                                              2000.0)]
    assert len(recorder.timing.issues_writer.records) == 1


def test_the_last_drain_comes_at_the_scripts_end_and_stops_the_spans():
    part, recorder, _ = part_for(dump_json(ddp_gloo_entries()[:1]))
    part.on_script_end(clean=False, on_main=False)
    assert len(recorder.writer.records) == 1
    assert recorder.issue_spans is None


def test_pacing_keeps_the_ring_from_filling_and_dumps_cheap(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    part, _, _ = part_for(dump_json([]))
    part._pace(0.0002, 0)  # a cheap dump: every worker pass
    assert part.interval_s == flight.MIN_INTERVAL_S
    clock[0] += 1.0
    part._pace(0.002, 10)  # a 2 ms dump: no more often than every 0.8 s (0.25% of the time)
    assert part.interval_s == pytest.approx(0.8)
    clock[0] += 1.0
    part._pace(0.05, 0)  # a 50 ms dump: at most the longest interval
    assert part.interval_s == flight.MAX_INTERVAL_S
    clock[0] += 1.0
    part._pace(0.01, 2048)  # 2048 ops/s into a ring of 1024: drain within 0.25 s all the same
    assert part.interval_s == pytest.approx(0.25)


def test_the_ring_size_is_the_users_or_set_for_torch():
    environ = {}
    assert flight.buffer_size(environ) == flight.BUFFER_SIZE
    assert environ == {"TORCH_FR_BUFFER_SIZE": str(flight.BUFFER_SIZE)}
    assert flight.buffer_size({"TORCH_FR_BUFFER_SIZE": "64"}) == 64
    assert flight.buffer_size({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}) == 0


def test_nccl_timing_is_turned_on_unless_the_user_set_it():
    environ = {"MASTER_ADDR": "127.0.0.1"}
    assert flight.nccl_timing(environ) is True
    assert environ == {"MASTER_ADDR": "127.0.0.1", "TORCH_NCCL_ENABLE_TIMING": "1"}
    for name in ("TORCH_NCCL_ENABLE_TIMING", "NCCL_ENABLE_TIMING"):  # torch reads both
        for value, timed in (("0", False), ("1", True), ("true", True)):
            environ = {name: value}
            assert flight.nccl_timing(environ) is timed
            assert environ == {name: value}  # the user's value is kept, and nothing added
    # One hardware queue: timing events would keep NCCL from overlapping with compute.
    environ = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert flight.nccl_timing(environ) is False and "TORCH_NCCL_ENABLE_TIMING" not in environ
    environ = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "TORCH_NCCL_ENABLE_TIMING": "1"}
    assert flight.nccl_timing(environ) is True


def test_the_ranks_environment_gets_nccl_timing_when_the_part_starts(monkeypatch):
    # set first, so that monkeypatch removes what open_flight sets when the test ends
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "unset")
    monkeypatch.delenv("TORCH_NCCL_ENABLE_TIMING")
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "16")
    assert flight.open_flight(Setup(FakeRecorder())) is not None
    assert os.environ["TORCH_NCCL_ENABLE_TIMING"] == "1"
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "0")
    assert flight.open_flight(Setup(FakeRecorder())) is not None
    assert os.environ["TORCH_NCCL_ENABLE_TIMING"] == "0"


class Setup:
    """What open_flight uses of a tracer.session.part_registry.PartSetup."""

    def __init__(self, comms):
        self.comms, self.reported, self.added = comms, [], []

    def built(self, name):
        return self.comms if name == "comms" else None

    def report(self, name, message):
        self.reported.append((name, message))

    def track_step_ends(self):
        return collections.deque()

    def build(self, cls, *args):
        part = cls(*args)
        self.added.append(part)
        return part


def test_a_torch_without_the_dump_gets_one_line_and_no_part(monkeypatch):
    import torch._C._distributed_c10d as c10d_c
    monkeypatch.delattr(c10d_c, "_dump_fr_trace_json")
    setup = Setup(FakeRecorder())
    assert flight.open_flight(setup) is None
    assert len(setup.reported) == 1 and "no Flight Recorder dump" in setup.reported[0][1]
    assert setup.comms.issue_spans is None  # the hooks note nothing


def test_without_the_comms_part_there_is_no_flight_part_and_no_line():
    setup = Setup(None)
    assert flight.open_flight(setup) is None and setup.reported == []


def test_a_ring_size_of_0_keeps_it_off_with_one_line(monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "0")
    setup = Setup(FakeRecorder())
    assert flight.open_flight(setup) is None
    assert "TORCH_FR_BUFFER_SIZE=0" in setup.reported[0][1]


def test_the_part_reads_this_torchs_own_dump(monkeypatch):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "16")
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "0")
    recorder = FakeRecorder()
    part = flight.open_flight(Setup(recorder))
    # The ring is the process's: empty in a fresh one, or holding the ops of process groups
    # that earlier tests of this worker made; either way this torch's dump decodes.
    part.drain()
    assert part.drains == 1 and part.error is None
    assert all(r.source == "native" for r in recorder.writer.records)
    assert recorder.issue_spans is not None


def test_a_failing_dump_switches_the_part_off_and_the_spans_with_it(capsys):
    def broken():
        raise RuntimeError("dump failed")
    recorder = FakeRecorder()
    part = FlightRecorder(recorder, broken, collections.deque(), 1024)
    with pytest.raises(RuntimeError):
        part.drain()  # the session's guard catches it and fails the part
    part.fail("RuntimeError: dump failed; flight is off")
    assert part.failed and recorder.issue_spans is None and not recorder.flight_recorded
    assert "dump failed" in capsys.readouterr().err


def _all_reduces(first: int, count: int) -> bytes:
    """A ring holding `count` all-reduces from record_id `first` on, 1 ms apart."""
    return dump_json([gloo_entry(i, i + 1, "gloo:all_reduce", T0 + i * 1_000_000, [[110]],
                                 ["Float"]) for i in range(first, first + count)])


def test_the_training_thread_keeps_a_dump_when_the_workers_drain_is_overdue(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    # The ring holds 4 entries: the worker sees 0-3, then, coming late, only 8-11; the
    # training thread's dump in between holds 4-7.
    recorder = FakeRecorder()
    part = FlightRecorder(recorder, Dumps(_all_reduces(0, 4), _all_reduces(4, 4),
                                          _all_reduces(8, 4)), collections.deque(), 4,
                          clock_ns=lambda: T0 + 10**9)
    part.drain()  # 4 entries over the first interval (0.2 s): 20 a second, 3 in 0.15 s; no
    assert len(recorder.writer.records) == 4  # step ended before it: no rate a step
    clock[0] += 0.14
    part.on_step()
    assert part.overdue_dumps == 0
    clock[0] += 0.02
    part.on_step()  # overdue: the ring is dumped here, and nothing is written on this thread
    assert part.overdue_dumps == 1 and len(recorder.writer.records) == 4
    part.on_step()  # not overdue again until as long again
    assert part.overdue_dumps == 1
    part.drain()  # the worker reads the kept dump first: nothing lost
    assert [r.position for r in recorder.writer.records] == list(range(12))
    assert part.lost == 0
    part._pace(0.0, 10)  # a rate again, overdue at once
    clock[0] += 1000.0
    part._lock.acquire()  # the worker is draining: the step does not wait for it
    part.on_step()
    part._lock.release()
    assert part.overdue_dumps == 1


def test_the_training_thread_keeps_a_dump_after_the_steps_that_fill_the_ring(monkeypatch):
    monkeypatch.setattr(flight.time, "monotonic", lambda: 100.0)  # time stands still
    recorder = FakeRecorder()
    part = FlightRecorder(recorder, Dumps(_all_reduces(0, 4), _all_reduces(4, 6),
                                          _all_reduces(10, 8)), collections.deque(), 8,
                          clock_ns=lambda: T0 + 10**9)
    for _ in range(4):
        part.on_step()
    part.drain()  # 4 entries in 4 steps: 6 (3/4 of the ring) in 6 steps
    for _ in range(5):
        part.on_step()
    assert part.overdue_dumps == 0
    part.on_step()
    assert part.overdue_dumps == 1
    part.drain()  # the kept dump (4-9), then the worker's own (10-17): nothing lost
    assert [r.position for r in recorder.writer.records] == list(range(18))
    assert part.lost == 0


def test_the_rate_is_measured_over_the_time_since_the_last_drain(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(flight.time, "monotonic", lambda: clock[0])
    part, _, _ = part_for(dump_json([]))
    part._pace(0.0, 0)
    clock[0] += 2.0  # the worker came 2 s late: 1024 entries in 2 s, not in its 0.2 s
    part._pace(0.01, 1024)  # a 10 ms dump: every 2 s at most, and half the ring at 512 a
    assert part.interval_s == pytest.approx(1.0)  # second fills in 1 s (at 5120: 0.2 s)

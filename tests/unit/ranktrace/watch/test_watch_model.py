"""The live view's model (ranktrace.watch.model) on records made by hand: who is named and for
how long, the medians of the rows, the waits (a union, on rank 0's clock), the step a phase
begins at, captured windows, and how ranks end."""

from __future__ import annotations

import random

import pytest

from ranktrace.watch.model import CaptureWindow, RankEnded, RunModel
from ranktrace.watch.phases import PhaseChange
from ranktrace.watch.tail import Batch
from tracer import schema

MS = 1_000_000
OFFSETS = {0: 0, 1: 2 * MS, 2: -1 * MS}  # each rank's clock minus rank 0's
SLOW_FROM = 20
STEPS = 200


def start(rank: int, world: int = 3) -> schema.RunStart:
    return schema.RunStart(schema_version=schema.SCHEMA_VERSION, run_name="hand-made",
                           rank=rank, local_rank=rank, world_size=world, host="h", pid=1,
                           start_ns=0, argv=[], script="s.py", script_args=[],
                           torch_version="x", config={})


def comm(step: int, position: int, issue_ns: int) -> schema.CommRecord:
    return schema.CommRecord(step=step, op="all_reduce", source="c10d", pg="0", pg_size=3,
                             dtype="float32", bytes=4096, start_ns=issue_ns,
                             end_ns=issue_ns + MS, duration_us=1000.0, timing="host",
                             algbw_gbps=1.0, busbw_gbps=1.0, position=position)


def step_records(first: int, last: int, jitter: random.Random):
    """Steps first..last of 3 ranks, on rank 0's clock: 10 ms steps, then 40 ms from
    SLOW_FROM; two all-reduces issued 5 and 8 ms into each step, rank 2's 30 ms late from
    SLOW_FROM. Before it, each arrival carries up to 6 ms of noise, so that the others wait
    for one rank or another by more than the 2 ms (a fifth of the step) a rank is named for."""
    steps, comms = {r: [] for r in OFFSETS}, {r: [] for r in OFFSETS}
    for step in range(first, last + 1):
        begin = SLOW_FROM * 10 * MS + (step - SLOW_FROM) * 40 * MS if step >= SLOW_FROM \
            else step * 10 * MS
        length = 40 * MS if step >= SLOW_FROM else 10 * MS
        for rank, offset in OFFSETS.items():
            late = 30 * MS if step >= SLOW_FROM and rank == 2 else 0
            for k, into in enumerate((5 * MS, 8 * MS)):
                noise = 0 if step >= SLOW_FROM else int(jitter.uniform(0, 6) * MS)
                comms[rank].append(comm(step, 2 * step + k, begin + into + late + noise + offset))
            steps[rank].append(schema.StepRecord(
                step=step, start_ns=begin + offset, end_ns=begin + length + offset,
                rss_bytes=(100 + rank) << 20, samples=64))
    return steps, comms


def batch(**kinds) -> Batch:
    made = Batch()
    for kind, by_rank in kinds.items():
        made.records[kind] = [(rank, records) for rank, records in by_rank.items()]
    return made


def manifests(world: int = 3):
    return {r: [start(r, world), schema.ClockSync(rank=r, offset_ns=o, uncertainty_ns=1000,
                                                  round_trips=8)] for r, o in OFFSETS.items()}


@pytest.fixture()
def model() -> RunModel:
    made = RunModel(recent_steps=20, window_s=2.0)
    made.take(batch(manifest=manifests()))
    return made


def test_a_clean_run_names_no_rank_and_no_phase(model):
    steps, comms = step_records(0, SLOW_FROM - 1, random.Random(0))
    model.take(batch(steps=steps, comms=comms))
    view = model.view()
    assert view.waited_for is None
    assert view.phases == []
    assert view.job_step_ms == pytest.approx(10.0)
    assert all(row.state == "running" for row in view.rows)
    # every late arrival is noise: 6 ms at most (so no clock offset shows as lateness)
    assert 2.0 < max(row.late_ms for row in view.rows) < 6.0
    assert min(row.wait_ms for row in view.rows) > 2.0


def test_the_late_rank_is_named_with_the_others_wait(model):
    steps, comms = step_records(0, STEPS, random.Random(0))
    model.take(batch(steps=steps, comms=comms))
    view = model.view()
    named = view.waited_for
    assert named.rank == 2
    # [5, 35) and [8, 38) ms into the step: waited once, 33 ms, not 30 + 30
    assert named.wait_ms == pytest.approx(33.0)
    # the steps of the last 2 s, 49-99 (the newest, 100, may not have settled)
    assert named.steps_last == named.steps == 51
    rows = {row.rank: row for row in view.rows}
    assert rows[0].wait_ms == rows[1].wait_ms == pytest.approx(33.0)
    assert rows[2].wait_ms == 0.0
    assert rows[2].late_ms == pytest.approx(30.0)
    assert rows[1].late_ms == 0.0  # rank 1's clock runs 2 ms ahead: taken off
    assert rows[0].wait_share == pytest.approx(33.0 / 40.0)
    assert rows[0].step_ms == rows[0].last_ms == pytest.approx(40.0)
    assert rows[0].step == STEPS
    assert rows[1].memory_bytes == 101 << 20 and rows[1].memory_kind == "RSS"
    assert rows[0].samples_per_s == pytest.approx(64 / 0.040)
    assert view.newest_step == STEPS


@pytest.mark.parametrize(("late_ms", "named"), [(1.0, False), (3.0, True)])
def test_a_rank_late_every_step_is_named_once_it_costs_a_fifth_of_the_step(model, late_ms,
                                                                            named):
    """Rank 1 issues every op `late_ms` after the others, in 10 ms steps."""
    steps, comms = {r: [] for r in OFFSETS}, {r: [] for r in OFFSETS}
    for n in range(1, 40):
        for rank, offset in OFFSETS.items():
            late = int(late_ms * MS) if rank == 1 else 0
            comms[rank].append(comm(n, n, n * 10 * MS + 5 * MS + late + offset))
            steps[rank].append(schema.StepRecord(step=n, start_ns=n * 10 * MS + offset,
                                                 end_ns=(n + 1) * 10 * MS + offset))
    model.take(batch(steps=steps, comms=comms))
    view = model.view()
    assert {row.rank: row.late_ms for row in view.rows} == {0: 0.0, 1: late_ms, 2: 0.0}
    if named:
        assert (view.waited_for.rank, view.waited_for.wait_ms) == (1, late_ms)
    else:
        assert view.waited_for is None


def test_in_slow_steps_a_late_rank_is_named_after_five_of_them(model):
    """5 s steps, rank 2 2 s late in each: the recent steps reach back 30 s at most, so it is
    named once 5 steps have settled (the newest left out), not 20."""
    named_at = None
    for n in range(1, 12):
        begin = n * 5000 * MS
        steps = {r: [schema.StepRecord(step=n, start_ns=begin + o, end_ns=begin + 5000 * MS + o)]
                 for r, o in OFFSETS.items()}
        comms = {r: [comm(n, n, begin + 100 * MS + (2000 * MS if r == 2 else 0) + o)]
                 for r, o in OFFSETS.items()}
        model.take(batch(steps=steps, comms=comms))
        named = model.view().waited_for
        if named is not None and named_at is None:
            named_at = n
            assert (named.rank, named.wait_ms, named.steps) == (2, 2000.0, 5)
    assert named_at == 6
    assert model.view().waited_for.steps == 7  # steps 4-10: 30 s of them


def test_a_pipelines_recv_waits_for_its_send_and_no_rank_is_named():
    """Rank 1 posts its recv 5 ms into each 40 ms step, rank 0 sends 30 ms in."""
    made = RunModel()
    made.take(batch(manifest={r: [start(r, world=2)] for r in (0, 1)}))
    steps, comms = {0: [], 1: []}, {0: [], 1: []}
    for n in range(1, 30):
        begin = n * 40 * MS
        for rank, (op, into) in enumerate((("send", 30), ("recv", 5))):
            record = comm(n, n - 1, begin + into * MS)
            record.op, record.peer, record.pg_size = op, 1 - rank, 2
            comms[rank].append(record)
            steps[rank].append(schema.StepRecord(step=n, start_ns=begin,
                                                 end_ns=begin + 40 * MS))
    made.take(batch(steps=steps, comms=comms))
    view = made.view()
    assert [(row.wait_ms, row.late_ms) for row in view.rows] == [(0.0, 0.0), (25.0, 0.0)]
    assert view.waited_for is None


def test_the_phase_begins_at_the_first_slow_step(model):
    steps, comms = step_records(0, STEPS, random.Random(0))
    model.take(batch(steps=steps, comms=comms))
    view = model.view()
    assert view.phases == [PhaseChange(step=SLOW_FROM, before_ms=10.0, after_ms=40.0)]
    assert view.series_steps == (1, STEPS)  # step 0, the set-up, is not a training step
    assert view.series_range == (10.0, 40.0)
    assert [e for e in model.drain_events() if isinstance(e, PhaseChange)] == view.phases


def test_the_phase_is_found_as_the_steps_come(model):
    """Fed a step at a time, the change is reported once the steps judged (the first 10 make
    the reference) span 5 s and 80% of them are slow: at step 142, 123 slow steps (4920 ms)
    and 9 fast ones (90 ms)."""
    steps, comms = step_records(0, STEPS, random.Random(0))
    found_at = None
    for step in range(STEPS + 1):
        model.take(batch(steps={r: [s[step]] for r, s in steps.items()},
                         comms={r: c[2 * step:2 * step + 2] for r, c in comms.items()}))
        if found_at is None and model.view().phases:
            found_at = step
    assert found_at == 142


def test_a_step_waits_for_the_slowest_running_rank(model):
    steps, _ = step_records(0, 30, random.Random(0))
    model.take(batch(steps={0: steps[0], 1: steps[1], 2: steps[2][:11]}))
    assert model.view().newest_step == 10  # rank 2 has ended step 10 only
    model.mark_gone(2, "its process 1 ended without run_end")
    view = model.view()
    assert view.newest_step == 30  # no longer waited for
    assert {row.rank: row.state for row in view.rows}[2] == "gone"
    assert RankEnded(2, "gone", None, "its process 1 ended without run_end") in \
        model.drain_events()


def test_captured_windows_and_the_end(model):
    record = schema.CaptureRecord(rank=0, t_ns=1, trigger="slow_step", trigger_step=22,
                                  first_step=25, steps=3, trigger_rank=2, ratio=4.0)
    missed = schema.CaptureRecord(rank=1, t_ns=1, trigger="slow_step", trigger_step=22,
                                  first_step=25, steps=3, trigger_rank=2, ratio=4.0,
                                  missed=True)
    asked = Batch()
    asked.requests.append(schema.CaptureRequest(trigger="on_demand", trigger_step=38,
                                                first_step=40, steps=2, t_ns=1, ask=0))
    model.take(asked)
    model.take(batch(manifest={0: [record], 1: [missed]}))
    view = model.view()
    assert view.captures == [
        CaptureWindow(25, 3, "slow_step", 2, 4.0, traced_ranks=1, missed_ranks=1),
        CaptureWindow(40, 2, "on_demand", None, None, traced_ranks=0, missed_ranks=0)]
    assert not view.ended
    ends = {r: [schema.RunEnd(rank=r, end_ns=1, status="ok" if r else "failed",
                              exit_code=0 if r else 1, steps=5, windows=0, samples=0,
                              comm_ops=0, bytes_written=0, errors=0,
                              exception=None if r else "ValueError: bad")] for r in OFFSETS}
    model.take(batch(manifest=ends))
    view = model.view()
    assert view.ended
    assert [row.state for row in view.rows] == ["failed", "ok", "ok"]
    assert RankEnded(0, "failed", 1, "ValueError: bad") in model.drain_events()


def test_a_rank_of_the_world_that_wrote_nothing_keeps_the_watch_going():
    made = RunModel()
    made.take(batch(manifest={0: [start(0, world=2)]}))
    made.take(batch(manifest={0: [schema.RunEnd(rank=0, end_ns=1, status="ok", exit_code=0,
                                                steps=1, windows=0, samples=0, comm_ops=0,
                                                bytes_written=0, errors=0)]}))
    assert made.missing_ranks() == [1]
    assert not made.ended()
    made.mark_gone(1, "wrote nothing")
    assert made.ended()


def test_a_newer_schema_is_named_and_its_records_left_out():
    made = RunModel()
    newer = start(0, world=1)
    newer.schema_version = schema.SCHEMA_VERSION + 1
    made.take(batch(manifest={0: [newer]},
                    steps={0: [schema.StepRecord(step=1, start_ns=0, end_ns=MS)]}))
    view = made.view()
    assert view.rows[0].state == "newer schema" and view.rows[0].step is None
    assert "newer than this watch reads" in view.problems[0]

"""Tests of tracer.comms in the pytest process (a 1-rank gloo group): patching and restoring,
compiled code, the recorder's fallbacks, user errors, CUDA-event bookkeeping with fake events,
the DDP hook options; and a crashed peer's error, traced and untraced."""

from __future__ import annotations

import re
import time

import pytest
import torch
import torch.distributed as dist

from helpers.comms_ranks import ListWriter, StepCounter, ToyNet
from helpers.launch import DDP, launch
from tracer.comms import CommsRecorder


# ---- single-process tests (1-rank gloo group in the pytest process) -----------------------------
@pytest.fixture
def recorder_factory(one_rank):
    made = []

    def make(step=lambda: 0, **kwargs):
        writer = ListWriter()
        recorder = CommsRecorder(writer, step, use_cuda=False, **kwargs)
        recorder.install()
        made.append(recorder)
        return recorder, writer

    yield make
    for recorder in made:
        recorder.uninstall()


def patched_attributes():
    # Not listed: dist.reduce_scatter_tensor, a deprecated alias that calls reduce_scatter_single
    # (recorded there); wrapping it would point its deprecation warning at the wrapper.
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.tensor._collective_utils as collective_utils
    from torch.nn.parallel import DistributedDataParallel as DDP
    c10d = dist.distributed_c10d
    owners = [(dist, n) for n in ("all_reduce", "all_gather", "broadcast", "isend", "irecv",
                                  "send", "recv", "batch_isend_irecv", "barrier",
                                  "all_to_all_single", "_register_comm_hook",
                                  "_broadcast_coalesced")]
    owners += [(c10d, n) for n in ("all_reduce", "isend", "irecv", "_coalescing_manager",
                                   "all_gather_single")]
    owners += [(collective_utils, "broadcast"), (collective_utils, "scatter")]
    owners += [(funcol, n) for n in ("all_reduce", "all_gather_single", "reduce_scatter_single",
                                     "wait_tensor")]
    owners += [(dist.Work, "wait"), (DDP, "__init__"), (DDP, "_register_builtin_comm_hook")]
    return {(id(owner), name): getattr(owner, name) for owner, name in owners}


def test_uninstall_restores_every_patched_attribute(one_rank):
    before = patched_attributes()
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False, ddp_bucket_hook=True)
    recorder.install()
    recorder.install()  # idempotent: a second install must not wrap the wrappers
    during = patched_attributes()
    changed = [key for key in before if during[key] is not before[key]]
    assert len(changed) == len(before), "every listed attribute is patched while installed"
    assert dist.all_reduce.__wrapped__ is before[(id(dist), "all_reduce")]
    recorder.uninstall()
    after = patched_attributes()
    assert all(after[key] is before[key] for key in before)
    assert recorder.error is None


def test_fsdp_constructors_alone_are_observed_and_put_back(one_rank):
    """FSDP imported before install: its two constructors are wrapped at once, no import hook is
    left behind, and uninstall puts the very same functions back."""
    import sys

    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    from tracer.comms.fsdp import AfterImport
    before = (FullyShardedDataParallel.__init__, FSDPParamGroup.__init__,
              FullyShardedDataParallel.forward, FSDPParamGroup.pre_forward)
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    recorder.install()
    try:
        assert FullyShardedDataParallel.__init__.__wrapped__ is before[0]
        assert FSDPParamGroup.__init__.__wrapped__ is before[1]
        assert (FullyShardedDataParallel.forward, FSDPParamGroup.pre_forward) == before[2:]
        assert not [f for f in sys.meta_path if isinstance(f, AfterImport)]
    finally:
        recorder.uninstall()
    assert (FullyShardedDataParallel.__init__, FSDPParamGroup.__init__) == before[:2]


def test_compiled_code_reaches_nothing_patched(one_rank):
    """Inductor's lowerings and compiled graphs hold the _c10d_functional ops: they stay torch's."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    ns = torch.ops._c10d_functional
    names = ("all_reduce", "all_reduce_", "all_gather_into_tensor", "reduce_scatter_tensor",
             "all_to_all_single", "broadcast", "wait_tensor")
    before = {name: getattr(ns, name) for name in names}
    forward = DDP.forward
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    recorder.install()
    try:
        assert all(type(getattr(ns, name)) is torch._ops.OpOverloadPacket for name in names)
        assert all(getattr(ns, name) is before[name] for name in names)
        assert DDP.forward is forward
    finally:
        recorder.uninstall()


def test_ops_work_and_are_recorded_with_step(recorder_factory):
    step = StepCounter()
    recorder, writer = recorder_factory(step)
    t = torch.arange(6, dtype=torch.float32)
    step.value = 5
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    recorder.drain(wait=True)
    assert t.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert [(r.op, r.bytes, r.step, r.async_op, r.pg_size) for r in writer.records] == [
        ("all_reduce", 24, 5, False, 1), ("all_reduce", 24, 5, True, 1)]
    assert recorder.ops == 2 and recorder.bytes == 48


def test_recorder_failure_falls_back_with_one_line(recorder_factory, capfd, monkeypatch):
    monkeypatch.setenv("RANK", "3")  # as under torchrun: the line names the rank

    def broken_step():
        raise RuntimeError("step counter exploded")

    recorder, writer = recorder_factory(broken_step)
    t = torch.full((4,), 3.0)
    dist.all_reduce(t)
    dist.all_reduce(t)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    recorder.drain(wait=True)
    assert t.tolist() == [3.0] * 4
    assert writer.records == [] and recorder.ops == 0
    assert "step counter exploded" in recorder.error
    lines = [line for line in capfd.readouterr().err.splitlines() if "ranktrace" in line]
    assert lines == [f"ranktrace: rank3 comms: {recorder.error}"]


def test_bug_inside_wrapper_falls_back_to_original(recorder_factory, capfd, monkeypatch):
    recorder, writer = recorder_factory()

    def broken_begin(*args, **kwargs):
        raise KeyError("bookkeeping bug")

    monkeypatch.setattr(recorder.timing, "begin", broken_begin)
    t = torch.ones(3)
    dist.broadcast(t, src=0)
    out = torch.empty(3)
    dist.all_gather_into_tensor(out, t)
    assert out.tolist() == [1.0, 1.0, 1.0]
    assert "bookkeeping bug" in recorder.error
    assert len([line for line in capfd.readouterr().err.splitlines() if "ranktrace" in line]) == 1


def test_user_errors_propagate_unchanged_and_are_not_recorder_errors(recorder_factory):
    def error_of(call):
        try:
            call()
        except Exception as exc:
            return type(exc), str(exc), type(exc.__context__)  # no recorder error chained in
        return None

    calls = [lambda: dist.all_reduce("not a tensor"), lambda: dist.broadcast(torch.ones(2), src=3)]
    without = [error_of(call) for call in calls]
    recorder, writer = recorder_factory()
    with_recorder = [error_of(call) for call in calls]
    assert all(e is not None for e in without)
    assert with_recorder == without
    assert recorder.error is None


def test_ddp_hook_failure_keeps_gradients_identical(recorder_factory, capfd):
    from torch.nn.parallel import DistributedDataParallel as DDP

    def run(recorder_step=None):
        if recorder_step is not None:
            recorder_factory(recorder_step, ddp_bucket_hook=True)
        torch.manual_seed(0)
        model = DDP(ToyNet())
        x = torch.randn(5, 13)
        for _ in range(2):
            model(x).pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    baseline = run()
    calls = {"n": 0}

    def step_that_fails_in_the_ddp_hook():
        calls["n"] += 1
        # The first call is DDP's initial broadcast; later ones are bucket all_reduces.
        if calls["n"] > 1:
            raise RuntimeError("late failure")
        return 0

    traced = run(step_that_fails_in_the_ddp_hook)
    assert all(torch.equal(a, b) for a, b in zip(baseline, traced))
    assert "late failure" in capfd.readouterr().err


def test_functional_collective_completes_at_wait_even_through_a_view(recorder_factory):
    import torch.distributed._functional_collectives as funcol
    recorder, writer = recorder_factory()
    group = dist.group.WORLD
    out = funcol.all_reduce(torch.ones(4, 6), "sum", group)
    view = out.view(24)        # AsyncCollectiveTensor re-wraps views without waiting
    total = float(view.sum())  # first real use waits
    recorder.drain()
    assert total == 24.0
    assert [(r.op, r.source, r.bytes, r.async_op) for r in writer.records] == [
        ("all_reduce", "functional", 96, True)]
    gathered = funcol.all_gather_tensor(torch.ones(3), 0, group)
    gathered.wait()
    recorder.drain()
    assert [(r.op, r.bytes) for r in writer.records[1:]] == [("all_gather", 12)]


def test_never_waited_functional_op_is_given_up_at_close_without_waiting(recorder_factory, capfd):
    import torch.distributed._functional_collectives as funcol
    recorder, writer = recorder_factory(wait_timeout_s=30.0)
    result = funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD)
    started = time.monotonic()
    recorder.drain(wait=True)
    waited = time.monotonic() - started
    assert writer.records == [] and recorder.ops == 0 and recorder.timing.dropped == 1
    assert waited < 30.0  # nothing to wait for: it must not sit out the timeout
    assert "1 ops never completed" in capfd.readouterr().err
    result.wait()


# ---- CUDA-event bookkeeping with fake events ----------------------------------------------------
class FakeEvent:
    """Stands in for torch.cuda.Event: the 'device' time is the host clock when record() ran."""

    created = 0
    ready = True

    def __init__(self):
        FakeEvent.created += 1
        self.t_ns = None
        self.streams = []

    def record(self, stream=None):
        self.t_ns = time.perf_counter_ns()
        self.streams.append(stream)

    def query(self):
        return FakeEvent.ready

    def elapsed_time(self, end):
        return (end.t_ns - self.t_ns) / 1e6


@pytest.fixture
def fake_events():
    FakeEvent.created = 0
    FakeEvent.ready = True
    yield FakeEvent
    FakeEvent.ready = True


def test_sync_op_is_timed_by_events_around_the_call(recorder_factory, fake_events):
    seen = []

    def factory():
        event = fake_events()
        seen.append(event)
        return event

    recorder, writer = recorder_factory(event_factory=factory)
    dist.all_reduce(torch.ones(5))
    recorder.drain()
    (record,) = writer.records
    start, end = seen
    assert record.timing == "cuda_event"
    # duration_us is whole ns over 1e3, as the events' times are read: within a ns of theirs
    assert record.duration_us == pytest.approx((end.t_ns - start.t_ns) / 1e3, abs=1.5e-3)
    assert record.end_ns - record.start_ns == int(record.duration_us * 1e3)
    assert record.algbw_gbps == pytest.approx(20 / (record.duration_us / 1e6) / 1e9)


def test_drain_never_blocks_on_unfinished_events(recorder_factory, fake_events):
    recorder, writer = recorder_factory(event_factory=fake_events)
    fake_events.ready = False
    dist.all_reduce(torch.ones(5))
    dist.all_reduce(torch.ones(5), async_op=True).wait()
    recorder.drain()
    assert writer.records == [] and recorder.ops == 2
    fake_events.ready = True
    recorder.drain()
    assert [r.async_op for r in writer.records] == [False, True]
    assert all(r.timing == "cuda_event" for r in writer.records)


def test_async_op_end_event_comes_from_the_future_callback(recorder_factory, fake_events):
    recorder, writer = recorder_factory(event_factory=fake_events)
    work = dist.all_reduce(torch.ones(3), async_op=True)
    work.get_future().wait()  # completion, without the workload calling work.wait()
    deadline = time.monotonic() + 10
    while not writer.records and time.monotonic() < deadline:
        recorder.drain()
    assert [(r.op, r.timing, r.async_op) for r in writer.records] == [
        ("all_reduce", "cuda_event", True)]


def test_drain_wait_gives_up_on_events_that_never_finish(recorder_factory, fake_events, capfd):
    recorder, writer = recorder_factory(event_factory=fake_events, wait_timeout_s=0.2)
    fake_events.ready = False
    dist.all_reduce(torch.ones(5))
    recorder.drain(wait=True)
    assert writer.records == [] and recorder.ops == 0 and recorder.timing.dropped == 1
    err = [line for line in capfd.readouterr().err.splitlines() if "ranktrace" in line]
    assert len(err) == 1 and "never completed" in err[0]
    assert recorder.error is None


def test_events_are_reused_once_resolved(recorder_factory, fake_events):
    recorder, writer = recorder_factory(event_factory=fake_events)
    for _ in range(50):
        dist.all_reduce(torch.ones(2))
        recorder.drain()
    assert len(writer.records) == 50
    assert fake_events.created <= 4


def functional_op(recorder, outputs):
    """What the functional-collective wrapper does for one op issued on `outputs`."""
    timing = recorder.timing
    pending = timing.begin("all_reduce", "functional", "0", 1, outputs[0],
                           sum(t.numel() * t.element_size() for t in outputs), True, None)
    timing.issued(pending)
    timing.await_functional(pending, outputs)
    return pending


def test_a_coalesced_functional_op_overwritten_before_its_wait_is_dropped_once():
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    outputs = [torch.zeros(2), torch.zeros(2)]  # 8 + 8 bytes
    functional_op(recorder, outputs)
    functional_op(recorder, outputs)  # in place on both outputs: the first op is lost, once
    assert (recorder.ops, recorder.bytes, recorder.timing.dropped) == (1, 16, 1)


def test_the_pending_cap_drops_an_op_with_all_its_outputs(monkeypatch):
    import tracer.comms.timing as timing

    monkeypatch.setattr(timing, "MAX_PENDING_FUNCTIONAL", 2)
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    first = [torch.zeros(1), torch.zeros(1)]
    functional_op(recorder, first)
    functional_op(recorder, [torch.zeros(1)])  # 3 outputs pending: the first op goes, whole
    assert (recorder.ops, recorder.timing.dropped) == (1, 1)
    assert len(recorder.timing.functional_pending) == 1
    monkeypatch.setattr(timing, "MAX_PENDING_FUNCTIONAL", 10)
    functional_op(recorder, first)  # reusing its storage finds nothing left to drop
    assert (recorder.ops, recorder.timing.dropped) == (2, 1)


def test_default_registers_no_ddp_comm_hook(recorder_factory):
    """DDP's C++ reducer reduces its buckets itself: seen in profiler windows, not recorded."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    recorder, writer = recorder_factory()
    assert recorder.ddp_buckets == "profiler windows"
    model = DDP(ToyNet())
    model(torch.randn(5, 13)).pow(2).sum().backward()
    recorder.drain(wait=True)
    assert model._get_ddp_logging_data().get("comm_hook", "") == ""
    assert [(r.op, r.source) for r in writer.records] == [("broadcast", "ddp")]  # initial sync


def test_bucket_hook_comes_from_the_config_only(one_rank, monkeypatch):
    """The tracer's options read RANKTRACE_DDP_BUCKET_HOOK; the recorder takes what they say."""
    monkeypatch.setenv("RANKTRACE_DDP_BUCKET_HOOK", "1")
    assert CommsRecorder(ListWriter(), lambda: 0, use_cuda=False).ddp_buckets == (
        "profiler windows")
    assert CommsRecorder(ListWriter(), lambda: 0, use_cuda=False,
                         ddp_bucket_hook=True).ddp_buckets == "comm hook"


def test_recorder_is_a_part_that_fails_once_and_tells_the_session(one_rank, capfd):
    from tracer.parts.part import Part
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    told = []
    recorder.on_failure, recorder.rank = told.append, 2
    assert isinstance(recorder, Part) and recorder.name == "comms"
    recorder.start()
    assert recorder.active
    try:
        assert recorder.fail("drain", RuntimeError("boom"))
        assert not recorder.fail("a later failure the session saw")
    finally:
        recorder.close()
    assert not recorder.active and told == [recorder]
    assert recorder.error == "drain failed (RuntimeError: boom); comms recording is off"
    lines = [line for line in capfd.readouterr().err.splitlines() if "ranktrace" in line]
    assert lines == [f"ranktrace: rank2 comms: {recorder.error}"]



# ---- a rank crashes: the other rank's error is the one it would print untraced ------------------
def rank_error(folder, traced: bool) -> list[str]:
    """Rank 0's traceback and error line when rank 1 exits at step 3 of workloads/ddp.py."""
    # --monitor-interval: torchrun stops rank 0 at its first check after rank 1 exits, which
    # falls anywhere in the interval; rank 0 must have printed its error by then. At 5 s, on
    # the 2-core CI machine with another test session beside it, the untraced run once lost
    # the race.
    result = launch(DDP, "--hidden", "16", "--layers", "2", "--batch-size", "8", "--steps", "4",
                    "--crash", "1:3", "--pg-timeout-s", "30", nproc=2,
                    torchrun=["--monitor-interval", "10"],
                    tracer=["--out", folder] if traced else None, timeout=300)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.startswith("[rank0]:")]
    assert any("Traceback" in line for line in lines), result.stderr
    # gloo says "Connection closed by peer" or "Read error ... Connection reset by peer", as the
    # socket's end was seen, with the peer's port: the text after gloo's source line varies.
    return [re.sub(r"(tcp/pair\.cc):\d+\] .*", r"\1] <gloo transport error>", line)
            for line in lines]


def test_a_crashed_peer_gives_the_same_error_traced_and_untraced(tmp_path):
    untraced = rank_error(tmp_path, traced=False)
    assert untraced[-1].startswith("[rank0]: RuntimeError: [") and "gloo" in untraced[-1], untraced
    assert any("loss.backward()" in line for line in untraced)  # a bucket all-reduce failed
    assert rank_error(tmp_path, traced=True) == untraced

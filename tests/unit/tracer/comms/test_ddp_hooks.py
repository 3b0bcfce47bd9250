"""DDP under the recorder (tracer.comms.ddp) on a 1-rank gloo group: the construction broadcast,
a user's comm hook labelled "ddp", and with --ddp-bucket-hook a timing hook that reduces each
bucket exactly as DDP's reducer does, handing its slot over to a hook the script registers."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from helpers.comms_ranks import ListWriter, ToyNet
from tracer.comms import CommsRecorder
from tracer.comms.ddp import LabelledDdpHook, ddp_default_hook, python_twin
from tracer.comms.patching import thread

TOYNET_BYTES = 4 * (13 * 31 + 31 + 31 * 17 + 17 + 17 * 5 + 5)  # every parameter, float32


def ops(recorder):
    recorder.drain(wait=True)
    return [(r.op, r.source, r.bytes) for r in recorder.writer.records]


def train(model, steps=2):
    torch.manual_seed(1)
    x = torch.randn(5, 13)
    for _ in range(steps):
        model(x).pow(2).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.fixture
def bucket_hook_recorder(one_rank):
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False, ddp_bucket_hook=True)
    recorder.install()
    yield recorder
    recorder.uninstall()


def test_ddps_construction_broadcast_is_one_ddp_op_of_every_parameter(recorder):
    DDP(ToyNet())
    assert ops(recorder) == [("broadcast", "ddp", TOYNET_BYTES)]
    assert recorder.ddp_buckets == "profiler windows"


def test_a_users_comm_hook_issues_ops_labelled_ddp(recorder):
    model = DDP(ToyNet())
    model.register_comm_hook(dist.group.WORLD, default_hooks.allreduce_hook)
    train(model, steps=1)
    buckets = ops(recorder)[1:]
    assert {(op, source) for op, source, _ in buckets} == {("all_reduce", "ddp")}
    assert sum(nbytes for *_, nbytes in buckets) == TOYNET_BYTES


def test_the_bucket_hook_times_each_bucket_and_leaves_the_gradients_as_ddps(one_rank):
    torch.manual_seed(0)
    untraced = train(DDP(ToyNet()))
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False, ddp_bucket_hook=True)
    recorder.install()
    try:
        torch.manual_seed(0)
        model = DDP(ToyNet())
        traced = train(model)
        assert model.reducer in recorder.ddp.default_reductions
        recorder.drain(wait=True)
    finally:
        recorder.uninstall()
    assert all(torch.equal(a, b) for a, b in zip(untraced, traced))
    assert recorder.ddp_buckets == "comm hook"
    buckets = [r for r in recorder.writer.records if r.op == "all_reduce"]
    assert {(r.source, r.async_op) for r in buckets} == {("ddp", True)}
    assert sum(r.bytes for r in buckets) == 2 * TOYNET_BYTES  # two steps


def test_a_hook_the_script_registers_takes_the_bucket_hooks_slot(bucket_hook_recorder):
    calls = []

    def users_hook(state, bucket):
        calls.append((state, thread.source))
        return default_hooks.allreduce_hook(None, bucket)

    model = DDP(ToyNet())
    model.register_comm_hook("the script's state", users_hook)
    default = bucket_hook_recorder.ddp.default_reductions[model.reducer]
    assert isinstance(default.user_hook, LabelledDdpHook) and default.user_hook.hook is users_hook
    assert default.user_state == "the script's state"
    train(model, steps=1)
    assert calls and all(call == ("the script's state", "ddp") for call in calls)


def test_the_bucket_hook_reduces_per_parameter_only_for_gradients_as_bucket_views(
        bucket_hook_recorder):
    plain = DDP(ToyNet())
    views = DDP(ToyNet(), gradient_as_bucket_view=True)
    reductions = bucket_hook_recorder.ddp.default_reductions
    assert reductions[plain.reducer].mode == "multiply"
    per_parameter = reductions[views.reducer]
    assert per_parameter.mode == "per_parameter" and len(per_parameter.probe_handles) == 6
    train(views, steps=1)
    # each gradient's address is noted after accumulation, before the bucket is reduced
    assert set(per_parameter.grad_addresses) == {id(p) for p in views.module.parameters()}


def test_a_labelled_hook_sets_the_source_for_its_own_call_only():
    seen = []

    def hook(state, bucket):
        seen.append(thread.source)
        raise RuntimeError(state)

    labelled = LabelledDdpHook(hook)
    assert labelled.__wrapped__ is hook
    with pytest.raises(RuntimeError, match="its error"):
        labelled("its error", None)
    assert seen == ["ddp"] and thread.source is None


def test_ddps_built_in_hooks_have_their_python_twins():
    assert python_twin(dist.BuiltinCommHookType.ALLREDUCE) is default_hooks.allreduce_hook
    assert python_twin(dist.BuiltinCommHookType.FP16_COMPRESS) is (
        default_hooks.fp16_compress_hook)


# ---- the default reduction's arithmetic, on a bucket of 3 ranks -----------------------------
class Bucket:
    def __init__(self, buffer, gradients, parameters):
        self._buffer, self._gradients, self._parameters = buffer, gradients, parameters

    def buffer(self):
        return self._buffer

    def gradients(self):
        return self._gradients

    def parameters(self):
        return self._parameters


class Reduction:
    """A DdpDefaultReduction's fields, for a group of 3 ranks."""

    def __init__(self, mode, grad_addresses=None):
        self.mode, self.user_hook, self.user_state = mode, None, None
        self.grad_addresses = grad_addresses or {}
        self.process_group = type("Group", (), {"size": staticmethod(lambda: 3)})()


@pytest.fixture
def all_reduced(monkeypatch):
    """dist.distributed_c10d.all_reduce replaced: each call's buffer and source noted."""
    calls = []

    class Work:
        def __init__(self, buffer):
            self.future = torch.futures.Future()
            self.future.set_result([buffer])

        def get_future(self):
            return self.future

    def all_reduce(buffer, group=None, async_op=False):
        calls.append((buffer.clone(), thread.source, async_op))
        return Work(buffer)

    monkeypatch.setattr(dist.distributed_c10d, "all_reduce", all_reduce)
    return calls


VALUES = torch.tensor([0.1, 0.7, 1.3, 2.9, 5.5, 11.1, 0.3, 7.7])


def test_the_default_reduction_divides_or_multiplies_as_ddps_reducer_does(all_reduced):
    divided, multiplied = VALUES / 3, VALUES * (1.0 / 3)
    assert not torch.equal(divided, multiplied)  # so that the mode matters bit for bit
    for mode, expected in (("divide", divided), ("multiply", multiplied)):
        buffer = VALUES.clone()
        future = ddp_default_hook(Reduction(mode), Bucket(buffer, [], []))
        assert torch.equal(future.wait(), expected)
        assert torch.equal(all_reduced[-1][0], expected) and all_reduced[-1][1:] == ("ddp", True)
    assert thread.source is None


def test_per_parameter_gradients_are_divided_where_they_were_views_of_the_bucket(all_reduced):
    buffer = VALUES.clone()
    views = [buffer[:4], buffer[4:]]
    first, second = torch.nn.Parameter(torch.ones(4)), torch.nn.Parameter(torch.ones(4))
    # only the first parameter's gradient was a view of the bucket (its address is inside)
    reduction = Reduction("per_parameter", {id(first): buffer.data_ptr(), id(second): -1})
    ddp_default_hook(reduction, Bucket(buffer, views, [first, second])).wait()
    assert torch.equal(buffer[:4], VALUES[:4] / 3)
    assert torch.equal(buffer[4:], VALUES[4:] * (1.0 / 3))


def test_a_hook_registered_after_ours_runs_in_its_place(all_reduced):
    reduction = Reduction("multiply")
    reduction.user_state, reduction.user_hook = "state", lambda state, bucket: (state, bucket)
    bucket = Bucket(VALUES.clone(), [], [])
    assert ddp_default_hook(reduction, bucket) == ("state", bucket)
    assert all_reduced == [] and torch.equal(bucket.buffer(), VALUES)

"""The functional collectives under the recorder (tracer.comms.functional) on a 1-rank gloo
group: each recorded once it is waited on, gathered payloads counted n times, meta tensors and
collectives traced into a graph never recorded, torch's own ops never replaced."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from helpers.comms_ranks import ListWriter
from tracer.comms import CommsRecorder
from tracer.comms.functional import FUNCTIONAL_SPECS


def records(recorder):
    recorder.drain(wait=True)
    return [(r.op, r.source, r.bytes, r.pg_size, r.async_op) for r in recorder.writer.records]


def test_a_functional_collective_is_recorded_when_it_is_waited_on(recorder):
    result = funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD)
    recorder.drain()
    assert recorder.writer.records == []  # issued, not yet waited on
    assert funcol.wait_tensor(result).tolist() == [1.0] * 4
    assert records(recorder) == [("all_reduce", "functional", 16, 1, True)]
    [record] = recorder.writer.records
    assert record.timing == "host" and record.start_ns <= record.end_ns


def test_a_gathered_payload_counts_once_per_rank_of_the_group(recorder):
    group_name = dist.group.WORLD.group_name
    recorder.functional._pg_name_sizes[group_name] = 4  # as if the group had 4 ranks
    funcol.all_gather_single(torch.ones(3), 0, dist.group.WORLD).wait()
    funcol.reduce_scatter_single(torch.ones(8), "sum", 0, dist.group.WORLD).wait()
    assert records(recorder) == [("all_gather", "functional", 48, 4, True),
                                 ("reduce_scatter", "functional", 32, 4, True)]


def test_a_group_size_is_asked_once_per_group_name(recorder, monkeypatch):
    asked = []
    monkeypatch.setattr(dist.distributed_c10d, "_get_group_size_by_name",
                        lambda name: asked.append(name) or 2)
    hooks = recorder.functional
    assert hooks._group("a group") == ("a group", 2)
    assert hooks._group("a group") == ("a group", 2)
    assert hooks._group(dist.group.WORLD) == (dist.group.WORLD.group_name, 2)
    assert asked == ["a group", dist.group.WORLD.group_name]


def test_meta_tensors_move_no_data_and_are_not_recorded(recorder):
    result = funcol.all_reduce(torch.ones(4, device="meta"), "sum", dist.group.WORLD)
    assert result.device.type == "meta"
    assert records(recorder) == [] and recorder.ops == 0


def test_a_collective_run_while_a_graph_is_traced_is_counted_not_recorded(recorder,
                                                                           monkeypatch):
    monkeypatch.setattr(recorder.functional, "_are_we_tracing", lambda: True)
    funcol.all_reduce(torch.ones(2), "sum", dist.group.WORLD).wait()
    assert records(recorder) == []
    assert recorder.functional.compiled_collectives == 1


def test_the_python_functions_are_wrapped_and_put_back_and_torchs_ops_never(one_rank):
    names = [n for n in (*FUNCTIONAL_SPECS, "wait_tensor") if hasattr(funcol, n)]
    before = {name: getattr(funcol, name) for name in names}
    op = torch.ops._c10d_functional.all_reduce
    recorder = CommsRecorder(ListWriter(), lambda: 0, use_cuda=False)
    recorder.install()
    try:
        assert all(getattr(funcol, n) is not before[n] for n in names)
        assert all(getattr(funcol, n).__wrapped__ is before[n] for n in names)
        assert torch.ops._c10d_functional.all_reduce is op
    finally:
        recorder.uninstall()
    assert all(getattr(funcol, n) is before[n] for n in names)

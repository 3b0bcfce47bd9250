"""What the per-rank reduction keeps of a rank for the late-rank cause tests and a straggler's
evidence (analysis.rank.step_evidence), on events worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

from analysis.core.frames import events_frame, steps_frame
from analysis.rank.step_evidence import host_op_spans, step_evidence

LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
SHAPES = "[[[64, 512], [512, 512]]]"  # op_args: the Input Dims first


def _rank():
    rows = [  # name, cat, ts, dur, op_args, is_gpu, is_comm
        ("ProfilerStep#1", "user_annotation", 0, 1000, None, False, False),
        ("aten::addmm", "cpu_op", 100, 50, SHAPES, False, False),
        ("aten::addmm", "cpu_op", 200, 50, SHAPES, False, False),
        ("aten::addmm", "cpu_op", 300, 70, SHAPES, False, False),
        (LOADER, "user_annotation", 500, 200, None, False, False),
        ("aten::mm", "cpu_op", 550, 20, "[[[2, 2], [2, 2]]]", False, False),  # data loading
        ("ProfilerStep#2", "user_annotation", 1000, 1000, None, False, False),
        ("aten::addmm", "cpu_op", 1100, 50, SHAPES, False, False),
        ("sgemm_128x64", "kernel", 1200, 30, None, True, False),
        ("gloo:all_reduce", "cpu_op", 1500, 100, None, False, True),
    ]
    columns = dict(zip(["name", "cat", "ts_ns", "dur_ns", "op_args", "is_gpu", "is_comm"],
                       map(list, zip(*rows))))
    events = events_frame({**columns, "pid": [1] * len(rows), "tid": [1] * len(rows)})
    return SimpleNamespace(rank=3, events=events, steps=steps_frame([1, 2], [0, 1000],
                                                                    [1000, 2000]))


def test_compute_ops_are_counted_by_step_shape_and_time_and_given_back_one_row_each():
    evidence = step_evidence(_rank())
    dims = "[[64, 512], [512, 512]]"
    assert evidence.op_counts.astype({"name": object, "dims": object}).to_dict("records") == [
        {"step": 1, "name": "aten::addmm", "dims": dims, "device": False, "dur_ns": 50, "count": 2},
        {"step": 1, "name": "aten::addmm", "dims": dims, "device": False, "dur_ns": 70, "count": 1},
        {"step": 2, "name": "aten::addmm", "dims": dims, "device": False, "dur_ns": 50, "count": 1},
        {"step": 2, "name": "sgemm_128x64", "dims": "", "device": True, "dur_ns": 30,
         "count": 1}]
    ops = evidence.compute_ops()
    assert ops.columns.tolist() == ["rank", "step", "name", "dims", "dur_ns", "device"]
    assert ops[["step", "dur_ns"]].to_numpy().tolist() == [[1, 50], [1, 50], [1, 70], [2, 50],
                                                          [2, 30]]
    assert set(ops["rank"]) == {3} and ops["device"].tolist() == [False] * 4 + [True]


def test_host_time_per_step_counts_loading_and_comm_calls_but_not_the_step_span():
    evidence = step_evidence(_rank())
    # Step 1: ops cover 50 + 50 + 70 + 200 (the loader, the mm inside it) of 1000 ns; step 2:
    # the addmm and the comm call, 50 + 100 (a kernel is no host time).
    assert evidence.host.to_dict("records") == [
        {"rank": 3, "step": 1, "step_ns": 1000, "loading_ns": 200, "outside_ns": 630},
        {"rank": 3, "step": 2, "step_ns": 1000, "loading_ns": 0, "outside_ns": 850}]
    assert evidence.names[["step", "name", "dur_ns"]].to_numpy().tolist() == [
        [1, "aten::addmm", 170], [1, "aten::mm", 20], [1, LOADER, 200], [2, "aten::addmm", 50]]


def test_host_spans_hold_every_host_op_but_the_step_spans_and_move_to_the_ops_clock():
    spans = host_op_spans(_rank())
    assert spans.ops["name"].astype(str).tolist() == [
        "aten::addmm", "aten::addmm", "aten::addmm", LOADER, "aten::mm", "aten::addmm",
        "gloo:all_reduce"]
    assert (spans.first_ns, spans.last_ns) == (0, 2000)
    moved = spans.moved(100)
    assert moved.ops["ts_ns"].tolist() == [0, 100, 200, 400, 450, 1000, 1400]
    assert moved.ops["end_ns"].tolist() == [50, 150, 270, 600, 470, 1050, 1500]
    assert (moved.first_ns, moved.last_ns) == (-100, 1900)


def test_a_rank_without_steps_has_no_step_evidence():
    rank = _rank()
    assert step_evidence(SimpleNamespace(rank=3, events=rank.events,
                                         steps=steps_frame())) is None

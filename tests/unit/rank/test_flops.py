"""FLOPs per op and per step (analysis.rank.flops, .op_model): ops profiled here against
torch.utils.flop_counter's count of the same calls, nesting, the profiler's own `flops`, steps,
foreign traces, and MFU's lost points on a step of known parts."""

import gzip
import json
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

from analysis.core.frames import steps_frame
from analysis.crossrank.waits import split_communication
from analysis.ingest.op_args import read_ops
from analysis.rank import flops
from analysis.rank.op_model import COMPUTE_KINDS, op_model
from analysis.report.values import records
from helpers.launch import DATA


def _counted_flops(table: pd.DataFrame) -> float:
    compute = table[table["counted"] & table["kind"].isin(COMPUTE_KINDS)]
    assert compute["flops"].notna().all(), compute[compute["flops"].isna()]
    return float(compute["flops"].sum())


def _profiled(tmp_path, work, **options) -> pd.DataFrame:
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, **options) as prof:
        work()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return flops.op_flops(read_ops([path]))


def _reference(work) -> int:
    with FlopCounterMode(display=False) as counter:
        work()
    return counter.get_total_flops()


def _ones(*shape, grad=False):
    return torch.ones(*shape, requires_grad=grad)


WORKS = {
    "mm": lambda: torch.mm(_ones(16, 32), _ones(32, 8)),
    "addmm": lambda: torch.addmm(_ones(8), _ones(16, 32), _ones(32, 8)),
    "bmm": lambda: torch.bmm(_ones(3, 16, 32), _ones(3, 32, 8)),
    "baddbmm": lambda: torch.baddbmm(_ones(3, 16, 8), _ones(3, 16, 32), _ones(3, 32, 8)),
    "matmul broadcast": lambda: torch.matmul(_ones(2, 3, 16, 32), _ones(32, 8)),
    "matmul vector": lambda: torch.matmul(_ones(32), _ones(32, 8)),
    "linear 3-D with bias": lambda: F.linear(_ones(2, 5, 32), _ones(8, 32), _ones(8)),
    "linear backward": lambda: F.linear(_ones(4, 32, grad=True), _ones(8, 32, grad=True))
    .sum().backward(),
    "conv2d strided grouped": lambda: F.conv2d(_ones(2, 4, 9, 9), _ones(6, 2, 3, 3), stride=2,
                                               padding=1, groups=2),
    "conv2d dilated backward": lambda: F.conv2d(_ones(1, 3, 12, 12, grad=True),
                                                _ones(4, 3, 3, 3, grad=True), dilation=2)
    .sum().backward(),
    "conv1d": lambda: F.conv1d(_ones(2, 3, 20), _ones(5, 3, 4), stride=3),
    "conv_transpose2d": lambda: F.conv_transpose2d(_ones(1, 4, 5, 5), _ones(4, 3, 3, 3),
                                                   stride=2),
}
Q, K = (2, 4, 16, 8), (2, 4, 24, 8)


def _attention(grad: bool):
    out = F.scaled_dot_product_attention(_ones(*Q, grad=grad), _ones(*K, grad=grad),
                                         _ones(*K, grad=grad))
    if grad:
        out.sum().backward()


@pytest.mark.parametrize("name", list(WORKS))
def test_flops_from_recorded_shapes_are_flop_counter_modes(tmp_path, name):
    work = WORKS[name]
    assert _counted_flops(_profiled(tmp_path, work)) == _reference(work)


def test_attention_flops_are_flop_counters_formulas(tmp_path):
    # FlopCounterMode registers no CPU flash attention op: its own formulas are the reference.
    forward = flop_counter.sdpa_flop_count(Q, K, K)
    assert _counted_flops(_profiled(tmp_path, lambda: _attention(False))) == forward
    backward = flop_counter.sdpa_backward_flop_count(Q, Q, K, K)
    assert _counted_flops(_profiled(tmp_path, lambda: _attention(True))) == forward + backward


def _ops(rows) -> pd.DataFrame:
    """An ops frame as read_ops gives it: (name, tid, ts_ns, end_ns, dims, types[, flops])."""
    frame = pd.DataFrame({
        "name": [r[0] for r in rows], "tid": [r[1] for r in rows],
        "ts_ns": [r[2] for r in rows], "end_ns": [r[3] for r in rows],
        "flops": [r[6] if len(r) > 6 else math.nan for r in rows],
        "input_dims": pd.Series([r[4] for r in rows], dtype=object),
        "input_type": pd.Series([r[5] for r in rows], dtype=object),
        "concrete_inputs": pd.Series([None] * len(rows), dtype=object)})
    return frame.sort_values(["tid", "ts_ns"], kind="stable", ignore_index=True)


FLOAT2 = ["float", "float"]


def test_nested_gemms_are_counted_once_at_the_innermost_and_a_copy_inside_does_not_hide_one():
    ops = _ops([
        ("aten::linear", "1", 0, 100, [[4, 8], [2, 8], []], ["float", "float", ""]),
        ("aten::matmul", "1", 10, 90, [[4, 8], [8, 2]], FLOAT2),
        ("aten::mm", "1", 20, 80, [[4, 8], [8, 2]], FLOAT2),
        ("aten::addmm", "2", 0, 50, [[2], [4, 8], [8, 2], [], []], ["float"] * 3),
        ("aten::copy_", "2", 10, 20, [[4, 2], [4, 2], []], ["float", "float", "Scalar"]),
    ])
    table = flops.op_flops(ops)
    counted = dict(zip(table["name"], table["counted"]))
    assert counted == {"aten::linear": False, "aten::matmul": False, "aten::mm": True,
                       "aten::addmm": True, "aten::copy_": True}
    assert _counted_flops(table) == 2 * (2 * 4 * 8 * 2)


def test_an_op_starting_with_the_one_nested_in_it_is_read_before_it(tmp_path):
    mm = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 5, "tid": 1,
          "pid": 1, "args": {"Input Dims": [[4, 8], [8, 2]], "Input type": FLOAT2}}
    matmul = {**mm, "name": "aten::matmul", "dur": 9}
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [mm, matmul]}))  # the child written first
    table = flops.op_flops(read_ops([path]))
    assert table["name"].tolist() == ["aten::matmul", "aten::mm"]
    assert table["counted"].tolist() == [False, True]


def test_the_profilers_own_flops_argument_is_used_where_the_trace_has_it():
    ops = _ops([("aten::mm", "1", 0, 10, [[4, 8], [8, 2]], FLOAT2, 1000.0),
                ("aten::mm", "1", 20, 30, [[4, 8], [8, 2]], FLOAT2)])
    table = flops.op_flops(ops)
    assert table["flops"].tolist() == [1000.0, 128.0]
    assert table["flops_from"].tolist() == ["profiler", "shapes"]


def test_a_gemms_bytes_are_its_operands_and_output():
    kind, count, nbytes = op_model("aten::mm", [[4, 8], [8, 2]], FLOAT2)
    assert (kind, count, nbytes) == ("gemm", 128.0, (32 + 16 + 8) * 4.0)
    kind, count, nbytes = op_model("aten::add", [[4, 8], [8], []], ["c10::BFloat16"] * 2 + [""])
    assert (kind, count, nbytes) == ("memory", 32.0, (32 + 8 + 32) * 2.0)
    assert op_model("aten::view", [[4, 8], []], ["float", "ScalarList"])[0] is None


def test_ops_are_given_the_step_whose_span_holds_their_start_and_summed_per_step():
    ops = _ops([("aten::mm", "1", 5, 10, [[4, 8], [8, 2]], FLOAT2),
                ("aten::mm", "1", 105, 110, [[4, 8], [8, 4]], FLOAT2),
                ("aten::mm", "1", 120, 130, [[2, 8], [8, 4]], ["c10::BFloat16"] * 2),
                ("aten::mm", "1", 300, 310, [[4, 8], [8, 2]], FLOAT2)])
    table = flops.op_flops(ops, steps_frame([3, 4], [0, 100], [100, 200]))
    assert table["step"].tolist() == [3, 4, 4, -1]
    assert table["in_step"].tolist() == [True, True, True, False]
    per_step = flops.step_flops(table, rank=0)
    assert per_step["step"].tolist() == [3, 4]
    assert per_step["flops_per_step"].tolist() == [128.0, 256.0 + 128.0]
    assert per_step["dtype"].tolist() == ["fp32", "fp32"]


def test_a_synthetic_trace_file_is_read_with_its_shapes_and_flops(tmp_path):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::bmm", "ts": 1.5, "dur": 2, "tid": 7,
         "pid": 1, "args": {"Input Dims": [[2, 3, 4], [2, 4, 5]], "Input type": FLOAT2}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 2, "tid": 7,
         "pid": 1, "args": {"Input Dims": [[3, 4], [4, 5]], "flops": 999}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 11, "dur": 1, "tid": 7, "pid": 0},
    ]
    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as out:
        json.dump({"traceEvents": events}, out)
    ops = read_ops([path])
    assert ops["name"].tolist() == ["aten::bmm", "aten::mm"]
    assert ops["ts_ns"].tolist() == [1500, 10000] and ops["end_ns"].tolist() == [3500, 12000]
    assert _counted_flops(flops.op_flops(ops)) == 2 * 2 * 3 * 4 * 5 + 999


def test_the_amd_trace_of_the_hta_samples_carries_shapes_for_its_gemms():
    path = DATA / "hta" / "amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    table = flops.op_flops(read_ops([path]))
    compute = table[table["counted"] & table["kind"].isin(COMPUTE_KINDS)]
    assert sorted(compute["name"]) == ["aten::addmm", "aten::mm"]
    # addmm [5, 128] x [128, 128] and mm [128, 5] x [5, 128]
    assert _counted_flops(table) == 2 * 5 * 128 * 128 * 2


def test_old_traces_without_concrete_inputs_leave_their_convolutions_uncounted():
    path = DATA / "kineto" / "resnet50_num_workers_0" / "worker0.1623143089861.pt.trace.json.gz"
    table = flops.op_flops(read_ops([path]))
    convs = table[table["counted"] & (table["kind"] == "conv")]
    assert len(convs) > 0 and convs["flops"].isna().all()  # stride and padding not recorded
    gemms = table[table["counted"] & (table["kind"] == "gemm")]
    assert len(gemms) > 0 and gemms["flops"].notna().all()


def _step(waits=None, **parts):
    """One profiled step of known parts, its communication split by `waits`
    (split_communication, as analysis.run gives the mfu table)."""
    row = {"rank": 0, "step": 1, "compute_only_ns": 0, "comm_only_ns": 0, "overlap_ns": 0,
           "memcpy_ns": 0, "idle_ns": 0}
    row.update(parts)
    row["step_ns"] = sum(row[c] for c in ("compute_only_ns", "comm_only_ns", "overlap_ns",
                                          "memcpy_ns", "idle_ns"))
    return split_communication(pd.DataFrame([row]), waits)


def _step_flops(value, rank=0):
    return pd.DataFrame({"rank": [rank], "step": [1], "flops_per_step": [value],
                         "dtype": ["fp32"], "memory_bytes": [0.0], "ops_without_shapes": [0]})


def test_mfu_and_its_lost_points_on_a_step_of_known_parts():
    waits = pd.DataFrame({"rank": [0], "step": [1], "wait_for_peers_ms": [0.2]})
    per_step = _step(waits, compute_only_ns=400_000, overlap_ns=100_000, comm_only_ns=300_000,
                     memcpy_ns=50_000, idle_ns=150_000)
    row = flops.mfu_table(_step_flops(2.5e8), per_step, {0: (1.0, "option")}).iloc[0]
    assert row["achieved_tflops"] == pytest.approx(0.25)  # 2.5e8 FLOP in 1 ms
    assert row["mfu_pct"] == pytest.approx(25.0)
    assert row["lost_waiting_pts"] == pytest.approx(20.0)
    assert row["lost_transfer_pts"] == pytest.approx(15.0)  # 0.1 ms exposed transfer + 0.05 copy
    assert row["lost_idle_pts"] == pytest.approx(15.0)
    assert row["lost_compute_pts"] == pytest.approx(25.0)  # 0.5 ms computing for 0.25 ideal
    total = row[flops.LOST_COLUMNS].sum()
    assert total == pytest.approx(100.0 - row["mfu_pct"], abs=1e-12)


def test_waiting_is_the_splits_bounded_by_the_exposed_communication_and_no_peak_gives_no_mfu():
    waits = pd.DataFrame({"rank": [0], "step": [1], "wait_for_peers_ms": [5.0]})
    per_step = _step(waits, compute_only_ns=600, comm_only_ns=100, idle_ns=300)
    row = flops.mfu_table(_step_flops(300.0), per_step, {0: (1e-3, "measured")}).iloc[0]
    assert row["lost_waiting_pts"] == pytest.approx(10.0) and row["lost_transfer_pts"] == 0
    assert row["mfu_pct"] == pytest.approx(30.0)  # 300 FLOP at 1 GFLOP/s: 300 ns of 1000
    assert row["lost_compute_pts"] == pytest.approx(30.0)
    none = flops.mfu_table(_step_flops(300.0), _step(None, compute_only_ns=600,
                                                     comm_only_ns=100, idle_ns=300), {})
    assert math.isnan(none["mfu_pct"].iloc[0])
    assert none["achieved_tflops"].iloc[0] == pytest.approx(0.3e-3)
    record = records(none)[0]
    assert list(record) == flops.MFU_COLUMNS
    assert record["mfu_pct"] is None and record["peak_source"] is None
    assert record["rank"] == 0 and record["step_ns"] == 1000 and type(record["step_ns"]) is int
    json.dumps(record, allow_nan=False)


def test_without_waits_nothing_is_waiting_and_a_step_without_a_modelled_op_has_no_flops():
    per_step = pd.concat([_step(None, compute_only_ns=600, comm_only_ns=400),
                          _step(None, compute_only_ns=1000).assign(step=2)], ignore_index=True)
    table = flops.mfu_table(_step_flops(500.0), per_step, {0: (1e-3, "option")})
    assert table["step"].tolist() == [1, 2]
    assert table["lost_waiting_pts"].tolist() == [0.0, 0.0]
    assert table["lost_transfer_pts"].tolist() == pytest.approx([40.0, 0.0])
    assert table["flops_per_step"].tolist() == [500.0, 0.0]
    assert table["mfu_pct"].tolist() == pytest.approx([50.0, 0.0])
    assert table["lost_compute_pts"].tolist() == pytest.approx([10.0, 100.0])


def test_a_rank_whose_compute_ops_lack_shapes_has_no_flops_and_no_mfu():
    ops = _ops([("aten::mm", "1", 5, 10, None, None), ("aten::add", "1", 20, 30, None, None)])
    per_step = flops.step_flops(flops.op_flops(ops, steps_frame([1], [0], [100])), rank=0)
    assert per_step["ops_without_shapes"].tolist() == [1]
    assert math.isnan(per_step["flops_per_step"].iloc[0])
    row = flops.mfu_table(per_step, _step(None, compute_only_ns=100), {0: (1.0, "option")})
    assert math.isnan(row["flops_per_step"].iloc[0]) and math.isnan(row["mfu_pct"].iloc[0])
    assert row["ops_without_shapes"].tolist() == [1]


def test_the_mean_per_rank_keeps_the_lost_points_adding_up():
    per_step = pd.concat([_step(None, compute_only_ns=600, comm_only_ns=400),
                          _step(None, compute_only_ns=900, idle_ns=100).assign(step=2)],
                         ignore_index=True)
    flops_of = pd.concat([_step_flops(500.0), _step_flops(200.0).assign(step=2)])
    by_rank = flops.mfu_per_rank(flops.mfu_table(flops_of, per_step, {0: (1e-3, "option")}))
    row = by_rank.iloc[0]
    assert (row["rank"], row["steps"], row["peak_source"]) == (0, 2, "option")
    assert row["mfu_pct"] == pytest.approx(35.0) and row["flops_per_step"] == 350.0
    assert row[flops.LOST_COLUMNS].sum() == pytest.approx(100.0 - row["mfu_pct"])


class _Start:
    def __init__(self, **fields):
        self.__dict__.update(fields)


class _Trace:
    def __init__(self, start):
        self.records = None if start is None else type("R", (), {"manifest": [start]})()


def test_a_ranks_peak_from_the_option_its_run_start_or_the_datasheet():
    RunStart = type("RunStart", (_Start,), {})
    measured = _Trace(RunStart(peak_tflops=0.5, peak_source="measured", device_name=None))
    h100 = _Trace(RunStart(peak_tflops=None, device_name="NVIDIA H100 80GB HBM3"))
    assert flops.rank_peak(measured, "fp32") == (0.5, "measured")
    assert flops.rank_peak(measured, "fp32", peak_tflops=2.0) == (2.0, "option")
    assert flops.rank_peak(h100, "bf16") == (989.4, "datasheet: H100 SXM")
    assert flops.rank_peak(h100, "fp32") == (67.0, "datasheet: H100 SXM")
    assert flops.rank_peak(h100, "fp32", tf32=True) == (494.7, "datasheet: H100 SXM")
    assert flops.rank_peak(_Trace(None), "fp32") == (None, None)

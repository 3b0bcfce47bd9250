"""Each counted op against the roofline (analysis.rank.roofline): rates, intensity and bound of
ops with known FLOPs, bytes and times, host or device."""

import math

import pandas as pd
import pytest

from analysis.core.frames import events_frame
from analysis.rank import roofline


def _table(rows):
    """op_flops rows: (name, kind, tid, ts_ns, end_ns, flops, bytes, counted)."""
    return pd.DataFrame({
        "name": [r[0] for r in rows], "kind": [r[1] for r in rows], "dtype": "fp32",
        "tid": [r[2] for r in rows], "ts_ns": [r[3] for r in rows],
        "end_ns": [r[4] for r in rows], "flops": [r[5] for r in rows],
        "bytes": [r[6] for r in rows], "counted": [r[7] for r in rows], "step": 1})


OPS = _table([
    ("aten::mm", "gemm", "1", 0, 1000, 2e6, 1e4, True),  # 2 TFLOP/s, 10 GB/s, intensity 200
    ("aten::add", "memory", "1", 2000, 4000, 1e3, 1.2e4, True),  # 6 GB/s, intensity 1/12
    ("aten::linear", "gemm", "1", 0, 1500, 2e6, 1e4, False),  # not counted
])


def test_host_times_give_rates_intensity_and_the_bound_against_the_ridge():
    table = roofline.op_roofline(OPS, peak_tflops=100.0, peak_gbps=1000.0)
    assert table["name"].tolist() == ["aten::mm", "aten::add"]
    assert table["time_from"].tolist() == ["host", "host"]
    assert table["achieved_tflops"].tolist() == pytest.approx([2.0, 0.5e-3])
    assert table["achieved_gbps"].tolist() == pytest.approx([10.0, 6.0])
    assert table["intensity"].tolist() == pytest.approx([200.0, 1 / 12])
    assert table["ridge"].tolist() == [100.0, 100.0]  # 100e12 FLOP/s over 1e12 B/s
    assert table["bound"].tolist() == ["compute", "memory"]
    assert table["roofline_tflops"].tolist() == pytest.approx([100.0, 1000.0 / 12 / 1e3])
    assert table["pct_of_roofline"].tolist() == pytest.approx([2.0, 0.6])


def test_without_a_bandwidth_there_is_no_bound_and_the_roof_is_the_peak():
    table = roofline.op_roofline(OPS, peak_tflops=4.0, peak_gbps=None)
    assert table["bound"].tolist() == [None, None] and math.isnan(table["ridge"].iloc[0])
    assert table["pct_of_roofline"].iloc[0] == pytest.approx(50.0)


def test_kernels_launched_inside_an_op_give_its_device_time():
    events = events_frame({
        "name": ["cudaLaunchKernel", "gemm_kernel", "cudaLaunchKernel", "add_kernel",
                 "cudaLaunchKernel", "stray_kernel"],
        "cat": ["cuda_runtime", "kernel", "cuda_runtime", "kernel", "cuda_runtime", "kernel"],
        "ts_ns": [100, 5000, 2100, 9000, 7000, 9500], "dur_ns": [10, 400, 10, 300, 10, 50],
        "pid": ["1", "0", "1", "0", "1", "0"], "tid": ["1", "7", "1", "7", "1", "7"],
        "correlation": [11, 11, 12, 12, 13, 13],
        "is_gpu": [False, True, False, True, False, True]})
    table = roofline.op_roofline(OPS, peak_tflops=100.0, peak_gbps=1000.0, events=events)
    assert table["time_from"].tolist() == ["device", "device"]
    assert table["time_ns"].tolist() == [400, 300]  # the launch at 7000 is in no op
    assert table["achieved_tflops"].tolist() == pytest.approx([5.0, 1e3 / 300e-9 / 1e12])


def test_ops_summed_by_name_slowest_first():
    table = roofline.roofline_by_op(roofline.op_roofline(pd.concat([OPS, OPS]), 100.0, 1000.0))
    assert table["name"].tolist() == ["aten::add", "aten::mm"]
    assert table["calls"].tolist() == [2, 2] and table["time_ns"].tolist() == [4000, 2000]
    assert table["achieved_tflops"].tolist() == pytest.approx([0.5e-3, 2.0])


def test_a_sum_of_ops_is_judged_by_the_same_arithmetic_as_one_op():
    ops = roofline.op_roofline(OPS, peak_tflops=100.0, peak_gbps=1000.0)
    by_op = roofline.roofline_by_op(ops)
    assert "ridge" not in by_op.columns  # no peak needed to sum
    judged = roofline.with_roofline(by_op, 100.0, 1000.0).set_index("name")
    for op in ops.itertuples():
        for column in ("achieved_tflops", "intensity", "ridge", "roofline_tflops",
                       "pct_of_roofline", "bound"):
            assert judged.loc[op.name, column] == pytest.approx(getattr(op, column)), column
    assert judged.loc["aten::mm", "peak_gbps"] == 1000.0
    unknown = roofline.with_roofline(by_op, None, None)
    assert unknown["roofline_tflops"].isna().all() and unknown["bound"].isna().all()


def test_an_op_timed_on_the_device_and_on_the_host_sums_both_and_says_so():
    mm = roofline.op_roofline(OPS, 100.0, 1000.0).iloc[[0]]
    ops = pd.concat([mm.assign(time_from="device"), mm.assign(time_from="host")])
    table = roofline.roofline_by_op(ops)
    assert table["time_from"].tolist() == ["device+host"]
    assert table["calls"].tolist() == [2] and table["time_ns"].tolist() == [2000]

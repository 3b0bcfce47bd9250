"""The communication tables' fast paths (categorical names, NumPy flag and time columns) give
what their general paths give (object names, nullable columns), on hand-built ranks with known
answers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis.core import intervals
from analysis.rank import hta, issuers
from analysis.rank import summary as rank_summary
from analysis.rank.comm import enclosing
from analysis.rank.comm import ops as communication

MS = 1_000_000  # ns


def host_event(name, ts_ms, dur_ms, *, collective=None) -> dict:
    return {"name": name, "cat": "cpu_op", "ts_ns": int(ts_ms * MS), "dur_ns": int(dur_ms * MS),
            "pid": "1", "tid": "1", "is_gpu": False,
            "is_comm": name in ("record_param_comms", "nccl:all_reduce"),
            "collective": collective}


def kernel(name, ts_ms, dur_ms) -> dict:
    return {"name": name, "cat": "kernel", "ts_ns": int(ts_ms * MS), "dur_ns": int(dur_ms * MS),
            "pid": "0", "tid": "7", "is_gpu": True, "is_comm": name.startswith("nccl"),
            "collective": None}


def as_general(events: pd.DataFrame) -> pd.DataFrame:
    """The same events with object names and categories, object flags (a missing one among
    them) and nullable integer times: the columns the general paths read."""
    general = events.astype({"name": object, "cat": object, "pid": object, "tid": object,
                             "is_gpu": object, "is_comm": object, "ts_ns": "Int64",
                             "dur_ns": "Int64"})
    general.loc[general["is_gpu"] == False, "is_gpu"] = None  # noqa: E712  (missing: host)
    if "correlation" in general.columns:
        general["correlation"] = general["correlation"].astype("Int64")
    return general


def as_fast(events: pd.DataFrame, categories=object) -> pd.DataFrame:
    """Categorical text columns (with object categories, as the trace reader gives them) and
    NumPy flags."""
    text = ("name", "cat", "pid", "tid")
    return events.astype({
        **{c: pd.CategoricalDtype(pd.Index(events[c].dropna().unique(), dtype=categories))
           for c in text},
        "is_gpu": bool, "is_comm": bool})


def variants(events: pd.DataFrame) -> list[pd.DataFrame]:
    """The events as the fast paths read them, as the general ones do, and with pandas' own
    text categories (general paths for categoricals)."""
    return [as_fast(events), as_general(events), as_fast(events, categories="str")]


def rank(events: pd.DataFrame, steps=None) -> SimpleNamespace:
    spans = None if steps is None else pd.DataFrame(steps, columns=["step", "start_ns", "end_ns"])
    return SimpleNamespace(rank=0, events=events, steps=spans, all_steps=spans)


def ddp_rank(forwards_reduced: list[bool], steps: int = 1) -> pd.DataFrame:
    """DDP forwards 10 ms apart, each followed by a gradient all-reduce (named by the call's
    collective, or by the op's own name) or not, and an unrelated kernel."""
    rows = []
    for i, reduced in enumerate(forwards_reduced):
        rows.append(host_event("DistributedDataParallel.forward", i * 10, 3))
        if reduced:
            rows.append(host_event("record_param_comms", i * 10 + 6, 0.1, collective="allreduce")
                        if i % 2 else host_event("nccl:all_reduce", i * 10 + 6, 0.1))
        rows.append(kernel("ncclKernel_AllReduce_RING_LL_Sum_float", i * 10 + 7, 1))
    return pd.DataFrame(rows)


@pytest.mark.parametrize(("reduced", "steps", "verdict"), [
    ([True, True, True, True], 1, issuers.ACCUMULATING_WITHOUT_NO_SYNC),
    ([False, False, False, True], 1, issuers.NO_SYNC_USED),
    ([True, True, True, False], 1, issuers.ACCUMULATING_WITHOUT_NO_SYNC),  # last one cut off
    ([True, True], 2, issuers.NO_ACCUMULATION),
    ([False, False], 1, None),
])
def test_ddp_accumulation_is_the_same_on_fast_and_general_columns(reduced, steps, verdict):
    events = ddp_rank(reduced)
    span = len(reduced) * 10 // steps
    step_spans = [(s, s * span * MS, (s + 1) * span * MS) for s in range(steps)]
    for columns in variants(events):
        assert issuers.ddp_accumulation([rank(columns, step_spans)]) == verdict


def test_issuers_of_ops_are_the_same_on_fast_and_general_columns():
    events = pd.DataFrame([
        host_event("FSDP::all_gather", 0, 10),
        host_event("DistributedDataParallel.forward", 20, 10),
        host_event("aten::mm", 40, 5),
        kernel("ncclKernel_AllGather_RING_LL_Sum_float", 5, 1),
        # A marker's name on the device is no marker, even on the host thread's ids.
        {**kernel("FullyShardedDataParallel._pre_forward", 60, 5), "pid": "1", "tid": "1"},
    ])
    op = np.array(["all_gather", "all_reduce", "all_reduce", "send", "broadcast", "broadcast",
                   "all_gather", "all_to_all"], dtype=object)
    host_ts = np.array([5, 25, 42, 50, 61, 62, 5, 2], dtype="float64") * MS
    host_tid = ["1", "1", "1", "1", "1", "1", "2", "1"]
    named = np.array([True, True, True, True, True, False, True, True])
    expected = ["fsdp2", "ddp", "ddp", "p2p", "c10d", "unknown", "fsdp2", "fsdp2"]
    for columns in variants(events):
        found = issuers.issuers_of_ops(rank(columns), op, host_ts, ["1"] * len(op), host_tid,
                                       named)
        assert found.tolist() == expected


@pytest.mark.parametrize("correlation", [
    np.array([-1, 5, 6, 7, 5, 6, 7, 8, -1, 9], dtype=np.int64),  # compact ids: the table
    np.array([-1, 5, 6, 7 << 40, 5, 6, 7 << 40, 8, -1, 9], dtype=np.int64),  # sparse: np.isin
    np.array([-1, 5, 6, 7, 5, 6, 7, 8, np.nan, 9], dtype=np.float64),  # not integers: np.isin
])
def test_device_events_launched_by_kept_host_events_are_np_isin(correlation):
    host = np.array([True, True, False, True, False, False, False, False, True, False])
    device = ~host
    found = hta._launched_by(correlation, host, device)
    assert found.tolist() == np.isin(correlation, np.unique(correlation[host])).tolist()
    # Ids 5 and 7<<40 or 7 were launched by kept host events, 6, 8 and 9 were not.
    assert (found & device).tolist() == [False, False, False, False, True, False, True, False,
                                         False, False]
    nothing = np.zeros(len(host), dtype=bool)
    assert not hta._launched_by(correlation, nothing, device).any()


@pytest.mark.parametrize("name", [
    "ampere_sgemm_32x128_nt", "ncclKernel_AllReduce_RING_LL_Sum_float", "ncclDevKernel_SendRecv",
    "nccl_no_kernel_word", "Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "dma_copy",
    "cudaDeviceSynchronize", "Event Sync", "void copy<Memcpy>(int)", "MemsetLater", "xMemset",
    "first line\\nSync after a newline", "first line\nSync after a newline",
    "nccl\nKernel", "void at::native::vectorized_elementwise_kernel<4>(int)", "",
])
def test_hta_is_compute_is_hta_patterns_rule(name):
    assert hta.hta_is_compute(name) == hta._compute_by_patterns(name)


def comm_rank(with_kernels: bool) -> pd.DataFrame:
    rows = [host_event("record_param_comms", 0, 1, collective="allreduce"),
            host_event("aten::mm", 2, 1), host_event("nccl:all_reduce", 3, 1)]
    if with_kernels:
        rows += [kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1, 2), kernel("gemm", 4, 1),
                 kernel("ncclKernel_Broadcast_RING_LL_Sum_float", 5, 1)]
    events = pd.DataFrame(rows)
    events["end_ns"] = events["ts_ns"] + events["dur_ns"]
    events["stream"] = np.where(events["is_gpu"], 7, -1)
    events["correlation"] = -1
    events["in_nelems"] = [float(i) if i % 2 else np.nan for i in range(len(events))]
    events["pg_name"] = pd.array(["0"] * len(events), dtype="string")  # an extension column
    return events


@pytest.mark.parametrize("with_kernels", [True, False])
def test_comm_events_summary_is_the_frame_selection(with_kernels):
    for events in variants(comm_rank(with_kernels)):
        comm = events[events["is_comm"].astype(bool)]
        kernels = comm["is_gpu"].astype(bool)
        if kernels.any():
            comm = comm[kernels]
        expected = comm[[c for c in rank_summary.OP_EVENT_COLUMNS if c in comm.columns]]
        expected = expected.astype({c: object for c, dtype in expected.dtypes.items()
                                    if isinstance(dtype, pd.CategoricalDtype)})
        found = rank_summary._comm_events(rank(events))
        pd.testing.assert_frame_equal(found, expected, check_exact=True)
        assert found["name"].dtype == object
        assert found["name"].tolist() == (
            ["ncclKernel_AllReduce_RING_LL_Sum_float", "ncclKernel_Broadcast_RING_LL_Sum_float"]
            if with_kernels else ["record_param_comms", "nccl:all_reduce"])


def launched(events: list[dict], correlation: int, launch_ms: float) -> list[dict]:
    """The events with a runtime launch (at `launch_ms` on the host thread) of the kernel with
    that correlation id."""
    launch = {**host_event("cudaLaunchKernel", launch_ms, 0.01), "cat": "cuda_runtime",
              "correlation": correlation}
    return [*events, launch]


def test_comm_ops_from_events_are_the_same_on_fast_and_general_columns():
    call = {**host_event("record_param_comms", 1, 2, collective="allreduce"),
            "in_nelems": 1024.0, "out_nelems": 1024.0, "comm_dtype": "Float", "group_size": 2.0,
            "pg_name": "0", "pg_desc": "default_pg"}
    rows = [call, {**kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5, 0.5),
                   "correlation": 11},
            # A kernel whose launch is under no call: sized by nothing, named by its own name.
            {**kernel("ncclDevKernel_Broadcast_RING_LL", 9, 0.25), "correlation": 12},
            host_event("aten::mm", 7, 1)]
    rows = launched(launched(rows, 11, 1.5), 12, 7.5)
    events = pd.DataFrame(rows)
    events["correlation"] = events["correlation"].fillna(-1).astype("int64")
    for column in ("in_nelems", "out_nelems", "group_size"):
        events[column] = events[column].astype("float64")
    events["stream"] = np.where(events["is_gpu"], 7, -1)
    found = [communication.comm_ops(rank(columns)) for columns in variants(events)]
    for other in found[1:]:
        pd.testing.assert_frame_equal(found[0], other, check_exact=True)
    ops = found[0]
    assert ops["op"].tolist() == ["all_reduce", "broadcast"]
    assert ops["bytes"].tolist()[0] == 4096.0 and np.isnan(ops["bytes"].tolist()[1])
    assert ops["duration_us"].tolist() == [500.0, 250.0]
    assert ops["pg_desc"].tolist() == ["default_pg", None]
    assert ops["issuer"].tolist() == ["c10d", "unknown"]


@pytest.mark.parametrize("values", [
    [5.0, np.nan, 1.0, 5.0, -0.0, 0.0, np.nan, 1.0],  # NaN last, ties in their order
    [5, 3, 1, 5, 0, 0, 9, 1],
    ["b", None, "a", "b", "a", "c", None, "a"],  # objects: pandas' own sort
])
@pytest.mark.parametrize("kept", [None, [True, True, False, True, True, False, True, True]])
def test_sorted_positions_are_the_stable_sort_of_pandas(values, kept):
    sort_ts = pd.Series(values, dtype=object if "a" in values else None)
    kept = None if kept is None else np.array(kept)
    expected = (sort_ts[kept] if kept is not None else sort_ts).sort_values(kind="stable").index
    assert enclosing.sorted_positions(sort_ts, kept).tolist() == expected.tolist()


@pytest.mark.parametrize("numbers", ["int64", "float64", "Int64"])
def test_ops_outside_the_selected_steps_go(numbers):
    spans = pd.DataFrame({"step": pd.array([1, 2, 3], dtype=numbers), "start_ns": [0, 10, 20],
                          "end_ns": [10, 20, 30]})
    host_ts = pd.Series([5, 15, 25, 35, np.nan, -1])
    step, kept = enclosing.steps_kept(host_ts, spans[spans["step"] != 2], spans)
    assert step.tolist() == [1, 2, 3, pd.NA, pd.NA, pd.NA]
    assert kept.tolist() == [True, False, True, True, True, True]


@pytest.mark.parametrize("values", [
    pd.Series([3, -1, 7], dtype="int64"), pd.Series([3, None, 7], dtype="Int64"),
    pd.Series([2.5, np.nan, 3.5]), pd.Series(["4", None, 5], dtype=object),
])
def test_int64_columns_are_the_rounded_integers(values):
    expected = pd.to_numeric(values, errors="coerce").round().astype("Int64").array
    found = communication._int64(values)
    pd.testing.assert_extension_array_equal(found, expected)
    assert found is not values.array  # a copy: the ops table owns its columns


def test_merged_kernels_in_the_shared_start_order_are_hta_merged():
    # Ties in start, negative-length intervals (HTA's rounding), and two nested subsets.
    ts = np.array([5.0, 1.0, 3.0, 1.0, 9.0, 3.0, 7.0, 2.0])
    end = np.array([6.0, 4.0, 2.5, 2.0, 12.0, 8.0, 7.5, 2.0])
    among = np.array([True, True, True, True, True, True, False, True])
    masks = hta._NameMasks(pd.Series(["k"] * len(ts)), set())
    by_start = masks.by_start(ts, among)
    for rows in (among, among & (ts != 3.0), np.array([0, 0, 1, 1, 0, 1, 0, 0], dtype=bool)):
        assert hta._merged(ts, end, rows, by_start) == intervals.hta_merged(ts[rows], end[rows])
    # 1-4, 1-2, 2-2, 3-2.5, 3-8 and 5-6 join into 1-8 (7 us busy), 9-12 apart (3 us).
    assert hta._merged(ts, end, among, by_start) == (10.0, 1.0, 12.0)


@pytest.mark.parametrize("starts", [[30, 10, 20, 10], [30.0, np.nan, 20.0, 10.0],
                                    pd.array([30, None, 20, 10], dtype="Int64")])
def test_step_spans_by_start_are_sort_values(starts):
    steps = pd.DataFrame({"step": [3, 1, 2, 0], "start_ns": starts, "end_ns": [35, 15, 25, 12]})
    spans = steps.sort_values("start_ns")
    expected = (spans["start_ns"].to_numpy(dtype="float64"),
                spans["end_ns"].to_numpy(dtype="float64"))
    found = issuers._spans_by_start(steps)
    np.testing.assert_array_equal(found[0], expected[0])
    np.testing.assert_array_equal(found[1], expected[1])

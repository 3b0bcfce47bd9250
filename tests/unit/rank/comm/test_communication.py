"""analysis.rank.comm.comm_ops: op names, nccl-tests sizes, bandwidths, joins, the collectives
table."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.core.comm_names import (
    UNKNOWN_OP,
    canonical_dtype,
    canonical_op,
    dtype_size,
    message_bytes,
)
from analysis.rank.comm.comm_ops import (
    COLLECTIVES_COLUMNS,
    OPS_COLUMNS,
    collectives_table,
    comm_ops,
    size_bucket,
)
from helpers.comm_events import event, events_frame, make_trace, records_with, steps_frame
from tracer import schema


# ---- names and sizes -----------------------------------------------------------------------------
@pytest.mark.parametrize("name, op", [
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"),
    ("allreduce_coalesced", "all_reduce"),
    ("c10d::allreduce_", "all_reduce"), ("nccl:all_reduce", "all_reduce"),
    ("gloo:all_reduce", "all_reduce"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
     "all_reduce"),
    ("_allgather_base", "all_gather"), ("allgather", "all_gather"),
    ("allgather_into_tensor_coalesced", "all_gather"), ("nccl:_all_gather_base", "all_gather"),
    ("ncclDevKernel_AllGather_RING_LL", "all_gather"),
    ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
    ("_reduce_scatter_base", "reduce_scatter"),
    ("c10d::reduce_scatter_", "reduce_scatter"), ("reduce", "reduce"), ("_reduce_oop", "reduce"),
    ("broadcast", "broadcast"), ("_broadcast_oop", "broadcast"), ("all_to_all", "all_to_all"),
    ("alltoall_base", "all_to_all"), ("c10d::alltoall_base_", "all_to_all"),
    ("gather", "gather"), ("scatter", "scatter"), ("send", "send"), ("c10d::send", "send"),
    ("recv", "recv"), ("recvAnySource", "recv"), ("c10d::recv_", "recv"), ("barrier", "barrier"),
    ("gloo:barrier", "barrier"),
    ("wait", None), ("coalesced", None), ("ncclDevKernel_SendRecv", None),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", None),
    ("aten::mm", None), ("", None), (None, None),
])
def test_torch_names_map_to_schema_ops(name, op):
    assert canonical_op(name) == op
    assert op is None or op in schema.COMM_OPS


@pytest.mark.parametrize("name, dtype, size", [
    ("Float", "float32", 4), ("BFloat16", "bfloat16", 2), ("Half", "float16", 2),
    ("Long", "int64", 8), ("Byte", "uint8", 1), ("Double", "float64", 8),
    ("float32", "float32", 4), ("torch.bfloat16", "bfloat16", 2), ("float", "float32", 4),
    ("c10::BFloat16", "bfloat16", 2), ("c10::Half", "float16", 2), ("long int", "int64", 8),
    ("int", "int32", 4), ("unsigned char", "uint8", 1), ("Float8_e4m3fn", "float8_e4m3fn", 1),
    ("nonsense", None, None), (None, None, None),
])
def test_dtype_spellings_and_sizes(name, dtype, size):
    assert canonical_dtype(name) == dtype
    assert dtype_size(name) == size


def test_all_gather_counts_the_output_and_reduce_scatter_the_input():
    # 4 ranks, 1000 float32 per rank: the gathered output and the scattered input are 4000.
    assert message_bytes("all_gather", 1000, 4000, 4, 4) == 16000
    assert message_bytes("all_gather", 1000, None, 4, 4) == 16000
    assert message_bytes("reduce_scatter", 4000, 1000, 4, 4) == 16000
    assert message_bytes("reduce_scatter", None, 1000, 4, 4) == 16000
    assert message_bytes("all_reduce", 1000, 1000, 4, 4) == 4000
    assert message_bytes("all_to_all", 1000, 1000, 2, 4) == 2000
    assert message_bytes("recv", 0, 10, 4, 2) == 40
    assert message_bytes("barrier", 1, 1, 1, 4) == 0
    assert message_bytes("all_reduce", 0, 0, 4, 2) == 0
    assert math.isnan(message_bytes("all_reduce", 1000, 1000, None, 4))
    assert math.isnan(message_bytes("all_gather", 1000, None, 4, None))


@pytest.mark.parametrize("nbytes, label, low", [
    (1, "1-2 B", 1), (1023, "512 B-1 KiB", 512), (1024, "1-2 KiB", 1024),
    (1.5 * 2**20, "1-2 MiB", 2**20), (2**21 - 1, "1-2 MiB", 2**20), (2**21, "2-4 MiB", 2**21),
    (3 * 2**30, "2-4 GiB", 2**31), (0, "0 B", 0),
])
def test_size_buckets_are_powers_of_two(nbytes, label, low):
    assert size_bucket(nbytes) == (label, float(low))


def test_unknown_size_has_its_own_bucket():
    label, low = size_bucket(float("nan"))
    assert label == "unknown" and math.isnan(low)


# ---- from the tracer's records -------------------------------------------------------------------
def comm_records(rows) -> pd.DataFrame:
    base = {"source": "ddp", "pg": "0", "dtype": "float32", "start_ns": 0, "end_ns": 0,
            "timing": "cuda_event", "algbw_gbps": 0.0, "busbw_gbps": 0.0, "rank": 1}
    return pd.DataFrame([{**base, **row} for row in rows])


def test_records_give_nccl_tests_bandwidths():
    records = comm_records([
        # 100 MB in 10 ms: algbw 10 GB/s; all_reduce over 4 ranks: busbw 10 * 2*3/4 = 15 GB/s.
        {"step": 3, "op": "all_reduce", "pg_size": 4, "bytes": 100_000_000,
         "duration_us": 10_000.0},
        # 8 MB in 1 ms over 8 ranks: algbw 8 GB/s, busbw 8 * 7/8 = 7 GB/s.
        {"step": 3, "op": "all_gather", "pg_size": 8, "bytes": 8_000_000, "duration_us": 1_000.0},
        # A crashed run's last op: no duration.
        {"step": 4, "op": "reduce_scatter", "pg_size": 8, "bytes": 8_000_000, "duration_us": None},
    ])
    ops = comm_ops(make_trace(records=records_with(records), rank=1))
    assert list(ops.columns) == OPS_COLUMNS
    assert ops["origin"].tolist() == ["records"] * 3
    assert ops["rank"].tolist() == [1, 1, 1]
    assert ops["algbw_gbps"].iloc[0] == pytest.approx(10.0)
    assert ops["busbw_gbps"].iloc[0] == pytest.approx(15.0)
    assert ops["algbw_gbps"].iloc[1] == pytest.approx(8.0)
    assert ops["busbw_gbps"].iloc[1] == pytest.approx(7.0)
    assert math.isnan(ops["algbw_gbps"].iloc[2]) and math.isnan(ops["busbw_gbps"].iloc[2])
    assert ops["bytes"].iloc[2] == 8_000_000


def test_records_win_over_trace_events():
    kernel = event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 0, 1000, is_gpu=True,
                   is_comm=True)
    records = comm_records([{"step": 0, "op": "broadcast", "pg_size": 2, "bytes": 4,
                             "duration_us": 1.0}])
    ops = comm_ops(make_trace(events_frame([kernel]), records=records_with(records)))
    assert ops["op"].tolist() == ["broadcast"]
    assert ops["origin"].tolist() == ["records"]


# ---- from trace events ---------------------------------------------------------------------------
def test_kernel_time_and_call_bytes_make_one_op():
    rows = [
        event("ProfilerStep#7", "user_annotation", 0, 100_000),
        event("c10d::_allgather_base_", "cpu_op", 900, 700, is_comm=True),
        event("record_param_comms", "cpu_op", 1_000, 500, is_comm=True,
              collective="_allgather_base", in_nelems=1000, out_nelems=2000, comm_dtype="Float",
              group_size=2, pg_name="3"),
        event("cudaLaunchKernel", "cuda_runtime", 1_200, 100, correlation=7),
        # The kernel repeats the args in newer traces; its own time (2 us) is the op's time.
        event("ncclDevKernel_AllGather_RING_LL", "kernel", 5_000, 2_000, correlation=7,
              is_gpu=True, is_comm=True, collective="allgather", in_nelems=1000,
              out_nelems=2000, comm_dtype="Float", group_size=2, pg_name="3"),
    ]
    ops = comm_ops(make_trace(events_frame(rows), steps_frame([(7, 0, 100_000)])))
    assert len(ops) == 1
    op = ops.iloc[0]
    assert (op["op"], op["pg"], op["pg_size"], op["dtype"]) == ("all_gather", "3", 2, "float32")
    assert op["bytes"] == 8000  # 2000 gathered float32
    assert op["duration_us"] == pytest.approx(2.0)
    assert op["algbw_gbps"] == pytest.approx(8000 / 2e-6 / 1e9)  # 4 GB/s
    assert op["busbw_gbps"] == pytest.approx(4.0 * 1 / 2)
    assert op["step"] == 7 and op["origin"] == "trace" and op["rank"] == 0


def test_several_kernels_of_one_call_are_timed_by_their_union():
    rows = [
        event("record_param_comms", "cpu_op", 1_000, 500, is_comm=True, collective="alltoall_base",
              in_nelems=256, out_nelems=256, comm_dtype="BFloat16", group_size=4, pg_name="0"),
        event("cudaLaunchKernel", "cuda_runtime", 1_100, 10, correlation=1),
        event("cudaLaunchKernel", "cuda_runtime", 1_200, 10, correlation=2),
        event("ncclDevKernel_SendRecv", "kernel", 10_000, 3_000, correlation=1, is_gpu=True,
              is_comm=True),
        event("ncclDevKernel_SendRecv", "kernel", 12_000, 3_000, correlation=2, is_gpu=True,
              is_comm=True, tid="8"),
    ]
    ops = comm_ops(make_trace(events_frame(rows)))
    assert len(ops) == 1
    assert ops["op"].iloc[0] == "all_to_all"
    assert ops["bytes"].iloc[0] == 512
    assert ops["duration_us"].iloc[0] == pytest.approx(5.0)  # [10, 15) us, not 3 + 3
    assert ops["step"].iloc[0] == -1  # a trace without ProfilerStep is one window, step -1


def test_ops_follow_the_step_selection():
    def call(ts):
        return event("record_param_comms", "cpu_op", ts, 10, is_comm=True, collective="allreduce",
                     in_nelems=1, out_nelems=1, comm_dtype="Float", group_size=2, pg_name="0")

    spans = steps_frame([(1, 0, 1_000), (2, 1_000, 2_000), (3, 2_000, 3_000)])
    trace = make_trace(events_frame([call(500), call(1_500), call(2_500), call(9_000)]),
                       steps=spans[spans["step"] == 2].reset_index(drop=True))
    trace.all_steps = spans
    ops = comm_ops(trace)
    # Steps 1 and 3 were left out; the op after the last step belongs to none.
    assert ops["step"].tolist() == [2, pd.NA]


def test_call_without_kernel_keeps_bytes_and_unknown_time():
    rows = [event("record_param_comms", "cpu_op", 1_000, 500, is_comm=True, collective="allreduce",
                  in_nelems=10, out_nelems=10, comm_dtype="Float", group_size=2, pg_name="0"),
            event("record_param_comms", "cpu_op", 2_000, 50, is_comm=True, collective="wait",
                  in_nelems=0, out_nelems=0, comm_dtype="Byte", group_size=2, pg_name="0")]
    ops = comm_ops(make_trace(events_frame(rows)))
    assert ops["op"].tolist() == ["all_reduce"]  # "wait" moves nothing
    assert ops["bytes"].iloc[0] == 40
    assert math.isnan(ops["duration_us"].iloc[0]) and math.isnan(ops["busbw_gbps"].iloc[0])


def test_kernels_without_a_call_fall_back_to_hints_and_names():
    rows = [
        event("nccl:all_to_all", "user_annotation", 1_000, 500, is_comm=True),
        event("cudaLaunchKernel", "cuda_runtime", 1_100, 10, correlation=3),
        event("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "kernel", 5_000, 1_000, correlation=3,
              is_gpu=True, is_comm=True),
        event("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "kernel", 8_000, 1_000, is_gpu=True,
              is_comm=True),
        event("ncclDevKernel_SendRecv", "kernel", 9_000, 1_000, is_gpu=True, is_comm=True),
    ]
    ops = comm_ops(make_trace(events_frame(rows)))
    assert ops["op"].tolist() == ["all_to_all", "reduce_scatter", UNKNOWN_OP]
    assert ops["duration_us"].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert ops["bytes"].isna().all()


def test_kernels_of_other_communication_libraries_get_their_op():
    names = ["void deep_ep::intranode::dispatch<8, 768>(int4*, float*)",
             "void deep_ep::internode::combine<true>(int4*)",
             "void vllm::cross_device_reduce_1stage<float, 8>(vllm::RankData*)",
             "c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 8>",
             "void nvshmemi_transfer_rma_kernel<float>(void*)"]
    rows = [event(name, "kernel", 1_000 * (i + 1), 500, is_gpu=True, is_comm=True)
            for i, name in enumerate(names)]
    ops = comm_ops(make_trace(events_frame(rows)))
    assert ops["op"].tolist() == ["all_to_all", "all_to_all", "all_reduce", "all_reduce",
                                  UNKNOWN_OP]


def test_gloo_op_counts_gathered_bytes_with_the_world_size():
    rows = [event("gloo:all_gather", "user_annotation", 1_000, 4_000_000, tid="9", is_comm=True,
                  input_dims="[[1000]]", comm_dtype="Float")]
    ops = comm_ops(make_trace(events_frame(rows), world_size=4))
    op = ops.iloc[0]
    assert (op["op"], op["pg_size"], op["bytes"]) == ("all_gather", 4, 16000)
    assert op["duration_us"] == pytest.approx(4000.0)
    assert op["algbw_gbps"] == pytest.approx(16000 / 4e-3 / 1e9)


def test_gloo_op_takes_group_from_its_call():
    rows = [
        event("record_param_comms", "cpu_op", 1_000, 50, is_comm=True, collective="allreduce",
              in_nelems=500, out_nelems=500, comm_dtype="BFloat16", group_size=2, pg_name="5"),
        event("gloo:all_reduce", "user_annotation", 1_100, 10_000, tid="9", is_comm=True,
              input_dims="[[500]]"),
    ]
    ops = comm_ops(make_trace(events_frame(rows), world_size=8))
    assert len(ops) == 1
    assert (ops["pg"].iloc[0], ops["pg_size"].iloc[0], ops["bytes"].iloc[0]) == ("5", 2, 1000)
    assert ops["duration_us"].iloc[0] == pytest.approx(10.0)


@pytest.mark.parametrize("events", [
    events_frame([]),
    pd.DataFrame({"name": ["x"]}),  # columns missing
    events_frame([event("aten::mm", "cpu_op", 0, 10)]),
])
def test_no_comm_gives_an_empty_frame_with_columns(events):
    ops = comm_ops(make_trace(events))
    assert ops.empty and list(ops.columns) == OPS_COLUMNS
    table = collectives_table(ops)
    assert table.empty and list(table.columns) == COLLECTIVES_COLUMNS


def test_empty_records_fall_back_to_events():
    rows = [event("gloo:broadcast", "user_annotation", 0, 1_000, is_comm=True,
                  input_dims="[[3]]", comm_dtype="Int")]
    trace = make_trace(events_frame(rows), records=records_with(pd.DataFrame()))
    ops = comm_ops(trace)
    assert ops["op"].tolist() == ["broadcast"] and ops["bytes"].tolist() == [12]


# ---- collectives_table ---------------------------------------------------------------------------
def ops_frame(rows) -> pd.DataFrame:
    base = {"source": "ddp", "dtype": "float32", "origin": "records", "algbw_gbps": np.nan,
            "busbw_gbps": np.nan}
    return pd.DataFrame([{**base, **row} for row in rows], columns=OPS_COLUMNS)


def test_collectives_table_sums_bytes_over_time():
    mib = 2**20
    ops = ops_frame([
        {"rank": 0, "step": 0, "op": "all_reduce", "pg": "0", "pg_size": 4, "bytes": 1 * mib,
         "duration_us": 100.0},
        {"rank": 0, "step": 1, "op": "all_reduce", "pg": "0", "pg_size": 4, "bytes": 1.5 * mib,
         "duration_us": 300.0},
        {"rank": 1, "step": 0, "op": "all_reduce", "pg": "0", "pg_size": 4, "bytes": 1 * mib,
         "duration_us": 100.0},
        # Counted and its bytes summed, but with no time it can't enter the bandwidth.
        {"rank": 1, "step": 1, "op": "all_reduce", "pg": "0", "pg_size": 4, "bytes": 1.5 * mib,
         "duration_us": np.nan},
        {"rank": 0, "step": 0, "op": "all_gather", "pg": "1", "pg_size": 2, "bytes": 64,
         "duration_us": 1000.0},
    ])
    table = collectives_table(ops)
    assert list(table.columns) == COLLECTIVES_COLUMNS
    assert table["op"].tolist() == ["all_gather", "all_reduce"]  # largest total time first
    reduce = table.iloc[1]
    assert reduce["size_bucket"] == "1-2 MiB" and reduce["bucket_min_bytes"] == mib
    assert reduce["count"] == 4
    assert reduce["total_bytes"] == pytest.approx(5 * mib)
    assert reduce["total_us"] == pytest.approx(500.0)
    assert reduce["mean_us"] == pytest.approx(500.0 / 3)
    timed_bytes = 3.5 * mib
    algbw = timed_bytes / 500e-6 / 1e9
    assert reduce["algbw_gbps"] == pytest.approx(algbw)
    assert reduce["busbw_gbps"] == pytest.approx(algbw * 1.5)
    assert (reduce["ranks"], reduce["rank_steps"]) == (2, 4)
    # Rank 0 moved 2.5 MiB in 400 us, rank 1 1 MiB in 100 us: rank 0 is slower.
    assert reduce["slowest_rank"] == 0
    assert reduce["slowest_rank_busbw_gbps"] == pytest.approx(2.5 * mib / 400e-6 / 1e9 * 1.5)
    gather = table.iloc[0]
    assert gather["size_bucket"] == "64-128 B"
    assert gather["busbw_gbps"] == pytest.approx(64 / 1e-3 / 1e9 * 0.5)
    assert pd.isna(gather["slowest_rank"])


def test_collectives_table_matches_schema_bandwidth():
    ops = ops_frame([{"rank": 0, "step": 0, "op": op, "pg": "0", "pg_size": 8,
                      "bytes": 3_000_000, "duration_us": 750.0}
                     for op in ("all_reduce", "reduce_scatter", "broadcast")])
    table = collectives_table(ops).set_index("op")
    for op in ("all_reduce", "reduce_scatter", "broadcast"):
        algbw, busbw = schema.bandwidth_gbps(op, 3_000_000, 8, 750e-6)
        assert table.loc[op, "algbw_gbps"] == pytest.approx(algbw)
        assert table.loc[op, "busbw_gbps"] == pytest.approx(busbw)


def test_unknown_groups_and_sizes_are_kept_apart():
    ops = ops_frame([
        {"rank": 0, "step": 0, "op": "all_reduce", "pg": None, "pg_size": None, "bytes": np.nan,
         "duration_us": 10.0},
        {"rank": 0, "step": 0, "op": "all_reduce", "pg": "0", "pg_size": 2, "bytes": 100,
         "duration_us": 10.0},
    ])
    table = collectives_table(ops).sort_values("pg").reset_index(drop=True)
    assert table["pg"].tolist() == ["0", "unknown"]
    assert table["size_bucket"].tolist() == ["64-128 B", "unknown"]
    assert math.isnan(table["algbw_gbps"].iloc[1])
    assert table["total_us"].tolist() == [10.0, 10.0]


def test_gloo_op_reads_the_element_type_from_input_type_when_dtype_is_absent():
    row = event("gloo:all_reduce", "user_annotation", 0, 1_000, is_comm=True,
                input_dims="[[1000]]", input_type='["c10::BFloat16"]')
    events = events_frame([row])
    ops = comm_ops(make_trace(events, world_size=2))
    assert (ops["dtype"].iloc[0], ops["bytes"].iloc[0]) == ("bfloat16", 2000)


# ---- foreign NCCL traces whose kernels sit in nccl:* annotations only ---------------------------
def dlrm_like_events() -> pd.DataFrame:
    """The structure of facebookresearch/param's 8-rank DLRM trace: no record_param_comms args;
    each NCCL kernel is launched inside an nccl:* op that carries Input Dims and Input type."""
    rows = [
        event("ProfilerStep#3", "user_annotation", 0, 1_000_000),
        event("nccl:all_to_all", "cpu_op", 10_000, 5_000, is_comm=True,
              input_dims="[[4096, 128]]", input_type='["c10::Half"]'),
        event("cudaLaunchKernel", "cuda_runtime", 11_000, 100, correlation=21),
        event("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
              "kernel", 100_000, 400_000, correlation=21, is_gpu=True, is_comm=True),
        event("nccl:all_reduce", "cpu_op", 500_000, 5_000, is_comm=True,
              input_dims="[[1000000]]", input_type='["float"]'),
        event("cudaLaunchKernel", "cuda_runtime", 501_000, 100, correlation=22),
        event("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
              "kernel", 600_000, 200_000, correlation=22, is_gpu=True, is_comm=True),
    ]
    return events_frame(rows)


def test_nccl_kernels_take_size_and_dtype_from_their_nccl_annotation():
    ops = comm_ops(make_trace(dlrm_like_events(), steps_frame([(3, 0, 1_000_000)]), world_size=8))
    assert ops["op"].tolist() == ["all_to_all", "all_reduce"]
    assert ops["dtype"].tolist() == ["float16", "float32"]
    assert ops["bytes"].tolist() == [4096 * 128 * 2, 4_000_000]
    assert ops["pg_size"].tolist() == [8, 8]  # the world size stands in for the group
    assert ops["step"].tolist() == [3, 3]
    # all_to_all: 1 MiB in 400 us; busbw x 7/8. all_reduce: 4 MB in 200 us; busbw x 2*7/8.
    assert ops["algbw_gbps"].tolist() == pytest.approx([1_048_576 / 400e-6 / 1e9, 20.0])
    assert ops["busbw_gbps"].tolist() == pytest.approx([1_048_576 / 400e-6 / 1e9 * 7 / 8, 35.0])
    table = collectives_table(ops)
    assert sorted(table["size_bucket"]) == ["1-2 MiB", "2-4 MiB"]
    assert table["busbw_gbps"].notna().all()


def test_kernel_args_win_over_the_annotation_around_it():
    rows = [
        event("nccl:all_reduce", "cpu_op", 1_000, 500, is_comm=True, input_dims="[[10]]",
              input_type='["float"]'),
        event("cudaLaunchKernel", "cuda_runtime", 1_100, 10, correlation=5),
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 5_000, 1_000, correlation=5,
              is_gpu=True, is_comm=True, collective="allreduce", in_nelems=256, out_nelems=256,
              comm_dtype="Float", group_size=4, pg_name="2"),
    ]
    op = comm_ops(make_trace(events_frame(rows), world_size=8)).iloc[0]
    assert (op["bytes"], op["pg_size"], op["pg"]) == (1024, 4, "2")


def test_innermost_call_on_the_launching_thread_is_found_for_many_kernels():
    rows = []
    for i in range(50):
        t = i * 10_000
        rows += [
            event("record_param_comms", "cpu_op", t, 5_000, is_comm=True, collective="allreduce",
                  in_nelems=i + 1, out_nelems=i + 1, comm_dtype="Float", group_size=2, pg_name="0"),
            event("record_param_comms", "cpu_op", t + 6_000, 1_000, tid="2", is_comm=True,
                  collective="broadcast", in_nelems=1, out_nelems=1, comm_dtype="Float",
                  group_size=2, pg_name="0"),
            event("cudaLaunchKernel", "cuda_runtime", t + 6_500, 10, correlation=i),
            event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", t + 7_000, 1_000,
                  correlation=i, is_gpu=True, is_comm=True),
        ]
    ops = comm_ops(make_trace(events_frame(rows)))
    kernels = ops[ops["duration_us"].notna()]
    # The launch lies after the all_reduce call ended and on another thread than the broadcast:
    # neither holds it, so each kernel is an op of its own with its name's collective.
    assert len(kernels) == 50 and kernels["bytes"].isna().all()
    assert (ops["duration_us"].isna() & (ops["op"] == "all_reduce")).sum() == 50

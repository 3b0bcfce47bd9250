"""Collective ops on the real traces of tests/data, process group names and who issued each op
(docs/report.md)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from analysis.core.model import RankTrace
from analysis.rank.comm.comm_ops import collectives_table, comm_ops
from analysis.run.loading import load_run_path
from helpers.comm_events import comm_records, event, events_frame, make_trace, records_with
from helpers.launch import DATA

NCCL_TRACE = DATA / "hta" / "nccl_parser_config" / "nccl_data.json.gz"
GLOO_TRACE = DATA / "hta" / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


# ---- real traces ---------------------------------------------------------------------------------
def read_trace(path: Path) -> RankTrace:
    # No parquet cache: nothing may be written into tests/data.
    return load_run_path(path, use_cache=False).ranks[0]


@pytest.fixture(scope="module")
def nccl_ops():
    return comm_ops(read_trace(NCCL_TRACE))


def test_real_nccl_trace_bytes_come_from_record_param_comms(nccl_ops):
    # 15 allreduce and 6 broadcast calls (record_param_comms), each with one NCCL kernel; the six
    # "wait" calls move nothing.
    assert len(nccl_ops) == 21
    assert nccl_ops["op"].value_counts().to_dict() == {"all_reduce": 15, "broadcast": 6}
    assert set(nccl_ops["origin"]) == {"trace"} and set(nccl_ops["rank"]) == {0}
    assert set(nccl_ops["pg"]) == {"0"} and set(nccl_ops["pg_size"]) == {2}
    # External id 2099: "In msg nelems" 2049000, dtype Float -> 8,196,000 bytes; its kernel ran
    # 3306.963 us, whereas record_param_comms itself lasted 189.626 us on the host.
    first = nccl_ops[nccl_ops["op"] == "all_reduce"].iloc[0]
    assert first["bytes"] == 2049000 * 4
    assert first["duration_us"] == pytest.approx(3306.963, abs=1e-3)
    assert first["busbw_gbps"] == pytest.approx(2049000 * 4 / 3306.963e-6 / 1e9 * 1.0, rel=1e-6)
    # External id 172: 53 elements of Long -> 424 bytes, in a 7.775 us kernel.
    small = nccl_ops[(nccl_ops["op"] == "broadcast") & (nccl_ops["dtype"] == "int64")]
    assert small["bytes"].tolist() == [424.0] * 3
    assert small["duration_us"].iloc[0] == pytest.approx(7.775, abs=1e-3)
    # ProfilerStep#4 to #6, seven ops each.
    assert nccl_ops["step"].value_counts().sort_index().to_dict() == {4: 7, 5: 7, 6: 7}


def test_real_nccl_trace_totals_match_its_json(nccl_ops):
    with gzip.open(NCCL_TRACE, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    sizes = {"Float": 4, "Long": 8}
    calls = [e["args"] for e in events if e.get("name") == "record_param_comms"
             and e["args"]["Collective name"] == "allreduce"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "AllReduce" in e["name"]]
    reduces = nccl_ops[nccl_ops["op"] == "all_reduce"]
    assert reduces["bytes"].sum() == sum(a["In msg nelems"] * sizes[a["dtype"]] for a in calls)
    assert sorted(reduces["duration_us"].round(3)) == sorted(round(k["dur"], 3) for k in kernels)
    table = collectives_table(nccl_ops)
    row = table[(table["op"] == "all_reduce") & (table["size_bucket"] == "16-32 MiB")].iloc[0]
    big = reduces[reduces["bytes"] >= 16 * 2**20]
    assert row["count"] == len(big) == 9
    seconds = big["duration_us"].sum() / 1e6
    assert row["busbw_gbps"] == pytest.approx(big["bytes"].sum() / seconds / 1e9)


def test_real_gloo_trace_times_gloo_ops():
    ops = comm_ops(read_trace(GLOO_TRACE))
    assert len(ops) == 10 and set(ops["op"]) == {"all_reduce"}
    assert set(ops["pg_size"]) == {300}  # the world size stands in: gloo ops name no group
    first = ops.iloc[0]
    assert first["duration_us"] == pytest.approx(173209.713, abs=1e-3)
    # "Input Dims" [[321271]], "Input type" ["float"].
    assert (first["dtype"], first["bytes"]) == ("float32", 321271 * 4)


# ---- process group names -----------------------------------------------------------------------
def test_groups_are_shown_by_the_name_the_trace_gives_them():
    # pg_desc: torch's "Process Group Description"
    rows = [
        event("record_param_comms", "cpu_op", 1_000, 500, is_comm=True, collective="allreduce",
              in_nelems=64, out_nelems=64, comm_dtype="Float", group_size=2, pg_name="1",
              pg_desc="mesh_tp"),
        event("record_param_comms", "cpu_op", 2_000, 500, is_comm=True, collective="allgather",
              in_nelems=64, out_nelems=128, comm_dtype="Float", group_size=2, pg_name="2",
              pg_desc="mesh_dp"),
        event("record_param_comms", "cpu_op", 3_000, 500, is_comm=True, collective="allreduce",
              in_nelems=8, out_nelems=8, comm_dtype="Float", group_size=4, pg_name="0",
              pg_desc="undefined"),
    ]
    ops = comm_ops(make_trace(events_frame(rows)))
    assert ops["pg_desc"].tolist() == ["mesh_tp", "mesh_dp", None]
    table = collectives_table(ops).sort_values("pg_id")
    assert table["pg"].tolist() == ["0", "mesh_tp (1)", "mesh_dp (2)"]
    assert table["pg_id"].tolist() == ["0", "1", "2"]


def test_recorded_groups_take_their_names_from_the_trace_of_the_same_rank():
    records = comm_records([
        {"step": 0, "op": "all_reduce", "pg": "1", "pg_size": 2, "bytes": 400, "duration_us": 2.0},
        {"step": 0, "op": "all_reduce", "pg": "3", "pg_size": 2, "bytes": 400, "duration_us": 2.0},
    ])
    trace = make_trace(records=records_with(records))
    # distributedInfo's pg_config, as torch.profiler writes it.
    trace.process_groups = [{"pg_name": "1", "pg_desc": "mesh_dp", "pg_size": 2, "ranks": [0, 1]},
                            {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4}]
    ops = comm_ops(trace)
    assert ops["pg_desc"].tolist() == ["mesh_dp", None]
    assert sorted(collectives_table(ops)["pg"]) == ["3", "mesh_dp (1)"]


# ---- who issued each op ------------------------------------------------------------------------
def call_in(span_name, ts, op="allgather", tid="1"):
    return [event(span_name, "user_annotation", ts, 1_000, tid=tid),
            event("record_param_comms", "cpu_op", ts + 100, 500, tid=tid, is_comm=True,
                  collective=op, in_nelems=64, out_nelems=128, comm_dtype="Float",
                  group_size=2, pg_name="0")]


def test_trace_ops_are_attributed_to_the_code_around_them():
    rows = [
        *call_in("FSDP::all_gather (layers.0)", 0),
        *call_in("FullyShardedDataParallel._pre_forward", 10_000),
        *call_in("_c10d_functional::all_reduce", 20_000, op="allreduce"),
        *call_in("aten::mm", 30_000, op="allreduce"),
        # A span on another thread does not hold this thread's call.
        event("FSDP::pre_backward", "user_annotation", 40_000, 1_000, tid="7"),
        *call_in("aten::add", 40_000, op="reduce_scatter"),
        event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel", 60_000, 1_000, is_gpu=True,
              is_comm=True),
    ]
    ops = comm_ops(make_trace(events_frame(rows)))
    # The reduce-scatter outside every span still belongs to FSDP2, which this trace runs.
    assert ops["issuer"].tolist() == ["fsdp2", "fsdp1", "functional", "c10d", "fsdp2", "unknown"]


def test_recorded_ops_take_the_tracer_source_and_fsdp_from_the_trace():
    records = comm_records([
        {"step": 0, "op": "all_reduce", "source": "ddp", "pg_size": 2, "bytes": 4,
         "duration_us": 1.0},
        {"step": 0, "op": "all_reduce", "source": "functional", "pg_size": 2, "bytes": 4,
         "duration_us": 1.0},
        {"step": 0, "op": "all_reduce", "source": "c10d", "pg_size": 2, "bytes": 4,
         "duration_us": 1.0},
        {"step": 0, "op": "all_gather", "source": "c10d", "pg_size": 2, "bytes": 4,
         "duration_us": 1.0},
        {"step": 0, "op": "send", "source": "p2p", "pg_size": 2, "bytes": 4,
         "duration_us": 1.0},
    ])
    plain = comm_ops(make_trace(records=records_with(records)))
    assert plain["issuer"].tolist() == ["ddp", "functional", "c10d", "c10d", "p2p"]
    fsdp2 = make_trace(events_frame([event("FSDP::all_gather", "user_annotation", 0, 10)]),
                       records=records_with(records))
    assert comm_ops(fsdp2)["issuer"].tolist() == ["ddp", "functional", "c10d", "fsdp2", "p2p"]


def test_group_descriptions_and_pg_config_are_read_and_cached(tmp_path):
    expected = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                 "pg_size": 2, "ranks": [0, 1]}]
    trace = read_trace(NCCL_TRACE)
    assert trace.process_groups == expected
    described = trace.events.dropna(subset=["pg_desc"])
    # 42 events carry "Process Group Description": record_param_comms calls and NCCL kernels.
    assert len(described) == 42 and set(described["pg_desc"]) == {"default_pg"}
    assert set(described["pg_name"]) == {"0"}
    assert set(comm_ops(trace)["pg_desc"]) == {"default_pg"}
    copy = tmp_path / NCCL_TRACE.name
    shutil.copy(NCCL_TRACE, copy)
    load_run_path(copy)  # writes the cache
    cached = load_run_path(copy).ranks[0]
    assert cached.process_groups == expected
    assert cached.events["pg_desc"].tolist() == trace.events["pg_desc"].tolist()

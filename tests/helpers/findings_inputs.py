"""Per-step, collectives, idle and rank inputs of the bottleneck findings, built by hand with
known answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.frames import empty_events, steps_frame
from analysis.core.model import RankTrace, RunRecords
from analysis.findings.bottlenecks import (
    FINDING_COLUMNS,
    find_bottlenecks,
)
from analysis.rank.comm.comm_ops import COLLECTIVES_COLUMNS
from analysis.rank.reduction import rank_tables
from tracer import schema

MS = 1_000_000


MIB = 2**20


GIB = 2**30


def step_row(rank, step, *, step_ms=100, compute=60, comm=10, overlap=10, memcpy=0, idle=None,
             exposed=None, kind="gpu") -> dict:
    idle = step_ms - compute - comm - overlap - memcpy if idle is None else idle
    return {"rank": rank, "step": step, "step_ns": step_ms * MS, "compute_only_ns": compute * MS,
            "comm_only_ns": comm * MS, "overlap_ns": overlap * MS, "memcpy_ns": memcpy * MS,
            "idle_ns": idle * MS, "exposed_comm_ns": (comm if exposed is None else exposed) * MS,
            "overlap_pct": np.nan, "kind": kind}


def per_step(rows) -> pd.DataFrame:
    return pd.DataFrame(rows)


def collective(op, pg, pg_size, bucket_min, total_us, busbw, *, count=10, rank_steps=4,
               issuer=None, pg_id=None) -> dict:
    label = {1 * MIB: "1-2 MiB", 8 * MIB: "8-16 MiB", 16 * MIB: "16-32 MiB",
             256: "256-512 B"}.get(bucket_min, "?")
    return {"op": op, "issuer": issuer, "pg": pg, "pg_id": pg if pg_id is None else pg_id,
            "pg_size": pg_size, "size_bucket": label,
            "bucket_min_bytes": float(bucket_min), "count": count, "total_bytes": np.nan,
            "total_us": float(total_us), "mean_us": total_us / count, "algbw_gbps": np.nan,
            "busbw_gbps": float(busbw), "ranks": 2, "rank_steps": rank_steps,
            "slowest_rank": pd.NA, "slowest_rank_busbw_gbps": np.nan}


def collectives(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLLECTIVES_COLUMNS)


def gaps(rows) -> pd.DataFrame:
    return pd.DataFrame([{"rank": r, "step": s, "start_ns": 0, "end_ns": d * MS, "dur_ns": d * MS,
                          "host_activity": a} for r, s, d, a in rows])


def trace(rank, backend="nccl", script=None, *, started=False, world_size=2, config=None,
          comms=None) -> RankTrace:
    """A rank without events; with `script` or `started`, its manifest's RunStart (world size
    `world_size`, tracer options `config`); `comms`: its comms records."""
    manifest = []
    if script is not None or started:
        script = script or "train.py"
        manifest.append(schema.RunStart(
            schema_version=1, run_name="t", rank=rank, local_rank=rank, world_size=world_size,
            host="h", pid=1, start_ns=0, argv=[script], script=script, script_args=[],
            torch_version="2", config=dict(config or {})))
    records = RunRecords(comms=comms if comms is not None else pd.DataFrame(),
                         samples=pd.DataFrame(), steps=pd.DataFrame(), manifest=manifest)
    rank_trace = RankTrace(rank=rank, world_size=world_size,
                           path=Path(f"rank{rank}.1.pt.trace.json.gz"), events=empty_events(),
                           steps=steps_frame(), records=records, problems=[], backend=backend)
    return reduced(rank_trace)


def reduced(rank_trace: RankTrace) -> RankTrace:
    """`rank_trace` with its tables, as the run's load reduces a rank (analysis.run.loading)."""
    rank_trace.tables = rank_tables(rank_trace)
    return rank_trace


def run(steps=None, per_rank=None, colls=None, idle=None, traces=None) -> pd.DataFrame:
    result = find_bottlenecks(steps if steps is not None else per_step([]),
                              per_rank if per_rank is not None else pd.DataFrame(),
                              colls if colls is not None else collectives([]),
                              idle if idle is not None else gaps([]),
                              traces if traces is not None else [trace(0), trace(1)])
    assert list(result.columns) == FINDING_COLUMNS
    return result


def finding(result: pd.DataFrame, name: str) -> pd.Series:
    rows = result[result["finding"] == name]
    assert len(rows) == 1, f"{name!r} not in {result['finding'].tolist()}"
    return rows.iloc[0]


def balanced(exposed) -> pd.DataFrame:
    return per_step([step_row(r, s, exposed=exposed) for r in (0, 1) for s in (0, 1)])


def memory_rank(rank, reserved_gib, allocated_gib, total_gib=40) -> dict:
    return {"rank": rank, "kind": "gpu", "peak_reserved_bytes": reserved_gib * GIB,
            "peak_allocated_bytes": allocated_gib * GIB, "device_total_bytes": total_gib * GIB,
            "peak_reserved_pct": reserved_gib / total_gib * 100, "device_used_pct": np.nan,
            "peak_device_used_bytes": np.nan}


def late_rank_1(steps=12):
    """Rank 1 arrives 30 ms late at every step's DDP all-reduce; the transfer takes 2 ms.
    (per-step table, collectives, the cross-rank result)"""
    from analysis.crossrank import analyse
    from analysis.crossrank.run_frames import typed_ops
    rows = []
    for s in range(steps):
        arrive = s * 100 * MS + 60 * MS
        for rank, late in ((0, 0), (1, 30 * MS)):
            rows.append({"rank": rank, "pg": "0", "pg_size": 2, "op": "all_reduce",
                         "bytes": 4 * MIB, "dtype": "float32", "step": s,
                         "issue_ns": arrive + late, "end_ns": arrive + 32 * MS, "peer": np.nan,
                         "queue": "0"})
    step_frame = pd.DataFrame([{"rank": r, "step": s, "start_ns": s * 100 * MS,
                                "end_ns": (s + 1) * 100 * MS}
                               for r in (0, 1) for s in range(steps)])
    sync = pd.DataFrame({"rank": [1], "offset_ns": [0], "uncertainty_ns": [1_000]})
    result = analyse(typed_ops(pd.DataFrame(rows)), step_frame, sync, 2)
    table = per_step([step_row(0, s, compute=60, comm=32, overlap=0, exposed=32)
                      for s in range(steps)]
                     + [step_row(1, s, compute=90, comm=2, overlap=0, exposed=2)
                        for s in range(steps)])
    colls = collectives([collective("all_reduce", "0", 2, 4 * MIB, 136_000, 0.1, count=8,
                                    issuer="ddp")])
    return table, colls, result

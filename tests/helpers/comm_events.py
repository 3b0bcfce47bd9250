"""Small ranks with communication built by hand for the tests: events rows, their frame as the
trace reader types it (analysis.core.frames) and a rank's trace around them."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

from analysis.core import frames
from analysis.core.event_kinds import EVENT_COLUMNS
from analysis.core.model import RankTrace, RunRecords

MS = 1_000_000  # ns


def event(name, cat, ts_ns, dur_ns, *, tid="1", correlation=-1, is_gpu=False, is_comm=False,
          **args) -> dict:
    row = {
        "name": name, "cat": cat, "ts_ns": ts_ns, "dur_ns": dur_ns, "end_ns": ts_ns + dur_ns,
        "pid": "100" if not is_gpu else "0", "tid": tid, "stream": 7 if is_gpu else -1,
        "correlation": correlation, "is_gpu": is_gpu, "is_comm": is_comm, "collective": None,
        "in_nelems": np.nan, "out_nelems": np.nan, "comm_dtype": None, "group_size": np.nan,
        "pg_name": None, "input_dims": None, "input_type": None,
    }
    row.update(args)
    return row


def events_frame(rows) -> pd.DataFrame:
    """The events frame of `rows` as the parser types it (analysis.core.frames); a column no row
    has takes its default."""
    present = [c for c in EVENT_COLUMNS if not rows or any(c in row for row in rows)]
    return frames.events_frame({c: [row.get(c) for row in rows] for c in present})


def steps_frame(spans) -> pd.DataFrame:
    return frames.steps_frame([s for s, _, _ in spans], [a for _, a, _ in spans],
                              [b for _, _, b in spans])


def make_trace(events=None, steps=None, records=None, rank=0, world_size=2) -> RankTrace:
    return RankTrace(rank=rank, world_size=world_size, path=Path("rank0.1.pt.trace.json.gz"),
                     events=events if events is not None else events_frame([]),
                     steps=steps if steps is not None else steps_frame([]),
                     records=records, problems=[])


def records_with(comms: pd.DataFrame, manifest=()) -> RunRecords:
    return RunRecords(comms=comms, samples=pd.DataFrame(), steps=pd.DataFrame(),
                      manifest=list(manifest))


def comm_records(rows) -> pd.DataFrame:
    base = {"source": "ddp", "pg": "0", "dtype": "float32", "start_ns": 0, "end_ns": 0,
            "timing": "cuda_event", "algbw_gbps": 0.0, "busbw_gbps": 0.0, "rank": 1}
    return pd.DataFrame([{**base, **row} for row in rows])


def four_ops() -> list[dict]:
    """Four kernels, each sized another way (the comments say how)."""
    return [
        # K1: its hint has no counts: "Input Dims" [2, 3] of BFloat16 (2 bytes), all_gather over
        # the world size (4): 6 x 4 x 2 = 48 bytes; the group's name from the kernel.
        event("nccl:all_gather", "user_annotation", 1_000, 500, is_comm=True,
              input_dims="[[2, 3], [5]]", input_type='["c10::BFloat16", "float"]'),
        event("cudaLaunchKernel", "cuda_runtime", 1_100, 10, correlation=1),
        event("ncclDevKernel_AllGather_RING_LL", "kernel", 5_000, 1_000, correlation=1,
              is_gpu=True, is_comm=True, pg_name="7"),
        # K2: has counts of its own (256 Half), so the hint only names it; no group size.
        event("c10d::allreduce_", "cpu_op", 2_000, 500, is_comm=True, in_nelems=1024,
              comm_dtype="Float", group_size=2, pg_name="0"),
        event("cudaLaunchKernel", "cuda_runtime", 2_100, 10, correlation=2),
        event("ncclKernel_AllReduce_RING_LL_Sum_float", "kernel", 7_000, 2_000, correlation=2,
              is_gpu=True, is_comm=True, in_nelems=256, comm_dtype="Half"),
        # K3: no launch in the trace, no name that gives its op: issued at its own start.
        event("ncclDevKernel_SendRecv", "kernel", 9_000, 500, correlation=99, tid="7",
              is_gpu=True, is_comm=True),
        # K4: launched inside a send call without a group size: the kernel's group.
        event("record_param_comms", "cpu_op", 3_000, 800, is_comm=True, collective="send",
              in_nelems=100, comm_dtype="Float", pg_name="5"),
        event("cudaLaunchKernel", "cuda_runtime", 3_100, 10, correlation=4),
        event("ncclDevKernel_SendRecv", "kernel", 11_000, 1_000, correlation=4, is_gpu=True,
              is_comm=True, group_size=2, pg_name="9", pg_desc="kernel_pg"),
    ]


def same(found: list, expected: list) -> bool:
    """Equal values of equal types, NaN equal to NaN."""
    def key(v):
        return (type(v), "nan" if isinstance(v, float) and math.isnan(v) else v)
    return [key(v) for v in found] == [key(v) for v in expected]


# ---- minimal events: a host op or a kernel per row -----------------------------------------------
def host_event(name, ts_ms, dur_ms, *, collective=None) -> dict:
    return {"name": name, "cat": "cpu_op", "ts_ns": int(ts_ms * MS), "dur_ns": int(dur_ms * MS),
            "pid": "1", "tid": "1", "is_gpu": False,
            "is_comm": name in ("record_param_comms", "nccl:all_reduce"),
            "collective": collective}


def kernel(name, ts_ms, dur_ms) -> dict:
    return {"name": name, "cat": "kernel", "ts_ns": int(ts_ms * MS), "dur_ns": int(dur_ms * MS),
            "pid": "0", "tid": "7", "is_gpu": True, "is_comm": name.startswith("nccl"),
            "collective": None}


def rank_of(events: pd.DataFrame, steps=None) -> SimpleNamespace:
    spans = None if steps is None else pd.DataFrame(steps, columns=["step", "start_ns", "end_ns"])
    return SimpleNamespace(rank=0, events=events, steps=spans, all_steps=spans)

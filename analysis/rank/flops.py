"""FLOPs per op and per step of a rank, from the shapes its Kineto trace(s) recorded, and MFU per
rank and step with the points it loses (docs/mfu.md defines every column).

Model FLOPs are those of GEMMs, convolutions and attention (analysis.rank.op_model), as
torch.utils.flop_counter counts them. An op is counted once: where such ops nest on one thread
(aten::linear > aten::matmul > aten::mm), only the innermost is, so that a FLOP is never counted
twice. Where the trace gives torch.profiler's own `flops` for the op counted, that is used.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.core import peaks
from analysis.core.model import RankTrace, known_rank
from analysis.ingest.op_args import read_ops
from analysis.rank.op_model import COMPUTE_KINDS, dtype_of, op_model

OP_FLOPS_COLUMNS = ["name", "tid", "ts_ns", "end_ns", "kind", "dtype", "flops", "bytes",
                    "counted", "flops_from", "step"]
MFU_COLUMNS = ["rank", "step", "flops_per_step", "achieved_tflops", "mfu_pct", "peak_tflops",
               "peak_source", "dtype", "step_ns", "lost_transfer_pts", "lost_waiting_pts",
               "lost_idle_pts", "lost_compute_pts"]


def op_flops(ops: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each op of `ops` (analysis.ingest.op_args.read_ops) with its kind, dtype, FLOPs and bytes
    (NaN where unknown), whether it is `counted` (a compute op with no compute op nested in it,
    or a memory op with no memory op nested in it), where its FLOPs come from ("profiler",
    "shapes" or ""), and the step whose span holds its start (-1: none)."""
    known: dict = {}  # once per distinct (name, shapes, types, scalars): a step repeats them
    modelled = []
    for args in zip(ops["name"], ops["input_dims"], ops["input_type"], ops["concrete_inputs"]):
        key = repr(args)
        if key not in known:
            known[key] = op_model(*args)
        modelled.append(known[key])
    frame = ops[["name", "tid", "ts_ns", "end_ns"]].copy()
    frame["kind"] = pd.Series([m[0] for m in modelled], dtype=object, index=frame.index)
    frame["dtype"] = pd.Series([dtype_of(t) for t in ops["input_type"]], dtype=object,
                               index=frame.index)
    flops = np.array([m[1] for m in modelled], dtype=np.float64)
    given = ops["flops"].to_numpy(dtype=np.float64)
    is_compute = frame["kind"].isin(COMPUTE_KINDS).to_numpy()
    from_profiler = is_compute & (given > 0)
    flops = np.where(from_profiler, given, flops)
    frame["flops"] = flops
    frame["bytes"] = [m[2] for m in modelled]
    frame["counted"] = _innermost(frame, is_compute) | _innermost(
        frame, (frame["kind"] == "memory").to_numpy())
    frame["flops_from"] = np.where(from_profiler, "profiler",
                                   np.where(np.isfinite(flops), "shapes", ""))
    frame["step"] = _step_of(frame["ts_ns"].to_numpy(), steps)
    return frame[OP_FLOPS_COLUMNS]


def _innermost(frame: pd.DataFrame, of_family: np.ndarray) -> np.ndarray:
    """Ops of the family with no op of the family nested in them on their thread (ops sorted
    by thread, start and longest first, as read_ops gives them)."""
    counted = of_family.copy()
    starts, ends = frame["ts_ns"].to_numpy(), frame["end_ns"].to_numpy()
    tids = frame["tid"].to_numpy()
    stack: list[int] = []
    tid = None
    for i in np.flatnonzero(of_family).tolist():
        if tids[i] != tid:
            stack, tid = [], tids[i]
        while stack and ends[stack[-1]] <= starts[i]:
            stack.pop()
        if stack and ends[i] <= ends[stack[-1]]:
            for j in stack:  # every enclosing op of the family has one nested in it
                counted[j] = False
        stack.append(i)
    return counted


def _step_of(ts_ns: np.ndarray, steps: pd.DataFrame | None) -> np.ndarray:
    if steps is None or not len(steps):
        return np.full(len(ts_ns), -1, dtype=np.int64)
    order = np.argsort(steps["start_ns"].to_numpy(), kind="stable")
    start = steps["start_ns"].to_numpy()[order]
    end = steps["end_ns"].to_numpy()[order]
    number = steps["step"].to_numpy()[order]
    at = np.searchsorted(start, ts_ns, side="right") - 1
    inside = (at >= 0) & (ts_ns < end[np.clip(at, 0, None)])
    return np.where(inside, number[np.clip(at, 0, None)], -1).astype(np.int64)


def rank_op_flops(trace: RankTrace) -> pd.DataFrame:
    """op_flops of a rank's trace file(s), assigned to its selected steps."""
    return op_flops(read_ops([trace.path, *trace.extra_paths]), trace.steps)


def step_flops(op_table: pd.DataFrame, rank=None) -> pd.DataFrame:
    """Per step: the counted model FLOPs (compute ops), the dtype that carries most of them,
    the counted memory ops' bytes, and the compute ops without shapes (not counted)."""
    inside = op_table[op_table["step"] >= 0]
    compute = inside[inside["counted"] & inside["kind"].isin(COMPUTE_KINDS)]
    rows = []
    for step in sorted(set(inside["step"].tolist())):
        mine = compute[compute["step"] == step]
        known = mine[np.isfinite(mine["flops"].to_numpy())]
        by_dtype = known.groupby(known["dtype"].fillna("unknown"))["flops"].sum()
        memory = inside[(inside["step"] == step) & inside["counted"]
                        & (inside["kind"] == "memory")]
        rows.append({"rank": rank, "step": int(step), "flops_per_step": float(known["flops"].sum()),
                     "dtype": str(by_dtype.idxmax()) if len(by_dtype) else None,
                     "memory_bytes": float(np.nansum(memory["bytes"].to_numpy())),
                     "ops_without_shapes": int(len(mine) - len(known))})
    return pd.DataFrame(rows, columns=["rank", "step", "flops_per_step", "dtype", "memory_bytes",
                                       "ops_without_shapes"])


def run_start_of(trace: RankTrace):
    """The rank's run_start record, or None (a foreign trace)."""
    if trace.records is None:
        return None
    return next((r for r in trace.records.manifest if type(r).__name__ == "RunStart"), None)


def rank_peak(trace: RankTrace, dtype: str | None, peak_tflops: float | None = None,
              tf32: bool = False) -> tuple[float | None, str | None]:
    """(peak TFLOP/s, where it comes from) for the rank: `peak_tflops` given ("option"); the
    tracer's run_start (its --peak-tflops, "option", or its measurement, "measured"); or the
    datasheet row of the device name it recorded ("datasheet: <row>"); (None, None) else."""
    if peak_tflops:
        return float(peak_tflops), "option"
    start = run_start_of(trace)
    if start is None:
        return None, None
    recorded = getattr(start, "peak_tflops", None)
    if recorded:
        return float(recorded), getattr(start, "peak_source", None) or "measured"
    row = peaks.device_peak(getattr(start, "device_name", None))
    value = peaks.peak_tflops(getattr(start, "device_name", None), dtype or "fp32", tf32)
    if row is None or value is None:
        return None, None
    return float(value), f"datasheet: {row.device}"


def mfu_rows(flops: pd.DataFrame, per_step: pd.DataFrame, peak: tuple,
             waits: pd.DataFrame | None = None) -> pd.DataFrame:
    """MFU_COLUMNS for one rank's steps: `flops` from step_flops, `per_step` its rows of
    analysis.rank.step_breakdown.breakdown_per_step, `peak` (TFLOP/s, source), `waits` its rows
    of analysis.crossrank's rank_step_waits (None: no waiting is split from transfer).

    The lost points add up to 100 - mfu_pct exactly (docs/mfu.md, "MFU and the points lost")."""
    joined = per_step.merge(flops.drop(columns=["rank"]), on="step", how="inner")
    if waits is not None and len(waits):
        joined = joined.merge(waits[["step", "wait_for_peers_ms"]], on="step", how="left")
    else:
        joined["wait_for_peers_ms"] = 0.0
    peak_tflops, source = peak
    rows = []
    for row in joined.itertuples(index=False):
        step_ns = float(row.step_ns)
        achieved = row.flops_per_step / (step_ns * 1e-9) / 1e12 if step_ns > 0 else math.nan
        out = {"rank": known_rank_value(row.rank), "step": int(row.step),
               "flops_per_step": row.flops_per_step, "achieved_tflops": achieved,
               "peak_tflops": peak_tflops, "peak_source": source, "dtype": row.dtype,
               "step_ns": int(row.step_ns)}
        out.update(_lost_points(row, step_ns, peak_tflops))
        rows.append(out)
    return pd.DataFrame(rows, columns=MFU_COLUMNS)


def known_rank_value(rank):
    return None if rank is None or (isinstance(rank, float) and math.isnan(rank)) else int(rank)


def _lost_points(row, step_ns: float, peak_tflops: float | None) -> dict:
    nan = math.nan
    if not peak_tflops or step_ns <= 0:
        return {"mfu_pct": nan, "lost_transfer_pts": nan, "lost_waiting_pts": nan,
                "lost_idle_pts": nan, "lost_compute_pts": nan}
    ideal_ns = row.flops_per_step / (peak_tflops * 1e3)  # FLOPs at the peak, in ns
    exposed = float(row.comm_only_ns)
    waiting = min(float(row.wait_for_peers_ms or 0.0) * 1e6, exposed)
    if waiting != waiting:  # NaN: a step without matched ops
        waiting = 0.0
    compute = float(row.compute_only_ns + row.overlap_ns)
    transfer = exposed - waiting + float(row.memcpy_ns)
    idle = float(row.idle_ns)
    mfu = 100.0 * ideal_ns / step_ns
    lost = {"lost_transfer_pts": 100.0 * transfer / step_ns,
            "lost_waiting_pts": 100.0 * waiting / step_ns,
            "lost_idle_pts": 100.0 * idle / step_ns}
    # Compute time beyond the FLOPs' time at the peak: with the five parts of the breakdown
    # adding up to step_ns, the four add up to 100 - mfu.
    lost["lost_compute_pts"] = 100.0 * (compute - ideal_ns) / step_ns
    return {"mfu_pct": mfu, **lost}


def mfu_table(ranks: list[RankTrace], per_step: pd.DataFrame, waits: pd.DataFrame | None = None,
              peak_tflops: float | None = None, tf32: bool = False) -> pd.DataFrame:
    """MFU_COLUMNS per rank and step: the ranks of a loaded run, `per_step` the run's
    breakdown_per_step rows of every rank, `waits` the cross-rank rank_step_waits (or None),
    `peak_tflops` an override of every rank's peak."""
    frames = []
    for trace in ranks:
        if not trace.has_trace:
            continue
        rank = known_rank(trace)
        flops = step_flops(rank_op_flops(trace), rank)
        mine = per_step[per_step["rank"].map(known_rank_value) == rank]
        if not len(flops) or not len(mine):
            continue
        dtype = flops["dtype"].dropna().mode()
        peak = rank_peak(trace, dtype.iloc[0] if len(dtype) else None, peak_tflops, tf32)
        rank_waits = None
        if waits is not None and len(waits):
            rank_waits = waits[waits["rank"].map(known_rank_value) == rank]
        frames.append(mfu_rows(flops, mine, peak, rank_waits))
    if not frames:
        return pd.DataFrame(columns=MFU_COLUMNS)
    return pd.concat(frames, ignore_index=True)


def mfu_records(table: pd.DataFrame) -> list[dict]:
    """mfu_table's rows as JSON-ready dicts: plain ints, floats and strs, None for NaN."""
    records = []
    for row in table.to_dict("records"):
        records.append({key: _plain(value) for key, value in row.items()})
    return records


def _plain(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return None if math.isnan(value) else float(value)
    return value

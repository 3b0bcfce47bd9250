"""FLOPs per op and per step of a rank, from the shapes its Kineto trace(s) recorded, and MFU per
rank and step with the points it loses (docs/mfu.md defines every column).

Model FLOPs are those of GEMMs, convolutions and attention (analysis.rank.op_model), as
torch.utils.flop_counter counts them. An op is counted once: where such ops nest on one thread
(aten::linear > aten::matmul > aten::mm), only the innermost is, so that a FLOP is never counted
twice. Where the trace gives torch.profiler's own `flops` for the op counted, that is used.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core import peaks
from analysis.core.model import RankTrace, known_rank
from analysis.ingest.op_args import ops_of_events
from analysis.rank.layers import step_windows
from analysis.rank.op_model import COMPUTE_KINDS, dtype_of, op_model
from analysis.rank.roofline import op_times, roofline_by_op, with_roofline

OP_FLOPS_COLUMNS = ["name", "tid", "ts_ns", "end_ns", "kind", "dtype", "flops", "bytes",
                    "counted", "flops_from", "step", "in_step"]
STEP_FLOPS_COLUMNS = ["rank", "step", "flops_per_step", "dtype", "memory_bytes",
                      "ops_without_shapes"]
MFU_COLUMNS = ["rank", "step", "flops_per_step", "achieved_tflops", "mfu_pct", "peak_tflops",
               "peak_source", "dtype", "ops_without_shapes", "step_ns", "lost_transfer_pts",
               "lost_waiting_pts", "lost_idle_pts", "lost_compute_pts"]
LOST_COLUMNS = ["lost_transfer_pts", "lost_waiting_pts", "lost_idle_pts", "lost_compute_pts"]


def op_flops(ops: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each op of `ops` (analysis.ingest.op_args.ops_of_events) with its kind, dtype, FLOPs and
    bytes (NaN where unknown), whether it is `counted` (a compute op with no compute op nested
    in it, or a memory op with no memory op nested in it), where its FLOPs come from
    ("profiler", "shapes" or ""), the step whose span holds its start (-1: none) and whether
    one does (`in_step`; a trace analysed whole is the one window -1)."""
    # Once per distinct (name, shapes, types, scalars): a step repeats them.
    names = ops["name"].to_numpy(dtype=object)
    dims, types, concrete = (ops[c].to_numpy(dtype=object)
                             for c in ("input_dims", "input_type", "concrete_inputs"))
    _, first, codes = np.unique(_args_keys(ops), return_index=True, return_inverse=True)
    modelled = [(*op_model(names[i], dims[i], types[i], concrete[i]), dtype_of(types[i]))
                for i in first.tolist()]

    def per_op(position: int, dtype) -> np.ndarray:
        values = np.empty(len(modelled), dtype=dtype)
        values[:] = [m[position] for m in modelled]
        return values[codes]

    kind = per_op(0, object)
    flops = per_op(1, np.float64)
    given = ops["flops"].to_numpy(dtype=np.float64)
    is_compute = np.array([m[0] in COMPUTE_KINDS for m in modelled], dtype=bool)[codes]
    is_memory = np.array([m[0] == "memory" for m in modelled], dtype=bool)[codes]
    from_profiler = is_compute & (given > 0)
    flops = np.where(from_profiler, given, flops)
    starts, ends = ops["ts_ns"].to_numpy(), ops["end_ns"].to_numpy()
    tids = ops["tid"].to_numpy()
    step, in_step = _step_of(starts, steps)
    return pd.DataFrame({
        "name": _texts(names), "tid": _texts(tids), "ts_ns": starts, "end_ns": ends,
        "kind": _texts(kind), "dtype": _texts(per_op(3, object)), "flops": flops,
        "bytes": per_op(2, np.float64),
        "counted": _innermost(starts, ends, tids, is_compute)
        | _innermost(starts, ends, tids, is_memory),
        "flops_from": _texts(np.where(from_profiler, "profiler",
                                      np.where(np.isfinite(flops), "shapes", ""))),
        "step": step, "in_step": in_step}, columns=OP_FLOPS_COLUMNS)


def _args_keys(ops: pd.DataFrame) -> np.ndarray:
    """The same int for ops of one name and one set of arguments: ops_of_events' `args_key`;
    for a frame without it, the ids of the argument lists (alive in `ops` while they are read,
    so an id names one list; equal lists of other ids are only modelled twice)."""
    if "args_key" in ops.columns:
        return ops["args_key"].to_numpy(dtype=np.int64)
    index_of: dict = {}
    keys = zip(ops["name"].tolist(), map(id, ops["input_dims"]), map(id, ops["input_type"]),
               map(id, ops["concrete_inputs"]))
    return np.fromiter((index_of.setdefault(key, len(index_of)) for key in keys),
                       dtype=np.int64, count=len(ops))


def _texts(values) -> pd.Series:
    """Text values as an object column: pandas' own str dtype costs more to select from."""
    return pd.Series(np.asarray(values, dtype=object), dtype=object, copy=False)


def _innermost(starts: np.ndarray, ends: np.ndarray, tids: np.ndarray,
               of_family: np.ndarray) -> np.ndarray:
    """Ops of the family with no op of the family nested in them on their thread (ops sorted
    by thread, start and longest first, as ops_of_events gives them). Ops on a thread nest as calls
    do: an op has one nested in it exactly when the next op of the family on its thread starts
    before it ends and ends no later (its first nested op)."""
    counted = of_family.copy()
    rows = np.flatnonzero(of_family)
    if len(rows) < 2:
        return counted
    begin, end, thread = starts[rows], ends[rows], tids[rows]
    nested_next = ((thread[1:] == thread[:-1]) & (begin[1:] < end[:-1])
                   & (end[1:] <= end[:-1]))
    counted[rows[:-1][nested_next]] = False
    return counted


def _step_of(ts_ns: np.ndarray, steps: pd.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """(the step of each start, -1 outside every step; whether it is inside one: a trace
    analysed whole is one window numbered -1 too)."""
    if steps is None or not len(steps):
        return np.full(len(ts_ns), -1, dtype=np.int64), np.zeros(len(ts_ns), dtype=bool)
    order = np.argsort(steps["start_ns"].to_numpy(), kind="stable")
    start = steps["start_ns"].to_numpy()[order]
    end = steps["end_ns"].to_numpy()[order]
    number = steps["step"].to_numpy()[order]
    at = np.searchsorted(start, ts_ns, side="right") - 1
    inside = (at >= 0) & (ts_ns < end[np.clip(at, 0, None)])
    return np.where(inside, number[np.clip(at, 0, None)], -1).astype(np.int64), inside


def rank_op_flops(trace: RankTrace) -> pd.DataFrame:
    """op_flops of a rank's events (the arguments the decoder kept: analysis.ingest.op_args),
    assigned to its analysis windows: its selected steps, or its whole trace as one window
    (step -1) where it has no ProfilerStep."""
    return op_flops(ops_of_events(trace.events), step_windows(trace))


def step_flops(op_table: pd.DataFrame, rank=None) -> pd.DataFrame:
    """Per step holding a modelled op: the counted model FLOPs (compute ops; NaN where every
    compute op of the step lacks its shapes, 0 where it has none), the dtype that carries most
    of them, the counted memory ops' bytes, and the compute ops without shapes (not
    counted)."""
    inside = op_table["in_step"].to_numpy(dtype=bool)
    steps, of_op = np.unique(op_table["step"].to_numpy(dtype=np.int64)[inside],
                             return_inverse=True)
    n = len(steps)
    counted = op_table["counted"].to_numpy(dtype=bool)[inside]
    kind = op_table["kind"].to_numpy(dtype=object)[inside]
    flops = op_table["flops"].to_numpy(dtype=float)[inside]
    compute = counted & pd.Series(kind, dtype=object).isin(COMPUTE_KINDS).to_numpy()
    known = compute & np.isfinite(flops)
    calls = np.bincount(of_op[compute], minlength=n)
    found = np.bincount(of_op[known], minlength=n)
    total = np.bincount(of_op[known], weights=flops[known], minlength=n)
    memory = counted & (kind == "memory")
    nbytes = op_table["bytes"].to_numpy(dtype=float)[inside]
    with_bytes = memory & np.isfinite(nbytes)
    memory_bytes = np.bincount(of_op[with_bytes], weights=nbytes[with_bytes], minlength=n)
    # The dtype carrying most FLOPs; of equal ones, the first by name.
    dtype = op_table["dtype"].to_numpy(dtype=object)[inside][known]
    names, of_dtype = pd.factorize(np.where(pd.isna(dtype), "unknown", dtype).astype(object),
                                   sort=True)
    width = max(len(of_dtype), 1)
    pair = of_op[known] * width + names
    by_dtype = np.bincount(pair, weights=flops[known], minlength=n * width).astype(
        float).reshape(n, width)
    by_dtype[np.bincount(pair, minlength=n * width).reshape(n, width) == 0] = -np.inf
    carrying = np.where(found > 0, np.asarray(of_dtype, dtype=object)[
        by_dtype.argmax(axis=1)] if len(of_dtype) else None, None)
    return pd.DataFrame({
        "rank": pd.Series([rank] * n, dtype=object), "step": steps.astype(int),
        "flops_per_step": np.where((found > 0) | (calls == 0), total, np.nan),
        "dtype": _texts(carrying), "memory_bytes": memory_bytes,
        "ops_without_shapes": (calls - found).astype(int)}, columns=STEP_FLOPS_COLUMNS)


def rank_flops_tables(trace: RankTrace) -> dict:
    """{"step_flops": step_flops of the rank, "op_roofline": its counted ops of the analysis
    windows summed by op (roofline.roofline_by_op, with its rank; no peak needed)}: what the
    per-rank reduce keeps (analysis.rank.reduction), from one rank_op_flops of its events."""
    ops = rank_op_flops(trace)
    rank = known_rank(trace)
    inside = ops[ops["in_step"].to_numpy(dtype=bool)]
    by_op = roofline_by_op(op_times(inside, trace.events))
    by_op.insert(0, "rank", rank)
    return {"step_flops": step_flops(ops, rank), "op_roofline": by_op}


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


def rank_peak_gbps(trace: RankTrace) -> float | None:
    """The datasheet memory bandwidth (GB/s) of the device the rank's run_start names, or None
    (a CPU, a foreign trace, a part not in analysis.core.peaks)."""
    start = run_start_of(trace)
    row = peaks.device_peak(getattr(start, "device_name", None)) if start is not None else None
    return float(row.memory_gbps) if row is not None else None


def rank_dtype(flops: pd.DataFrame) -> str | None:
    """The dtype that most of a rank's steps (step_flops rows) carry their FLOPs in."""
    dtype = flops["dtype"].dropna().mode() if len(flops) else pd.Series([], dtype=object)
    return str(dtype.iloc[0]) if len(dtype) else None


def mfu_table(flops: pd.DataFrame, per_step: pd.DataFrame, peaks_of: dict) -> pd.DataFrame:
    """MFU_COLUMNS per rank and profiled step: `flops` the step_flops rows of every rank,
    `per_step` the run's profiled breakdown rows with the communication split
    (analysis.crossrank.waits.split_communication: its peer_wait_ns is the waiting; NaN, no
    waits known, is none), `peaks_of` {rank: (peak TFLOP/s, source)} (rank_peak; a rank
    missing has no peak).

    A rank without a modelled op in any step has no row; a profiled step of a rank that has
    some, but not in that step, has 0 FLOPs. The lost points add up to 100 - mfu_pct exactly
    (docs/mfu.md, "MFU and the points lost")."""
    if not len(flops) or not len(per_step):
        return pd.DataFrame(columns=MFU_COLUMNS)
    # Each profiled step of a rank with step_flops rows, and its row there (-1: none).
    flop_ranks = _rank_keys(flops["rank"])
    row_of = {key: i for i, key in enumerate(zip(flop_ranks.tolist(),
                                                  flops["step"].astype(np.int64).tolist()))}
    step_ranks = _rank_keys(per_step["rank"])
    kept = np.isin(step_ranks, flop_ranks)
    joined = per_step[kept]
    keys = step_ranks[kept]
    at = np.array([row_of.get(key, -1) for key in zip(
        keys.tolist(), joined["step"].astype(np.int64).tolist())], dtype=np.intp)
    has_ops = at >= 0

    def of_flops(column: str, missing) -> np.ndarray:
        values = flops[column].to_numpy()
        found = values[np.clip(at, 0, None)] if len(values) else np.zeros(len(at))
        return np.where(has_ops, found, missing)

    flops_per_step = of_flops("flops_per_step", 0.0).astype(float)
    step_ns = joined["step_ns"].to_numpy(dtype=float)
    peak = np.array([peaks_of.get(None if k < 0 else int(k), (None, None))[0] or np.nan
                     for k in keys.tolist()], dtype=float)
    source = [peaks_of.get(None if k < 0 else int(k), (None, None))[1] for k in keys.tolist()]
    with np.errstate(divide="ignore", invalid="ignore"):
        achieved = np.where(step_ns > 0, flops_per_step / (step_ns * 1e-9) / 1e12, np.nan)
        ideal_ns = flops_per_step / (peak * 1e3)  # the FLOPs at the peak, in ns
        judged = (peak > 0) & (step_ns > 0) & np.isfinite(flops_per_step)

        def points(ns) -> np.ndarray:
            return np.where(judged, 100.0 * np.asarray(ns, dtype=float) / step_ns, np.nan)

        exposed = joined["comm_only_ns"].to_numpy(dtype=float)
        waiting = np.nan_to_num(joined["peer_wait_ns"].to_numpy(dtype=float), nan=0.0)
        compute = (joined["compute_only_ns"].to_numpy(dtype=float)
                   + joined["overlap_ns"].to_numpy(dtype=float))
        # Compute time beyond the FLOPs' time at the peak: with the five parts of the breakdown
        # adding up to step_ns, the four lost points add up to 100 - mfu.
        lost = {"lost_transfer_pts": points(exposed - waiting
                                            + joined["memcpy_ns"].to_numpy(dtype=float)),
                "lost_waiting_pts": points(waiting),
                "lost_idle_pts": points(joined["idle_ns"].to_numpy(dtype=float)),
                "lost_compute_pts": points(compute - ideal_ns)}
        mfu = points(ideal_ns)
    dtype = of_flops("dtype", None)
    without = of_flops("ops_without_shapes", 0).astype(float)
    return pd.DataFrame({
        "rank": pd.Series([None if k < 0 else int(k) for k in keys.tolist()], dtype=object),
        "step": joined["step"].to_numpy(dtype=np.int64), "flops_per_step": flops_per_step,
        "achieved_tflops": achieved, "mfu_pct": mfu, "peak_tflops": peak,
        "peak_source": pd.Series(source, dtype=object),
        "dtype": _texts([d if isinstance(d, str) else None for d in dtype]),
        "ops_without_shapes": np.nan_to_num(without, nan=0.0).astype(np.int64),
        "step_ns": joined["step_ns"].to_numpy(dtype=np.int64), **lost}, columns=MFU_COLUMNS)


def _rank_keys(ranks: pd.Series) -> np.ndarray:
    """A rank column as int64 keys, -1 for the unknown rank (None or NaN)."""
    return pd.to_numeric(ranks.astype(object), errors="coerce").fillna(-1).to_numpy(
        dtype=np.int64)


def mfu_per_rank(table: pd.DataFrame) -> pd.DataFrame:
    """Per rank of an mfu_table: its profiled steps, the mean over them of the FLOPs per step,
    the achieved TFLOP/s, MFU and each lost-point column (the means add up as the steps'
    do: to 100 - MFU), its peak and source, and its compute ops without shapes (summed)."""
    columns = ["rank", "steps", "flops_per_step", "achieved_tflops", "peak_tflops",
               "peak_source", "mfu_pct", *LOST_COLUMNS, "ops_without_shapes"]
    if table is None or not len(table):
        return pd.DataFrame(columns=columns)
    keys, first, of_row = np.unique(_rank_keys(table["rank"]), return_index=True,
                                    return_inverse=True)
    found = {"rank": pd.Series([None if k < 0 else int(k) for k in keys.tolist()],
                               dtype=object),
             "steps": np.bincount(of_row, minlength=len(keys))}
    for column in ("flops_per_step", "achieved_tflops", "mfu_pct", *LOST_COLUMNS):
        values = pd.to_numeric(table[column], errors="coerce").to_numpy(dtype=float)
        known = np.isfinite(values)
        with np.errstate(divide="ignore", invalid="ignore"):
            found[column] = (np.bincount(of_row[known], weights=values[known],
                                         minlength=len(keys))
                             / np.bincount(of_row[known], minlength=len(keys)))
    # A rank's peak is the same in each of its rows: its first row's.
    found["peak_tflops"] = pd.to_numeric(table["peak_tflops"], errors="coerce").to_numpy(
        dtype=float)[first]
    found["peak_source"] = pd.Series(table["peak_source"].to_numpy(dtype=object)[first],
                                     dtype=object)
    found["ops_without_shapes"] = np.bincount(
        of_row, weights=table["ops_without_shapes"].to_numpy(dtype=float),
        minlength=len(keys)).astype(np.int64)
    return pd.DataFrame(found, columns=columns)


# ---- the run's tables ---------------------------------------------------------------------------
def mfu_of_run(traces: list[RankTrace], per_step: pd.DataFrame,
               peak_tflops: float | None = None) -> pd.DataFrame:
    """mfu_table of the run: each rank's step_flops (its reduction's), `per_step` its profiled
    breakdown rows with the communication split (analysis.crossrank.waits), each rank's peak
    by rank_peak (`peak_tflops`, else its run_start's, else the datasheet's)."""
    frames, peaks_of = [], {}
    for trace in traces:
        if not trace.has_trace:
            continue
        flops = trace.table("step_flops")
        frames.append(flops)
        peaks_of[known_rank(trace)] = rank_peak(trace, rank_dtype(flops), peak_tflops)
    every = (pd.concat(frames, ignore_index=True) if frames
             else pd.DataFrame(columns=STEP_FLOPS_COLUMNS))
    return mfu_table(every, per_step, peaks_of)


ROOFLINE_OPS_PER_RANK = 10
# The `roofline` table: roofline.with_roofline's columns, with the rank and its peak's source.
ROOFLINE_COLUMNS = ["rank", "name", "kind", "dtype", "calls", "flops", "bytes", "time_ns",
                    "time_from", "achieved_tflops", "achieved_gbps", "intensity", "peak_tflops",
                    "peak_source", "peak_gbps", "ridge", "bound", "roofline_tflops",
                    "pct_of_roofline"]


def roofline_of_run(traces: list[RankTrace], peak_tflops: float | None = None,
                    per_rank: int = ROOFLINE_OPS_PER_RANK) -> pd.DataFrame:
    """Each rank's `per_rank` slowest op groups (name, kind, dtype; summed over its analysed
    steps; its reduction's op_roofline) against its roofline: the rank's peak (as its MFU's)
    and the datasheet bandwidth of its device where known (docs/mfu.md, "In the report")."""
    frames = []
    for trace in traces:
        if not trace.has_trace:
            continue
        by_op = trace.table("op_roofline").head(per_rank)
        if not len(by_op):
            continue
        peak, source = rank_peak(trace, rank_dtype(trace.table("step_flops")), peak_tflops)
        frames.append(with_roofline(by_op, peak, rank_peak_gbps(trace))
                      .assign(peak_source=source))
    if not frames:
        return pd.DataFrame(columns=ROOFLINE_COLUMNS)
    return pd.concat(frames, ignore_index=True)[ROOFLINE_COLUMNS]

"""Collective and p2p ops per rank, and the collectives table (definitions in docs/report.md).

`comm_ops(trace)` gives one row per op on one rank: from the tracer's comm records when the run
folder has them, else from the Kineto trace's events. `collectives_table(ops)` groups ops by op,
process group and power-of-two message-size bucket. Bandwidths follow nccl-tests through
`tracer.schema.bandwidth_gbps`; bytes are nccl-tests' size S (see `tracer.schema.CommRecord`).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.core.comm_names import UNKNOWN_OP, UNKNOWN_PG, canonical_dtype, canonical_op
from analysis.core.model import known_rank
from analysis.core.steps import FIRST_TRAINING_STEP
from analysis.rank import issuers
from analysis.rank.comm.event_ops import REQUIRED_EVENT_COLUMNS, op_columns
from analysis.rank.comm.event_ops import col as _col
from analysis.rank.comm.profiled import (
    FROM_PROFILED,
    FROM_RECORDS,
    FROM_TRACE,
    pair_with_profiled,
)
from tracer import schema

COLLECTIVES_COLUMNS = [
    "op", "issuer", "pg", "pg_id", "pg_size", "size_bucket", "bucket_min_bytes", "count",
    "total_bytes", "total_us", "mean_us", "algbw_gbps", "busbw_gbps", "ranks", "rank_steps",
    "slowest_rank", "slowest_rank_busbw_gbps", "ms_per_step", "time_from",
]
UNKNOWN_BUCKET = "unknown"


def _bandwidths(op, nbytes, pg_size, duration_us) -> tuple[float, float]:
    nbytes_ok, duration_ok = _finite(nbytes), _finite(duration_us)
    if not (nbytes_ok and duration_ok):
        return float("nan"), float("nan")
    algbw, busbw = schema.bandwidth_gbps(op, int(round(nbytes)), 1, duration_us / 1e6)
    if not _finite(pg_size) or pg_size < 1:
        return algbw, float("nan")
    return algbw, algbw * schema.bus_factor(op, int(pg_size))


def _finite(value) -> bool:
    try:
        return value is not None and value is not pd.NA and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


# ---- comm_ops ------------------------------------------------------------------------------------
def comm_ops(trace, join=None) -> pd.DataFrame:
    """One row per collective/p2p op on `trace`'s rank, columns OPS_COLUMNS.

    Uses the tracer's comm records when the run folder has any for this rank (they cover every
    step); otherwise derives the ops from the trace's events (`join`: their
    comm_events.KernelJoin, where the caller has it). `issuer` says which code issued
    the op and `pg_desc` the group's name (analysis.rank.issuers).
    """
    records = getattr(trace, "records", None)
    comms = getattr(records, "comms", None) if records is not None else None
    rank = known_rank(trace)
    if isinstance(comms, pd.DataFrame) and len(comms):
        frame = _with_profiled_times(_ops_from_records(comms, rank, trace), comms, trace, join)
        traced = (_trace_columns(trace, rank, join)
                  if _ddp_buckets_in_windows_only(records) and not _has_native(comms) else None)
        if traced is not None:
            # The records lack DDP's bucket all-reduces (no comm hook): take them from the
            # profiler windows' events, where the trace shows them (docs/report.md).
            traced = frame_of(traced)
            buckets = traced[(traced["issuer"] == "ddp") & (traced["op"] == "all_reduce")]
            if len(buckets):
                frame = pd.concat([frame, buckets[frame.columns.intersection(buckets.columns)]],
                                  ignore_index=True)
    else:
        columns = _trace_columns(trace, rank, join)
        if columns is None:
            return empty_ops()
        return frame_of(_with_bandwidths(columns))
    frame["pg_desc"] = _descs(trace, frame["pg"], _col(frame, "pg_desc"))
    return frame_of(_with_bandwidths(typed_columns(frame)))


def _descs(trace, pgs, own) -> list:
    """Each op's group name: its own, else the one the rank's trace or records give the group."""
    names = issuers.group_names(trace)
    return [issuers.group_desc(pg, desc) or names.get(pg) for pg, desc in zip(pgs, own)]


NATIVE_SOURCE = "native"  # a record of PyTorch's Flight Recorder: every collective, C++ ones too
ISSUE_ONLY = "issue"  # a record's `timing` when the backend gave no completion


def _has_native(comms: pd.DataFrame) -> bool:
    """The records hold the collectives issued in C++ (DDP's buckets among them): the windows'
    events would count them twice."""
    return "source" in comms.columns and bool((comms["source"] == NATIVE_SOURCE).any())


def windows_hold_what_records_lack(records) -> bool:
    """The rank's records lack DDP's bucket all-reduces (traced without the DDP comm hook, and
    no Flight Recorder records) while its profiled windows show them."""
    comms = getattr(records, "comms", None) if records is not None else None
    return (_ddp_buckets_in_windows_only(records) and isinstance(comms, pd.DataFrame)
            and not _has_native(comms))


def _ddp_buckets_in_windows_only(records) -> bool:
    """The tracer ran without its DDP comm hook, so DDP's buckets are only in the traces."""
    return any(isinstance(r, schema.RunStart) and r.ddp_buckets == schema.DDP_BUCKETS_FROM_PROFILER
               for r in (getattr(records, "manifest", None) or []))


def _trace_columns(trace, rank, join=None) -> dict | None:
    """The ops of the trace's events (comm_events.op_columns) with their issuers and group
    names, as typed columns (ops_table.typed_columns' types); None when the trace has no op."""
    events = getattr(trace, "events", None)
    if not isinstance(events, pd.DataFrame) or events.empty or any(
            c not in events.columns for c in REQUIRED_EVENT_COLUMNS):
        return None
    ops = op_columns(events, getattr(trace, "steps", None), getattr(trace, "all_steps", None),
                     getattr(trace, "world_size", None), join)
    if ops is None:
        return None
    index = pd.RangeIndex(len(ops["op"]))
    step = ops["step"]
    if not isinstance(step, pd.Series):
        step = pd.Series(step, index=index)
    issuer = issuers.issuers_of_ops(trace, objects(ops["op"]), ops["host_ts"],
                                    [str(p) for p in ops["host_pid"]],
                                    [str(t) for t in ops["host_tid"]],
                                    np.array(ops["named"], dtype=bool))
    return {
        "rank": int64(pd.Series(rank, index=index)),
        "step": int64(step),
        "op": objects(ops["op"]),
        "source": objects(ops["source"]),
        "issuer": objects(issuer),
        "pg": objects(ops["pg"]),
        "pg_desc": objects(_descs(trace, ops["pg"], ops["pg_desc"])),
        "pg_size": int64(pd.Series(ops["pg_size"], index=index)),
        "dtype": objects(ops["dtype"]),
        "bytes": float64(pd.Series(ops["bytes"], index=index)),
        "duration_us": float64(pd.Series(ops["duration_us"], index=index)),
        "algbw_gbps": np.full(len(index), np.nan),
        "busbw_gbps": np.full(len(index), np.nan),
        "origin": objects(["trace"] * len(index)),
        "time_from": objects([FROM_TRACE] * len(index)),
    }


def _ops_from_records(comms: pd.DataFrame, rank, trace) -> pd.DataFrame:
    ops = _col(comms, "op").map(
        lambda op: op if op in schema.COMM_OPS else (canonical_op(op) or UNKNOWN_OP))
    ranks = _col(comms, "rank")
    if rank is not None:
        ranks = ranks.where(ranks.notna(), rank)
    frame = pd.DataFrame({
        "rank": ranks,
        "step": _col(comms, "step"),
        "op": ops,
        "source": _col(comms, "source"),
        "issuer": issuers.issuers_from_records(_col(comms, "source"), ops, trace,
                                               _col(comms, "issuer")),
        "pg": _col(comms, "pg").map(lambda pg: None if pg is None or pd.isna(pg) else str(pg)),
        "pg_size": _col(comms, "pg_size"),
        "dtype": _col(comms, "dtype").map(
            lambda d: canonical_dtype(d) or (d if isinstance(d, str) else None)),
        "bytes": pd.to_numeric(_col(comms, "bytes"), errors="coerce"),
        "duration_us": pd.to_numeric(_col(comms, "duration_us"), errors="coerce"),
        "origin": "records",
        "time_from": FROM_RECORDS,
    })
    frame.loc[frame["duration_us"] < 0, "duration_us"] = np.nan
    # Timed at issue only (no completion from the backend): the op's time is unknown, not 0,
    # and so are its bandwidths.
    issue_only = (_col(comms, "timing") == ISSUE_ONLY).to_numpy(dtype=bool)
    frame.loc[issue_only, "duration_us"] = np.nan
    frame.loc[issue_only, "time_from"] = None
    return frame


def _with_profiled_times(frame: pd.DataFrame, comms: pd.DataFrame, trace, join=None
                         ) -> pd.DataFrame:
    """The record ops with the time of each one timed at issue only taken from the same op in
    the rank's profiled steps (analysis.rank.comm.profiled), `time_from` "profiled steps": the
    worker thread's gloo op, or the NCCL kernels, of the trace."""
    untimed = frame["time_from"].isna().to_numpy() & frame["duration_us"].isna().to_numpy()
    steps = getattr(trace, "steps", None)
    events = getattr(trace, "events", None)
    if (not untimed.any() or steps is None or not len(steps) or not isinstance(
            events, pd.DataFrame) or events.empty
            or any(c not in events.columns for c in REQUIRED_EVENT_COLUMNS)):
        return frame
    in_window = frame["step"].isin(steps["step"]).to_numpy(dtype=bool)
    if not (untimed & in_window).any():
        return frame
    traced = op_columns(events, steps, getattr(trace, "all_steps", None),
                        getattr(trace, "world_size", None), join)
    if traced is None:
        return frame
    profiled = pd.DataFrame({name: list(traced[name]) for name in
                             ("step", "op", "pg", "bytes", "duration_us", "host_ts")})
    profiled = profiled.sort_values("host_ts", kind="stable").reset_index(drop=True)
    # Records in issue order: native ones are written after the ops issued after them.
    order = np.argsort(pd.to_numeric(_col(comms, "start_ns"), errors="coerce").to_numpy(
        "float64"), kind="stable")
    rows = np.full(len(frame), -1, dtype=np.int64)
    rows[order] = pair_with_profiled(frame.iloc[order], profiled)
    use = untimed & (rows >= 0)
    duration = profiled["duration_us"].to_numpy("float64")[rows[use]]
    use[use] = ~np.isnan(duration)
    if not use.any():
        return frame
    frame = frame.copy()
    frame.loc[use, "duration_us"] = profiled["duration_us"].to_numpy("float64")[rows[use]]
    frame.loc[use, "time_from"] = FROM_PROFILED
    return frame


def _with_bandwidths(columns: dict) -> dict:
    """The columns with algbw_gbps and busbw_gbps: _bandwidths of each op, by array (the same
    float operations in the same order), with one bus factor per distinct (op, group size)."""
    nbytes, duration_us = columns["bytes"], columns["duration_us"]
    sizes = pd.array(columns["pg_size"], dtype="Int64")
    known = np.isfinite(nbytes) & np.isfinite(duration_us)
    rounded = np.round(np.where(known, nbytes, 0.0))  # int(round()) of a float, as a float
    seconds = duration_us / 1e6
    moving = known & (seconds > 0) & (rounded > 0)
    algbw = np.where(known, 0.0, np.nan)
    algbw[moving] = rounded[moving] / seconds[moving] / 1e9
    grouped = known & ~sizes.isna() & (sizes.fillna(0).to_numpy("int64") >= 1)
    pairs = list(zip(np.asarray(columns["op"], dtype=object)[grouped].tolist(),
                     sizes[grouped].to_numpy("int64").tolist()))
    factors = {pair: schema.bus_factor(*pair) for pair in dict.fromkeys(pairs)}
    busbw = np.full(len(algbw), np.nan)
    busbw[grouped] = algbw[grouped] * np.array([factors[p] for p in pairs], dtype="float64")
    columns["algbw_gbps"] = algbw
    columns["busbw_gbps"] = busbw
    return columns


# ---- collectives_table ---------------------------------------------------------------------------
_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))


def _size_text(nbytes: int) -> tuple[str, str]:
    for unit, scale in _UNITS:
        if nbytes >= scale:
            return f"{nbytes / scale:g}", unit
    return "0", "B"


def size_bucket(nbytes) -> tuple[str, float]:
    """(label, lower bound) of the power-of-two bucket [2^k, 2^(k+1)) bytes holding `nbytes`.

    0 bytes is its own bucket "0 B"; unknown sizes fall in "unknown" (lower bound NaN).
    """
    if not _finite(nbytes) or nbytes < 0:
        return UNKNOWN_BUCKET, float("nan")
    nbytes = int(round(float(nbytes)))
    if nbytes == 0:
        return "0 B", 0.0
    low = 1 << (nbytes.bit_length() - 1)
    high = low * 2
    low_number, low_unit = _size_text(low)
    high_number, high_unit = _size_text(high)
    if low_unit == high_unit:
        return f"{low_number}-{high_number} {low_unit}", float(low)
    return f"{low_number} {low_unit}-{high_number} {high_unit}", float(low)


def empty_collectives() -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(dtype=_COLLECTIVES_DTYPES.get(column, "object"))
                         for column in COLLECTIVES_COLUMNS})


_COLLECTIVES_DTYPES = {
    "pg_size": "Int64", "bucket_min_bytes": "float64", "count": "int64", "total_bytes": "float64",
    "total_us": "float64", "mean_us": "float64", "algbw_gbps": "float64", "busbw_gbps": "float64",
    "ranks": "int64", "rank_steps": "int64", "slowest_rank": "Int64",
    "slowest_rank_busbw_gbps": "float64", "ms_per_step": "float64", "time_from": "str",
}


# The columns of the ops that collectives_table reads.
_GROUPED_COLUMNS = ["rank", "step", "op", "issuer", "pg", "pg_desc", "pg_size", "bytes",
                    "duration_us", "origin", "time_from"]
# The steps an op's time covers: its origin's, or the profiled steps' (origin "trace") for a
# record timed from them.
PROFILED_ORIGIN = "trace"


def analysed_steps_of(ops: pd.DataFrame) -> dict:
    """{(rank, origin): distinct steps} of the ops: how many steps each rank's source covered,
    where the caller knows no better (a step without any op of the rank's source is missed)."""
    if not isinstance(ops, pd.DataFrame) or ops.empty:
        return {}
    rank = pd.to_numeric(ops["rank"], errors="coerce")
    step = pd.to_numeric(ops["step"], errors="coerce")
    profiled = (_col(ops, "time_from") == FROM_PROFILED).to_numpy(dtype=bool)
    keyed = pd.concat([  # a record timed from the profiled steps also covers one of them
        pd.DataFrame({"rank": rank, "origin": _col(ops, "origin").astype(object), "step": step}),
        pd.DataFrame({"rank": rank[profiled], "origin": PROFILED_ORIGIN, "step": step[profiled]}),
    ]).dropna()
    counts = keyed.groupby(["rank", "origin"])["step"].nunique()
    return {(int(rank), origin): int(n) for (rank, origin), n in counts.items()}


def analysed_ops(ops: pd.DataFrame, steps: list[int] | None) -> tuple[pd.DataFrame,
                                                                        pd.DataFrame]:
    """(the ops of the analysed steps, the set-up ops): records of the tracer's step 0 (before
    the first step: process group start, DDP's first broadcast, barriers) are set-up and enter
    no step's rows; `steps` (--steps) selects the analysed steps of every source. A run with
    no op past set-up (it stopped before its first step) has only those: they are its ops, not
    set-up."""
    step = pd.to_numeric(ops["step"], errors="coerce").astype("float64")
    recorded = (ops["origin"] == "records").to_numpy(dtype=bool)
    setup = recorded & (step < FIRST_TRAINING_STEP).to_numpy(dtype=bool)
    if setup.all():
        setup[:] = False
    kept = ~setup
    if steps is not None:
        kept &= step.isin(steps).to_numpy(dtype=bool)
    return (ops[kept].reset_index(drop=True), ops[setup].reset_index(drop=True))


def steps_covered(traces, ops: pd.DataFrame, steps: list[int] | None) -> dict:
    """{(rank, origin): analysed steps} that each rank's sources of ops cover: the steps of its
    records (from the first step, those of --steps) and its profiled steps; where neither is
    known, the distinct steps of its ops (analysed_steps_of)."""
    covered = analysed_steps_of(ops)
    for trace in traces:
        rank = known_rank(trace)
        if rank is None:
            continue
        records = trace.records
        record_steps = getattr(records, "steps", None) if records is not None else None
        if record_steps is not None and len(record_steps) and "step" in record_steps:
            numbers = pd.to_numeric(record_steps["step"], errors="coerce").dropna()
            numbers = numbers[numbers >= FIRST_TRAINING_STEP]
            if steps is not None:
                numbers = numbers[numbers.isin(steps)]
            covered[(int(rank), "records")] = int(numbers.nunique())
        if len(trace.steps):
            covered[(int(rank), "trace")] = int(trace.steps["step"].nunique())
    return covered


def collectives_table(ops: pd.DataFrame, analysed_steps: dict | None = None) -> pd.DataFrame:
    """Ops grouped by op, issuer, process group (with its size) and power-of-two message-size
    bucket.

    pg: the group's label, its name with its id ("mesh_dp (1)") where a rank's trace or records
    name it, else the id; pg_id: the id; issuer: the code that issued the ops
    (analysis.rank.issuers).

    count: ops; total_bytes: their summed S (known sizes only); total_us: their summed time
    (known times only); mean_us: total_us over the ops with a known time; algbw/busbw: summed
    bytes over summed seconds of the ops whose size and time are both known, through
    schema.bandwidth_gbps; ranks: ranks that ran the group; rank_steps: distinct (rank, step)
    pairs it ran in; slowest_rank: the rank with the lowest busbw on it (NA with one rank);
    ms_per_step: its cost per analysed step, the mean over its ranks of each rank's timed ops'
    time over the steps that rank's source of ops covered (`analysed_steps`, {(rank, origin):
    steps}; by default analysed_steps_of(ops)), so that ops recorded in every step and ops
    seen in a few profiled steps compare (a record timed from the profiled steps counts over
    the rank's profiled steps, {(rank, "trace"): steps}); time_from: where the times come from,
    "records", "profiled steps" (records timed at issue only, timed by the same ops of the
    profiled steps), "trace" or several of them, None where no op has a time. Sorted by
    ms_per_step, largest first.
    """
    if not isinstance(ops, pd.DataFrame) or ops.empty or "op" not in ops.columns:
        return empty_collectives()
    columns = typed_columns(ops, _GROUPED_COLUMNS)
    kept = pd.notna(columns["op"])
    if not kept.any():
        return empty_collectives()
    if not kept.all():
        columns = {name: values[kept] for name, values in columns.items()}
    op = columns["op"]
    issuer = _filled(columns["issuer"], issuers.UNKNOWN)
    pg = _filled(columns["pg"], UNKNOWN_PG)
    nbytes, duration_us = columns["bytes"], columns["duration_us"]
    labels, lows = _size_buckets(nbytes)
    size_key = columns["pg_size"].to_numpy("float64", na_value=-1.0)
    groups = _Groups([op, issuer, pg, size_key, np.where(np.isnan(lows), -1.0, lows)])
    timed = ~np.isnan(nbytes) & ~np.isnan(duration_us) & (duration_us > 0)
    timed_bytes = np.where(timed, nbytes, 0.0)
    timed_us = np.where(timed, duration_us, 0.0)
    has_bytes, has_time = ~np.isnan(nbytes), ~np.isnan(duration_us)
    # Sums as Series.sum takes them: NumPy's sum of each group's values in frame order, NaN as 0.
    bytes_sum = groups.sums(np.where(has_bytes, nbytes, 0.0))
    us_sum = groups.sums(np.where(has_time, duration_us, 0.0))
    timed_bytes_sum, timed_us_sum = groups.sums(timed_bytes), groups.sums(timed_us)
    timed_count = groups.counts(has_time)
    bytes_count = groups.counts(has_bytes)
    rank, step = columns["rank"], columns["step"]
    ranked = ~rank.isna()
    rank_values = rank.to_numpy("int64", na_value=0)
    ranks = groups.distinct(ranked, rank_values)
    stepped = ranked & ~step.isna()
    rank_steps = groups.distinct(stepped, rank_values, step.to_numpy("int64", na_value=0))
    # A record timed from the profiled steps costs its time over the profiled steps.
    covers = np.where(columns["time_from"] == FROM_PROFILED, PROFILED_ORIGIN, columns["origin"])
    per_step = _ms_per_step(groups, ranks, ranked, rank_values, covers,
                            np.where(has_time, duration_us, 0.0),
                            analysed_steps if analysed_steps is not None
                            else analysed_steps_of(ops))

    names = _first_names(pg, columns["pg_desc"])
    first = groups.first
    pg_sizes = [None if key < 0 else int(key) for key in size_key[first].tolist()]
    group_ops, group_pgs = op[first].tolist(), pg[first].tolist()
    slowest = _slowest_ranks(groups, ranks, ranked, rank_values, timed_bytes, timed_us,
                             group_ops, pg_sizes)
    bandwidths = [_group_bandwidth(*args) for args in zip(
        group_ops, timed_bytes_sum.tolist(), timed_us_sum.tolist(), pg_sizes)]
    total_us = np.where(timed_count > 0, us_sum, np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_us = np.where(timed_count > 0, total_us / np.maximum(timed_count, 1), np.nan)
    slowest_ranks = [None] * len(first)
    slowest_busbw = np.full(len(first), np.nan)
    for group, (found_rank, busbw) in slowest.items():
        slowest_ranks[group], slowest_busbw[group] = found_rank, busbw
    table = {
        "op": group_ops, "issuer": issuer[first].tolist(),
        "pg": [issuers.group_label(p, names.get(p)) for p in group_pgs], "pg_id": group_pgs,
        "pg_size": pd.array(pg_sizes, dtype="Int64"),
        "size_bucket": labels[first].tolist(),
        "bucket_min_bytes": lows[first],
        "count": groups.size.astype("int64"),
        "total_bytes": np.where(bytes_count > 0, bytes_sum, np.nan),
        "total_us": total_us, "mean_us": mean_us,
        "algbw_gbps": np.array([b[0] for b in bandwidths], dtype="float64"),
        "busbw_gbps": np.array([b[1] for b in bandwidths], dtype="float64"),
        "ranks": ranks.astype("int64"), "rank_steps": rank_steps.astype("int64"),
        "slowest_rank": pd.array(slowest_ranks, dtype="Int64"),
        "slowest_rank_busbw_gbps": slowest_busbw,
        "ms_per_step": np.where(timed_count > 0, per_step, np.nan),
        "time_from": pd.array(_time_sources(groups, columns["time_from"], has_time),
                              dtype="str"),
    }
    order = _table_order(table)
    return pd.DataFrame({name: [values[i] for i in order] if isinstance(values, list)
                         else values[order] for name, values in table.items()})


def _ms_per_step(groups, ranks, ranked, rank_values, origin, duration_us, steps: dict
                 ) -> np.ndarray:
    """Per group: the mean over its ranks of the ops' time (ms) over the steps of each op's
    rank and origin (NaN where a rank's source covered no step)."""
    covered = np.array([steps.get((int(r), o), 0) if k else 0
                        for r, o, k in zip(rank_values.tolist(), origin.tolist(),
                                           ranked.tolist())], dtype="float64")
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(covered > 0, duration_us / 1e3 / covered,
                         np.where(duration_us > 0, np.nan, 0.0))
    return groups.sums(share) / np.maximum(ranks, 1)


def _table_order(table: dict) -> np.ndarray:
    """The rows' order in the table: ms_per_step largest first, then op, pg, issuer and
    bucket_min_bytes (missing numbers last; ties in the groups' order), as sort_values(kind=
    "stable") gives it. The text columns hold text only: ops without an op are left out, and
    a missing issuer or group is named unknown."""
    texts = [table[name] for name in ("issuer", "pg", "op")]
    cost, low = table["ms_per_step"], table["bucket_min_bytes"]
    codes = [np.unique(np.array(column, dtype=object), return_inverse=True)[1]
             for column in texts]
    # np.lexsort: the last key first, each sort stable.
    return np.lexsort([np.nan_to_num(low, nan=0.0), np.isnan(low), *codes,
                       -np.nan_to_num(cost, nan=0.0), np.isnan(cost)])


def _time_sources(groups: _Groups, time_from: np.ndarray, has_time: np.ndarray) -> list:
    """Per group: where its ops' times come from (analysis.rank.comm.profiled), the distinct
    sources of its timed ops in a fixed order ("records, profiled steps"), None without any."""
    order = {FROM_RECORDS: 0, FROM_PROFILED: 1, FROM_TRACE: 2}
    found: list[set] = [set() for _ in range(len(groups.first))]
    for group, source in zip(groups.of[has_time].tolist(), time_from[has_time].tolist()):
        if source is not None:
            found[group].add(source)
    return [", ".join(sorted(f, key=lambda s: (order.get(s, 3), s))) or None for f in found]


def _filled(values: np.ndarray, missing) -> np.ndarray:
    """The object array with `missing` for None."""
    filled = values.copy()
    filled[pd.isna(values)] = missing
    return filled


def _size_buckets(nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(label, lower bound) of each size's size_bucket, computed once per distinct size."""
    distinct, inverse = np.unique(nbytes, return_inverse=True)
    buckets = [size_bucket(b) for b in distinct.tolist()]
    labels = np.empty(len(buckets), dtype=object)
    labels[:] = [b[0] for b in buckets]
    return labels[inverse], np.array([b[1] for b in buckets], dtype="float64")[inverse]


class _Groups:
    """Rows grouped by equal keys (as groupby(sort=False) groups them), the groups numbered in
    the order of their first row."""

    def __init__(self, keys: list):
        combined = np.zeros(len(keys[0]), dtype=np.int64)
        for key in keys:
            codes, uniques = pd.factorize(key)
            combined = combined * len(uniques) + codes
        _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        number = np.empty(len(order), dtype=np.int64)
        number[order] = np.arange(len(order))
        self.of = number[inverse]  # each row's group
        self.first = first[order]  # each group's first row
        self.rows = np.argsort(self.of, kind="stable")  # rows by group, in frame order in each
        self.size = np.bincount(self.of, minlength=len(order))
        self.bounds = np.concatenate([[0], np.cumsum(self.size)])

    def sums(self, values: np.ndarray) -> np.ndarray:
        by_group = values[self.rows]
        return np.array([by_group[start:end].sum()
                         for start, end in zip(self.bounds[:-1], self.bounds[1:])],
                        dtype="float64")

    def counts(self, mask: np.ndarray) -> np.ndarray:
        return np.bincount(self.of[mask], minlength=len(self.first))

    def distinct(self, mask: np.ndarray, *values: np.ndarray) -> np.ndarray:
        """The number of distinct value tuples among each group's rows where `mask`."""
        if not mask.any():
            return np.zeros(len(self.first), dtype=np.int64)
        combined, width = self.of[mask], 1
        for value in values:
            codes, uniques = pd.factorize(value[mask])
            combined, width = combined * len(uniques) + codes, width * len(uniques)
        return np.bincount(np.unique(combined) // width, minlength=len(self.first))


def _first_names(pg: np.ndarray, desc: np.ndarray) -> dict:
    """{pg: its first named row's pg_desc}: a group named on any rank is named on all of them."""
    named = np.flatnonzero(pd.notna(desc))
    names: dict = {}
    for group, name in zip(pg[named].tolist(), desc[named].tolist()):
        names.setdefault(group, name)
    return names


def _group_bandwidth(op, timed_bytes, timed_us, pg_size) -> tuple[float, float]:
    if timed_us <= 0:
        return float("nan"), float("nan")
    return _bandwidths(op, timed_bytes, pg_size, timed_us)


def _slowest_ranks(groups: _Groups, ranks, ranked, rank_values, timed_bytes, timed_us,
                   group_ops: list, pg_sizes: list) -> dict:
    """{group: (rank, its busbw)} of the groups that more than one rank ran: the rank with the
    lowest busbw among those with timed ops."""
    rows = ranked & (ranks[groups.of] > 1)
    if not rows.any():
        return {}
    rows = groups.rows[rows[groups.rows]]  # by group, in frame order in each
    group_of, rank_of = groups.of[rows], rank_values[rows]
    # Each group's sums per rank as its own groupby("rank").sum() took them: pandas adds the
    # ranks of a group whose rows come in rank order by ufunc.reduceat, the others with
    # compensated sums; one groupby of the groups of each kind takes the same path for each.
    unordered = np.zeros(len(ranks), dtype=bool)
    unordered[group_of[1:][(group_of[1:] == group_of[:-1]) & (rank_of[1:] < rank_of[:-1])]] = True
    per_rank = pd.concat([
        pd.DataFrame({"group": group_of[kind], "rank": rank_of[kind],
                      "timed_bytes": timed_bytes[rows[kind]], "timed_us": timed_us[rows[kind]]}
                     ).groupby(["group", "rank"]).sum()
        for kind in (unordered[group_of], ~unordered[group_of]) if kind.any()])
    per_rank = per_rank[per_rank["timed_us"] > 0]
    found: dict = {}
    members: dict = {}
    for (group, rank), nbytes, us in zip(per_rank.index.tolist(),
                                         per_rank["timed_bytes"].tolist(),
                                         per_rank["timed_us"].tolist()):
        members.setdefault(group, []).append((rank, nbytes, us))
    for group, rows_of_group in members.items():
        if len(rows_of_group) < 2:
            continue
        # The bus factor is the same for every rank of one group, so algbw ranks them as busbw
        # would.
        bandwidths = {rank: _bandwidths(group_ops[group], nbytes, pg_sizes[group], us)
                      for rank, nbytes, us in rows_of_group}
        rank = min(bandwidths, key=lambda r: (bandwidths[r][0], r))
        found[group] = (int(rank), float(bandwidths[rank][1]))
    return found


# ---- the ops table: its columns and their types -------------------------------------------------
OPS_COLUMNS = [
    "rank", "step", "op", "source", "issuer", "pg", "pg_desc", "pg_size", "dtype", "bytes",
    "duration_us", "algbw_gbps", "busbw_gbps", "origin", "time_from",
]


def empty_ops() -> pd.DataFrame:
    return typed_ops(pd.DataFrame({column: [] for column in OPS_COLUMNS}))


def typed_ops(frame: pd.DataFrame) -> pd.DataFrame:
    return frame_of(typed_columns(frame))


_FLOAT_COLUMNS = ("bytes", "duration_us", "algbw_gbps", "busbw_gbps")
_NUMBER_COLUMNS = frozenset({"rank", "step", "pg_size", *_FLOAT_COLUMNS})


def typed_columns(frame: pd.DataFrame, names: list = OPS_COLUMNS) -> dict:
    """{column: array} of the columns `names` of OPS_COLUMNS in their types: Int64 counts,
    float64 measures, object text with None for missing."""
    frame = frame.reindex(columns=names)
    columns = {}
    for column in names:
        values = frame[column]
        if column in ("rank", "step", "pg_size"):
            columns[column] = int64(values)
        elif column in _FLOAT_COLUMNS:
            columns[column] = float64(values)
        else:
            columns[column] = objects(values.to_numpy(dtype=object, copy=True))
    return columns


def int64(values: pd.Series):
    # Integers as they are: converting and rounding them changes nothing but costs.
    if values.dtype == np.dtype("int64"):
        return pd.arrays.IntegerArray(values.to_numpy(copy=True), np.zeros(len(values), bool))
    if values.dtype == "Int64":
        return values.array.copy()
    return pd.to_numeric(values, errors="coerce").round().astype("Int64").array


def float64(values: pd.Series) -> np.ndarray:
    return pd.to_numeric(values, errors="coerce").to_numpy(dtype="float64")


def objects(values) -> np.ndarray:
    """The values as an object array, None for every missing value."""
    objects = np.empty(len(values), dtype=object)
    objects[:] = values
    objects[pd.isna(objects)] = None
    return objects


def frame_of(columns: dict) -> pd.DataFrame:
    # One Series per column on one shared index: pandas neither aligns them nor reads the text
    # columns as its string dtype (they stay object, None for missing).
    index = pd.RangeIndex(len(columns["op"]))
    return pd.DataFrame({
        column: pd.Series(values, index=index, copy=False,
                          dtype=object if column not in _NUMBER_COLUMNS else None)
        for column, values in columns.items()
    }, index=index)

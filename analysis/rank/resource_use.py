"""What the tracer's records say of each rank and step: memory peaks and mean utilisation
(docs/report.md), for analysis.rank.tables' tables.

Memory comes from the tracer's step records and utilisation from its device samples; both are on
the host clock (`time.time_ns()`), so samples are joined to steps through the step records'
start_ns/end_ns, never through trace timestamps.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.model import known_rank

_STEP_RECORD_COLUMNS = {
    "cuda_peak_allocated_bytes": "peak_allocated_bytes",
    "cuda_peak_reserved_bytes": "peak_reserved_bytes",
    "cuda_total_bytes": "device_total_bytes",
    "rss_bytes": "rss_bytes",
}


def records_by_rank(traces) -> dict:
    """rank -> RunRecords; a rank with several trace files shares one set of records."""
    by_rank: dict = {}
    for trace in traces or []:
        records = getattr(trace, "records", None)
        if records is None:
            continue
        rank = known_rank(trace)
        if rank is None:
            rank = _rank_from_records(records)
        if rank is None or rank in by_rank:
            continue
        by_rank[int(rank)] = records
    return by_rank


def _rank_from_records(records):
    for name in ("steps", "samples", "comms"):
        frame = getattr(records, name, None)
        if (isinstance(frame, pd.DataFrame) and "rank" in frame.columns
                and frame["rank"].notna().any()):
            return int(frame["rank"].dropna().iloc[0])
    return None


def _numeric(frame: pd.DataFrame, column: str) -> pd.Series:
    if column not in frame.columns:
        return pd.Series(np.nan, index=frame.index, dtype="float64")
    return pd.to_numeric(frame[column], errors="coerce").astype("float64")


def _step_records(rank: int, records) -> pd.DataFrame:
    """rank, step, start_ns, end_ns and the memory columns of the tracer's step records."""
    steps = getattr(records, "steps", None)
    columns = ["rank", "step", "start_ns", "end_ns", *_STEP_RECORD_COLUMNS.values()]
    if not isinstance(steps, pd.DataFrame) or steps.empty or "step" not in steps.columns:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame({
        "rank": rank,
        "step": _numeric(steps, "step"),
        "start_ns": _numeric(steps, "start_ns"),
        "end_ns": _numeric(steps, "end_ns"),
        **{ours: _numeric(steps, theirs) for theirs, ours in _STEP_RECORD_COLUMNS.items()},
    })
    frame = frame.dropna(subset=["step"])
    # A restarted rank can record a step twice; its peaks are the larger of the two.
    return frame.groupby(["rank", "step"], as_index=False).agg(
        start_ns=("start_ns", "min"), end_ns=("end_ns", "max"),
        **{c: (c, "max") for c in _STEP_RECORD_COLUMNS.values()})


def _samples(records) -> pd.DataFrame:
    samples = getattr(records, "samples", None)
    if not isinstance(samples, pd.DataFrame) or samples.empty or "t_ns" not in samples.columns:
        return pd.DataFrame(columns=["t_ns", "sm_util_pct", "cpu_process_pct", "mem_used_bytes",
                                     "mem_total_bytes"])
    frame = pd.DataFrame({
        "t_ns": _numeric(samples, "t_ns"),
        "sm_util_pct": _numeric(samples, "sm_util_pct"),
        "cpu_process_pct": _numeric(samples, "cpu_process_pct"),
        "mem_used_bytes": _numeric(samples, "mem_used_bytes"),
        "mem_total_bytes": _numeric(samples, "mem_total_bytes"),
    })
    return frame.dropna(subset=["t_ns"]).sort_values("t_ns", kind="stable").reset_index(drop=True)


def _window_means(samples: pd.DataFrame, column: str, starts, ends
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Mean of `column` over the samples with start <= t_ns <= end, and how many there were."""
    valid = samples[samples[column].notna()]
    times = valid["t_ns"].to_numpy(dtype="float64")
    values = valid[column].to_numpy(dtype="float64")
    sums = np.concatenate([[0.0], np.cumsum(values)])
    lo = np.searchsorted(times, starts, side="left")
    hi = np.searchsorted(times, ends, side="right")
    counts = (hi - lo).astype("int64")
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, (sums[hi] - sums[lo]) / np.maximum(counts, 1), np.nan)
    return means, counts


def step_resources(traces) -> pd.DataFrame:
    """Per (rank, step) of the tracer's records: memory peaks and mean utilisation."""
    frames = []
    for rank, records in records_by_rank(traces).items():
        steps = _step_records(rank, records)
        if steps.empty:
            continue
        samples = _samples(records)
        starts = steps["start_ns"].to_numpy(dtype="float64")
        ends = steps["end_ns"].to_numpy(dtype="float64")
        sm, sm_count = _window_means(samples, "sm_util_pct", starts, ends)
        cpu, cpu_count = _window_means(samples, "cpu_process_pct", starts, ends)
        steps = steps.assign(sm_util_pct=sm, cpu_process_pct=cpu,
                             util_samples=np.maximum(sm_count, cpu_count))
        frames.append(steps)
    columns = ["rank", "step", *_STEP_RECORD_COLUMNS.values(), "sm_util_pct", "cpu_process_pct",
               "util_samples"]
    if not frames:  # no step records (a plain Kineto trace): the typed empty frame at once
        return _typed_empty(columns, keys=("rank", "step"))
    return keyed(pd.concat(frames, ignore_index=True)[columns])


def _typed_empty(columns: list[str], keys: tuple[str, ...]) -> pd.DataFrame:
    """No rows: `keys` Int64, the other columns float64 (built from arrays: a Series per column
    costs more than the tables of a few steps)."""
    return pd.DataFrame({c: pd.array([], dtype="Int64") if c in keys else np.zeros(0)
                         for c in columns})


def keyed(frame: pd.DataFrame) -> pd.DataFrame:
    for column in ("rank", "step"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").round().astype("Int64")
    return frame


RANK_RESOURCE_COLUMNS = ["rank", "peak_allocated_bytes", "peak_reserved_bytes",
                          "device_total_bytes", "peak_rss_bytes", "sm_util_pct",
                          "cpu_process_pct", "peak_device_used_bytes", "device_used_total_bytes"]


def rank_resources(traces) -> pd.DataFrame:
    """Per rank, over every step the tracer recorded: memory peaks and mean utilisation."""
    columns = RANK_RESOURCE_COLUMNS
    by_rank = records_by_rank(traces)
    if not by_rank:  # no tracer records (a plain Kineto trace): the typed empty frame at once
        return _typed_empty(columns, keys=("rank",))
    rows = []
    for rank, records in by_rank.items():
        steps = _step_records(rank, records)
        samples = _samples(records)
        row = {"rank": rank}
        for column in _STEP_RECORD_COLUMNS.values():
            known = column in steps and steps[column].notna().any()
            row[column] = steps[column].max() if known else np.nan
        row["peak_rss_bytes"] = row.pop("rss_bytes")
        in_steps = np.zeros(len(samples), dtype=bool)
        if not steps.empty and not samples.empty:
            times = samples["t_ns"].to_numpy(dtype="float64")
            for start, end in zip(steps["start_ns"], steps["end_ns"]):
                in_steps |= (times >= start) & (times <= end)
        inside = samples[in_steps]
        row["sm_util_pct"] = inside["sm_util_pct"].mean() if len(inside) else np.nan
        row["cpu_process_pct"] = inside["cpu_process_pct"].mean() if len(inside) else np.nan
        row["peak_device_used_bytes"] = samples["mem_used_bytes"].max() if len(samples) else np.nan
        row["device_used_total_bytes"] = (samples["mem_total_bytes"].max() if len(samples)
                                          else np.nan)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=columns)
    frame["rank"] = frame["rank"].astype("Int64")
    for column in columns[1:]:
        if str(frame[column].dtype) != "float64":
            frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    return frame

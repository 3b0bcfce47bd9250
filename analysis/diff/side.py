"""One side of a run comparison: one run, or several repeats of one configuration, and the
frames the comparison needs from it (docs/diff.md). `load_side` reads; the rest is pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.model import UNKNOWN_RANK
from analysis.core.step_spec import PathWindow
from analysis.core.steps import FIRST_TRAINING_STEP
from analysis.crossrank.report_tables import MS, rank_bars
from analysis.diff import operators as diff_ops
from analysis.findings import bottlenecks
from analysis.ingest.load import LoadOptions
from analysis.ingest.runs import resolve
from analysis.rank import pipeline_schedule
from analysis.rank.comm.comm_ops import size_bucket
from analysis.run.analysed_run import Run
from analysis.run.loading import load_run
from tracer import schema

CATEGORIES = ["compute", "overlap", "transfer", "waiting", "comm", "memcpy", "idle"]
RESOURCE_PEAKS = ["peak_allocated_bytes", "peak_reserved_bytes", "peak_device_used_bytes",
                  "peak_rss_bytes"]
RESOURCE_MEANS = ["sm_util_pct", "cpu_process_pct"]


@dataclass
class Side:
    path: str
    runs: list[Run]
    cross: list = field(default_factory=list)  # per run: crossrank's result, or None
    problems: list[str] = field(default_factory=list)
    steps: list[int] | None = None  # --steps
    # JSON files in its folders that are neither traces nor records (a saved report), ignored
    notes: list[str] = field(default_factory=list)


def load_side(path: Path, steps: list[int] | None, use_cache: bool = True,
              jobs: int | None = None, comm_kernels: tuple = (),
              window: PathWindow | None = None) -> Side:
    """A run folder is one run; a folder of runs is every run in it, taken as repeats of one
    configuration; `window`: the one-rank critical path's windows (--window, --instance).
    Raises analysis.ingest.runs.NothingToAnalyse when `path` holds no trace."""
    resolved = resolve([path], all_runs=True)
    side = Side(path=str(path), runs=[], steps=steps, notes=resolved.notes)
    for run_dir, files in resolved.runs:
        loaded = load_run(files, run_dir, LoadOptions(steps=steps, use_cache=use_cache,
                                                      jobs=jobs, comm_kernels=comm_kernels,
                                                      path_window=window))
        where = run_dir if run_dir is not None else path
        run = Run(loaded, name=where.name or str(where), path=str(where),
                  steps_spec=",".join(map(str, steps)) if steps else None)
        side.runs.append(run)
        side.problems += run.problems
        # The run's own cross-rank pass (its report's), so that both read the same steps.
        side.cross.append(run.cross_rank if len(run.ranks) >= 2 else None)
    return side


# ---- the steps compared --------------------------------------------------------------------------
def compared_steps(run: Run, wanted: list[int] | None) -> pd.DataFrame:
    """rank, step, step_ns of the steps a run contributes: the tracer's step records where a
    rank has them (every training step, step 0's set-up left out), else the breakdown's
    ProfilerSteps; `wanted` (--steps) narrows both."""
    frames = []
    breakdown = run.breakdown
    for trace in run.ranks:
        records = getattr(trace.records, "steps", None)
        if isinstance(records, pd.DataFrame) and len(records) and "end_ns" in records.columns:
            frame = pd.DataFrame({"rank": trace.rank, "step": records["step"].astype(int),
                                  "step_ns": records["end_ns"] - records["start_ns"]})
            frame = frame[frame["step"] >= FIRST_TRAINING_STEP]
        else:
            frame = breakdown.loc[breakdown["rank"] == trace.rank, ["rank", "step", "step_ns"]]
        if wanted is not None:
            frame = frame[frame["step"].isin(wanted)]
        frames.append(frame.astype({"step": "int64", "step_ns": "int64"}))
    if not frames:
        return pd.DataFrame({"rank": [], "step": [], "step_ns": []})
    return pd.concat(frames, ignore_index=True).drop_duplicates(["rank", "step"])


def step_times(side: Side) -> pd.DataFrame:
    """run, rank, step, step_ns over every run of the side."""
    frames = [compared_steps(run, side.steps).assign(run=i) for i, run in enumerate(side.runs)]
    return pd.concat(frames, ignore_index=True)[["run", "rank", "step", "step_ns"]]


# ---- the tables ----------------------------------------------------------------------------------
def categories(side: Side) -> pd.DataFrame:
    """rank, steps and the mean ms per step of each category, over the side's runs (weighted
    by their steps). Transfer and waiting split the exposed communication where the cross-rank
    pass has waits (analysis.crossrank.report_tables.rank_bars); `comm` is the unsplit part. Waiting
    for peers is the mean over every analysed step (docs/definitions.md, "Analysed steps"); the
    kernel-level parts over the profiled ones; `steps` counts the analysed steps."""
    frames = []
    for run, cross in zip(side.runs, side.cross):
        per_step = run.breakdown
        if per_step.empty:
            continue
        waits = cross.waits if cross is not None else None
        bars = rank_bars(per_step, waits if waits is not None and len(waits) else None)
        bars = bars.merge(per_step.groupby("rank").size().rename("steps").reset_index())
        bars["wait_steps"] = bars["steps"]
        analysed = run.report.step_rows
        if "waiting" in bars and analysed is not None and "peer_wait_ns" in analysed:
            waited = analysed.dropna(subset=["peer_wait_ns"]).groupby("rank")["peer_wait_ns"]
            every = pd.DataFrame({"waiting": waited.mean() / MS, "wait_steps": waited.size()})
            every.index = every.index.astype(bars["rank"].dtype)
            bars = bars.set_index("rank")
            bars.update(every)
            bars = bars.reset_index()
        frames.append(bars)
    if not frames:
        return pd.DataFrame(columns=["rank", "steps", *CATEGORIES])
    frame = pd.concat(frames, ignore_index=True).reindex(
        columns=["rank", "steps", "wait_steps", *CATEGORIES])
    frame[CATEGORIES] = frame[CATEGORIES].astype("float64")
    weights = pd.DataFrame({c: frame["wait_steps" if c == "waiting" else "steps"]
                            for c in CATEGORIES}).astype("float64")
    summed = (frame[CATEGORIES] * weights).assign(rank=frame["rank"]).groupby(
        "rank", sort=True).sum(min_count=1)
    weight = weights.where(frame[CATEGORIES].notna()).assign(rank=frame["rank"]).groupby(
        "rank", sort=True).sum()
    means = summed / weight.replace(0, np.nan)
    split = means["waiting"].notna()
    means.loc[split, "comm"] = means.loc[split, ["transfer", "waiting"]].sum(axis=1)
    steps = frame.groupby("rank", sort=True)[["steps", "wait_steps"]].sum().max(axis=1)
    return means.assign(steps=steps.astype(int)).reset_index()[["rank", "steps", *CATEGORIES]]


def operators(side: Side) -> tuple[pd.DataFrame, int]:
    """Operators and kernels summed over every rank and run, and the rank-steps they cover."""
    frames, rank_steps = [], 0
    for run in side.runs:
        for trace in run.ranks:
            frames.append(diff_ops.rank_ops(trace))
            rank_steps += int((run.breakdown["rank"] == trace.rank).sum())
    frame = pd.concat(frames or [diff_ops.empty_ops()], ignore_index=True)
    table = frame.groupby(["kind", "name", "path"], sort=True)[
        ["calls", "total_ns", "self_ns"]].sum().reset_index()
    return table, rank_steps


def collectives(side: Side) -> tuple[pd.DataFrame, int]:
    """Per op and size bucket over the compared steps: count, bytes, time and bus bytes (bytes
    x the op's bus factor), summed over ranks and runs; and the rank-steps they cover."""
    rows, rank_steps = [], 0
    for run in side.runs:
        ops = run.comm_ops
        if ops is None:
            continue
        compared = _comm_coverage(run, ops, side.steps)
        rank_steps += len(compared)
        ops = ops.dropna(subset=["step"])
        keys = set(zip(compared["rank"], compared["step"].astype(int)))
        rows.append(ops[[(r, int(s)) in keys for r, s in zip(ops["rank"], ops["step"])]])
    columns = ["op", "size_bucket", "bucket_min_bytes", "count", "bytes", "time_us",
               "bus_bytes", "timed_bytes"]
    if not rows:
        return pd.DataFrame(columns=columns), rank_steps
    ops = pd.concat(rows, ignore_index=True)
    buckets = [size_bucket(b) for b in ops["bytes"]]
    timed = ops["duration_us"].notna() & ops["bytes"].notna() & ops["pg_size"].notna()
    ops = ops.assign(
        size_bucket=[b[0] for b in buckets], bucket_min_bytes=[b[1] for b in buckets],
        time_us=ops["duration_us"].where(timed, 0.0),
        timed_bytes=ops["bytes"].where(timed, 0.0),
        bus_bytes=[b * schema.bus_factor(op, n) if t else 0.0
                   for op, b, n, t in zip(ops["op"], ops["bytes"], ops["pg_size"], timed)])
    table = ops.groupby(["op", "size_bucket"], sort=True, dropna=False).agg(
        bucket_min_bytes=("bucket_min_bytes", "first"), count=("op", "size"),
        bytes=("bytes", lambda values: values.sum(min_count=1)),
        time_us=("time_us", "sum"), bus_bytes=("bus_bytes", "sum"),
        timed_bytes=("timed_bytes", "sum"))
    return table.reset_index()[columns], rank_steps


def _comm_coverage(run: Run, ops: pd.DataFrame, wanted: list[int] | None) -> pd.DataFrame:
    """rank, step of the steps whose ops are known: the compared steps of a rank whose ops come
    from the tracer's records (every step), the breakdown's ProfilerSteps of one whose ops come
    from its trace."""
    compared = compared_steps(run, wanted)
    from_records = set(ops.loc[ops["origin"] == "records", "rank"])
    profiled = run.breakdown[["rank", "step"]]
    if wanted is not None:
        profiled = profiled[profiled["step"].isin(wanted)]
    return pd.concat([compared.loc[compared["rank"].isin(from_records), ["rank", "step"]],
                      profiled[~profiled["rank"].isin(from_records)]], ignore_index=True)


def resources(side: Side) -> pd.DataFrame:
    """rank, the memory peaks (the largest over runs) and the device-sample averages (the mean
    over runs) of the per-rank table (docs/report.md)."""
    frames = [run.per_rank for run in side.runs if run.per_rank is not None]
    columns = ["rank", *RESOURCE_PEAKS, *RESOURCE_MEANS]
    if not frames:
        return pd.DataFrame(columns=columns)
    frame = pd.concat(frames, ignore_index=True).reindex(columns=columns)
    frame[columns[1:]] = frame[columns[1:]].astype("float64")
    grouped = frame.groupby("rank", sort=True)
    return grouped[RESOURCE_PEAKS].max().join(grouped[RESOURCE_MEANS].mean()).reset_index()


def findings(side: Side) -> pd.DataFrame:
    """finding, share_pct, ranks, evidence: the bottleneck findings and the cross-rank
    stragglers ("ranks wait for rank R") of every run; repeats keep the mean share."""
    frames = []
    for run, cross in zip(side.runs, side.cross):
        if run.findings is not None and len(run.findings):
            frames.append(run.findings[["finding", "share_pct", "ranks", "evidence"]])
        stragglers = cross.stragglers if cross is not None else None
        if stragglers is not None and len(stragglers):
            fired = stragglers[stragglers["fires"].astype(bool)]
            frames.append(pd.DataFrame({
                "finding": [f"ranks wait for rank {int(r)}" for r in fired["rank"]],
                "share_pct": fired["share_pct"].astype(float),
                "ranks": [str(int(r)) for r in fired["rank"]],
                "evidence": [f"{w:.1f} ms of waiting per step caused"
                             for w in fired["caused_wait_ms_per_step"]]}))
    if not frames:
        return pd.DataFrame(columns=["finding", "share_pct", "ranks", "evidence"])
    frame = pd.concat(frames, ignore_index=True)
    return frame.groupby("finding", sort=False).agg(
        share_pct=("share_pct", "mean"), ranks=("ranks", "last"),
        evidence=("evidence", "last")).reset_index()


def pipeline(side: Side) -> pd.DataFrame:
    """rank, measured_bubble_pct, theory_bubble_pct, recv_wait_pct per stage (the cross-rank
    pass's pipeline table), the mean over runs."""
    columns = ["rank", "measured_bubble_pct", "theory_bubble_pct", "recv_wait_pct"]
    frames = [c.pipeline[columns] for c in side.cross
              if c is not None and len(c.pipeline)]
    if not frames:
        return pd.DataFrame(columns=columns)
    frame = pd.concat(frames, ignore_index=True)
    frame[columns[1:]] = frame[columns[1:]].astype("float64")
    return frame.groupby("rank", sort=True)[columns[1:]].mean().reset_index()


def critical_path(side: Side) -> pd.DataFrame:
    """rank, category, ms: the critical path's time by rank and category (analysis.crossrank.
    critical_path) summed over the analysed steps of every run of the side and divided by their
    number, the mean ms per analysed step; empty where no run has a path."""
    parts, steps = [], 0
    for run in side.runs:
        critical = run.critical
        if critical is None or critical.critical_path_steps.empty:
            continue
        steps += len(critical.critical_path_steps)
        parts.append(critical.critical_path[["rank", "category", "ms"]])
    if not parts:
        return pd.DataFrame(columns=["rank", "category", "ms"])
    frame = pd.concat(parts, ignore_index=True)
    summed = frame.groupby(["rank", "category"], sort=True)["ms"].sum() / steps
    return summed.reset_index()


def phases(side: Side) -> list[list]:
    """Each run's phases (analysis.run's Run.phases: docs/definitions.md, "Phases"), in the
    order of the side's runs."""
    return [list(run.phases) for run in side.runs]


def layout(side: Side) -> dict:
    """world_size, ranks, kind ("pipeline" or "data/tensor parallel"), stages of the first run."""
    run = side.runs[0]
    ranks = sorted(int(t.rank) for t in run.ranks if t.rank != UNKNOWN_RANK)
    collective_table = run.collectives if run.collectives is not None else pd.DataFrame()
    is_pipeline = bottlenecks.is_pipeline_run(collective_table, run.ranks)
    stages = None
    if is_pipeline:
        schedule = pipeline_schedule.detect(run.ranks)
        stages = schedule.total_stages(len(ranks)) if schedule.stages_by_rank else len(ranks)
    world = run.loaded.world_size
    return {"world_size": int(world) if world is not None and not np.isnan(world) else None,
            "ranks": ranks, "kind": "pipeline" if is_pipeline else "data/tensor parallel",
            "stages": stages}

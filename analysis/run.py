"""Analysing a run: every table for one loaded run, and `open_run`, the front for notebooks.

```python
from analysis import open_run

run = open_run("traces/20261129-220609-ddp", steps="3-5")
run.per_step          # our breakdown and the per-step table, one row per (rank, step)
run.per_rank, run.collectives, run.setup_collectives, run.idle_gaps, run.findings, run.problems
run.mfu, run.roofline  # MFU per rank and step, the slowest ops against the roofline
```

Each table is computed once, on first use; all are plain DataFrames (docs/analysis.md).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from pathlib import Path

import pandas as pd

from analysis import crossrank
from analysis.core.events import with_events
from analysis.core.model import UNKNOWN_RANK, LoadResult, RankTrace, known_rank
from analysis.core.steps import parse_step_spec
from analysis.crossrank import critical_path
from analysis.crossrank.report import with_transfer_bandwidth
from analysis.crossrank.waits import split_communication, wait_windows
from analysis.findings import bottlenecks, notes, stop, stop_traces, verdict
from analysis.findings.captures import analysed_captures
from analysis.findings.memory_findings import NEAR_FULL
from analysis.findings.memory_section import MemorySection, memory_section
from analysis.ingest.captures import group_captures
from analysis.ingest.load import load_path
from analysis.rank import critical_path as rank_critical_path
from analysis.rank import flops
from analysis.rank import tables as ranks
from analysis.rank.comm import ops as communication
from analysis.rank.hta import hta_temporal_breakdown
from analysis.rank.idle import idle_gaps, idle_gaps_empty, idle_summary, label_peer_waits
from analysis.rank.reduced import failure_text, raise_if_failed, reduced_table
from analysis.rank.roofline import with_roofline
from analysis.rank.step_breakdown import breakdown_per_step, empty_breakdown, rank_totals
from analysis.rank.summary import rank_tables
from analysis.report import output
from analysis.report.progress import Progress
from tracer import schema


def _rank_rows(traces: list[RankTrace], name: str, build: Callable[[RankTrace], pd.DataFrame],
               problems: list[str]) -> list[pd.DataFrame]:
    """Each rank's table `name` (analysis.rank.reduced.reduced_table); a rank whose table
    failed is one problem naming its file, rank and the table, and has no rows in it."""
    frames = []
    for trace in traces:
        try:
            frames.append(reduced_table(trace, name, build))
        except Exception as exc:  # one rank's failure must not cost the others
            problems.append(f"{trace.path}: {trace.label}: {name} table failed "
                            f"({failure_text(exc)}); the rank has no rows in it")
    return frames


FLOP_TABLES = ("step_flops", "op_roofline")


def flop_tables(trace: RankTrace) -> dict:
    """The rank's "step_flops" and "op_roofline" (flops.rank_flops_tables): those its reduce
    kept, the failure it recorded (ReducedTableFailed), else computed from its events."""
    if all(name in trace.reduced for name in FLOP_TABLES):
        return {name: trace.reduced[name] for name in FLOP_TABLES}
    raise_if_failed(trace, *FLOP_TABLES)
    return flops.rank_flops_tables(with_events(trace))


def mfu_of_run(traces: list[RankTrace], per_step: pd.DataFrame,
               peak_tflops: float | None = None,
               tables_of: Callable[[RankTrace], dict] = flop_tables) -> pd.DataFrame:
    """flops.mfu_table of the run: each rank's step_flops (`tables_of`), `per_step` its profiled
    breakdown rows with the communication split (split_communication), each rank's peak by
    flops.rank_peak (`peak_tflops`, else its run_start's, else the datasheet's)."""
    frames, peaks_of = [], {}
    for trace in traces:
        if not trace.has_trace:
            continue
        step_flops = tables_of(trace)["step_flops"]
        frames.append(step_flops)
        peaks_of[known_rank(trace)] = flops.rank_peak(trace, flops.rank_dtype(step_flops),
                                                      peak_tflops)
    every = (pd.concat(frames, ignore_index=True) if frames
             else pd.DataFrame(columns=flops.STEP_FLOPS_COLUMNS))
    return flops.mfu_table(every, per_step, peaks_of)


ROOFLINE_OPS_PER_RANK = 10
# The `roofline` table: roofline.with_roofline's columns, with the rank and its peak's source.
ROOFLINE_COLUMNS = ["rank", "name", "kind", "dtype", "calls", "flops", "bytes", "time_ns",
                    "time_from", "achieved_tflops", "achieved_gbps", "intensity", "peak_tflops",
                    "peak_source", "peak_gbps", "ridge", "bound", "roofline_tflops",
                    "pct_of_roofline"]


def roofline_of_run(traces: list[RankTrace], peak_tflops: float | None = None,
                    per_rank: int = ROOFLINE_OPS_PER_RANK,
                    tables_of: Callable[[RankTrace], dict] = flop_tables) -> pd.DataFrame:
    """Each rank's `per_rank` slowest op groups (name, kind, dtype; summed over its analysed
    steps; `tables_of`) against its roofline: the rank's peak (as its MFU's) and the datasheet
    bandwidth of its device where known (docs/mfu.md, "In the report")."""
    frames = []
    for trace in traces:
        if not trace.has_trace:
            continue
        tables = tables_of(trace)
        by_op = tables["op_roofline"].head(per_rank)
        if not len(by_op):
            continue
        peak, source = flops.rank_peak(trace, flops.rank_dtype(tables["step_flops"]),
                                       peak_tflops)
        frames.append(with_roofline(by_op, peak, flops.rank_peak_gbps(trace))
                      .assign(peak_source=source))
    if not frames:
        return pd.DataFrame(columns=ROOFLINE_COLUMNS)
    return pd.concat(frames, ignore_index=True)[ROOFLINE_COLUMNS]


def analyse_run(loaded: LoadResult, name: str, path: str, steps_spec: str | None = None,
                hta_compatible: bool = False, progress: Progress | None = None,
                peak_tflops: float | None = None) -> output.RunReport:
    """All the tables for one loaded run: ours, then the communication, rank, cross-rank and
    bottleneck analyses (analysis.rank.comm.ops, .ranks, .crossrank, .bottlenecks), and MFU and
    the roofline (analysis.rank.flops; `peak_tflops` overrides every rank's peak). A table that
    fails becomes a problem naming it, and the rest is still reported. `progress` shows the
    per-rank phases (analysis.report.progress)."""
    problems = list(loaded.problems)
    traces = loaded.ranks
    over = progress.over if progress is not None else (lambda items, phase: items)
    per_step = pd.concat(_rank_rows(over(traces, "time breakdown"), "per_step",
                                    breakdown_per_step, problems)
                         or [empty_breakdown()], ignore_index=True)
    gaps = pd.concat(_rank_rows(over(traces, "idle gaps"), "idle_gaps", idle_gaps, problems)
                     or [idle_gaps_empty()], ignore_index=True)
    report = output.RunReport(
        name=name, path=path, files=[str(f) for f in loaded.files],
        world_size=loaded.world_size, steps_spec=steps_spec, hta_compatible=hta_compatible,
        problems=problems, ranks=traces, per_step=per_step, totals=rank_totals(per_step),
        # idle: summed once the gaps are labelled with the waits for peers, below.
        hta=hta_temporal_breakdown(traces), idle=None, idle_gaps=gaps)

    def table(name: str, build: Callable[[], pd.DataFrame]) -> pd.DataFrame | None:
        try:
            result = build()
        except Exception as exc:  # one table's failure must not cost the others
            problems.append(f"{name} table failed: {failure_text(exc)}")
            report.unavailable[name] = failure_text(exc)
            return None
        report.tables[name] = result
        return result

    selected = parse_step_spec(steps_spec) if steps_spec else None
    every_op = table("comm_ops", lambda: pd.concat(
        [reduced_table(t, "comm_ops", communication.comm_ops)
         for t in over(traces, "collectives")]
        or [communication.empty_ops()], ignore_index=True))
    cross = _cross_rank(loaded, per_step, report, selected)
    # Waiting for peers is not communication of the rank's own: the breakdown's
    # communication-only time split into transfer and waiting (docs/definitions.md).
    report.per_step = per_step = split_communication(
        per_step, cross["waits"] if cross is not None else None)
    report.totals = rank_totals(per_step)
    # MFU of the profiled steps, whose waiting is the split's (docs/mfu.md); each rank's FLOPs
    # found once for both tables.
    found: dict = {}

    def tables_of(trace: RankTrace) -> dict:
        if id(trace) not in found:
            found[id(trace)] = flop_tables(trace)
        return found[id(trace)]

    table("mfu", lambda: mfu_of_run(traces, per_step, peak_tflops, tables_of))
    table("roofline", lambda: roofline_of_run(traces, peak_tflops, tables_of=tables_of))
    # The analysed steps: every recorded step (of --steps), the profiled ones with their
    # kernel-level split (docs/definitions.md, "Analysed steps").
    analysed = per_step
    if not hta_compatible:
        recorded = record_step_rows(loaded, per_step, selected)
        if len(recorded):
            analysed = pd.concat([per_step, split_communication(
                recorded, cross["waits"] if cross is not None else None)], ignore_index=True)
    per_rank = table("per_rank", lambda: ranks.per_rank_table(analysed, traces))
    step_table = table("per_step", lambda: ranks.per_step_table(analysed, traces))
    if cross is not None:
        report.idle_gaps = label_peer_waits(gaps, wait_windows(cross))
    report.idle = idle_summary(report.idle_gaps)
    # After the gaps are labelled: a wait for peers is no cause a what-if removes.
    report.critical = _critical_path(cross, report, per_step[["rank", "step"]])
    collectives = None
    if every_op is not None:
        ops, setup = analysed_ops(every_op, selected)
        report.tables["comm_ops"] = ops
        table("setup_collectives", lambda: communication.collectives_table(setup))
        collectives = table("collectives", lambda: with_transfer_bandwidth(
            communication.collectives_table(ops, analysed_steps(loaded, ops, selected)),
            cross))
    steps_of = step_table if step_table is not None else per_step
    found = table("bottlenecks", lambda: bottlenecks.find_bottlenecks(
        steps_of, per_rank, collectives, report.idle_gaps, traces, cross_rank=cross))
    report.memory = _memory(loaded, steps_of, report)
    found = _with_memory_findings(report, found)
    noted = table("notes", lambda: notes.find_notes(steps_of, collectives, traces, cross))
    report.captures = _captures(loaded, steps_of, cross, report)
    report.verdict = verdict.run_verdict(steps_of, found, noted, cross, report.critical,
                                         report.captures)
    _with_memory_line(report)
    _stop_diagnosis(loaded, report)
    return report


def _captures(loaded: LoadResult, steps_of: pd.DataFrame, cross: dict | None,
              report: output.RunReport) -> list[dict]:
    """The run's capture windows (docs/report.md, "Capture windows"), each with what its steps
    show; a failure is one problem and no window."""
    records = {int(t.rank): t.records for t in loaded.ranks
               if t.rank != UNKNOWN_RANK and t.records is not None}
    if not records:
        return []
    try:
        windows, problems = group_captures(records)
        report.problems.extend(problems)
        return analysed_captures(windows, steps_of, cross["waits"] if cross else None)
    except Exception as exc:  # the rest of the report stands without them
        why = f"{type(exc).__name__}: {exc}"
        report.problems.append(f"capture windows failed ({why})")
        report.unavailable["captures"] = why
        return []


def _stop_diagnosis(loaded: LoadResult, report: output.RunReport) -> None:
    """analysis.findings.stop on a run that did not end well; a failure becomes a problem."""
    statuses = {t.rank: t.status for t in loaded.ranks if t.rank != UNKNOWN_RANK}
    if loaded.run_dir is None or not stop.needs_diagnosis(statuses):
        return
    try:
        issued, frames, problems = stop.read_stop_inputs(
            Path(loaded.run_dir), sorted(statuses), loaded.world_size)
        report.problems.extend(problems)
        completed = pd.concat([t.records.comms for t in loaded.ranks if t.records is not None]
                              or [pd.DataFrame()], ignore_index=True)
        exceptions = {t.rank: end.exception for t in loaded.ranks if t.records is not None
                      for end in t.records.manifest if isinstance(end, schema.RunEnd)}
        ops = stop.stop_ops(issued, completed)
        report.stop = stop.stop_diagnosis(ops, frames, statuses,
                                          loaded.world_size or len(statuses), exceptions)
        if ops.empty and report.stop is not None:
            # No comms record (--no-comms): what the ranks' Kineto windows hold is compared.
            traced = stop_traces.diagnose_traces(*stop_traces.trace_ops(loaded.ranks),
                                                 loaded.world_size or len(statuses))
            if traced is not None:
                report.stop["groups"] = traced["groups"]
                report.stop["lines"] = traced["lines"] + [r["text"] for r in report.stop["ranks"]]
    except Exception as exc:  # the rest of the report stands without it
        why = f"{type(exc).__name__}: {exc}"
        report.problems.append(f"stop diagnosis failed ({why})")
        report.unavailable["stop_diagnosis"] = why


def analysed_ops(ops: pd.DataFrame, steps: list[int] | None) -> tuple[pd.DataFrame,
                                                                        pd.DataFrame]:
    """(the ops of the analysed steps, the set-up ops): records of the tracer's step 0 (before
    the first step: process group start, DDP's first broadcast, barriers) are set-up and enter
    no step's rows; `steps` (--steps) selects the analysed steps of every source. A run with
    no op past set-up (it stopped before its first step) has only those: they are its ops, not
    set-up."""
    step = pd.to_numeric(ops["step"], errors="coerce").astype("float64")
    recorded = (ops["origin"] == "records").to_numpy(dtype=bool)
    setup = recorded & (step < communication.FIRST_STEP).to_numpy(dtype=bool)
    if setup.all():
        setup[:] = False
    kept = ~setup
    if steps is not None:
        kept &= step.isin(steps).to_numpy(dtype=bool)
    return (ops[kept].reset_index(drop=True), ops[setup].reset_index(drop=True))


def record_step_rows(loaded: LoadResult, per_step: pd.DataFrame,
                     steps: list[int] | None) -> pd.DataFrame:
    """Breakdown rows of the analysed steps that no profiler window holds: each rank's recorded
    steps (from the first step, those of --steps) that `per_step` lacks, with step_ns, start_ns
    and end_ns from the tracer's step record and every part of the kernel-level split missing
    (docs/definitions.md, "Analysed steps"). The kind is the rank's profiled kind."""
    profiled_rank = pd.to_numeric(per_step["rank"], errors="coerce")
    profiled_step = pd.to_numeric(per_step["step"], errors="coerce")
    kinds = dict(zip(profiled_rank.tolist(), per_step["kind"].tolist()))
    frames = []
    for trace in loaded.ranks:
        records = trace.records
        recorded = getattr(records, "steps", None) if records is not None else None
        if trace.rank == UNKNOWN_RANK or recorded is None or not len(recorded):
            continue
        if not {"step", "start_ns", "end_ns"} <= set(recorded.columns):
            continue
        numbers = recorded[["step", "start_ns", "end_ns"]].apply(pd.to_numeric, errors="coerce")
        numbers = numbers.dropna().drop_duplicates("step", keep="last")
        rank = int(trace.rank)
        kept = ((numbers["step"] >= communication.FIRST_STEP)
                & (numbers["end_ns"] > numbers["start_ns"])
                & ~numbers["step"].isin(profiled_step[profiled_rank == rank]))
        if steps is not None:
            kept &= numbers["step"].isin(steps)
        numbers = numbers[kept].astype("int64")
        frames.append(pd.DataFrame({
            "rank": rank, "step": numbers["step"],
            "step_ns": numbers["end_ns"] - numbers["start_ns"],
            "kind": kinds.get(float(rank)), "start_ns": numbers["start_ns"],
            "end_ns": numbers["end_ns"]}))
    columns = ["rank", "step", "step_ns", "kind", "start_ns", "end_ns"]
    frame = (pd.concat(frames, ignore_index=True) if frames
             else pd.DataFrame(columns=columns))
    return frame.reindex(columns=list(dict.fromkeys([*per_step.columns, *columns])))


def analysed_steps(loaded: LoadResult, ops: pd.DataFrame, steps: list[int] | None) -> dict:
    """{(rank, origin): analysed steps} that each rank's sources of ops cover: the steps of its
    records (from the first step, those of --steps) and its profiled steps; where neither is
    known, the distinct steps of its ops (rank.comm.ops.analysed_steps_of)."""
    covered = communication.analysed_steps_of(ops)
    for trace in loaded.ranks:
        if trace.rank == UNKNOWN_RANK:
            continue
        records = trace.records
        record_steps = getattr(records, "steps", None) if records is not None else None
        if record_steps is not None and len(record_steps) and "step" in record_steps:
            numbers = pd.to_numeric(record_steps["step"], errors="coerce").dropna()
            numbers = numbers[numbers >= communication.FIRST_STEP]
            if steps is not None:
                numbers = numbers[numbers.isin(steps)]
            covered[(int(trace.rank), "records")] = int(numbers.nunique())
        if len(trace.steps):
            covered[(int(trace.rank), "trace")] = int(trace.steps["step"].nunique())
    return covered


def _cross_rank(loaded: LoadResult, per_step: pd.DataFrame | None,
                report: output.RunReport, steps: list[int] | None) -> dict | None:
    """The cross-rank pass (docs/cross-rank.md), or None with one problem saying why."""
    work = None
    if per_step is not None and len(per_step):
        work = per_step[["rank", "step", "step_ns"]].assign(
            work_ns=ranks.work_ns(per_step)).dropna(subset=["rank"])
        work = work.astype({"rank": "int64", "step": "int64"})
    try:
        cross = crossrank.cross_rank(loaded, work=work, steps=steps)
    except Exception as exc:  # the per-rank analysis stands without it
        why = f"{type(exc).__name__}: {exc}"
        report.problems.append(f"cross-rank analysis failed ({why}); waiting for peers is not "
                               f"told from transfer")
        report.unavailable["cross_rank"] = why
        return None
    for part, why in cross.get("failed", {}).items():  # the rest of the pass stands
        report.problems.append(f"cross-rank {part} analysis failed ({why}); the rest of the "
                               f"cross-rank analysis stands")
        report.unavailable[f"cross_rank_{part}"] = why
    report.cross_rank = cross
    return cross


def _critical_path(cross: dict | None, report: output.RunReport,
                   profiled: pd.DataFrame) -> dict | None:
    """The critical path and what-if answers (docs/critical-path.md) of the cross-rank result,
    with the report's idle gaps known in the `profiled` (rank, step) rows. Without the pass, or
    with no step it analyses, a run of one rank with GPU events gets that rank's own path
    (analysis.rank.critical_path; docs/critical-path.md, "One rank on a GPU"). None where there
    is neither, or with one problem saying why the model failed."""
    if cross is None:
        return _one_rank_path(report)
    try:
        result = critical_path.analyse(cross, idle_gaps=report.idle_gaps, profiled=profiled)
    except Exception as exc:  # the rest of the report stands without it
        why = f"{type(exc).__name__}: {exc}"
        report.problems.append(f"critical path analysis failed ({why}); no what-if answer")
        report.unavailable["critical_path"] = why
        return None
    if not len(result["critical_path_steps"]):  # no analysed step across ranks: one rank
        return _one_rank_path(report) or result
    return result


def _one_rank_path(report: output.RunReport) -> dict | None:
    """The single-rank critical path of a run of one traced rank with device ops, or None:
    the one its reduction built (analysis.rank.summary.rank_tables builds it wherever the rank
    may be the run's only traced one), else computed from its events."""
    traces = [t for t in report.ranks if t.has_trace]
    if len(traces) != 1:
        return None
    try:
        result = reduced_table(traces[0], "critical_path",
                               lambda trace: rank_critical_path.analyse(trace))
    except Exception as exc:  # the rest of the report stands without it
        why = failure_text(exc)
        report.problems.append(f"critical path analysis failed ({why}); no what-if answer")
        report.unavailable["critical_path"] = why
        return None
    return result if len(result["critical_path_steps"]) else None


def _table(name: str, doc: str) -> property:
    """A Run property: the report's table `name` (None where it could not be computed)."""
    return property(lambda run: run.report.tables.get(name), doc=doc)


def _part(name: str, doc: str) -> property:
    """A Run property: the report's own field `name`."""
    return property(lambda run: getattr(run.report, name), doc=doc)


class Run:
    """One analysed run: its ranks, problems and every table as a DataFrame."""

    def __init__(self, loaded: LoadResult, name: str, path: str,
                 steps_spec: str | None = None, hta_compatible: bool = False,
                 peak_tflops: float | None = None):
        self.loaded = loaded
        self.name = name
        self.path = path
        self._options = {"steps_spec": steps_spec, "hta_compatible": hta_compatible,
                         "peak_tflops": peak_tflops}

    @cached_property
    def report(self) -> output.RunReport:
        """Every table at once, as the command line prints them."""
        return analyse_run(self.loaded, self.name, self.path, **self._options)

    @property
    def ranks(self) -> list[RankTrace]:
        """One RankTrace per rank: its events frame, steps, the tracer's records."""
        return self.loaded.ranks

    @property
    def per_step(self) -> pd.DataFrame:
        """The breakdown with memory, utilisation and spread across ranks (docs/report.md)."""
        return self.report.step_table()

    problems = _part("problems", "Everything that could not be read or computed, each naming "
                                 "file and rank.")
    breakdown = _part("per_step", "Our time breakdown, one row per (rank, step) "
                                  "(docs/definitions.md).")
    totals = _part("totals", "The breakdown summed over each rank's steps.")
    idle_gaps = _part("idle_gaps", "Every idle gap and what the host was doing.")
    idle = _part("idle", "Idle time per rank and what the host was doing.")
    hta = _part("hta", "HTA 0.5.0's temporal breakdown, one row per rank.")
    per_rank = _table("per_rank", "One row per rank: step time, breakdown, memory, utilisation.")
    comm_ops = _table("comm_ops", "Every collective and p2p op of every rank in the analysed "
                                  "steps.")
    collectives = _table("collectives", "Ops of the analysed steps grouped by op, process group "
                                        "and size, costliest per step first.")
    setup_collectives = _table("setup_collectives", "Collectives issued before the first step "
                                                    "(set-up), grouped as the collectives are.")
    findings = _table("bottlenecks", "The bottleneck findings, largest share of step time first.")
    notes = _table("notes", "What the analysis could not tell (no share of step time).")
    mfu = _table("mfu", "MFU per rank and profiled step, with the points it loses "
                        "(docs/mfu.md).")
    roofline = _table("roofline", "Each rank's slowest op groups against its roofline "
                                  "(docs/mfu.md).")
    verdict = _part("verdict", "The verdict the report opens with (docs/report.md).")
    captures = _part("captures", "The capture windows (slow step or on demand), each with its "
                                 "steps' mean step, waits and late rank (docs/report.md).")
    critical = _part("critical", "The critical path per analysed step and the what-if answers "
                                 "(docs/critical-path.md), None where they could not be "
                                 "computed.")
    cross_rank = _part("cross_rank", "The cross-rank pass's frames (clock, ops, waits, bandwidth, "
                                     "stragglers, mismatches, pipeline; docs/cross-rank.md), "
                                     "None where it failed.")

    def document(self) -> dict:
        """The JSON document of `--format json`."""
        return output.run_document(self.report)


def open_run(path, steps: str | None = None, *, run: str | None = None,
             hta_compatible: bool = False, use_cache: bool = True, jobs: int | None = None,
             comm_kernels: tuple = (), keep_events: bool = True,
             peak_tflops: float | None = None) -> Run:
    """Load the run that `path` names (a run folder, a folder of runs: the newest, trace files),
    with the options of the command line (`steps` as in --steps, e.g. "3-5,7"; `peak_tflops` as
    --peak-tflops, every rank's peak for MFU);
    `keep_events=False` holds each rank's reduced results instead of its events, for runs of
    many ranks (docs/analysis.md, "Large runs and Dask"). Raises
    NothingToAnalyse when `path` holds no trace, ValueError for a bad `steps`."""
    loaded = load_path(path, steps, run=run, hta_compatible=hta_compatible,
                       use_cache=use_cache, jobs=jobs, comm_kernels=comm_kernels,
                       keep_events=keep_events, reduce_rank=rank_tables)
    where = loaded.run_dir if loaded.run_dir is not None else Path(
        path[0] if isinstance(path, (list, tuple)) else path)
    return Run(loaded, name=where.name or str(where), path=str(where), steps_spec=steps,
               hta_compatible=hta_compatible, peak_tflops=peak_tflops)


# ---- memory (docs/memory.md) ---------------------------------------------------------------
def _memory(loaded: LoadResult, steps_of: pd.DataFrame, report: output.RunReport
            ) -> MemorySection | None:
    """analysis.findings.memory_section over each rank's step records and analysed steps;
    a failure is one problem and no section."""
    records = {int(t.rank): t.records for t in loaded.ranks
               if t.rank != UNKNOWN_RANK and t.records is not None}
    if not records:
        return None
    try:
        analysed: dict[int, list[int]] = {}
        if len(steps_of) and {"rank", "step"} <= set(steps_of.columns):
            for rank, step in zip(steps_of["rank"], steps_of["step"]):
                if not (pd.isna(rank) or pd.isna(step)):
                    analysed.setdefault(int(rank), []).append(int(step))
        offsets = {rank: r.offset_ns for rank, rank_records in records.items()
                   for r in rank_records.manifest if isinstance(r, schema.ClockSync)}
        section = memory_section({rank: r.steps for rank, r in records.items()},
                                 loaded.run_dir, analysed, offsets)
        report.problems.extend(section.problems)
        return section
    except Exception as exc:  # the rest of the report stands without it
        why = f"{type(exc).__name__}: {exc}"
        report.problems.append(f"memory analysis failed ({why})")
        report.unavailable["memory"] = why
        return None


def _with_memory_findings(report: output.RunReport, found: pd.DataFrame | None
                          ) -> pd.DataFrame | None:
    """The findings with the memory section's after them; the older "memory near capacity"
    from the ranks table gives way to the section's where that says the same."""
    memory = report.memory
    if found is None or memory is None or not memory.findings:
        return found
    extra = pd.DataFrame(memory.findings, columns=bottlenecks.FINDING_COLUMNS)
    if (extra["finding"] == NEAR_FULL).any():
        found = found[found["finding"] != NEAR_FULL]
    found = pd.concat([found, extra.astype({"share_pct": "float64",
                                            "ms_per_step": "float64"})], ignore_index=True)
    report.tables["bottlenecks"] = found
    return found


def _with_memory_line(report: output.RunReport) -> None:
    """The verdict's memory line, after who waits for whom."""
    line = report.memory.verdict_line if report.memory is not None else None
    if report.verdict is None or line is None:
        return
    lines = report.verdict["lines"]
    at = next((i + 1 for i, text in enumerate(lines) if text.startswith("Waiting:")), len(lines))
    lines.insert(at, line)
    report.verdict["memory"] = line

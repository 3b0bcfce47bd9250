"""Analysing a run: every table of one loaded run, each computed on first use, and `open_run`,
the front for notebooks.

```python
from analysis import open_run

run = open_run("traces/20261129-220609-ddp", steps="3-5")
run.per_step          # our breakdown and the per-step table, one row per (rank, step)
run.per_rank, run.collectives, run.setup_collectives, run.idle_gaps, run.findings, run.problems
run.phases            # the run's phases, each with its late rank, waits and what-if
run.mfu, run.roofline  # MFU per rank and step, the slowest ops against the roofline
run.memory            # memory per rank and across ranks (docs/memory.md)
```

Each table is computed once, on first use, with what it needs and nothing more (`run.roofline`
computes no cross-rank pass); all are plain DataFrames (docs/analysis.md). `run.report` computes
every table, as the command line prints them (analysis.core.contracts.RunReport).
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import pandas as pd

from analysis import crossrank
from analysis.core.contracts import (
    Breakdown,
    CriticalPath,
    CrossRank,
    MemorySection,
    Phase,
    RunReport,
    StopDiagnosis,
    Verdict,
)
from analysis.core.model import UNKNOWN_RANK, LoadResult, RankTrace
from analysis.core.step_spec import parse_step_spec
from analysis.crossrank import critical_path, what_if_cores
from analysis.crossrank.phases import find_phases
from analysis.crossrank.report_tables import with_transfer_bandwidth
from analysis.crossrank.waits import with_waits
from analysis.findings import bottlenecks, notes, stop_diagnosis, verdict
from analysis.findings.capture_windows import analysed_captures
from analysis.findings.late_ranks import LateRank, cause_rows, late_ranks
from analysis.findings.memory_findings import with_memory_findings
from analysis.findings.memory_section import analysed_steps, memory_section
from analysis.ingest.capture_records import group_captures
from analysis.ingest.memory_files import memory_inputs
from analysis.ingest.stop_records import stop_inputs
from analysis.rank import flops, tables
from analysis.rank.comm import comm_ops
from analysis.rank.hta import hta_temporal_breakdown
from analysis.rank.idle import idle_gaps_empty
from analysis.rank.step_breakdown import empty_breakdown, record_step_rows
from analysis.report import json_document
from analysis.report.progress import Progress
from analysis.run.guarded import Guarded
from analysis.run.loading import load_run_path


class Run:
    """One loaded run and every table of its analysis, each computed on first use (a table that
    fails is None, and a problem says why)."""

    def __init__(self, loaded: LoadResult, name: str, path: str,
                 steps_spec: str | None = None, hta_compatible: bool = False,
                 peak_tflops: float | None = None, progress: Progress | None = None):
        self.loaded = loaded
        self.name = name
        self.path = path
        self.steps_spec = steps_spec
        self.hta_compatible = hta_compatible
        self.peak_tflops = peak_tflops
        self._selected = parse_step_spec(steps_spec) if steps_spec else None
        self._progress = progress
        self._guarded = Guarded()

    # ---- the run as loaded -----------------------------------------------------------------------
    @property
    def ranks(self) -> list[RankTrace]:
        """One RankTrace per rank: its events frame, steps, the tracer's records and its
        tables (RankTrace.table)."""
        return self.loaded.ranks

    @property
    def problems_met(self) -> list[str]:
        """The problems of the tables computed so far (the load's are loaded.problems)."""
        return list(self._guarded.problems)

    @property
    def problems(self) -> list[str]:
        """Everything that could not be read or computed, each naming file and rank (every
        table is computed for it)."""
        return self.report.problems

    @property
    def unavailable(self) -> dict[str, str]:
        """The tables computed so far that could not be, and why."""
        return dict(self._guarded.unavailable)

    def _over(self, phase: str) -> list[RankTrace]:
        """The ranks, with the progress of a per-rank phase shown (analysis.report.progress)."""
        traces = self.loaded.ranks
        return self._progress.over(traces, phase) if self._progress is not None else traces

    def _rank_rows(self, name: str, phase: str, empty: pd.DataFrame) -> pd.DataFrame:
        """Every rank's table `name`, as its reduction made it; a rank whose table failed is
        one problem naming its file, rank and the table, and has no rows in it."""
        frames = []
        for trace in self._over(phase):
            frame = self._guarded.part(
                None, lambda trace=trace: trace.table(name),
                f"{trace.path}: {trace.label}: {name} table failed ({{why}}); the rank has no "
                f"rows in it")
            if frame is not None:
                frames.append(frame)
        return pd.concat(frames or [empty], ignore_index=True)

    # ---- the breakdown ---------------------------------------------------------------------------
    @cached_property
    def _profiled(self) -> pd.DataFrame:
        """Every rank's breakdown of its profiled steps, before the cross-rank waits."""
        return self._rank_rows("per_step", "time breakdown", empty_breakdown())

    @cached_property
    def _gaps(self) -> pd.DataFrame:
        """Every rank's idle gaps, before the waits for peers are told."""
        return self._rank_rows("idle_gaps", "idle gaps", idle_gaps_empty())

    @cached_property
    def hta(self) -> pd.DataFrame:
        """HTA 0.5.0's temporal breakdown, one row per rank."""
        return hta_temporal_breakdown(self.loaded.ranks)

    @cached_property
    def _waited(self) -> Breakdown:
        """The breakdown with the cross-rank waits applied (crossrank.waits.with_waits): the
        profiled steps, and every recorded step (of --steps) as an analysed one unless
        HTA-compatible (docs/definitions.md, "Analysed steps")."""
        recorded = (None if self.hta_compatible else
                    record_step_rows(self.loaded.ranks, self._profiled, self._selected))
        return with_waits(self._profiled, recorded, self._gaps, self.cross_rank)

    @property
    def breakdown(self) -> pd.DataFrame:
        """Our time breakdown, one row per (rank, profiled step), its communication split into
        transfer and waiting for peers (docs/definitions.md)."""
        return self._waited.per_step

    @property
    def totals(self) -> pd.DataFrame:
        """The breakdown summed over each rank's steps."""
        return self._waited.totals

    @property
    def idle_gaps(self) -> pd.DataFrame:
        """Every idle gap and what the host was doing."""
        return self._waited.idle_gaps

    @property
    def idle(self) -> pd.DataFrame:
        """Idle time per rank and what the host was doing."""
        return self._waited.idle

    # ---- across ranks ----------------------------------------------------------------------------
    @cached_property
    def cross_rank(self) -> CrossRank | None:
        """The cross-rank pass (clock, ops, waits, bandwidth, stragglers, mismatches, pipeline;
        docs/cross-rank.md), None where it failed."""
        profiled = self._profiled
        work = None
        if len(profiled):
            work = profiled[["rank", "step", "step_ns"]].assign(
                work_ns=tables.work_ns(profiled)).dropna(subset=["rank"])
            work = work.astype({"rank": "int64", "step": "int64"})
        cross = self._guarded.part(
            "cross_rank", lambda: crossrank.cross_rank(self.loaded, work=work,
                                                       steps=self._selected),
            "cross-rank analysis failed ({why}); waiting for peers is not told from transfer")
        for part, why in (cross.failed if cross is not None else {}).items():
            # the rest of the pass stands
            self._guarded.problems.append(f"cross-rank {part} analysis failed ({why}); the rest "
                                          f"of the cross-rank analysis stands")
            self._guarded.unavailable[f"cross_rank_{part}"] = why
        return cross

    @cached_property
    def critical(self) -> CriticalPath | None:
        """The critical path per analysed step and the what-if answers
        (docs/critical-path.md), with the idle gaps known in the profiled (rank, step) rows;
        without the pass, or with no step it analyses, a run of one rank with GPU events gets
        that rank's own path (docs/critical-path.md, "One rank on a GPU"). None where there is
        neither, or where the model failed."""
        cross = self.cross_rank
        if cross is None:
            return self._one_rank_path()
        result = self._guarded.part(
            "critical_path", lambda: critical_path.analyse(
                cross, idle_gaps=self.idle_gaps, profiled=self.breakdown[["rank", "step"]],
                cores=what_if_cores.host_cores(self.loaded.ranks)),
            "critical path analysis failed ({why}); no what-if answer")
        if result is None:
            return None
        if not len(result.critical_path_steps):  # no analysed step across ranks: one rank
            return self._one_rank_path() or result
        if self.loaded.path_window is not None:
            self._guarded.problems.append(
                f"--window {self.loaded.path_window.name!r}: the critical path across ranks is "
                f"per step; the window applies to the path of a run of one traced rank")
        return result

    def _one_rank_path(self) -> CriticalPath | None:
        """The single-rank critical path of a run of one traced rank with device ops, as its
        reduction built it (analysis.rank.reduction.rank_tables builds it wherever the rank
        may be the run's only traced one), or None."""
        traces = [t for t in self.loaded.ranks if t.has_trace]
        if len(traces) != 1:
            return None
        result = self._guarded.part(
            "critical_path", lambda: traces[0].table("critical_path"),
            "critical path analysis failed ({why}); no what-if answer")
        return result if result is not None and len(result.critical_path_steps) else None

    # ---- the run's tables ------------------------------------------------------------------------
    @cached_property
    def mfu(self) -> pd.DataFrame | None:
        """MFU per rank and profiled step, with the points it loses (docs/mfu.md)."""
        return self._guarded.table("mfu", lambda: flops.mfu_of_run(
            self.loaded.ranks, self.breakdown, self.peak_tflops))

    @cached_property
    def roofline(self) -> pd.DataFrame | None:
        """Each rank's slowest op groups against its roofline (docs/mfu.md)."""
        return self._guarded.table("roofline", lambda: flops.roofline_of_run(
            self.loaded.ranks, self.peak_tflops))

    @cached_property
    def per_rank(self) -> pd.DataFrame | None:
        """One row per rank: step time, breakdown, memory, utilisation."""
        return self._guarded.table("per_rank", lambda: tables.per_rank_table(
            self._waited.analysed, self.loaded.ranks))

    @cached_property
    def _step_rows(self) -> pd.DataFrame | None:
        return self._guarded.table("per_step", lambda: tables.per_step_table(
            self._waited.analysed, self.loaded.ranks))

    @property
    def per_step(self) -> pd.DataFrame:
        """The breakdown with memory, utilisation and spread across ranks, one row per analysed
        (rank, step) (docs/report.md); the breakdown where it could not be built."""
        rows = self._step_rows
        return rows if rows is not None else self.breakdown

    @cached_property
    def _every_op(self) -> pd.DataFrame | None:
        """Every collective and p2p op of every rank (its reduction's), set-up included."""
        return self._guarded.table("comm_ops", lambda: pd.concat(
            [trace.table("comm_ops") for trace in self._over("collectives")]
            or [comm_ops.empty_ops()], ignore_index=True))

    @cached_property
    def _ops(self) -> tuple[pd.DataFrame, pd.DataFrame] | None:
        """(the ops of the analysed steps, the set-up ops)."""
        every = self._every_op
        return comm_ops.analysed_ops(every, self._selected) if every is not None else None

    @property
    def comm_ops(self) -> pd.DataFrame | None:
        """Every collective and p2p op of every rank in the analysed steps."""
        return self._ops[0] if self._ops is not None else None

    @cached_property
    def setup_collectives(self) -> pd.DataFrame | None:
        """Collectives issued before the first step (set-up), grouped as the collectives are."""
        if self._ops is None:
            return None
        return self._guarded.table("setup_collectives",
                                   lambda: comm_ops.collectives_table(self._ops[1]))

    @cached_property
    def collectives(self) -> pd.DataFrame | None:
        """Ops of the analysed steps grouped by op, process group and size, costliest per step
        first, with the transfer-based bandwidth of the cross-rank pass."""
        if self._ops is None:
            return None
        ops = self._ops[0]
        return self._guarded.table("collectives", lambda: with_transfer_bandwidth(
            comm_ops.collectives_table(
                ops, comm_ops.steps_covered(self.loaded.ranks, ops, self._selected)),
            self.cross_rank))

    # ---- findings --------------------------------------------------------------------------------
    @cached_property
    def late(self) -> dict[int, LateRank]:
        """The late ranks (the straggler rule's, the pipeline stage that holds the others back)
        and the causes that hold for each over the analysed steps (docs/report.md, "Why a rank
        is late"); empty where none is named or the tests failed."""
        analysed = self._waited.analysed
        steps = analysed["step"].dropna().unique() if len(analysed) else []
        found = self._guarded.part(
            "late_causes", lambda: late_ranks(self.loaded.ranks, self.cross_rank, steps),
            "the causes of the late ranks could not be tested ({why})")
        return found or {}

    @cached_property
    def _bottlenecks(self) -> pd.DataFrame | None:
        """The bottleneck findings of the step time, largest share of step time first."""
        return self._guarded.table("bottlenecks", lambda: bottlenecks.find_bottlenecks(
            self.per_step, self.per_rank, self.collectives, self.idle_gaps, self.loaded.ranks,
            cross_rank=self.cross_rank, late=self.late))

    @cached_property
    def memory(self) -> MemorySection | None:
        """Memory per rank and across ranks over the analysed steps, its findings and the
        out-of-memory diagnosis (docs/memory.md); None for a run without the tracer's step
        records, or where it failed."""
        def section() -> MemorySection | None:
            inputs = memory_inputs(self.loaded)
            if inputs is None:
                return None
            self._guarded.problems.extend(inputs.problems)
            return memory_section(inputs, analysed_steps(self.per_step))

        return self._guarded.part("memory", section, "memory analysis failed ({why})")

    @cached_property
    def findings(self) -> pd.DataFrame | None:
        """The bottleneck findings, largest share of step time first, then the memory
        findings (risks, no share of step time)."""
        memory = self.memory
        return with_memory_findings(self._bottlenecks,
                                    memory.findings if memory is not None else ())

    @cached_property
    def notes(self) -> pd.DataFrame | None:
        """What the analysis could not tell (no share of step time)."""
        return self._guarded.table("notes", lambda: notes.find_notes(
            self.per_step, self.collectives, self.loaded.ranks, self.cross_rank))

    @cached_property
    def captures(self) -> list[dict]:
        """The capture windows (slow step or on demand), each with its steps' mean step, waits
        and late rank (docs/report.md, "Capture windows")."""
        records = {int(t.rank): t.records for t in self.loaded.ranks
                   if t.rank != UNKNOWN_RANK and t.records is not None}
        if not records:
            return []

        def analysed() -> list[dict]:
            windows, problems = group_captures(records)
            self._guarded.problems.extend(problems)
            cross = self.cross_rank
            return analysed_captures(windows, self.per_step,
                                     cross.waits if cross is not None else None)

        found = self._guarded.part("captures", analysed, "capture windows failed ({why})")
        return found if found is not None else []

    @cached_property
    def phases(self) -> list[Phase]:
        """The run's phases: stretches of steps in which every rank's step time and wait for
        peers are steady, each with its own late rank, waits and what-if (docs/definitions.md,
        "Phases"); one for a steady run, none where they could not be found."""
        found = self._guarded.part(
            "phases", lambda: find_phases(self.per_step, self.cross_rank, self.critical),
            "phases failed ({why}); the run is analysed as one")
        return found if found is not None else []

    @cached_property
    def verdict(self) -> Verdict:
        """The verdict the report opens with (docs/report.md)."""
        memory = self.memory
        return verdict.run_verdict(self.per_step, self.findings, self.notes, self.cross_rank,
                                   self.critical, self.captures, self.late,
                                   memory.verdict_line if memory is not None else None,
                                   self.phases)

    @cached_property
    def stop(self) -> StopDiagnosis | None:
        """The stop diagnosis of a run folder that did not end well (docs/reliability.md), None
        for one that did."""
        loaded = self.loaded
        statuses = {t.rank: t.status for t in loaded.ranks if t.rank != UNKNOWN_RANK}
        if loaded.run_dir is None or not stop_diagnosis.needs_diagnosis(statuses):
            return None

        def diagnosed() -> StopDiagnosis | None:
            inputs = stop_inputs(loaded)
            self._guarded.problems.extend(inputs.problems)
            return stop_diagnosis.diagnose(inputs, loaded.ranks)

        return self._guarded.part("stop_diagnosis", diagnosed, "stop diagnosis failed ({why})")

    # ---- the whole report ------------------------------------------------------------------------
    @cached_property
    def report(self) -> RunReport:
        """Every table, as the command line prints them, computed in the order their problems
        are told: the ranks' tables, the cross-rank pass, the run's tables, the findings, the
        MFU, roofline and critical path, the phases, the verdict, the stop diagnosis."""
        loaded = self.loaded
        # In the order of the report's problems. The FLOP tables and the critical path of a run
        # of one trace are computed beside (analysis.rank.reduction): taken after everything
        # that does not need them, they are waited for 3-8 ms where they were 15-26 ms.
        parts = {name: getattr(self, name) for name in (
            "_profiled", "_gaps", "hta", "_every_op", "cross_rank", "_waited", "per_rank",
            "_step_rows", "setup_collectives", "collectives", "late", "_bottlenecks", "memory",
            "findings", "notes", "captures", "mfu", "roofline", "critical", "phases", "verdict",
            "stop")}
        waited = parts["_waited"]
        return RunReport(
            name=self.name, path=self.path, files=[str(f) for f in loaded.files],
            world_size=loaded.world_size, steps_spec=self.steps_spec,
            hta_compatible=self.hta_compatible, ranks=loaded.ranks,
            problems=[*loaded.problems, *self._guarded.problems],
            unavailable=dict(self._guarded.unavailable), per_step=waited.per_step,
            totals=waited.totals, hta=parts["hta"], idle=waited.idle,
            idle_gaps=waited.idle_gaps, step_rows=parts["_step_rows"],
            per_rank=parts["per_rank"], comm_ops=self.comm_ops,
            collectives=parts["collectives"], setup_collectives=parts["setup_collectives"],
            findings=parts["findings"], notes=parts["notes"], mfu=parts["mfu"],
            roofline=parts["roofline"], cross_rank=parts["cross_rank"],
            critical=parts["critical"], verdict=parts["verdict"], captures=parts["captures"],
            phases=parts["phases"], stop=parts["stop"], memory=parts["memory"],
            path_window=loaded.path_window, late_causes=cause_rows(parts["late"]))

    def document(self) -> dict:
        """The JSON document of `--format json`."""
        return json_document.run_document(self.report)


def analyse_run(loaded: LoadResult, name: str, path: str, steps_spec: str | None = None,
                hta_compatible: bool = False, progress: Progress | None = None,
                peak_tflops: float | None = None) -> RunReport:
    """Every table of one loaded run (Run.report); `peak_tflops` overrides every rank's peak,
    `progress` shows the per-rank phases (analysis.report.progress)."""
    return Run(loaded, name, path, steps_spec, hta_compatible, peak_tflops, progress).report


def open_run(path, steps: str | None = None, *, run: str | None = None,
             hta_compatible: bool = False, use_cache: bool = True, jobs: int | None = None,
             comm_kernels: tuple = (), keep_events: bool = True,
             peak_tflops: float | None = None, path_window=None) -> Run:
    """Load the run that `path` names (a run folder, a folder of runs: the newest, trace files),
    with the options of the command line (`steps` as in --steps, e.g. "3-5,7"; `peak_tflops` as
    --peak-tflops, every rank's peak for MFU; `path_window` a PathWindow as --window and
    --instance);
    `keep_events=False` holds each rank's reduced results instead of its events, for runs of
    many ranks (docs/analysis.md, "Large runs and Dask"). Raises
    NothingToAnalyse when `path` holds no trace, ValueError for a bad `steps`."""
    loaded = load_run_path(path, steps, run=run, hta_compatible=hta_compatible,
                           use_cache=use_cache, jobs=jobs, comm_kernels=comm_kernels,
                           keep_events=keep_events, path_window=path_window)
    where = loaded.run_dir if loaded.run_dir is not None else Path(
        path[0] if isinstance(path, (list, tuple)) else path)
    return Run(loaded, name=where.name or str(where), path=str(where), steps_spec=steps,
               hta_compatible=hta_compatible, peak_tflops=peak_tflops)

"""What one stage of the analysis hands the next (docs/analysis.md, "The stages").

Frozen dataclasses, one per hand-over; their tables are pandas DataFrames, whose columns are
those of the function that makes them (checked there, analysis.core.frames for the events and
steps frames):

- `RankTables`: what the per-rank reduction (analysis.rank.reduction.rank_tables) computes of
  one rank while its events are at hand, where its file is parsed; every run-wide analysis
  takes a rank's tables from it (`RankTrace.table`, analysis.core.model), and from nowhere
  else.
- `CrossRank`: the cross-rank pass (analysis.crossrank.cross_rank).
- `CriticalPath`: the critical path and the what-if answers, across ranks
  (analysis.crossrank.critical_path) or of one rank (analysis.rank.one_rank_path).
- `Phase`: a stretch of steady steps of the run (analysis.crossrank.phases).
- `Breakdown`: the per-step breakdown with the cross-rank waits applied in one step
  (analysis.crossrank.waits.with_waits).
- `Finding`: a bottleneck finding or a note (analysis.crossrank.findings,
  analysis.findings.bottlenecks, analysis.findings.notes).
- `Verdict`: the lines the report opens with (analysis.findings.verdict).
- `StopInputs`, `StopDiagnosis`: what ingest reads for the stop diagnosis of a run that did not
  end well (analysis.ingest.stop_records), and the diagnosis
  (analysis.findings.stop_diagnosis).
- `RankMemory`, `MemoryInputs`, `OomDiagnosis`, `MemorySection`: one rank's memory figures
  (analysis.rank.memory_figures), what the memory section reads of a run
  (analysis.ingest.memory_files), the out-of-memory diagnosis (analysis.findings.oom_diagnosis)
  and the memory section of the report (analysis.findings.memory_section; docs/memory.md).
- `RunReport`: every table of one analysed run (analysis.run), which the writers
  (analysis.report) show as they are.

This module imports no pandas: the model of a loaded run (analysis.core.model) refers to it
before the command imports pandas (analysis.ingest.parse_ahead).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from analysis.core.forked import ComputedElsewhereFailed, ForkedResult
from analysis.core.step_spec import PathWindow

if TYPE_CHECKING:
    import pandas as pd


def _frame() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame()


# ---- one rank's tables ---------------------------------------------------------------------------
class ReducedTableFailed(Exception):
    """A rank's table or summary that failed where its file was parsed. `why` is the failure
    as it was ("ExceptionType: message"), which the report gives as a failure computed in the
    command would be given."""

    def __init__(self, label: str, name: str, why: str):
        super().__init__(f"{label}'s {name} failed where its trace was parsed: {why}")
        self.name = name
        self.why = why


class NotReduced(Exception):
    """A rank loaded without the per-rank reduction (analysis.ingest.load_files without
    `reduce_rank`): it has no tables to take (analysis.run.loading loads a run with it)."""


def failure_text(exc: Exception) -> str:
    """How the report names a failure: "ExceptionType: message", the reduction's own for a
    ReducedTableFailed."""
    return exc.why if isinstance(exc, ReducedTableFailed) else f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True, eq=False)
class RankTables:
    """The tables and summaries of one rank, by the function that made each
    (analysis.rank.reduction.RANK_TABLES and RANK_SUMMARIES); `failed` names those whose
    function raised ({name: "ExceptionType: message"}), which `take` raises where the table is
    taken. A summary that only some runs need is None where it was not built (rank_tables says
    where it is)."""

    per_step: pd.DataFrame | None = None  # analysis.rank.step_breakdown.breakdown_per_step
    idle_gaps: pd.DataFrame | None = None  # analysis.rank.idle.idle_gaps
    comm_ops: pd.DataFrame | None = None  # analysis.rank.comm.comm_ops.comm_ops
    # analysis.rank.flops.rank_flops_tables (each a ForkedResult while computed beside)
    step_flops: pd.DataFrame | ForkedResult | None = None
    op_roofline: pd.DataFrame | ForkedResult | None = None
    hta: dict | None = None  # analysis.rank.hta.hta_rank_summary
    pipeline_schedule: Any = None  # analysis.rank.pipeline_schedule.rank_schedule
    ddp_accumulation: str | None = None  # analysis.rank.issuers.ddp_accumulation
    comm_events: pd.DataFrame | None = None  # the communication events the cross-rank pass reads
    event_count: int = 0  # complete events in the rank's trace(s)
    # The one-rank critical path (a CriticalPath; a ForkedResult while computed beside).
    critical_path: CriticalPath | ForkedResult | None = None
    stop_trace_ops: pd.DataFrame | None = None  # the collectives of every step of the trace
    # What the cause tests of a late rank read of its steps (analysis.rank.step_evidence:
    # a StepEvidence, None without steps), and its host ops (a HostSpans).
    step_evidence: Any = None
    host_spans: Any = None
    failed: Mapping[str, str] = field(default_factory=dict)

    def take(self, name: str, label: str = "the rank"):
        """The table or summary `name`; ReducedTableFailed where its function raised (one
        computed beside, analysis.core.forked, is waited for)."""
        if name in self.failed:
            raise ReducedTableFailed(label, name, self.failed[name])
        found = getattr(self, name)
        if isinstance(found, ForkedResult):
            try:
                return found.result()
            except ComputedElsewhereFailed as exc:
                raise ReducedTableFailed(label, name, exc.why) from None
        return found


# ---- across ranks --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class CrossRank:
    """The cross-rank pass (docs/cross-rank.md): every op matched across ranks on one clock,
    waiting told from transfer, the rank the others waited for, and pipeline bubbles."""

    clock: pd.DataFrame = field(default_factory=_frame)  # each rank's offset to the common clock
    ops: pd.DataFrame = field(default_factory=_frame)  # every matched op with its wait and transfer
    waits: pd.DataFrame = field(default_factory=_frame)  # per (rank, step): waiting and transfer
    bandwidth: pd.DataFrame = field(default_factory=_frame)  # transfer-based bandwidth per group
    stragglers: pd.DataFrame = field(default_factory=_frame)  # the late-rank rule per rank
    mismatches: pd.DataFrame = field(default_factory=_frame)  # ops the members disagree on
    pipeline: pd.DataFrame = field(default_factory=_frame)  # bubbles per stage
    # stages, microbatches, virtual stages, theoretical bubble (and kind); None without p2p ops
    pipeline_schedule: dict | None = None
    # what the pass saw but cannot tell for sure: notes, never ranked with the findings
    notes: tuple[Finding, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)  # {pass: "Type: message"}
    # per rank: its Kineto clock minus its ops' clock (analysis.crossrank.run_frames)
    kineto_shift_ns: Mapping[int, int] = field(default_factory=dict)
    steps: pd.DataFrame = field(default_factory=_frame)  # each rank's steps, own clock

    def matched(self) -> bool:
        """Whether the pass matched any op: its findings then replace the per-rank ones."""
        return len(self.ops) > 0


@dataclass(frozen=True, eq=False)
class CriticalPath:
    """The critical path per analysed step and the what-if answers (docs/critical-path.md);
    the frames' columns are analysis.core.dag's PATH_COLUMNS, PATH_STEP_COLUMNS and
    SEGMENT_COLUMNS."""

    critical_path: pd.DataFrame  # the path's time per step, rank and category
    critical_path_steps: pd.DataFrame  # per step: its length, the ranks that end and start it
    critical_path_segments: pd.DataFrame  # its stretches of time on the common clock
    what_if: list[dict] = field(default_factory=list)  # the answers, largest saving first
    # per step: its measured mean step (measured_ms) and each answer's saving in it, a column
    # per answer's `change` (crossrank.what_if.answers_by_step); empty where not computed
    what_if_steps: pd.DataFrame = field(default_factory=_frame)


@dataclass(frozen=True)
class Phase:
    """A stretch of the run's analysed steps in which every rank's step time and wait for peers
    are steady (analysis.crossrank.phases; docs/definitions.md, "Phases")."""

    first_step: int
    last_step: int
    steps: int  # analysed steps in it
    share_pct: float  # of the run's time: its (rank, step) rows' step time over all rows'
    step_ms: float  # its mean step over its (rank, step) rows
    ranks: Mapping[int, Mapping[str, float | None]]  # rank -> {"step_ms", "wait_ms"}, means
    late_rank: int | None  # the rank the straggler rule names on its steps alone
    late_ms_per_step: float | None  # the wait that rank caused, per step
    waiting_ranks: list[int] = field(default_factory=list)  # those that wait for it
    what_if: dict | None = None  # the top what-if answer on its steps


@dataclass(frozen=True, eq=False)
class Breakdown:
    """The per-step breakdown with the cross-rank waits applied (analysis.crossrank.waits.
    with_waits), each table once: nothing computed is corrected afterwards."""

    per_step: pd.DataFrame  # the profiled steps, communication split into transfer and waiting
    analysed: pd.DataFrame  # per_step and the recorded steps no profiler window holds
    idle_gaps: pd.DataFrame  # every idle gap, those inside a wait for peers labelled so
    totals: pd.DataFrame  # per_step summed over each rank's steps
    idle: pd.DataFrame  # idle time per rank and what the host was doing


# ---- findings ------------------------------------------------------------------------------------
# The bottlenecks table and the notes table (docs/report.md).
FINDING_COLUMNS = ["finding", "share_pct", "evidence", "suggestion", "ranks", "ms_per_step"]
NOTE_COLUMNS = ["note", "evidence", "suggestion", "ranks"]


@dataclass(frozen=True)
class Finding:
    """A finding (what costs step time, the evidence in numbers and what to do) or, with
    `note`, a note (what the analysis could not tell), which is shown apart and never ranked
    with the findings (docs/report.md)."""

    name: str  # the finding ("exposed communication") or the note
    share_pct: float = math.nan  # of step time at stake; NaN where none is
    evidence: str = ""
    suggestion: str = ""
    ranks: str = ""  # the ranks it is about, as text ("0-3, 5")
    note: bool = False
    # its clause of a verdict line that names it apart (the memory findings': "rank 1 grows
    # 2.00 MiB per step from step 20"); "" where none does
    headline: str = ""

    def finding_row(self) -> dict:
        """The bottlenecks table's row (FINDING_COLUMNS but ms_per_step)."""
        return {"finding": self.name, "share_pct": float(self.share_pct),
                "evidence": self.evidence, "suggestion": self.suggestion, "ranks": self.ranks}

    def note_row(self) -> dict:
        """The notes table's row (NOTE_COLUMNS)."""
        return {"note": self.name, "evidence": self.evidence, "suggestion": self.suggestion,
                "ranks": self.ranks}


@dataclass(frozen=True)
class Verdict:
    """The verdict the report opens with (docs/report.md, "The verdict"); the writers print
    `lines` as they are."""

    state: str  # analysis.findings.verdict's states: "bottleneck", "nothing found", ...
    limits: str | None  # what limits the step, in words
    waits: str | None  # who waits for whom, in words
    change: str | None  # the one change most worth trying
    change_ms_per_step: float | None  # the step time at stake in it
    step_ms: float | None  # the analysed steps' mean
    what_if: str | None  # the top what-if answer in words
    lines: list[str] = field(default_factory=list)
    # the changes to try, most predicted saving first (analysis.findings.verdict.tries): finding,
    # change, saved_ms_per_step (None where the what-if model cannot price it)
    tries: list[dict] = field(default_factory=list)
    memory: str | None = None  # the memory line ("Memory: ..."), None where memory is fine


@dataclass(frozen=True, eq=False)
class StopInputs:
    """What the stop diagnosis reads of a run folder (analysis.ingest.stop_records)."""

    statuses: Mapping[int, str | None]  # how each rank's run ended (its manifest)
    world_size: int
    issued: pd.DataFrame  # every rank's issue records
    completed: pd.DataFrame  # every rank's comm records
    frames: pd.DataFrame  # the main thread's innermost frames of each rank's stack dump
    exceptions: Mapping[int, str | None]  # each rank's exception at run_end
    problems: list[str] = field(default_factory=list)  # what could not be read


@dataclass(frozen=True, eq=False)
class StopDiagnosis:
    """The stop diagnosis (docs/reliability.md, "Stop diagnosis"): per process group where its
    members parted, each rank's status and where its main thread was, and the lines the report
    prints."""

    groups: pd.DataFrame
    ranks: list[dict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


# ---- memory (docs/memory.md) ---------------------------------------------------------------------
MEASURE_CUDA = "cuda_allocated"  # the series: PyTorch's peak allocated CUDA memory per step
MEASURE_RSS = "rss"  # the process's resident memory near each step's end


@dataclass(frozen=True)
class RankMemory:
    """One rank's memory figures (analysis.rank.memory_figures; docs/memory.md, "Figures per
    rank"): every byte figure in bytes, NaN where unknown."""

    rank: int
    measure: str  # MEASURE_CUDA or MEASURE_RSS
    steps: int  # analysed steps with a value
    first_step: int
    last_step: int
    peak_bytes: float
    peak_step: int
    reserved_bytes: float  # the allocator's peak reserved memory (CUDA); NaN on CPU
    device_total_bytes: float  # the device's capacity (CUDA); NaN on CPU
    headroom_pct: float  # share of the device left above the peak reserved (else allocated)
    growth_bytes_per_step: float
    growth_from_step: int | None
    noise_bytes: float  # the series' noise the growth was judged against
    steps_to_full: float  # at the growth's rate, from the last step; NaN without both
    full_at_step: int | None
    categories_at_peak: dict[str, int] | None  # schema.MEMORY_CATEGORIES -> bytes
    categories_steps: tuple[int, int] | None  # the profiler window they come from
    categories_peak_bytes: float  # that window's peak: every tensor the profiler saw
    # Bytes a step each category gained from the first profiler window's peak to the last's
    # (two windows or more, at different steps); None otherwise
    categories_growth_per_step: dict[str, float] | None = None


@dataclass(frozen=True, eq=False)
class MemoryInputs:
    """What the memory section reads of a run (analysis.ingest.memory_files.memory_inputs)."""

    steps: Mapping[int, Any]  # rank -> its step records' frame (tracer.schema.StepRecord)
    profiles: Mapping[int, list]  # rank -> its tracer.schema.MemoryProfileRecords ([] or none)
    snapshots: list  # every readable tracer.schema.MemorySnapshotRecord, by rank and step
    offsets_ns: Mapping[int, int]  # rank -> its clock_sync offset, where it has one
    problems: list[str] = field(default_factory=list)  # files that could not be read


@dataclass(frozen=True, eq=False)
class OomDiagnosis:
    """Which rank ran out of memory first, at which step, and what held the memory
    (analysis.findings.oom_diagnosis; docs/memory.md, "Out of memory")."""

    first_rank: int
    first_step: int
    ranks: list[dict]  # one entry per rank that ran out, the first first
    lines: list[str]  # as the report prints them


@dataclass(frozen=True, eq=False)
class MemorySection:
    """The memory section of the report (analysis.findings.memory_section): what the writers
    show of memory; they compute nothing more."""

    rows: list[dict] = field(default_factory=list)  # the memory table, one row per rank
    findings: tuple[Finding, ...] = ()  # the memory findings, each with its headline
    verdict_line: str | None = None  # "Memory: ..." or None where memory is fine
    oom: OomDiagnosis | None = None  # where a rank ran out
    # rank -> (steps, bytes) of its series, for the figure: the measure of each rank's row
    series: Mapping[int, tuple[list[int], list[float]]] = field(default_factory=dict)


# ---- the run -------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class RunReport:
    """Every table of one analysed run (analysis.run.analysed_run.Run.report), None where it
    could not be computed (`unavailable` says why, `problems` says it too)."""

    name: str
    path: str
    files: list[str]
    world_size: int | None
    steps_spec: str | None
    hta_compatible: bool
    problems: list[str]
    unavailable: Mapping[str, str]  # table -> why it is missing
    ranks: list  # RankTrace, as loaded
    per_step: pd.DataFrame  # the breakdown of every rank's profiled steps (Breakdown.per_step)
    totals: pd.DataFrame  # per_step summed over each rank's steps
    hta: pd.DataFrame  # HTA 0.5.0's temporal breakdown, one row per rank
    idle: pd.DataFrame  # idle time per rank and what the host was doing
    idle_gaps: pd.DataFrame  # every idle gap
    step_rows: pd.DataFrame | None = None  # the per-step table (analysis.rank.tables)
    per_rank: pd.DataFrame | None = None
    comm_ops: pd.DataFrame | None = None  # the ops of the analysed steps
    collectives: pd.DataFrame | None = None
    setup_collectives: pd.DataFrame | None = None
    findings: pd.DataFrame | None = None  # the bottlenecks table (FINDING_COLUMNS)
    notes: pd.DataFrame | None = None  # the notes table (NOTE_COLUMNS)
    mfu: pd.DataFrame | None = None
    roofline: pd.DataFrame | None = None
    cross_rank: CrossRank | None = None
    critical: CriticalPath | None = None
    verdict: Verdict | None = None
    captures: list[dict] = field(default_factory=list)  # the capture windows and what they show
    phases: list[Phase] = field(default_factory=list)  # the run's phases, in step order
    stop: StopDiagnosis | None = None  # None for a run that ended well
    # per late rank and cause that holds (analysis.findings.late_ranks.cause_rows)
    late_causes: list[dict] = field(default_factory=list)
    memory: MemorySection | None = None  # None without step records
    # the one-rank critical path's windows (--window, --instance), None: the steps
    path_window: PathWindow | None = None

    def nothing_analysed(self) -> bool:
        """No breakdown row and no collective: nothing to show but the reasons."""
        return self.per_step.empty and (self.collectives is None or self.collectives.empty)

    def step_table(self) -> pd.DataFrame:
        """The per-step table: analysis.rank.tables' fuller one where it was built, else the
        breakdown."""
        return self.step_rows if self.step_rows is not None else self.per_step

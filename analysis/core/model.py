"""The data model of a loaded run: one RankTrace per rank, the tracer's records of a rank
(RunRecords) and the whole LoadResult; docs/analysis.md describes each field.

analysis.ingest.load builds them. This module imports no pandas: the command lists a run's record
files (analysis.ingest.records) before it imports pandas (analysis.ingest.parse_ahead).
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.core.step_spec import PathWindow

if TYPE_CHECKING:
    import pandas as pd

    from analysis.core.contracts import RankTables

# The rank of a trace that names none, among several (shown as "rank ?"): ranks are ints, so
# that a rank column is int64 and a rank compares and sorts without a None check.
UNKNOWN_RANK = -1


def known_rank(trace) -> int | None:
    """`trace.rank` as tables and the JSON document hold it: None where the rank is unknown (or
    the object has no rank)."""
    rank = getattr(trace, "rank", None)
    return None if rank is None or rank == UNKNOWN_RANK else rank


@dataclass(frozen=True)
class StepsEnded:
    """What the tracer's records say of which steps ended (analysis.ingest.records.
    steps_ended): `last`, the last step known to have ended, as `said_by` says; `cut_short`:
    the records may stop before steps that did end (the rank died without its run_end, its
    last records unwritten), so that they bound no step of a complete trace."""

    last: int
    said_by: str
    cut_short: bool = False


@dataclass
class RunRecords:
    comms: pd.DataFrame
    samples: pd.DataFrame
    steps: pd.DataFrame
    manifest: list


@dataclass
class RankTrace:
    rank: int  # UNKNOWN_RANK for a trace that names none
    world_size: int | None
    path: Path
    events: pd.DataFrame  # the events frame (analysis.core.frames)
    steps: pd.DataFrame  # the selected ProfilerStep spans (a steps frame)
    records: RunRecords | None
    problems: list[str]
    # Whether any timestamp in the file was written as a float: HTA rounds such traces to whole
    # microseconds, and the HTA-compatible columns must do the same.
    float_timestamps: bool = False
    # Every ProfilerStep span in the trace, before --steps selection.
    all_steps: pd.DataFrame | None = None
    # More files of the same rank (further profiler windows); their events are in `events`.
    extra_paths: list[Path] = field(default_factory=list)
    backend: str | None = None
    # False for a rank known only from the tracer's records (killed before its trace was written).
    has_trace: bool = True
    # How the rank's run ended, from its manifest: ok, failed, interrupted or crashed (no run_end).
    status: str | None = None
    # The trace's distributedInfo.pg_config: one dict per process group (pg_name, pg_desc, ...).
    process_groups: list[dict] = field(default_factory=list)
    # What the per-rank reduction computed of this rank where its file was parsed
    # (analysis.rank.reduction); None where the run was loaded without it. `events` is None
    # when the events were dropped afterwards.
    tables: RankTables | None = None
    # Reads this rank's events frame again once dropped (given by analysis.ingest.load, which
    # knows the files, the cache and the communication kernels they were loaded with).
    read_events: Callable[[RankTrace], pd.DataFrame] | None = None

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, numbers.Integral):
            raise TypeError(f"RankTrace.rank: expected int (UNKNOWN_RANK = {UNKNOWN_RANK} for an "
                            f"unknown rank), found {type(self.rank).__name__}")

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank != UNKNOWN_RANK else "rank ?"

    @property
    def event_count(self) -> int:
        """Complete events in the rank's trace(s), whether or not they are still held."""
        if self.events is not None:
            return len(self.events)
        return self.tables.event_count if self.tables is not None else 0

    def table(self, name: str):
        """The rank's table or summary `name`, as its reduction made it (RankTables.take:
        ReducedTableFailed where it failed there); NotReduced for a rank loaded without the
        reduction."""
        if self.tables is None:
            # Imported here: the command lists a run's files before it makes the contracts'
            # classes (9 ms of the 95 before it forks its decoder).
            from analysis.core.contracts import NotReduced
            raise NotReduced(f"{self.path}: {self.label}: not reduced, so it has no {name} "
                             f"(load the run with analysis.run.loading)")
        return self.tables.take(name, self.label)

    def with_events(self) -> RankTrace:
        """This rank with its events frame: itself, or, when its events were dropped after
        loading, a copy with them read again from its file(s) (not kept: the caller holds
        them only as long as it needs them)."""
        if self.events is not None:
            return self
        if self.read_events is None:
            raise ValueError(f"{self.path}: {self.label}: its events were dropped and there is "
                             f"nothing to read them again with")
        return dataclasses.replace(self, events=self.read_events(self))


@dataclass
class LoadResult:
    ranks: list[RankTrace]
    problems: list[str]
    run_dir: Path | None
    world_size: int | None = None
    files: list[Path] = field(default_factory=list)
    # the one-rank critical path's windows it was loaded with (--window, --instance;
    # analysis.core.step_spec.PathWindow), None: the ProfilerSteps
    path_window: PathWindow | None = None

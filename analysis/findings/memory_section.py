"""The memory section of a run's report, computed in one place (docs/memory.md): each rank's
figures over its analysed steps, the cross-rank table, the findings and the verdict's memory
line, the out-of-memory diagnosis, and each rank's series for the report's figure.

The memory profiles (--profile-memory) and the CUDA snapshots are read here, from the run
folder; a file that cannot be read is a problem and the rest of the section stands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.crossrank.memory_balance import memory_rows
from analysis.findings.memory_findings import memory_findings, memory_verdict_line
from analysis.findings.oom_diagnosis import oom_diagnosis
from analysis.ingest.memory_profiles import read_memory_profiles
from analysis.ingest.oom_snapshot import read_snapshots
from analysis.rank.memory_figures import RankMemory, rank_memory, rank_series


@dataclass
class MemorySection:
    """What the writers show of memory; they compute nothing more."""

    rows: list[dict] = field(default_factory=list)  # the memory table, one row per rank
    findings: list[dict] = field(default_factory=list)  # finding rows (findings.bottlenecks')
    verdict_line: str | None = None  # "Memory: ..." or None where memory is fine
    oom: dict | None = None  # analysis.findings.oom_diagnosis's, where a rank ran out
    # rank -> (steps, bytes) of its series, for the figure: the measure of each rank's row
    series: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def memory_section(steps_of: dict[int, pd.DataFrame], run_dir: Path | None = None,
                   analysed: dict[int, list[int]] | None = None,
                   offsets_ns: dict[int, int] | None = None,
                   stages: dict[int, int] | None = None) -> MemorySection:
    """The section from each rank's step records (`steps_of`: rank -> its steps frame), the
    memory files of `run_dir`, the analysed steps per rank (`analysed`; None: every record's),
    the ranks' clock offsets (clock_sync) and pipeline stages where known."""
    section = MemorySection()
    profiles: dict[int, list] = {}
    if run_dir is not None:
        for rank in steps_of:
            profiles[rank], problems = read_memory_profiles(Path(run_dir), rank)
            section.problems += problems
    figures: list[RankMemory] = []
    for rank, steps in sorted(steps_of.items()):
        kept = None if analysed is None else analysed.get(rank, [])
        figure = rank_memory(rank, steps, profiles.get(rank), kept)
        if figure is None:
            continue
        figures.append(figure)
        _, series = rank_series(steps, kept)
        section.series[rank] = (series["step"].astype(int).tolist(), series["value"].tolist())
    if figures:
        section.rows = memory_rows(figures)
        section.findings = memory_findings(figures, stages)
        section.verdict_line = memory_verdict_line(section.findings)
    if run_dir is not None:
        snapshots, problems = read_snapshots(Path(run_dir))
        section.problems += problems
        section.oom = oom_diagnosis(snapshots, profiles, offsets_ns)
    return section

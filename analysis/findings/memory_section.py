"""The memory section of a run's report, computed in one place (docs/memory.md): each rank's
figures over its analysed steps, the cross-rank table, the findings and the verdict's memory
line, the out-of-memory diagnosis, and each rank's series for the report's figure, as one
MemorySection (analysis.core.contracts).

What it reads of the run (the step records, the memory profiles of --profile-memory, the CUDA
snapshots) is a MemoryInputs, read by analysis.ingest.memory_files.
"""

from __future__ import annotations

import pandas as pd

from analysis.core.contracts import MemoryInputs, MemorySection, RankMemory
from analysis.crossrank.memory_balance import memory_rows
from analysis.findings.memory_findings import memory_findings, memory_verdict_line
from analysis.findings.oom_diagnosis import oom_diagnosis
from analysis.rank.memory_figures import rank_memory, rank_series


def analysed_steps(per_step: pd.DataFrame | None) -> dict[int, list[int]]:
    """rank -> the step numbers of its rows in the per-step table (the analysed steps)."""
    analysed: dict[int, list[int]] = {}
    if per_step is not None and len(per_step) and {"rank", "step"} <= set(per_step.columns):
        for rank, step in zip(per_step["rank"], per_step["step"]):
            if not (pd.isna(rank) or pd.isna(step)):
                analysed.setdefault(int(rank), []).append(int(step))
    return analysed


def memory_section(inputs: MemoryInputs, analysed: dict[int, list[int]] | None = None,
                   stages: dict[int, int] | None = None) -> MemorySection:
    """The section from what the run's memory files hold (`inputs`), over the analysed steps
    per rank (`analysed`; None: every record's), with the ranks' pipeline stages where
    known."""
    figures: list[RankMemory] = []
    series: dict[int, tuple[list[int], list[float]]] = {}
    for rank, steps in sorted(inputs.steps.items()):
        kept = None if analysed is None else analysed.get(rank, [])
        figure = rank_memory(rank, steps, inputs.profiles.get(rank), kept)
        if figure is None:
            continue
        figures.append(figure)
        _, values = rank_series(steps, kept)
        series[rank] = (values["step"].astype(int).tolist(), values["value"].tolist())
    findings = memory_findings(figures, stages) if figures else []
    return MemorySection(
        rows=memory_rows(figures) if figures else [], findings=tuple(findings),
        verdict_line=memory_verdict_line(findings), series=series,
        oom=oom_diagnosis(inputs.snapshots, inputs.profiles, inputs.offsets_ns))

"""The pipeline schedule a run uses, from what torch.distributed.pipelining leaves in the trace.

Multi-stage schedules (`ScheduleInterleaved1F1B`, `ScheduleLoopedBFS`, the zero-bubble ones,
`ScheduleDualPipeV`) run each action inside a `PP:<action>` span: `PP:2F0` is stage 2's forward
of microbatch 0, `PP:1B3` a full backward, `PP:0I1`/`PP:0W1` a backward split into input and
weight parts. `ScheduleGPipe` opens `Forward i` / `Backward i` spans; `Schedule1F1B` opens none.
Definitions in docs/report.md ("Pipeline bubble").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import pandas as pd

from analysis.core.events import distinct_names
from analysis.core.model import known_rank
from analysis.rank.issuers import host_events

_ACTION_RE = re.compile(r"^PP:\(?(\d+)(F|B|I|W)(\d+)?")
_GPIPE_RE = re.compile(r"^(?:Forward|Backward) \d+$")


@dataclass
class PipelineSchedule:
    stages_by_rank: dict = field(default_factory=dict)  # rank -> stage indices it ran
    microbatches: int | None = None
    kind: str | None = None  # "interleaved", "looped", "gpipe", or None when the trace can't tell
    split_backward: bool = False  # backward run as input and weight parts (zero-bubble schedules)

    @property
    def stages_per_rank(self) -> int | None:
        counts = {len(s) for s in self.stages_by_rank.values() if s}
        return max(counts) if counts else None

    def total_stages(self, ranks: int) -> int:
        """Stages over the pipeline's `ranks` ranks: the distinct stage indices seen, or the
        stages per rank times the ranks where only some ranks were traced."""
        seen = set().union(*self.stages_by_rank.values()) if self.stages_by_rank else set()
        per_rank = self.stages_per_rank or 1
        return max(len(seen), per_rank * ranks)


def detect(traces) -> PipelineSchedule:
    """The run's schedule: what each rank's spans say (`rank_schedule`, its reduction's),
    merged."""
    return merge([trace.table("pipeline_schedule") for trace in traces or []])


def rank_schedule(trace) -> PipelineSchedule:
    """What one rank's `PP:` and GPipe spans say; `kind` is "gpipe" where it has GPipe spans
    and no `PP:` action."""
    schedule = PipelineSchedule()
    events = getattr(trace, "events", None)
    if isinstance(events, pd.DataFrame) and "name" in events.columns and not any(
            name.startswith("PP:") or _GPIPE_RE.match(name)
            for name in distinct_names(events["name"])):
        return schedule  # no span of any schedule: the usual case, told from the names alone
    host = host_events(trace)
    if host.empty:
        return schedule
    names = host["name"].astype(str)
    actions = host[names.str.startswith("PP:")].sort_values("ts_ns")
    parsed = actions["name"].astype(str).str.extract(_ACTION_RE).dropna(subset=[0])
    if parsed.empty:
        schedule.kind = "gpipe" if names.str.match(_GPIPE_RE).any() else None
        return schedule
    stages = parsed[0].astype(int)
    schedule.stages_by_rank[known_rank(trace)] = set(stages.unique().tolist())
    schedule.split_backward = bool(parsed[1].isin(["I", "W"]).any())
    micro = pd.to_numeric(parsed[2], errors="coerce").dropna()
    if len(micro):
        schedule.microbatches = int(micro.max()) + 1
    forwards = stages[parsed[1] == "F"].to_numpy()
    if len(set(forwards)) > 1 and len(micro):
        # Looped BFS runs all microbatches of one stage before the next stage's; an
        # interleaved schedule switches stage after fewer forwards than that.
        order = pd.Series(forwards)
        runs = order.groupby((order.diff() != 0).cumsum()).size()
        schedule.kind = "interleaved" if runs.max() < int(micro.max()) + 1 else "looped"
    return schedule


def merge(schedules: list[PipelineSchedule]) -> PipelineSchedule:
    """Several ranks' schedules as one: any rank's interleaving makes the run interleaved, and
    GPipe is told only where no rank ran `PP:` actions."""
    merged = PipelineSchedule()
    kinds = set()
    for schedule in schedules:
        for rank, stages in schedule.stages_by_rank.items():
            merged.stages_by_rank.setdefault(rank, set()).update(stages)
        merged.split_backward = merged.split_backward or schedule.split_backward
        if schedule.microbatches is not None:
            merged.microbatches = max(merged.microbatches or 0, schedule.microbatches)
        kinds.add(schedule.kind)
    for kind in ("interleaved", "looped"):
        if kind in kinds:
            merged.kind = kind
            break
    else:
        if "gpipe" in kinds and not merged.stages_by_rank:
            merged.kind = "gpipe"
    return merged

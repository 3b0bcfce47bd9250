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

from analysis.issuers import host_events

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
    schedule = PipelineSchedule()
    gpipe = False
    for trace in traces or []:
        host = host_events(trace)
        if host.empty:
            continue
        names = host["name"].astype(str)
        actions = host[names.str.startswith("PP:")].sort_values("ts_ns")
        parsed = actions["name"].astype(str).str.extract(_ACTION_RE).dropna(subset=[0])
        gpipe = gpipe or names.str.match(_GPIPE_RE).any()
        if parsed.empty:
            continue
        stages = parsed[0].astype(int)
        rank = getattr(trace, "rank", None)
        schedule.stages_by_rank.setdefault(rank, set()).update(stages.unique().tolist())
        schedule.split_backward = schedule.split_backward or parsed[1].isin(["I", "W"]).any()
        micro = pd.to_numeric(parsed[2], errors="coerce").dropna()
        if len(micro):
            schedule.microbatches = max(schedule.microbatches or 0, int(micro.max()) + 1)
        forwards = stages[parsed[1] == "F"].to_numpy()
        if len(set(forwards)) > 1 and len(micro):
            # Looped BFS runs all microbatches of one stage before the next stage's; an
            # interleaved schedule switches stage after fewer forwards than that.
            order = pd.Series(forwards)
            runs = order.groupby((order.diff() != 0).cumsum()).size()
            kind = "interleaved" if runs.max() < int(micro.max()) + 1 else "looped"
            schedule.kind = "interleaved" if "interleaved" in (kind, schedule.kind) else kind
    if schedule.kind is None and gpipe and not schedule.stages_by_rank:
        schedule.kind = "gpipe"
    return schedule

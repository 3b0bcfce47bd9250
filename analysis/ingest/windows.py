"""Several profiler windows of one rank (one trace file each) as one trace.

Windows of one process follow each other in time. Two that hold the same steps (a window's file
copied, or written twice) would count every event and collective of those steps twice: the later
window's events that start before the earlier windows end are left out, with a problem naming
both files and the steps.
"""

from __future__ import annotations

import pandas as pd

from analysis.core.frames import check_events, contract_categories
from analysis.core.step_spec import format_ranges
from analysis.ingest.parsed_trace import ParsedTrace
from analysis.ingest.runs import file_rank


def _start(part: ParsedTrace) -> int:
    if len(part.steps):
        return int(part.steps["start_ns"].min())
    return int(part.events["ts_ns"].min()) if len(part.events) else 0


def _end(events: pd.DataFrame) -> int | None:
    return int(events["end_ns"].max()) if len(events) else None


def merge_windows(parts: list[ParsedTrace]) -> ParsedTrace:
    """One trace of a rank's windows, in time order, an overlap counted once (from the earlier
    window)."""
    parts = sorted(parts, key=_start)
    first = parts[0]
    rank = first.rank if first.rank is not None else file_rank(first.path)
    problems = [m for p in parts for m in p.problems]
    kept = [first.events]
    seen = set(first.steps["step"].tolist())
    covered = _end(first.events)
    for earlier, part in zip(parts, parts[1:]):
        events = part.events
        steps = set(part.steps["step"].tolist())
        shared = steps & seen
        starts = events["ts_ns"].to_numpy()
        if covered is not None and (shared or (not (steps and seen) and len(starts)
                                               and starts.min() < covered)):
            later = starts >= covered
            where = f"steps {format_ranges(sorted(shared))}" if shared else "time"
            problems.append(
                f"{part.path}: rank {rank}: this profiler window overlaps {earlier.path.name} in "
                f"{where}; the overlap is counted once, from {earlier.path.name} "
                f"({int((~later).sum())} events of this window left out)")
            events = events[later]
        kept.append(events)
        seen |= steps
        end = _end(events)
        covered = end if covered is None else max(covered, end or covered)
    events = check_events(contract_categories(pd.concat(kept, ignore_index=True)))
    steps = (pd.concat([p.steps for p in parts], ignore_index=True)
             .sort_values("step", kind="stable").drop_duplicates("step").reset_index(drop=True))
    return ParsedTrace(path=first.path, rank=first.rank, world_size=first.world_size,
                       backend=first.backend, events=events, steps=steps,
                       float_timestamps=any(p.float_timestamps for p in parts),
                       problems=problems, process_groups=first.process_groups)

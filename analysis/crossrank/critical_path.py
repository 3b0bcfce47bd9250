"""The critical path of every analysed step across ranks, and what-if answers on it
(docs/critical-path.md).

The path ends at the step end of the rank whose step ends last and runs backwards through
each node's binding predecessor (the one whose time, plus the node's duration, gives the node's
time) to a rank's step start. Its time is split by rank and category: `compute` (host and device
work between a rank's ops), `transfer` (an op's end after its last member arrived), `queued`
(an op waiting for the op before it on its queue, beyond what the graph holds) and `clock`
(negative: ends stamped before what they follow). Waiting for peers is never on the path: a
member that waited is not its instance's binding predecessor.

    crossrank.critical_path.analyse(cross, steps) -> {"critical_path": frame,
        "critical_path_steps": frame, "critical_path_segments": frame, "what_if": list}
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core import dag
from analysis.core.contracts import CriticalPath, CrossRank
from analysis.core.dag import NEVER, PATH_COLUMNS, SEGMENT_COLUMNS
from analysis.crossrank import step_graph, what_if, what_if_cores, what_if_idle, what_if_pipeline
from analysis.crossrank.grouped import group_starts
from analysis.crossrank.step_graph import (
    ARRIVAL,
    END_OF_OP,
    ISSUE,
    LAST,
    START,
    STEP_END,
    StepGraph,
)

CATEGORIES = ("compute", "transfer", "queued", "clock", "between_steps", "previous_step")


def binding_predecessors(graph: StepGraph) -> np.ndarray:
    """Per node, the predecessor that sets its time (-1 for sources). Among equal ones: an op's
    end before the host's previous event (the host waited for the op), the instance's last
    arriver as the waits name it, then the lowest rank."""
    src, dst, time = graph.src, graph.dst, graph.time
    latest = dag.latest_predecessor(time, src, dst)
    binding = time[src] == latest[dst]
    src, dst = src[binding], dst[binding]
    preferred = (graph.kind[src] == END_OF_OP) | (
        (graph.kind[dst] == LAST) & (graph.rank[src] == graph.rank[dst]))
    order = np.lexsort((graph.rank[src], ~preferred, dst))
    first = group_starts(dst[order])
    chosen = np.full(len(time), -1, dtype=np.int64)
    chosen[dst[order][first]] = src[order][first]
    return chosen


def path_end_nodes(graph: StepGraph, times: np.ndarray | None = None) -> np.ndarray:
    """Per analysed step (sorted), the step end that ends it: the latest, the lowest rank of
    equal ones."""
    times = graph.time if times is None else times
    ends = graph.step_ends  # in the order of graph.steps: by step, then rank
    step = graph.step[ends]
    order = np.lexsort((np.arange(len(ends)), -times[ends], step))
    return ends[order][group_starts(step[order])]


def category_of(graph: StepGraph, nodes: np.ndarray,
                duration: np.ndarray | None = None) -> np.ndarray:
    """Each node's category on the path by its kind and the sign of its duration (default
    the node's; its part on the path where given). A step start lasts the time since its
    rank's previous step ended (the chained graph): between_steps; an arrival queued behind
    an op of an earlier step: previous_step."""
    kind = graph.kind[nodes]
    duration = graph.duration[nodes] if duration is None else duration
    earlier = step_graph.behind_earlier_step(graph)[nodes]
    category = np.select(
        [duration < 0, kind == START, np.isin(kind, (ISSUE, STEP_END)), kind == END_OF_OP,
         earlier, kind == ARRIVAL],
        ["clock", "between_steps", "compute", "transfer", "previous_step", "queued"], "")
    return category


def path_bounds(graph: StepGraph, chosen: np.ndarray, ends: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per analysed step (the order of `ends`), where its path begins and ends (ns): it ends
    at its latest step end (not before it begins) and begins where the previous step's path
    ended, for the step after an analysed one; else at the step start it reaches back to, or
    later where the previous path ended later: each moment is on one step's path at most."""
    step = graph.step[ends]
    follows = np.zeros(len(ends), bool)
    follows[1:] = step[1:] == step[:-1] + 1
    reached = graph.time[_walk(graph, chosen, ends[~follows],
                               np.full((~follows).sum(), NEVER))[-1]]
    own_start = np.zeros(len(ends), np.int64)
    own_start[~follows] = reached
    low, high = np.empty(len(ends), np.int64), np.empty(len(ends), np.int64)
    before = None
    for row, end in enumerate(graph.time[ends].tolist()):
        if before is None:
            low[row] = own_start[row]
        else:
            low[row] = before if follows[row] else max(int(own_start[row]), before)
        high[row] = before = max(end, int(low[row]))
    return low, high


def _walk(graph: StepGraph, chosen: np.ndarray, ends: np.ndarray, low: np.ndarray):
    """The paths back from `ends` through binding predecessors, all at once, each until it
    crosses its `low` (a time) or reaches a source: (nodes, path of each, step back from its
    end, where each node's part on the path begins, the node each path stopped at)."""
    current, which = ends.copy(), np.arange(len(ends))
    stopped = ends.copy()
    nodes, paths, backs, begins = [], [], [], []
    back = 0
    while len(current):
        t, d = graph.time[current], graph.duration[current]
        inside = t > low[which]
        current, which, t, d = current[inside], which[inside], t[inside], d[inside]
        begin = np.maximum(t - d, low[which])
        nodes.append(current)
        paths.append(which)
        backs.append(np.full(len(current), back))
        begins.append(begin)
        stopped[which] = current
        previous = chosen[current]
        more = (t - d > low[which]) & (previous >= 0)
        current, which = previous[more], which[more]
        back += 1
    joined = [np.concatenate(a) if a else np.zeros(0, np.int64)
              for a in (nodes, paths, backs, begins)]
    return (*joined, stopped)


def trace_paths(graph: StepGraph) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(path rows: step, rank, category, ms; per step: path_ms, end_rank, start_rank, step_ms
    of the rank that ends it; the path's segments in time order: path_segments), on the
    chained graph (step_graph.chained): a step's path begins where the previous one's ended."""
    chosen = binding_predecessors(graph)
    ends = path_end_nodes(graph)
    low, high = path_bounds(graph, chosen, ends)
    nodes, which, back, begin, stopped = _walk(graph, chosen, ends, low)
    part = graph.time[nodes] - begin
    path_step = graph.step[ends][which]
    category = category_of(graph, nodes, part)
    segments = path_segments(graph, nodes, back, begin, path_step, category)
    on_path = part != 0
    rows = pd.DataFrame({"step": path_step[on_path], "rank": graph.rank[nodes[on_path]],
                         "category": category[on_path], "ms": part[on_path] / 1e6})
    path = (rows.groupby(["step", "rank", "category"], sort=True)["ms"].sum().reset_index()
            if len(rows) else pd.DataFrame(columns=PATH_COLUMNS))
    steps = graph.steps
    end_row = ends - len(steps)  # E nodes follow the S nodes, one per row of steps
    summary = pd.DataFrame({
        "step": graph.step[ends], "path_ms": (high - low) / 1e6,
        "end_rank": graph.rank[ends], "start_rank": graph.rank[stopped],
        "step_ms": (steps["end_ns"].to_numpy("int64")[end_row]
                    - steps["start_ns"].to_numpy("int64")[end_row]) / 1e6})
    return path.astype({"step": "int64", "rank": "int64", "ms": "float64"}), summary, segments


def path_segments(graph: StepGraph, nodes: np.ndarray, back: np.ndarray, begin: np.ndarray,
                  path_step: np.ndarray, category: np.ndarray) -> pd.DataFrame:
    """The path's nodes' parts of positive length as stretches of time, [begin, time) on the
    common clock, in time order per step, consecutive ones of one rank and category joined:
    step, rank, category, start_ns, end_ns. Negative (clock) time has no stretch."""
    end = graph.time[nodes]
    kept = end > begin
    nodes, back, begin, end = nodes[kept], back[kept], begin[kept], end[kept]
    step, category = path_step[kept], category[kept]
    order = np.lexsort((-back, step))
    nodes, step, begin, end, category = (nodes[order], step[order], begin[order], end[order],
                                         category[order])
    rank = graph.rank[nodes]
    new = group_starts(step, rank, category)
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(nodes)) - 1
    return pd.DataFrame({"step": step[first], "rank": rank[first], "category": category[first],
                         "start_ns": begin[first], "end_ns": end[last]},
                        columns=SEGMENT_COLUMNS).astype(
        {"step": "int64", "rank": "int64", "start_ns": "int64", "end_ns": "int64"})


def analyse(cross: CrossRank, steps: pd.DataFrame | None = None,
            busbw_gbps: float | None = None, idle_gaps: pd.DataFrame | None = None,
            profiled: pd.DataFrame | None = None,
            cores: what_if_cores.HostCores | None = None, sharing: bool = True
            ) -> CriticalPath:
    """The critical path and what-if answers of a cross-rank result (analysis.crossrank's
    `ops`, `clock`, `pipeline_schedule` and `kineto_shift_ns`); `steps`: each rank's steps
    (rank, step, start_ns, end_ns, own clock; default cross.steps); `busbw_gbps`: also
    answer "each collective at this bus bandwidth"; `idle_gaps`: the ranks' idle gaps
    (analysis.rank.idle: rank, step, start_ns, end_ns on each rank's Kineto clock,
    host_activity), for "no gaps of this cause"; `profiled`: the (rank, step) rows whose gaps
    are known (default: those the gaps have); `cores`: the ranks' CPU time and the CPUs they
    share, where they compute on the host (what_if_cores), to hold each answer to it and, with
    `sharing`, to serve each change's host work and transfers on those CPUs at once."""
    steps = cross.steps if steps is None else steps
    ops = cross.ops
    if ops is None or steps is None or ops.empty or steps.empty:
        return dag.no_critical_path()
    if "timed" in ops.columns and not ops["timed"].all():
        # An op timed at issue only (gloo's Flight Recorder entries) cannot have ended before its
        # last member arrived: that is its end here, with no transfer (docs/critical-path.md).
        untimed = ~ops["timed"].astype(bool)
        ops = ops.assign(end_ns=ops["end_ns"].where(
            ~untimed, ops[["end_ns", "last_arrival_ns"]].max(axis=1)))
    graph = step_graph.build(ops, step_graph.steps_on_common_clock(steps, cross.clock))
    # Steps in a row: a step's path begins where the previous one's ended, and the what-ifs
    # carry a change into the steps after it.
    graph = step_graph.chained(graph)
    path, summary, segments = trace_paths(graph)
    schedule = cross.pipeline_schedule
    gaps = what_if_idle.gaps_on_common_clock(idle_gaps, cross.clock,
                                             cross.kineto_shift_ns)
    more = (what_if_pipeline.bubble_changes(graph, schedule)
            + what_if_idle.idle_changes(graph, gaps, profiled))
    least = shared = None
    if cores is not None:
        def least(change, numbers):
            return what_if_cores.step_bounds(cores, graph, change, numbers)
    if cores is not None and sharing:
        # a data loader's wait is not work on the cores
        waiting = graph.duration - what_if_idle.without_gaps(
            graph, gaps[gaps["host_activity"] == "data_loading"])

        def shared(durations):
            return what_if_cores.on_shared_cores(cores, graph, durations, waiting)
    answers, by_step = what_if.answers_by_step(graph, busbw_gbps, more, least, shared)
    if len(graph.steps):
        answers = what_if.ordered(answers + what_if_pipeline.microbatch_answers(
            graph, schedule, answers, what_if.measured_step_ms(graph)))
    return CriticalPath(critical_path=path, critical_path_steps=summary,
                        critical_path_segments=segments, what_if=answers,
                        what_if_steps=by_step)

"""Longest-path propagation on a dependency graph held as arrays (docs/critical-path.md): the
cross-rank step graph (analysis.crossrank.step_graph) and one rank's GPU graph
(analysis.rank.one_rank_path) both use it.

A graph is its nodes' measured times and its edges (src, dst), sorted by the level of their
target with `by_level`; `propagate` gives every node's time for other node durations. Both
analyses give their result in one shape: the frames of PATH_COLUMNS, PATH_STEP_COLUMNS and
SEGMENT_COLUMNS and the what-if list (`no_critical_path` where there is none).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.contracts import CriticalPath

NEVER = np.iinfo(np.int64).min

# The frames of a critical-path result (analysis.core.contracts.CriticalPath): the path's time
# per step, rank and category, per step, and its stretches of time (docs/critical-path.md).
PATH_COLUMNS = ["step", "rank", "category", "ms"]
PATH_STEP_COLUMNS = ["step", "path_ms", "end_rank", "start_rank", "step_ms"]
SEGMENT_COLUMNS = ["step", "rank", "category", "start_ns", "end_ns"]


def no_critical_path() -> CriticalPath:
    """The result of a critical-path analysis with no step to analyse."""
    return CriticalPath(critical_path=pd.DataFrame(columns=PATH_COLUMNS),
                        critical_path_steps=pd.DataFrame(columns=PATH_STEP_COLUMNS),
                        critical_path_segments=pd.DataFrame(columns=SEGMENT_COLUMNS))


def by_level(src: np.ndarray, dst: np.ndarray, n: int):
    """Edges sorted by the level of their target (sources 0, else 1 + the predecessors'
    highest), then by target, and where each level starts. Levels are found frontier by
    frontier (Kahn's order), so each edge is visited once however deep the graph."""
    by_src = np.argsort(src, kind="stable")
    out_start = np.searchsorted(src[by_src], np.arange(n + 1))
    waiting = np.bincount(dst, minlength=n)
    level = np.zeros(n, dtype=np.int64)
    frontier = np.flatnonzero(waiting == 0)
    done, depth = len(frontier), 0
    while len(frontier):
        depth += 1
        counts = out_start[frontier + 1] - out_start[frontier]
        firsts = np.repeat(out_start[frontier] - np.cumsum(counts) + counts, counts)
        edges = by_src[firsts + np.arange(counts.sum())]
        targets = dst[edges]
        np.subtract.at(waiting, targets, 1)
        level[targets] = depth  # the last frontier to reach a node sets its level
        frontier = np.unique(targets[waiting[targets] == 0])
        done += len(frontier)
    if done < n:  # pragma: no cover - the edges follow measured order
        raise ValueError("the dependency graph has a cycle")
    edge_level = level[dst]
    order = np.lexsort((dst, edge_level))  # by level, then target: propagate reduces runs
    counts = np.bincount(edge_level, minlength=int(level.max(initial=0)) + 1)
    return src[order], dst[order], np.concatenate([[0], np.cumsum(counts)])


def latest_predecessor(time: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Per node, the latest time of its predecessors (NEVER for a source)."""
    latest = np.full(len(time), NEVER)
    np.maximum.at(latest, dst, time[src])
    return latest


def propagate(graph, durations: np.ndarray) -> np.ndarray:
    """Node times for each column of `durations` (nodes x scenarios) on `graph` (its `time`,
    `src`, `dst` and `level_starts`, edges as `by_level` sorts them: by level, then target):
    sources keep their measured time, every other node = the latest of its predecessors + its
    duration."""
    durations = durations.reshape(len(graph.time), -1)
    times = np.repeat(graph.time[:, None], durations.shape[1], axis=1)
    # Where each target's run of edges begins: edges are sorted by level, then target.
    dst = graph.dst
    runs = np.flatnonzero(np.concatenate([[True], dst[1:] != dst[:-1]]))
    bounds = np.searchsorted(runs, graph.level_starts)
    for k in range(1, len(graph.level_starts) - 1):
        first, stop = bounds[k], bounds[k + 1]
        if first == stop:
            continue
        lo, hi = graph.level_starts[k], graph.level_starts[k + 1]
        targets = dst[runs[first:stop]]
        latest = np.maximum.reduceat(times[graph.src[lo:hi]], runs[first:stop] - lo, axis=0)
        times[targets] = latest + durations[targets]
    return times

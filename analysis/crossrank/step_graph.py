"""The dependency graph of every analysed step across ranks, and longest-path propagation on it
(docs/critical-path.md).

Nodes, per rank and step: its step start S (a source), each matched op's issue I, arrival A and
end F, its step end E; per matched instance one node L, its last arrival. Edges:

- a rank's host chain: S -> I -> ... -> I -> E, its ops' issues in order;
- an op's end F to the first host event of its rank (an issue after the op's own, or E) at or
  after the end: the host waits for the op (blocking);
- I -> A, and, for an op queued behind an earlier op on its queue, that op's F -> A;
- every member's A -> the instance's L -> every member's F.

Each node but S lasts `duration` = its measured time - the latest measured time of its
predecessors, so that propagating the measured durations gives back every measured time.
Shortening durations and propagating again answers what-if questions, on the graph `chained`
joins step to step (each rank's E to its next S).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS
from analysis.core.dag import NEVER, latest_predecessor
from analysis.core.dag import by_level as _by_level
from analysis.crossrank.clock import to_common_clock
from analysis.crossrank.grouped import cummax_by_group, group_starts

START, ISSUE, ARRIVAL, LAST, END_OF_OP, STEP_END = range(6)


@dataclass
class StepGraph:
    """Arrays of nodes and edges; edges sorted by the level of their target."""

    time: np.ndarray       # measured time of each node, common clock, ns
    duration: np.ndarray   # time - latest predecessor time (0 for sources)
    kind: np.ndarray       # START ... STEP_END
    rank: np.ndarray       # the node's rank (L: the instance's last arriver)
    step: np.ndarray
    op_row: np.ndarray     # row in `ops` (I, A, F), else -1
    src: np.ndarray
    dst: np.ndarray
    level_starts: np.ndarray  # edges of level k: [level_starts[k], level_starts[k + 1])
    ops: pd.DataFrame      # the matched ops of the analysed steps, on the common clock
    steps: pd.DataFrame    # rank, step, start_ns, end_ns (common clock) of the analysed steps
    # Each rank's step end joined to its next step's start (chained): a change in one step
    # moves every later one
    chained: bool = False

    @property
    def step_ends(self) -> np.ndarray:
        """The E node of each row of `steps`."""
        return np.flatnonzero(self.kind == STEP_END)

    @property
    def step_starts(self) -> np.ndarray:
        return np.flatnonzero(self.kind == START)


def steps_on_common_clock(steps: pd.DataFrame, clock: pd.DataFrame) -> pd.DataFrame:
    """Step starts and ends (each rank's own clock) on the common clock, as the ops are."""
    moved = to_common_clock(steps.rename(columns={"start_ns": "issue_ns"}), clock)
    return moved.rename(columns={"issue_ns": "start_ns"})


def analysed(ops: pd.DataFrame, steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(matched ops, step rows) of the steps the graph covers: steps with a matched op, of which
    every rank with an op in it has a step row (one per rank and step)."""
    ops = ops[ops["instance"] >= 0]
    steps = steps.drop_duplicates(["rank", "step"])
    have = pd.MultiIndex.from_frame(steps[["rank", "step"]])
    covered = pd.MultiIndex.from_frame(ops[["rank", "step"]]).isin(have)
    incomplete = set(ops.loc[~covered, "step"])
    kept = set(ops["step"]) - incomplete
    ops = ops[ops["step"].isin(kept)].reset_index(drop=True)
    steps = steps[steps["step"].isin(kept)].sort_values(["step", "rank"], kind="stable")
    return ops, steps.reset_index(drop=True)


def build(ops: pd.DataFrame, steps: pd.DataFrame) -> StepGraph:
    """The graph of `ops` (matched ops on the common clock: rank, step, instance, issue_ns,
    arrival_ns, end_ns, queue, op) and `steps` (rank, step, start_ns, end_ns, common clock)."""
    ops, steps = analysed(ops, steps)
    n_steps, n_ops = len(steps), len(ops)
    instance_codes, instance_of = np.unique(ops["instance"].to_numpy("int64"),
                                            return_inverse=True)
    n_inst = len(instance_codes)
    base_i, base_a, base_f, base_l = (2 * n_steps + k * n_ops for k in range(4))
    n = base_l + n_inst
    o_rank, o_step = ops["rank"].to_numpy("int64"), ops["step"].to_numpy("int64")
    issue, arrival = ops["issue_ns"].to_numpy("int64"), ops["arrival_ns"].to_numpy("int64")
    end = ops["end_ns"].to_numpy("int64")
    s_rank, s_step = steps["rank"].to_numpy("int64"), steps["step"].to_numpy("int64")
    op_index = np.arange(n_ops)

    time = np.concatenate([steps["start_ns"].to_numpy("int64"), steps["end_ns"].to_numpy("int64"),
                           issue, arrival, end, np.zeros(n_inst, dtype=np.int64)])
    kind = np.concatenate([np.full(n_steps, START), np.full(n_steps, STEP_END),
                           np.full(n_ops, ISSUE), np.full(n_ops, ARRIVAL),
                           np.full(n_ops, END_OF_OP), np.full(n_inst, LAST)]).astype(np.int8)
    step = np.concatenate([s_step, s_step, o_step, o_step, o_step,
                           np.zeros(n_inst, dtype=np.int64)])
    rank = np.concatenate([s_rank, s_rank, o_rank, o_rank, o_rank,
                           np.zeros(n_inst, dtype=np.int64)])
    op_row = np.concatenate([np.full(2 * n_steps, -1), op_index, op_index, op_index,
                             np.full(n_inst, -1)])
    # The instance's L: its step, and (for the path's rows) the member that arrived last.
    step[base_l + instance_of] = o_step
    rank[base_l + instance_of] = ops["last_rank"].to_numpy("int64")

    edges = [_host_chain(steps, ops, base_i, base_f), (base_i + op_index, base_a + op_index),
             _queue_edges(ops, base_a, base_f),
             (base_a + op_index, base_l + instance_of), (base_l + instance_of, base_f + op_index)]
    src = np.concatenate([e[0] for e in edges]).astype(np.int64)
    dst = np.concatenate([e[1] for e in edges]).astype(np.int64)
    # L's time is the latest arrival of its members: its duration is 0 by construction.
    last = np.full(n, NEVER)
    on_last = kind[dst] == LAST
    np.maximum.at(last, dst[on_last], time[src[on_last]])
    time[base_l:] = last[base_l:]
    latest = latest_predecessor(time, src, dst)
    duration = np.where(latest == NEVER, 0, time - latest)
    src, dst, level_starts = _by_level(src, dst, n)
    return StepGraph(time=time, duration=duration, kind=kind, rank=rank, step=step,
                     op_row=op_row, src=src, dst=dst, level_starts=level_starts, ops=ops,
                     steps=steps)


def chained(graph: StepGraph) -> StepGraph:
    """The graph with an edge from each rank's step end E to its start S of the next step
    (step + 1, where analysed), whose duration is the time between them: what-if answers
    then carry a step's change into the steps after it, as a rank that ends a step late starts
    the next one late (docs/critical-path.md, "Steps in a row")."""
    steps = graph.steps
    rows = pd.MultiIndex.from_arrays([steps["rank"].to_numpy("int64"),
                                      steps["step"].to_numpy("int64")])
    following = rows.get_indexer(pd.MultiIndex.from_arrays(
        [steps["rank"].to_numpy("int64"), steps["step"].to_numpy("int64") + 1]))
    joined = np.flatnonzero(following >= 0)
    starts, ends = graph.step_starts, graph.step_ends  # one of each per row of steps
    src, dst = ends[joined], starts[following[joined]]
    duration = graph.duration.copy()
    duration[dst] = graph.time[dst] - graph.time[src]
    src, dst, level_starts = _by_level(np.concatenate([graph.src, src]),
                                       np.concatenate([graph.dst, dst]), len(graph.time))
    return replace(graph, duration=duration, src=src, dst=dst, level_starts=level_starts,
                   chained=True)


def _host_chain(steps: pd.DataFrame, ops: pd.DataFrame, base_i: int, base_f: int):
    """Edges of each rank's host chain S -> I ... -> E, and from each op's end F to the first
    host event of the chain after its own issue at or after that end (none past E)."""
    n_steps, n_ops = len(steps), len(ops)
    node = np.concatenate([np.arange(n_steps), n_steps + np.arange(n_steps),
                           base_i + np.arange(n_ops)])
    rank = np.concatenate([steps["rank"].to_numpy("int64")] * 2 + [ops["rank"].to_numpy("int64")])
    step = np.concatenate([steps["step"].to_numpy("int64")] * 2 + [ops["step"].to_numpy("int64")])
    phase = np.concatenate([np.zeros(n_steps), np.full(n_steps, 2), np.ones(n_ops)]).astype(np.int8)
    t = np.concatenate([steps["start_ns"].to_numpy("int64"), steps["end_ns"].to_numpy("int64"),
                        ops["issue_ns"].to_numpy("int64")])
    order = np.lexsort((node, t, phase, step, rank))
    node, rank, step, t = node[order], rank[order], step[order], t[order]
    first = group_starts(rank, step)
    chain_src, chain_dst = node[:-1][~first[1:]], node[1:][~first[1:]]
    group = np.cumsum(first) - 1
    # Each op's end, merged with its chain's host events in time order (an end before an event
    # at the same instant): its target is the next host event, and at least the one after its
    # own issue. Times made non-decreasing along a chain (S and E are placed first and last).
    effective = cummax_by_group(t, first)
    position = np.arange(len(node))
    issue_position = np.empty(n_ops, dtype=np.int64)
    is_issue = node >= base_i
    issue_position[node[is_issue] - base_i] = position[is_issue]
    op_group = group[issue_position]
    op_end = ops["end_ns"].to_numpy("int64")
    merged_group = np.concatenate([op_group, group])
    merged_t = np.concatenate([op_end, effective])
    merged_type = np.concatenate([np.zeros(n_ops), np.ones(len(node))]).astype(np.int8)
    merged_pos = np.concatenate([np.full(n_ops, len(node)), position])
    m_order = np.lexsort((merged_type, merged_t, merged_group))
    # The next host event at or after each merged row: a reverse running minimum of positions.
    next_host = np.minimum.accumulate(merged_pos[m_order][::-1])[::-1]
    found = np.empty(n_ops, dtype=np.int64)
    is_end = merged_type[m_order] == 0
    found[m_order[is_end]] = next_host[is_end]
    target = np.maximum(found, issue_position + 1)
    ok = target < len(node)
    target = np.minimum(target, len(node) - 1)
    ok &= group[target] == op_group  # past its chain's E: the op ended after the step
    return (np.concatenate([chain_src, base_f + np.arange(n_ops)[ok]]),
            np.concatenate([chain_dst, node[target[ok]]]))


def _queue_edges(ops: pd.DataFrame, base_a: int, base_f: int):
    """F -> A for an op that arrived after its issue (queued): from the earlier op of its rank,
    step and queue with the latest end (p2p ops are not queued, as in the waits)."""
    queue = pd.factorize(ops["queue"].to_numpy(object), sort=True, use_na_sentinel=False)[0]
    rank, step = ops["rank"].to_numpy("int64"), ops["step"].to_numpy("int64")
    issue, end = ops["issue_ns"].to_numpy("int64"), ops["end_ns"].to_numpy("int64")
    order = np.lexsort((np.arange(len(ops)), issue, queue, step, rank))
    first = group_starts(rank[order], step[order], queue[order])
    e = end[order]
    running = cummax_by_group(e, first)
    # The row that set the running maximum: the latest row at or before with its end equal to
    # it. A group's first row always sets it, so a running maximum over all rows stays within
    # the group.
    setter = np.maximum.accumulate(np.where(e == running, np.arange(len(order)), -1))
    previous = np.full(len(order), -1)
    previous[1:] = setter[:-1]
    previous[first] = -1
    queued = (ops["arrival_ns"].to_numpy("int64") > issue)[order]
    p2p = ops["op"].isin(P2P_OPS).to_numpy()[order]
    keep = queued & (previous >= 0) & ~p2p
    return base_f + order[previous[keep]], base_a + order[keep]


def behind_earlier_step(graph: StepGraph) -> np.ndarray:
    """Per node, whether it is the arrival A of an op queued behind an op of an earlier step
    of its rank and queue that was still running when it was issued (an all-reduce of the
    previous step that ended after that step): its wait is that step's work, not this one's
    (p2p ops are not queued, as in the waits)."""
    ops = graph.ops
    held = np.zeros(len(graph.time), bool)
    if not len(ops):
        return held
    queue = pd.factorize(ops["queue"].to_numpy(object), sort=True, use_na_sentinel=False)[0]
    rank, step = ops["rank"].to_numpy("int64"), ops["step"].to_numpy("int64")
    issue, end = ops["issue_ns"].to_numpy("int64"), ops["end_ns"].to_numpy("int64")
    order = np.lexsort((np.arange(len(ops)), issue, queue, rank))
    first = group_starts(rank[order], queue[order])
    # The latest end before each op on its rank and queue, and that op's step.
    running = cummax_by_group(end[order], first)
    setter = np.maximum.accumulate(np.where(end[order] == running, np.arange(len(order)), -1))
    before = np.full(len(order), -1)
    before[1:] = setter[:-1]
    before[first] = -1
    has = before >= 0
    earlier = np.zeros(len(order), bool)
    prev = order[before[has]]
    this = order[has]
    earlier[has] = (step[prev] < step[this]) & (end[prev] > issue[this])
    queued = (ops["arrival_ns"].to_numpy("int64") > issue)[order]
    p2p = ops["op"].isin(P2P_OPS).to_numpy()[order]
    arrivals = np.flatnonzero(graph.kind == ARRIVAL)  # one per op, in the order of `ops`
    held[arrivals[order[earlier & queued & ~p2p]]] = True
    return held

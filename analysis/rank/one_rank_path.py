"""The critical path of each profiled step of one rank on a GPU, from its Kineto trace alone
(docs/critical-path.md, "One rank on a GPU"), on the graph of analysis.rank.gpu_graph.

The path of a step (or window) runs from its last event T back through binding predecessors
to where it begins: where the previous step's path ended, or the window's start S, so that
each moment is on one step's path; its time is split into cpu, idle, previous_step, launch,
device_idle, kernel, comm_kernel, memcpy and memset. Waiting for the device is slack: the ops
the host waited for are on the path instead. What-if answers shorten durations and propagate
each step again.

    rank.critical_path.analyse(trace) -> {"critical_path": frame, "critical_path_steps": frame,
        "critical_path_segments": frame, "what_if": list}
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.core import dag
from analysis.core.contracts import CriticalPath
from analysis.core.dag import PATH_COLUMNS, SEGMENT_COLUMNS
from analysis.core.step_spec import PathWindow
from analysis.rank import path_windows
from analysis.rank.gpu_graph import (
    _NAMES,
    CPU,
    DEVICE,
    DEVICE_IDLE,
    HOST,
    IDLE,
    LAUNCH,
    PREVIOUS_STEP,
    START,
    STEP_END,
    RankGraph,
    binding_predecessors,
    build,
    covered,
    held_before,
)


def path_bounds(graph: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    """Per row of the graph's steps, where its path begins and ends (ns): it ends at its
    last event T (not before it begins) and begins where the previous row's path ended, for a
    step that follows it (graph.chained), else at its start S, or later where the previous
    row's path ended later: each moment is on one step's path at most."""
    n_steps = len(graph.steps)
    start = graph.steps["start_ns"].to_numpy("int64")
    sink = graph.time[2 * n_steps + np.arange(n_steps)]
    low, high = np.empty(n_steps, np.int64), np.empty(n_steps, np.int64)
    before = None
    for row in range(n_steps):
        if before is None:
            low[row] = start[row]
        else:
            low[row] = before if graph.chained[row] else max(int(start[row]), before)
        high[row] = before = max(int(sink[row]), int(low[row]))
    return low, high


def trace_paths(graph: RankGraph, rank: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(path rows: step, rank, category, ms; per step: path_ms, end_rank, start_rank, step_ms;
    the path's segments in time order)."""
    chosen = binding_predecessors(graph)
    pred, time, duration = chosen.tolist(), graph.time.tolist(), graph.duration.tolist()
    steps = graph.steps
    n_steps = len(steps)
    s_time = steps["start_ns"].to_numpy("int64")
    low_of, high_of = path_bounds(graph)
    nodes, lows, of_step = [], [], []
    for row in range(n_steps):
        start, v = int(low_of[row]), 2 * n_steps + row
        # Back from T through binding predecessors (across the step's start to the previous
        # step's end, for a chained step) until the path's beginning is crossed.
        while v >= 0:
            t, d = time[v], duration[v]
            if t <= start:
                break
            low = t - d
            if d:
                nodes.append(v)
                lows.append(low if low > start else start)
            if low <= start:
                break
            v = pred[v]
        of_step.extend([row] * (len(nodes) - len(of_step)))
    nodes = np.array(nodes, np.int64)
    low = np.array(lows, np.int64)
    high = graph.time[nodes]
    parts = _parts(graph, nodes, low, high, chosen)
    parts["row"] = np.tile(np.array(of_step, np.int64), 3)
    rows = pd.DataFrame({"step": steps["step"].to_numpy("int64")[parts["row"]],
                         "category": parts["category"], "ns": parts["end"] - parts["start"]})
    rows = rows[rows["ns"] != 0]
    path = (rows.groupby(["step", "category"], sort=True)["ns"].sum().reset_index()
            if len(rows) else pd.DataFrame(columns=["step", "category", "ns"]))
    path = pd.DataFrame({"step": path["step"].astype("int64"), "rank": int(rank),
                         "category": _NAMES[path["category"].to_numpy(np.int64)],
                         "ms": path["ns"].astype(float) / 1e6},
                        columns=PATH_COLUMNS)
    summary = pd.DataFrame({"step": steps["step"].to_numpy("int64"),
                            "path_ms": (high_of - low_of) / 1e6, "end_rank": int(rank),
                            "start_rank": int(rank),
                            "step_ms": (steps["end_ns"].to_numpy("int64") - s_time) / 1e6})
    return path, summary, _segments(graph, parts, rank)


def _parts(graph: RankGraph, nodes, low, high, chosen) -> dict:
    """The path's nodes cut into three parts of one category each, in time order: a device
    op's wait before it split into the time until the ops it queued behind on its stream
    ended, launched before the step (previous_step), and the rest (launch, or device_idle where
    it followed its stream or the step's start), then its own time; a host stretch's host work
    (cpu) and the rest (idle), the latter taken as one part each in the order cpu then idle
    (the stretch is not cut where they alternate), after an empty first part."""
    kind = graph.kind[nodes]
    device = kind == DEVICE
    busy = np.minimum(graph.busy[nodes], high - low)
    cut = np.where(device, high - busy, high)
    work = np.zeros(len(nodes), np.int64)
    host = ~device
    work[host] = covered(graph, graph.thread[nodes[host]], low[host], high[host])
    held = np.zeros(len(nodes), np.int64)
    held[device] = held_before(graph, nodes[device], low[device], cut[device])
    binding_kind = graph.kind[np.clip(chosen[nodes], 0, None)]
    wait = np.where(binding_kind == HOST, LAUNCH, DEVICE_IDLE)
    first_end = low + held
    second_cat = np.where(device, wait, CPU)
    second_end = np.where(device, cut, low + work)
    third_cat = np.where(device, graph.device_category[nodes], IDLE)
    node = np.concatenate([nodes, nodes, nodes])
    first_cat = np.full(len(nodes), PREVIOUS_STEP)
    index = np.arange(len(nodes)) * 3
    return {"node": node,
            "category": np.concatenate([first_cat, second_cat, third_cat]).astype(np.int64),
            "start": np.concatenate([low, first_end, second_end]),
            "end": np.concatenate([first_end, second_end, high]),
            "order": np.concatenate([index + 2, index + 1, index])}


def _segments(graph: RankGraph, parts: dict, rank: int) -> pd.DataFrame:
    """The path's parts of positive length in time order per step, consecutive ones of one
    category joined: step, rank, category, start_ns, end_ns."""
    keep = parts["end"] > parts["start"]
    step = parts["row"][keep]
    category, start, end = parts["category"][keep], parts["start"][keep], parts["end"][keep]
    order = np.lexsort((-parts["order"][keep], step))
    step, category, start, end = step[order], category[order], start[order], end[order]
    new = np.ones(len(step), bool)
    new[1:] = (step[1:] != step[:-1]) | (category[1:] != category[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(step)) - 1
    return pd.DataFrame({"step": graph.steps["step"].to_numpy("int64")[step[first]],
                         "rank": int(rank), "category": _NAMES[category[first]],
                         "start_ns": start[first], "end_ns": end[last]},
                        columns=SEGMENT_COLUMNS).astype(
        {"step": "int64", "rank": "int64", "start_ns": "int64", "end_ns": "int64"})


def steps_alone(graph: RankGraph, sort: bool = True) -> RankGraph:
    """The graph with each step on its own: the edges between steps dropped (the previous
    step's end to the start, device ops of the step before that the step's ops follow or wait
    for), a node left without a predecessor hung from its step's start, durations measured
    again (a wait on a dropped edge becomes part of the node's own time), edges sorted by
    level (for dag.propagate; `sort=False` leaves them unsorted, for propagate_once). Each
    step is then as deep as its own work, and the steps propagate side by side."""
    within = graph.step[graph.src] == graph.step[graph.dst]
    src, dst = graph.src[within], graph.dst[within]
    latest = dag.latest_predecessor(graph.time, src, dst)
    orphan = np.flatnonzero((latest == dag.NEVER) & (graph.kind != START))
    src = np.concatenate([src, graph.step[orphan]])
    dst = np.concatenate([dst, orphan])
    latest = dag.latest_predecessor(graph.time, src, dst)
    duration = np.where(latest == dag.NEVER, 0, graph.time - latest)
    level_starts = None
    if sort:
        src, dst, level_starts = dag.by_level(src, dst, len(graph.time))
    return replace(graph, duration=duration, src=src, dst=dst, level_starts=level_starts)


def propagate_once(graph: RankGraph, durations: np.ndarray) -> np.ndarray:
    """dag.propagate's node times (nodes x scenarios) for `durations`, on `graph`'s edges in
    any order: sources keep their measured time, every other node = the latest of its
    predecessors + its duration. A step of the GPU graph is thousands of levels deep with a
    few nodes each, where dag.by_level and dag.propagate spend their time in numpy calls per
    level: here numpy scans along chains (a thread's calls, a stream's ops), in rounds of
    Kahn's order over their pieces (_along_chains); where that takes too many rounds (or its
    numbers could overflow, or the chains close a cycle), Kahn's order an edge at a time in
    Python (_kahn), to the same times. The nodes that precede none (each step's last event,
    T, which every node precedes) are set after it, on arrays."""
    durations = durations.reshape(len(graph.time), -1).astype(np.int64)
    n, scenarios = durations.shape
    leads = np.bincount(graph.src, minlength=n) > 0
    inner = leads[graph.dst]  # edges into a node that precedes another
    src, dst = graph.src[inner], graph.dst[inner]
    times = _along_chains(graph, src, dst, durations) if scenarios else None
    if times is None:
        times = _kahn(graph.time, src, dst, durations)
    last = ~inner
    if last.any():
        # By target: np.maximum.at takes milliseconds for the 10^4 edges into each T.
        by = np.argsort(graph.dst[last], kind="stable")
        into, came = graph.dst[last][by], graph.src[last][by]
        group = np.flatnonzero(np.append(True, into[1:] != into[:-1]))
        ends = into[group]
        for k in range(scenarios):
            latest = np.maximum.reduceat(times[:, k][came], group)
            times[ends, k] = latest + durations[ends, k]
    return times


def _kahn(time: np.ndarray, src: np.ndarray, dst: np.ndarray,
          durations: np.ndarray) -> np.ndarray:
    """propagate_once's times (nodes x scenarios) on the edges `src` -> `dst`, in Kahn's
    order, an edge at a time in Python, two scenarios a pass: a node in a cycle, or after one,
    keeps its measured time."""
    n, scenarios = durations.shape
    order = np.argsort(src, kind="stable")
    targets = dst[order].tolist()
    out_start = np.searchsorted(src[order], np.arange(n + 1)).tolist()
    waiting = np.bincount(dst, minlength=n).tolist()
    columns = []
    for k in range(0, scenarios, 2):
        pair = durations[:, [k, min(k + 1, scenarios - 1)]]
        columns += _two_scenarios(time.tolist(), targets, out_start, list(waiting),
                                  pair[:, 0].tolist(), pair[:, 1].tolist())
    return np.array(columns[:scenarios], dtype=np.int64).T.reshape(n, scenarios)


def _two_scenarios(time: list, targets: list, out_start: list, left: list, first: list,
                   second: list) -> list[list]:
    """_kahn's loop for two scenarios' durations (`first`, `second`): [times, times].
    A node's time is set as its last predecessor's edge arrives."""
    n = len(time)
    times, other = list(time), list(time)  # sources keep theirs; every other node is set below
    latest, latest_other = [dag.NEVER] * n, [dag.NEVER] * n
    frontier = [v for v in range(n) if not left[v]]
    while frontier:
        ready = []
        for u in frontier:
            time_u, other_u = times[u], other[u]
            for v in targets[out_start[u]:out_start[u + 1]]:
                waits = left[v] - 1
                left[v] = waits
                if waits:
                    if time_u > latest[v]:
                        latest[v] = time_u
                    if other_u > latest_other[v]:
                        latest_other[v] = other_u
                    continue
                before = latest[v]
                times[v] = (time_u if time_u > before else before) + first[v]
                before = latest_other[v]
                other[v] = (other_u if other_u > before else before) + second[v]
                ready.append(v)
        frontier = ready
    return [times, other]


@dataclass
class _Chains:
    """Paths along the graph's edges that cover its nodes, each node on one: per node the
    predecessor it follows on its chain (-1 at a chain's head), its chain, and its place in
    `layout`, the nodes chain after chain, each chain in order; per chain its length and its
    first place."""

    pred: np.ndarray
    chain: np.ndarray
    place: np.ndarray
    lengths: np.ndarray
    first: np.ndarray
    layout: np.ndarray


def _chains(graph: RankGraph, src: np.ndarray, dst: np.ndarray) -> _Chains | None:
    """The graph's nodes as chains: a node follows one predecessor of its kind and thread (its
    thread's previous call, its stream's previous op: device ops have no thread) that no other
    node follows; None where those links close a cycle (_kahn's times then). Places by
    pointer jumping over runs of consecutive node numbers (most links are v - 1 -> v), not by
    measured times, which need not follow the edges."""
    n = len(graph.time)
    kind = graph.thread.astype(np.int64) * 256 + graph.kind  # one code per thread and kind
    alike = (kind[src] == kind[dst]) & (src != dst)
    pred = np.full(n, -1)
    pred[dst[alike]] = src[alike]  # one of a node's candidates, whichever: each is an edge
    linked = np.flatnonzero(pred >= 0)
    follower = np.full(n, -1)
    follower[pred[linked]] = linked
    pred[linked[follower[pred[linked]] != linked]] = -1  # the others start chains of their own
    nodes = np.arange(n)
    new_run = np.ones(n, bool)
    new_run[1:] = pred[1:] != nodes[:-1]
    starts = np.flatnonzero(new_run)
    run = np.cumsum(new_run) - 1
    before = pred[starts]
    up = np.where(before >= 0, run[before], np.arange(len(starts)))
    ahead = np.where(before >= 0, before - starts[up] + 1, 0)  # of the first node of run `up`
    for _ in range(64):
        higher = up[up]
        if np.array_equal(higher, up):
            break
        ahead = ahead + ahead[up]
        up = higher
    if not np.array_equal(up[up], up) or (pred[starts[up]] >= 0).any():
        return None
    root = up == np.arange(len(starts))
    of_run = (np.cumsum(root) - 1)[up]
    lengths = np.bincount(of_run, weights=np.diff(starts, append=n),
                          minlength=int(root.sum())).astype(np.int64)
    first = np.cumsum(lengths) - lengths
    place = (first[of_run] + ahead - starts)[run] + nodes
    layout = np.empty(n, np.int64)
    layout[place] = nodes
    return _Chains(pred, of_run[run], place, lengths, first, layout)


def _rounds(chains: _Chains, src: np.ndarray, dst: np.ndarray,
            cap: int | None = None) -> np.ndarray | None:
    """Per round of Kahn's order over the chains' pieces, each chain's first place not set
    (rounds + 1 x chains, from none set): a node is set in the round after all its cross
    predecessors (`src` -> `dst`, the edges that are no chain's link) were, and not before the
    node it follows. None past `cap` rounds (default: about what _kahn would take, and none
    where the chains are a few nodes long on average). Per pair of chains, the cross edges in
    target order with their latest source place so far: the first that the source chain's
    front has not passed blocks the target chain there, one searchsorted for all pairs a
    round."""
    n = len(chains.chain)
    if cap is None and len(chains.lengths) * 8 > n:
        return None  # chains of a few nodes (no threads or streams): scans would not pay
    source, target, at = chains.chain[src], chains.chain[dst], chains.place[dst]
    order = np.argsort(source * n + at, kind="stable")
    source, target, at = source[order], target[order], at[order]
    new = np.ones(len(order), bool)
    new[1:] = (source[1:] != source[:-1]) | (target[1:] != target[:-1])
    heads = np.flatnonzero(new)
    ends = np.append(heads[1:], len(order))[:len(heads)]
    # A lane of n per pair keeps the pairs apart in one running maximum.
    lane = np.cumsum(new) - 1
    latest = np.maximum.accumulate(chains.place[src][order] + lane * n)
    lane, source, target = lane[heads] * n, source[heads], target[heads]
    if cap is None:
        # A round of _scan costs about what Kahn's loop spends on 100 nodes, a round here a
        # search per pair: so bounded, the worst case stays near Kahn's own cost.
        cap = min(16 + n // 128, 2 * (n + len(src)) // max(len(heads), 1))
    end = chains.first + chains.lengths
    front = chains.first
    history = [front]
    while True:
        k = np.searchsorted(latest, lane + front[source])
        blocked = np.where(k < ends, at[np.minimum(k, len(at) - 1)], n)
        after = end.copy()
        np.minimum.at(after, target, blocked)
        if np.array_equal(after, front):
            return np.array(history)
        if len(history) > cap:
            return None
        history.append(after)
        front = after


def _along_chains(graph: RankGraph, src: np.ndarray, dst: np.ndarray, durations: np.ndarray,
                  cap: int | None = None) -> np.ndarray | None:
    """_kahn's times (nodes x scenarios) by numpy scans along chains (_chains): on a chain
    t[i] = max(t[i-1], A[i]) + d[i], A the latest of the node's other predecessors, so with D
    the durations' running sum t[i] = D[i] + max over j <= i of (A[j] - D[j-1]), a running
    maximum. The chains' pieces are scanned round after round (_rounds, _plan), each piece
    once, when its other predecessors are set; the rounds are as many as a path turns back to
    a chain it left (a synchronisation, for the GPU graph). None past `cap` rounds, or where
    the sums could overflow."""
    plan = _schedule(graph, src, dst, cap)
    if plan is None:
        return None
    n, scenarios = durations.shape
    # Every time set is a measured one plus the durations along a path: within `bound` of one.
    bound = n * max(-int(durations.min()), int(durations.max()))
    if bound >= 1 << 62:
        bound = int(np.abs(durations.astype(np.float64)).sum(axis=0).max() * (1 + 1e-6)) + 1
    low, high = int(graph.time.min()), int(graph.time.max())
    base, width = low - 2 * bound, high - low + 4 * bound + 1  # A - D[j-1] - base in [0, width)
    if (int(plan.local.max(initial=0)) + 1) * width + abs(base) >= 1 << 62:
        return None
    band = np.repeat(plan.local * width, plan.sizes)
    times = np.empty((scenarios, n), np.int64)
    times[:] = graph.time - base
    for k in range(scenarios):
        _scan(times[k], durations[:, k], plan, band)
    times += base
    return times.T


def _schedule(graph: RankGraph, src: np.ndarray, dst: np.ndarray,
              cap: int | None) -> _Plan | None:
    """_along_chains's _Plan on the edges `src` -> `dst`: None where the chains' links close a
    cycle or the rounds pass `cap`."""
    chains = _chains(graph, src, dst)
    if chains is None:
        return None
    cross = chains.pred[dst] != src
    src, dst = src[cross], dst[cross]
    history = _rounds(chains, src, dst, cap)
    return None if history is None else _plan(chains, history, src, dst)


@dataclass
class _Plan:
    """_along_chains's order of work: the nodes set (`order`), round after round, piece after
    piece, each piece in chain order; per piece its size, first place in `order` and place in
    its round (`local`); per round its first place in `order` (`bounds`, and the end). The
    arrivals into pieces from earlier rounds (cross edges, and the chain link into a piece's
    first node), by target: `came` their sources, `group` each target's first arrival,
    `target` its place in `order`; per round its first arrival and target. `heads`: the
    places of the chains' first nodes (a source keeps its measured time)."""

    order: np.ndarray
    sizes: np.ndarray
    offsets: np.ndarray
    local: np.ndarray
    bounds: np.ndarray
    came: np.ndarray
    group: np.ndarray
    target: np.ndarray
    edge_bounds: np.ndarray
    group_bounds: np.ndarray
    heads: np.ndarray


def _plan(chains: _Chains, history: np.ndarray, src: np.ndarray, dst: np.ndarray) -> _Plan:
    """The _Plan of the chains' fronts per round (`history`, _rounds) with the cross edges
    `src` -> `dst`."""
    sizes = np.diff(history, axis=0).ravel()  # the pieces, round after round
    kept = np.flatnonzero(sizes)
    sizes, starts, of_round = sizes[kept], history[:-1].ravel()[kept], kept // history.shape[1]
    offsets = np.cumsum(sizes) - sizes
    order = chains.layout[np.repeat(starts - offsets, sizes) + np.arange(sizes.sum())]
    local = np.arange(len(sizes)) - np.searchsorted(of_round, of_round)
    bounds = np.append(0, np.cumsum(np.diff(history, axis=0).sum(axis=1)))
    heads = order[offsets]
    follows = heads[chains.pred[heads] >= 0]
    came = np.concatenate([src, chains.pred[follows]])
    total = int(bounds[-1])
    rank = np.full(len(chains.chain), total)
    rank[order] = np.arange(total)
    into = rank[np.concatenate([dst, follows])]
    reached = into < total  # a node in or after a cycle is never set
    into, came = into[reached], came[reached]
    by = np.argsort(into, kind="stable")
    into, came = into[by], came[by]
    group = np.flatnonzero(np.append(True, into[1:] != into[:-1])) if len(into) else into
    target = into[group]
    return _Plan(order, sizes, offsets, local, bounds, came, group, target,
                 np.searchsorted(into, bounds), np.searchsorted(target, bounds),
                 np.flatnonzero(chains.pred[order] < 0))


def _scan(times: np.ndarray, durations: np.ndarray, plan: _Plan, band: np.ndarray):
    """Sets `times` (every node's measured time, less _along_chains's base) to one scenario's
    times (less the base). Each piece's running maximum is kept from the others' by a band of
    its own (`band`, `width` above the one before), which its first node, with an arrival or
    a source, always reaches."""
    order, bounds, target, came, group = (plan.order, plan.bounds, plan.target, plan.came,
                                          plan.group)
    d = durations[order]
    summed = np.cumsum(d)
    summed -= np.repeat(summed[plan.offsets] - d[plan.offsets], plan.sizes)  # D, per piece
    lift = band[target] + d[target] - summed[target]  # A + lift: A - D[j-1], in the band
    value = band.copy()  # no arrival: the band's floor
    first = plan.heads  # a source's measured time; the others' arrivals replace it below
    value[first] = times[order[first]] + band[first] - d[first]
    drop = np.subtract(summed, band, out=summed)
    for r in range(len(bounds) - 1):
        lo, hi = bounds[r], bounds[r + 1]
        g0, g1, e0 = plan.group_bounds[r], plan.group_bounds[r + 1], plan.edge_bounds[r]
        part = value[lo:hi]
        if g1 > g0:
            latest = np.maximum.reduceat(times[came[e0:plan.edge_bounds[r + 1]]],
                                         group[g0:g1] - e0)
            part[target[g0:g1] - lo] = latest + lift[g0:g1]
        np.maximum.accumulate(part, out=part)
        times[order[lo:hi]] = part + drop[lo:hi]


def what_if(graph: RankGraph, rank: int) -> list[dict]:
    """Launch latency removed, and host work halved: durations changed, every step propagated
    again (the previous step's end holds the next one's start)."""
    chosen = binding_predecessors(graph)
    bound_by = graph.kind[np.clip(chosen, 0, None)]
    has_pred = chosen >= 0
    device = graph.kind == DEVICE
    no_latency = graph.duration.copy()
    waited_launch = device & has_pred & (bound_by == HOST)
    rows = np.flatnonzero(waited_launch)
    own = np.minimum(graph.duration, graph.busy)[rows]
    # The wait behind work launched before the step (previous_step) is no launch latency: kept.
    behind = held_before(graph, rows, graph.time[rows] - graph.duration[rows],
                         graph.time[rows] - own)
    no_latency[rows] = own + behind
    halved = graph.duration.copy()
    host = np.isin(graph.kind, (HOST, STEP_END)) & has_pred & (bound_by != DEVICE)
    rows = np.flatnonzero(host)
    work = covered(graph, graph.thread[rows], graph.time[rows] - graph.duration[rows],
                   graph.time[rows])
    halved[rows] -= work // 2
    alone = steps_alone(graph, sort=False)
    shorter = alone.duration - graph.duration  # the waits the dropped edges leave, kept
    times = propagate_once(alone, np.column_stack([no_latency, halved]) + shorter[:, None])
    n_steps = len(graph.steps)
    starts, sinks = np.arange(n_steps), 2 * n_steps + np.arange(n_steps)
    measured = graph.time[sinks] - graph.time[starts]
    step_ms = float(np.mean(graph.steps["end_ns"] - graph.steps["start_ns"])) / 1e6
    changes = [
        ("launch latency removed", "launch_latency_removed",
         "every device op that waited for its launch starts when its launch call returns; host "
         "work, stream order and synchronisation as measured"),
        ("host work halved", "host_work_halved",
         "the host's work (its ops and runtime calls) between the graph's host events takes "
         "half as long; its idle time, the device and launch latency as measured"),
    ]
    answers = []
    for k, (change, kind, assumptions) in enumerate(changes):
        predicted = times[sinks, k] - times[starts, k]
        saved = float(np.mean(measured - predicted)) / 1e6
        if saved <= 0.0005:
            continue
        answers.append({"change": change, "kind": kind, "ranks": [int(rank)],
                        "saved_ms_per_step": round(saved, 3),
                        "predicted_step_ms": round(step_ms - saved, 3),
                        "assumptions": assumptions})
    return sorted(answers, key=lambda w: -w["saved_ms_per_step"])


def analyse(trace, events: pd.DataFrame | None = None, answer_what_if: bool = True,
            window: PathWindow | None = None) -> CriticalPath:
    """The critical path of each step of one rank (`trace`: its rank and steps; `events`: its
    events frame, default trace.events) and, with `answer_what_if`, what-if answers on it.
    `window`: the occurrences of a user annotation instead of the steps (path_windows); a
    trace without ProfilerStep is one window."""
    events = trace.events if events is None else events
    if events is None or not len(events) or not events["is_gpu"].any():
        return dag.no_critical_path()
    profiled = getattr(trace, "all_steps", None)
    if window is None and not len(trace.steps if trace.steps is not None else []) and (
            profiled is not None and len(profiled)):
        return dag.no_critical_path()  # ProfilerSteps, none of them selected
    steps, chain = path_windows.windows(trace.steps, events, window)
    if not len(steps):
        return dag.no_critical_path()
    graph = build(events, steps, chain=chain)
    if graph is None:
        return dag.no_critical_path()
    path, summary, segments = trace_paths(graph, trace.rank)
    return CriticalPath(critical_path=path, critical_path_steps=summary,
                        critical_path_segments=segments,
                        what_if=what_if(graph, trace.rank) if answer_what_if else [])

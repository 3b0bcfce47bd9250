"""The critical path of each profiled step of one rank on a GPU, from its Kineto trace alone
(docs/critical-path.md, "One rank on a GPU").

Nodes, per step: its start S and end E (the ProfilerStep span), a sink T (the step's last event,
host or device); per host call that launches device work (a runtime call whose correlation id a
kernel, memcpy or memset has) or waits for it (a runtime call named as synchronisation,
core.event_kinds.SYNC_RE) one node H at the call's end; per device op one node K at its end.
Edges: each host thread's calls in order, from S (the ProfilerStep's thread on to E); a launch
to its op; the ops of one stream in order; an op that ended before its own launch call returned
to that call (a blocking copy); a synchronisation to the last device op that ended before it
returned; the previous step's E to S. Each node lasts its time minus its predecessors' latest, so
the path from T back through binding predecessors to S covers the step exactly; its time is split
into cpu, idle, launch, kernel, comm_kernel, memcpy and memset.

    rank.critical_path.analyse(trace) -> {"critical_path": frame, "critical_path_steps": frame,
        "critical_path_segments": frame, "what_if": list}
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analysis.core import dag
from analysis.core.event_kinds import (
    HOST_OP_CATS,
    PROFILER_STEP_RE,
    RUNTIME_CATS,
    SYNC_RE,
    normal_cat,
)

START, STEP_END, SINK, HOST, DEVICE = range(5)
PATH_COLUMNS = ["step", "rank", "category", "ms"]
PATH_STEP_COLUMNS = ["step", "path_ms", "end_rank", "start_rank", "step_ms"]
SEGMENT_COLUMNS = ["step", "rank", "category", "start_ns", "end_ns"]
CATEGORIES = ("cpu", "idle", "launch", "kernel", "comm_kernel", "memcpy", "memset")
CPU, IDLE, LAUNCH, KERNEL, COMM_KERNEL, MEMCPY, MEMSET = range(len(CATEGORIES))
DEVICE_CATEGORY = {"kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET}
_NAMES = np.array(CATEGORIES, dtype=object)


@dataclass
class RankGraph:
    """Arrays of nodes and edges (edges sorted by the level of their target, dag.by_level)."""

    time: np.ndarray      # measured time of each node (ns, the trace's clock)
    duration: np.ndarray  # time - latest predecessor time (0 for sources)
    kind: np.ndarray      # START ... DEVICE
    step: np.ndarray      # row of `steps` the node belongs to
    thread: np.ndarray    # host thread code (H, E), else -1
    busy: np.ndarray      # DEVICE: the op's own duration; else 0
    device_category: np.ndarray  # DEVICE: KERNEL, COMM_KERNEL, MEMCPY, MEMSET; else -1
    src: np.ndarray
    dst: np.ndarray
    level_starts: np.ndarray | None  # set by steps_alone, for dag.propagate
    steps: pd.DataFrame   # step, start_ns, end_ns
    covered: list         # per thread code: (union starts, union ends, prefix of lengths)


def _empty() -> dict:
    return {"critical_path": pd.DataFrame(columns=PATH_COLUMNS),
            "critical_path_steps": pd.DataFrame(columns=PATH_STEP_COLUMNS),
            "critical_path_segments": pd.DataFrame(columns=SEGMENT_COLUMNS), "what_if": []}


def _codes_where(column: pd.Series, test) -> np.ndarray:
    """Per row of a categorical column, test(category text), decided once per category."""
    wanted = [bool(test(str(c))) for c in column.cat.categories] + [False]
    return np.array(wanted)[column.cat.codes.to_numpy()]


def build(events: pd.DataFrame, steps: pd.DataFrame) -> RankGraph | None:
    """The graph of the steps (step, start_ns, end_ns) of one rank's events frame; None where
    the steps launch no device op."""
    steps = steps.sort_values("start_ns", kind="stable").reset_index(drop=True)
    s_start, s_end = steps["start_ns"].to_numpy("int64"), steps["end_ns"].to_numpy("int64")
    n_steps = len(steps)
    ts, end = events["ts_ns"].to_numpy("int64"), events["end_ns"].to_numpy("int64")
    gpu = events["is_gpu"].to_numpy(bool)
    corr = events["correlation"].to_numpy("int64")
    cat = events["cat"]
    runtime = _codes_where(cat, lambda c: normal_cat(c) in RUNTIME_CATS) & ~gpu
    tid_codes = events["tid"].cat.codes.to_numpy().astype(np.int64)
    thread_of = pd.factorize(events["pid"].cat.codes.to_numpy().astype(np.int64)
                             * (len(events["tid"].cat.categories) + 1) + tid_codes)[0]
    # Device ops, and the host call that launched each (its first runtime call by correlation).
    dev = np.flatnonzero(gpu & (corr >= 0))
    calls = np.flatnonzero(runtime)
    call_rows = pd.Series(calls).groupby(corr[calls]).first() if len(calls) else pd.Series()
    launch_of = call_rows.reindex(corr[dev]).to_numpy()
    ok = ~np.isnan(launch_of) if len(dev) else np.zeros(0, bool)
    dev, launch_of = dev[ok], launch_of[ok].astype(np.int64)
    # The host calls of the graph: launches and synchronisations inside a step, the outermost
    # of nested ones on their thread.
    syncs = runtime & _codes_where(events["name"], lambda n: SYNC_RE.search(n))
    chosen = np.zeros(len(events), bool)
    chosen[launch_of] = True
    chosen |= syncs
    host = np.flatnonzero(chosen)
    where = np.searchsorted(s_start, ts[host], side="right") - 1
    inside = (where >= 0) & (ts[host] < s_end[np.clip(where, 0, None)])
    host, h_step = host[inside], where[inside]
    order = np.lexsort((ts[host], thread_of[host], h_step))
    host, h_step = host[order], h_step[order]
    h_thread = thread_of[host]
    new_chain = np.ones(len(host), bool)
    new_chain[1:] = (h_step[1:] != h_step[:-1]) | (h_thread[1:] != h_thread[:-1])
    reach = _cummax_by_group(end[host], new_chain)
    nested = np.zeros(len(host), bool)
    nested[1:] = ~new_chain[1:] & (ts[host][1:] < reach[:-1])
    host, h_step, h_thread = host[~nested], h_step[~nested], h_thread[~nested]
    new_chain = new_chain[~nested]
    # Device ops launched from the graph's host calls.
    h_index = np.full(len(events), -1)
    h_index[host] = np.arange(len(host))
    keep = h_index[launch_of] >= 0
    dev, launch_of = dev[keep], h_index[launch_of[keep]]
    if not len(dev):
        return None
    d_order = np.argsort(end[dev], kind="stable")
    dev, launch_of = dev[d_order], launch_of[d_order]
    n_host, n_dev = len(host), len(dev)
    base_h, base_k = 3 * n_steps, 3 * n_steps + n_host
    d_step = h_step[launch_of]

    time = np.concatenate([s_start, s_end, np.zeros(n_steps, np.int64), end[host], end[dev]])
    kind = np.concatenate([np.full(n_steps, START), np.full(n_steps, STEP_END),
                           np.full(n_steps, SINK), np.full(n_host, HOST),
                           np.full(n_dev, DEVICE)]).astype(np.int8)
    rows = np.arange(n_steps)
    step = np.concatenate([rows, rows, rows, h_step, d_step])
    step_thread = _step_threads(events, steps, thread_of, h_step, h_thread)
    thread = np.concatenate([np.full(n_steps, -1), step_thread, np.full(n_steps, -1), h_thread,
                             np.full(n_dev, -1)])
    busy = np.concatenate([np.zeros(3 * n_steps + n_host, np.int64), end[dev] - ts[dev]])
    comm = events["is_comm"].to_numpy(bool)[dev]
    d_cat = np.array([DEVICE_CATEGORY.get(normal_cat(c), KERNEL)
                      for c in cat.cat.categories] + [KERNEL], dtype=np.int8)[
        cat.cat.codes.to_numpy()[dev]]
    d_cat = np.where(comm, COMM_KERNEL, d_cat)
    device_category = np.concatenate([np.full(base_k, -1, dtype=np.int8), d_cat])

    h_node, k_node = base_h + np.arange(n_host), base_k + np.arange(n_dev)
    src, dst = [], []

    def edge(a, b):
        src.append(np.asarray(a, np.int64))
        dst.append(np.asarray(b, np.int64))

    # Host chains: S -> H ... H of each step and thread; the step's thread on to E; all to T.
    # Another thread's chain begins after the step's thread's last call that returned before
    # its first call began (the step's thread handed it the work: autograd's backward thread),
    # else at S.
    own = h_thread == step_thread[h_step]
    firsts = np.flatnonzero(new_chain)
    handed = np.full(len(firsts), -1)
    other = firsts[~own[firsts]]
    if len(other):
        mine = np.flatnonzero(own)
        key = np.lexsort((end[host][mine], h_step[mine]))
        mine = mine[key]
        # Per step, the latest own call ending at or before each first call's start.
        at = _last_at_or_before(h_step[mine], end[host][mine], h_step[other], ts[host][other])
        handed[~own[firsts]] = np.where(at >= 0, mine[np.clip(at, 0, None)], -1)
    edge(np.where(handed >= 0, base_h + handed, h_step[firsts]), h_node[firsts])
    edge(h_node[:-1][~new_chain[1:]], h_node[1:][~new_chain[1:]])
    # The step's end after the calls of its thread that returned before it.
    to_end = (h_thread == step_thread[h_step]) & (end[host] <= s_end[h_step])
    edge(h_node[to_end], n_steps + h_step[to_end])
    edge(rows, n_steps + rows)
    edge(h_node, 2 * n_steps + h_step)
    edge(n_steps + rows, 2 * n_steps + rows)
    edge(k_node, 2 * n_steps + d_step)
    # The previous step's end to the step's start (consecutive steps).
    numbers = steps["step"].to_numpy("int64")
    joined = np.flatnonzero((numbers[1:] == numbers[:-1] + 1) & (s_end[:-1] <= s_start[1:]))
    edge(n_steps + joined, joined + 1)
    # An op that ended before its launch call returned (a blocking copy) holds that call, and
    # follows the host event before the call.
    launch_end = end[host][launch_of]
    blocking = end[dev] <= launch_end
    edge(h_node[launch_of[~blocking]], k_node[~blocking])
    edge(k_node[blocking], h_node[launch_of[blocking]])
    chain_prev = np.where(new_chain, h_step, np.concatenate([[0], h_node[:-1]]))
    edge(chain_prev[launch_of[blocking]], k_node[blocking])
    # Stream order: each op after the previous one on its stream, where that ended before it
    # started.
    stream = events["stream"].to_numpy("int64")[dev]
    by_stream = np.lexsort((ts[dev], stream))
    same = stream[by_stream][1:] == stream[by_stream][:-1]
    prev, this = by_stream[:-1][same], by_stream[1:][same]
    follows = end[dev][prev] <= ts[dev][this]
    edge(k_node[prev[follows]], k_node[this[follows]])
    # Synchronisation: the last device op that ended before the call returned, launched before
    # the call began, and ending after it began (any stream: the trace does not say which).
    is_sync = syncs[host]
    at = np.searchsorted(end[dev], end[host][is_sync], side="right") - 1
    waited = np.clip(at, 0, None)
    sync_nodes = h_node[is_sync]
    ok = ((at >= 0) & (ts[host][launch_of[waited]] < ts[host][is_sync])
          & (end[dev][waited] > ts[host][is_sync]))
    edge(k_node[waited[ok]], sync_nodes[ok])

    src, dst = np.concatenate(src), np.concatenate(dst)
    latest = dag.latest_predecessor(time, src, dst)
    time[2 * n_steps:3 * n_steps] = latest[2 * n_steps:3 * n_steps]  # T: the step's last event
    # A node the edges leave without a predecessor (an op starting before its launch, clock
    # error) hangs from its step's start.
    orphan = (latest == dag.NEVER) & (kind != START)
    orphan &= time >= s_start[step]
    src = np.concatenate([src, step[orphan]])
    dst = np.concatenate([dst, np.flatnonzero(orphan)])
    latest = dag.latest_predecessor(time, src, dst)
    duration = np.where(latest == dag.NEVER, 0, time - latest)
    covered = _coverage(events, ts, end, thread_of, gpu, runtime,
                        int(thread_of.max(initial=-1)) + 1)
    return RankGraph(time=time, duration=duration, kind=kind, step=step, thread=thread, busy=busy,
                     device_category=device_category, src=src, dst=dst,
                     level_starts=None, steps=steps, covered=covered)


def _cummax_by_group(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Running maximum of values within groups of consecutive rows (starts: first rows)."""
    if not len(values):
        return values
    return pd.Series(values).groupby(np.cumsum(starts)).cummax().to_numpy()


def _last_at_or_before(group: np.ndarray, value: np.ndarray, q_group: np.ndarray,
                       q_value: np.ndarray) -> np.ndarray:
    """Per query, the position in (group, value) rows, sorted by both, of the last row of its
    group with value at or before the query's; -1 where none."""
    result = np.full(len(q_group), -1)
    lo = np.searchsorted(group, q_group, side="left")
    hi = np.searchsorted(group, q_group, side="right")
    for g in np.unique(q_group):
        mine = np.flatnonzero(q_group == g)
        first, stop = lo[mine[0]], hi[mine[0]]
        at = np.searchsorted(value[first:stop], q_value[mine], side="right") - 1
        result[mine] = np.where(at >= 0, first + at, -1)
    return result


def _step_threads(events, steps, thread_of, h_step, h_thread) -> np.ndarray:
    """Per step, the thread of its ProfilerStep span; else the thread with most host calls."""
    result = np.full(len(steps), -1)
    marks = np.flatnonzero(_codes_where(events["name"], PROFILER_STEP_RE.match)
                           & _codes_where(events["cat"], lambda c: normal_cat(c) in HOST_OP_CATS)
                           & ~events["is_gpu"].to_numpy(bool))
    if len(marks):
        number = [int(PROFILER_STEP_RE.match(str(v)).group(1))
                  for v in events["name"].to_numpy()[marks]]
        thread = dict(zip(number, thread_of[marks]))
        result = np.array([thread.get(int(s), -1) for s in steps["step"]], dtype=np.int64)
    if len(h_thread):
        busiest = np.bincount(h_thread).argmax()
        result = np.where(result < 0, busiest, result)
    return result


def _coverage(events, ts, end, thread_of, gpu, runtime, n_threads) -> list:
    """Per thread: the union of its host ops (cpu_op, user annotations but ProfilerStep) and
    runtime calls, with the running sum of their lengths, for `covered`."""
    host_op = _codes_where(events["cat"], lambda c: normal_cat(c) in HOST_OP_CATS)
    step_mark = _codes_where(events["name"], PROFILER_STEP_RE.match)
    rows = np.flatnonzero(((host_op & ~step_mark) | runtime) & ~gpu)
    result = []
    for t in range(n_threads):
        mine = rows[thread_of[rows] == t]
        u_start, u_end = _union(ts[mine], end[mine])
        result.append((u_start, u_end, np.concatenate([[0], np.cumsum(u_end - u_start)])))
    return result


def _union(starts: np.ndarray, ends: np.ndarray):
    if not len(starts):
        return starts, ends
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], np.maximum(ends[order], starts[order])
    reach = np.maximum.accumulate(ends)
    begins = np.ones(len(starts), bool)
    begins[1:] = starts[1:] > reach[:-1]
    first = np.flatnonzero(begins)
    return starts[first], reach[np.append(first[1:], len(starts)) - 1]


def covered(graph: RankGraph, thread: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Host work (ns) of each thread in [lo, hi): its ops' and calls' union inside."""
    result = np.zeros(len(lo), np.int64)
    for t in np.unique(thread[thread >= 0]):
        mine = np.flatnonzero(thread == t)
        starts, ends, prefix = graph.covered[t]
        result[mine] = _running(starts, ends, prefix, hi[mine]) - _running(
            starts, ends, prefix, lo[mine])
    return result


def _running(starts, ends, prefix, at):
    """Covered time up to each instant `at`."""
    if not len(starts):
        return np.zeros(len(at), np.int64)
    i = np.searchsorted(starts, at, side="right") - 1
    j = np.clip(i, 0, None)
    inside = np.clip(at - starts[j], 0, ends[j] - starts[j])
    return np.where(i >= 0, prefix[j] + inside, 0)


def binding_predecessors(graph: RankGraph) -> np.ndarray:
    """Per node, the predecessor that sets its time (-1 for sources); among equal ones a device
    op (what the host waited for), then the lowest node."""
    src, dst, time = graph.src, graph.dst, graph.time
    latest = dag.latest_predecessor(time, src, dst)
    binding = time[src] == latest[dst]
    src, dst = src[binding], dst[binding]
    order = np.lexsort((src, graph.kind[src] != DEVICE, dst))
    dst_sorted = dst[order]
    first = np.ones(len(order), bool)
    first[1:] = dst_sorted[1:] != dst_sorted[:-1]
    chosen = np.full(len(time), -1, dtype=np.int64)
    chosen[dst_sorted[first]] = src[order][first]
    return chosen


def trace_paths(graph: RankGraph, rank: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(path rows: step, rank, category, ms; per step: path_ms, end_rank, start_rank, step_ms;
    the path's segments in time order)."""
    chosen = binding_predecessors(graph)
    pred, time, duration = chosen.tolist(), graph.time.tolist(), graph.duration.tolist()
    steps = graph.steps
    n_steps = len(steps)
    s_time = steps["start_ns"].to_numpy("int64")
    nodes, lows, of_step = [], [], []
    for row in range(n_steps):
        start, v = int(s_time[row]), 2 * n_steps + row
        while v >= 0 and v != row:
            t, d = time[v], duration[v]
            low = t - d
            if t > start and d:
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
    parts["row"] = np.concatenate([of_step, of_step]).astype(np.int64)
    rows = pd.DataFrame({"step": steps["step"].to_numpy("int64")[parts["row"]],
                         "category": parts["category"], "ns": parts["end"] - parts["start"]})
    rows = rows[rows["ns"] != 0]
    path = (rows.groupby(["step", "category"], sort=True)["ns"].sum().reset_index()
            if len(rows) else pd.DataFrame(columns=["step", "category", "ns"]))
    path = pd.DataFrame({"step": path["step"].astype("int64"), "rank": int(rank),
                         "category": _NAMES[path["category"].to_numpy(np.int64)],
                         "ms": path["ns"].astype(float) / 1e6},
                        columns=PATH_COLUMNS)
    sink = graph.time[2 * n_steps + np.arange(n_steps)]
    summary = pd.DataFrame({"step": steps["step"].to_numpy("int64"),
                            "path_ms": (sink - s_time) / 1e6, "end_rank": int(rank),
                            "start_rank": int(rank),
                            "step_ms": (steps["end_ns"].to_numpy("int64") - s_time) / 1e6})
    return path, summary, _segments(graph, parts, rank)


def _parts(graph: RankGraph, nodes, low, high, chosen) -> dict:
    """The path's nodes cut into parts of one category each: a device op's wait before it
    (launch, or idle where it followed its stream or the step's start) and its own time; a
    host stretch's host work (cpu) and the rest (idle), the latter taken as one part each in
    the order cpu then idle (the stretch is not cut where they alternate)."""
    kind = graph.kind[nodes]
    device = kind == DEVICE
    busy = np.minimum(graph.busy[nodes], high - low)
    cut = np.where(device, high - busy, high)
    work = np.zeros(len(nodes), np.int64)
    host = ~device
    work[host] = covered(graph, graph.thread[nodes[host]], low[host], high[host])
    binding_kind = graph.kind[np.clip(chosen[nodes], 0, None)]
    wait = np.where(binding_kind == HOST, LAUNCH, IDLE)
    first_cat = np.where(device, wait, CPU)
    first_end = np.where(device, cut, low + work)
    second_cat = np.where(device, graph.device_category[nodes], IDLE)
    node = np.concatenate([nodes, nodes])
    return {"node": node, "category": np.concatenate([first_cat, second_cat]).astype(np.int64),
            "start": np.concatenate([low, first_end]), "end": np.concatenate([first_end, high]),
            "order": np.concatenate([np.arange(len(nodes)) * 2 + 1, np.arange(len(nodes)) * 2])}


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


def steps_alone(graph: RankGraph) -> RankGraph:
    """The graph with each step on its own: the edges between steps dropped (the previous
    step's end to the start, device ops of the step before that the step's ops follow or wait
    for), a node left without a predecessor hung from its step's start, durations measured
    again (a wait on a dropped edge becomes part of the node's own time), edges sorted by
    level. Each step is then as deep as its own work, and the steps propagate side by side."""
    within = graph.step[graph.src] == graph.step[graph.dst]
    src, dst = graph.src[within], graph.dst[within]
    latest = dag.latest_predecessor(graph.time, src, dst)
    orphan = np.flatnonzero((latest == dag.NEVER) & (graph.kind != START))
    src = np.concatenate([src, graph.step[orphan]])
    dst = np.concatenate([dst, orphan])
    latest = dag.latest_predecessor(graph.time, src, dst)
    duration = np.where(latest == dag.NEVER, 0, graph.time - latest)
    src, dst, level_starts = dag.by_level(src, dst, len(graph.time))
    return replace(graph, duration=duration, src=src, dst=dst, level_starts=level_starts)


def what_if(graph: RankGraph, rank: int) -> list[dict]:
    """Launch latency removed, and host work halved: durations changed, every step propagated
    again (the previous step's end holds the next one's start)."""
    chosen = binding_predecessors(graph)
    bound_by = graph.kind[np.clip(chosen, 0, None)]
    has_pred = chosen >= 0
    device = graph.kind == DEVICE
    no_latency = graph.duration.copy()
    waited_launch = device & has_pred & (bound_by == HOST)
    no_latency[waited_launch] = np.minimum(graph.duration, graph.busy)[waited_launch]
    halved = graph.duration.copy()
    host = np.isin(graph.kind, (HOST, STEP_END)) & has_pred & (bound_by != DEVICE)
    rows = np.flatnonzero(host)
    work = covered(graph, graph.thread[rows], graph.time[rows] - graph.duration[rows],
                   graph.time[rows])
    halved[rows] -= work // 2
    alone = steps_alone(graph)
    shorter = alone.duration - graph.duration  # the waits the dropped edges leave, kept
    times = dag.propagate(alone, np.column_stack([no_latency, halved]) + shorter[:, None])
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


def analyse(trace, events: pd.DataFrame | None = None, answer_what_if: bool = True) -> dict:
    """The critical path of each step of one rank (`trace`: its rank and steps; `events`: its
    events frame, default trace.events) and, with `answer_what_if`, what-if answers on it."""
    events = trace.events if events is None else events
    steps = trace.steps
    if events is None or steps is None or not len(steps) or not events["is_gpu"].any():
        return _empty()
    graph = build(events, steps[["step", "start_ns", "end_ns"]])
    if graph is None:
        return _empty()
    path, summary, segments = trace_paths(graph, trace.rank)
    return {"critical_path": path, "critical_path_steps": summary,
            "critical_path_segments": segments,
            "what_if": what_if(graph, trace.rank) if answer_what_if else []}

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

from dataclasses import replace

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
    predecessors + its duration. Kahn's order, an edge at a time in Python, two scenarios a
    pass: a step of the GPU graph is thousands of levels deep with a few nodes each, where
    dag.by_level and dag.propagate spend their time in numpy calls per level. The nodes that
    precede none (each step's last event, T, which every node precedes) are set after it, on
    arrays."""
    durations = durations.reshape(len(graph.time), -1).astype(np.int64)
    n, scenarios = durations.shape
    leads = np.bincount(graph.src, minlength=n) > 0
    inner = leads[graph.dst]  # edges into a node that precedes another
    src, dst = graph.src[inner], graph.dst[inner]
    order = np.argsort(src, kind="stable")
    targets = dst[order].tolist()
    out_start = np.searchsorted(src[order], np.arange(n + 1)).tolist()
    waiting = np.bincount(dst, minlength=n).tolist()
    columns = []
    for k in range(0, scenarios, 2):
        pair = durations[:, [k, min(k + 1, scenarios - 1)]]
        columns += _two_scenarios(graph.time.tolist(), targets, out_start, list(waiting),
                                  pair[:, 0].tolist(), pair[:, 1].tolist())
    times = np.array(columns[:scenarios], dtype=np.int64).T.reshape(n, scenarios)
    last = ~inner
    if last.any():
        ends = np.unique(graph.dst[last])
        latest = np.full((n, scenarios), dag.NEVER)
        np.maximum.at(latest, graph.dst[last], times[graph.src[last]])
        times[ends] = latest[ends] + durations[ends]
    return times


def _two_scenarios(time: list, targets: list, out_start: list, left: list, first: list,
                   second: list) -> list[list]:
    """propagate_once's loop for two scenarios' durations (`first`, `second`): [times, times].
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

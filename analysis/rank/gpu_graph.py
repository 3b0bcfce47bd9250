"""One rank's dependency graph of host calls and device ops per profiled step, for its
critical path (analysis.rank.one_rank_path; docs/critical-path.md, "One rank on a GPU").

Nodes, per step: its start S and end E (the ProfilerStep span), a sink T (the step's last event,
host or device); per host call that launches device work (a runtime call whose correlation id a
kernel, memcpy or memset has) or waits for it (a runtime call named as synchronisation,
core.event_kinds.SYNC_RE) one node H at the call's end; per device op one node K at its end.
Edges: each host thread's calls in order, from S (the ProfilerStep's thread on to E); a launch
to its op; the ops of one stream in order; an op that ended before its own launch call returned
to that call (a blocking copy); a synchronisation to the last device op that ended before it
returned; the previous step's E to S. Each node lasts its time minus its predecessors' latest.
"""

from __future__ import annotations

from dataclasses import dataclass

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
# In the order a device op's time runs: the host, the wait behind earlier work, the launch or
# the gap after the op before on the stream, the op itself.
CATEGORIES = ("cpu", "idle", "previous_step", "launch", "device_idle", "kernel", "comm_kernel",
              "memcpy", "memset")
(CPU, IDLE, PREVIOUS_STEP, LAUNCH, DEVICE_IDLE, KERNEL, COMM_KERNEL, MEMCPY,
 MEMSET) = range(len(CATEGORIES))
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
    # DEVICE: the latest end of the device ops of its stream that started before it (those
    # launched outside the steps included): what it queued behind; else NEVER
    stream_before: np.ndarray
    chained: np.ndarray   # per row of `steps`: it follows the row before (its E -> S edge)


def _codes_where(column: pd.Series, test) -> np.ndarray:
    """Per row of a categorical column, test(category text), decided once per category."""
    wanted = [bool(test(str(c))) for c in column.cat.categories] + [False]
    return np.array(wanted)[column.cat.codes.to_numpy()]


@dataclass
class _Columns:
    """The events' columns the graph reads, as arrays."""

    ts: np.ndarray
    end: np.ndarray
    gpu: np.ndarray
    corr: np.ndarray
    runtime: np.ndarray  # a runtime call on the host
    syncs: np.ndarray  # a runtime call named as synchronisation
    thread_of: np.ndarray  # host thread code of each event


@dataclass
class _Calls:
    """The host calls of the graph (in step, thread and time order) and the device ops they
    launched (in end order)."""

    host: np.ndarray  # rows of the events
    h_step: np.ndarray  # row of `steps` of each call
    h_thread: np.ndarray
    new_chain: np.ndarray  # the first call of its step and thread
    dev: np.ndarray  # rows of the events
    launch_of: np.ndarray  # per device op, its call's position in `host`


def build(events: pd.DataFrame, steps: pd.DataFrame, chain: bool = True) -> RankGraph | None:
    """The graph of the steps (step, start_ns, end_ns) of one rank's events frame; None where
    the steps launch no device op. `chain`: consecutive steps follow each other (the previous
    step's end to the next one's start: ProfilerSteps); without it each window stands alone
    (instances of an annotation, with other work between them)."""
    steps = steps.sort_values("start_ns", kind="stable").reset_index(drop=True)
    s_start, s_end = steps["start_ns"].to_numpy("int64"), steps["end_ns"].to_numpy("int64")
    n_steps = len(steps)
    cols = _columns(events)
    calls = _calls(events, cols, s_start, s_end)
    if calls is None:
        return None
    ts, end, host, dev = cols.ts, cols.end, calls.host, calls.dev
    n_host, n_dev = len(host), len(dev)
    base_k = 3 * n_steps + n_host
    d_step = calls.h_step[calls.launch_of]
    time = np.concatenate([s_start, s_end, np.zeros(n_steps, np.int64), end[host], end[dev]])
    kind = np.concatenate([np.full(n_steps, START), np.full(n_steps, STEP_END),
                           np.full(n_steps, SINK), np.full(n_host, HOST),
                           np.full(n_dev, DEVICE)]).astype(np.int8)
    rows = np.arange(n_steps)
    step = np.concatenate([rows, rows, rows, calls.h_step, d_step])
    step_thread = _step_threads(events, steps, cols.thread_of, calls.h_step, calls.h_thread)
    thread = np.concatenate([np.full(n_steps, -1), step_thread, np.full(n_steps, -1),
                             calls.h_thread, np.full(n_dev, -1)])
    busy = np.concatenate([np.zeros(3 * n_steps + n_host, np.int64), end[dev] - ts[dev]])
    device_category = np.concatenate([np.full(base_k, -1, dtype=np.int8),
                                      _device_categories(events, dev)])
    # Edges in one fixed order: a node's predecessors of equal time are told apart by it.
    device = _device_edges(events, n_steps, cols, calls)
    consecutive = _consecutive_steps(steps) if chain else _edge([], [])
    edges = (_host_edges(steps, cols, calls, step_thread) + device[:1]
             + [consecutive] + device[1:])
    src = np.concatenate([a for a, _ in edges])
    dst = np.concatenate([b for _, b in edges])
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
    covered = _coverage(events, ts, end, cols.thread_of, cols.gpu, cols.runtime,
                        int(cols.thread_of.max(initial=-1)) + 1)
    chained = np.zeros(n_steps, bool)
    chained[consecutive[1]] = True
    return RankGraph(time=time, duration=duration, kind=kind, step=step, thread=thread, busy=busy,
                     device_category=device_category, src=src, dst=dst,
                     level_starts=None, steps=steps, covered=covered,
                     stream_before=np.concatenate([np.full(base_k, dag.NEVER),
                                                   _stream_before(events, cols, dev)]),
                     chained=chained)


def _stream_before(events: pd.DataFrame, cols: _Columns, dev: np.ndarray) -> np.ndarray:
    """Per graph device op, the latest end of the device ops (kernel, memcpy, memset) of its
    stream in the trace that started before it, launched inside the steps or not (NEVER for
    a stream's first)."""
    device_op = cols.gpu & _codes_where(events["cat"],
                                        lambda c: normal_cat(c) in DEVICE_CATEGORY)
    rows = np.union1d(np.flatnonzero(device_op), dev)
    stream = events["stream"].to_numpy("int64")[rows]
    start, end = cols.ts[rows], cols.end[rows]
    order = np.lexsort((rows, start, stream))
    first = np.ones(len(order), bool)
    first[1:] = stream[order][1:] != stream[order][:-1]
    reach = _cummax_by_group(end[order], first)
    before = np.full(len(order), dag.NEVER)
    before[1:] = reach[:-1]
    before[first] = dag.NEVER
    of_row = np.empty(len(order), np.int64)
    of_row[order] = np.arange(len(order))
    return before[of_row[np.searchsorted(rows, dev)]]


def _columns(events: pd.DataFrame) -> _Columns:
    gpu = events["is_gpu"].to_numpy(bool)
    runtime = _codes_where(events["cat"], lambda c: normal_cat(c) in RUNTIME_CATS) & ~gpu
    tid_codes = events["tid"].cat.codes.to_numpy().astype(np.int64)
    thread_of = pd.factorize(events["pid"].cat.codes.to_numpy().astype(np.int64)
                             * (len(events["tid"].cat.categories) + 1) + tid_codes)[0]
    return _Columns(ts=events["ts_ns"].to_numpy("int64"), end=events["end_ns"].to_numpy("int64"),
                    gpu=gpu, corr=events["correlation"].to_numpy("int64"), runtime=runtime,
                    syncs=runtime & _codes_where(events["name"], lambda n: SYNC_RE.search(n)),
                    thread_of=thread_of)


def _calls(events: pd.DataFrame, cols: _Columns, s_start: np.ndarray,
           s_end: np.ndarray) -> _Calls | None:
    """The graph's host calls: launches and synchronisations inside a step, the outermost of
    nested ones on their thread; and the device ops they launched. None without such an op."""
    ts, end, corr = cols.ts, cols.end, cols.corr
    # Device ops, and the host call that launched each (its first runtime call by correlation).
    dev = np.flatnonzero(cols.gpu & (corr >= 0))
    runtime_calls = np.flatnonzero(cols.runtime)
    call_rows = (pd.Series(runtime_calls).groupby(corr[runtime_calls]).first()
                 if len(runtime_calls) else pd.Series())
    launch_of = call_rows.reindex(corr[dev]).to_numpy()
    ok = ~np.isnan(launch_of) if len(dev) else np.zeros(0, bool)
    dev, launch_of = dev[ok], launch_of[ok].astype(np.int64)
    chosen = np.zeros(len(events), bool)
    chosen[launch_of] = True
    chosen |= cols.syncs
    host = np.flatnonzero(chosen)
    where = np.searchsorted(s_start, ts[host], side="right") - 1
    inside = (where >= 0) & (ts[host] < s_end[np.clip(where, 0, None)])
    host, h_step = host[inside], where[inside]
    order = np.lexsort((ts[host], cols.thread_of[host], h_step))
    host, h_step = host[order], h_step[order]
    h_thread = cols.thread_of[host]
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
    return _Calls(host=host, h_step=h_step, h_thread=h_thread, new_chain=new_chain,
                  dev=dev[d_order], launch_of=launch_of[d_order])


def _device_categories(events: pd.DataFrame, dev: np.ndarray) -> np.ndarray:
    """KERNEL, COMM_KERNEL, MEMCPY or MEMSET of each device op."""
    cat = events["cat"]
    d_cat = np.array([DEVICE_CATEGORY.get(normal_cat(c), KERNEL)
                      for c in cat.cat.categories] + [KERNEL], dtype=np.int8)[
        cat.cat.codes.to_numpy()[dev]]
    return np.where(events["is_comm"].to_numpy(bool)[dev], COMM_KERNEL, d_cat)


def _edge(a, b) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(a, np.int64), np.asarray(b, np.int64)


def _host_edges(steps: pd.DataFrame, cols: _Columns, calls: _Calls,
                step_thread: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Host chains: S -> H ... H of each step and thread; the step's thread on to E; all to T.
    Another thread's chain begins after the step's thread's last call that returned before its
    first call began (the step's thread handed it the work: autograd's backward thread), else
    at S."""
    n_steps = len(steps)
    s_end = steps["end_ns"].to_numpy("int64")
    host, h_step, h_thread, new_chain = calls.host, calls.h_step, calls.h_thread, calls.new_chain
    ts, end = cols.ts, cols.end
    h_node = 3 * n_steps + np.arange(len(host))
    rows = np.arange(n_steps)
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
    # The step's end after the calls of its thread that returned before it.
    to_end = (h_thread == step_thread[h_step]) & (end[host] <= s_end[h_step])
    return [_edge(np.where(handed >= 0, 3 * n_steps + handed, h_step[firsts]), h_node[firsts]),
            _edge(h_node[:-1][~new_chain[1:]], h_node[1:][~new_chain[1:]]),
            _edge(h_node[to_end], n_steps + h_step[to_end]),
            _edge(rows, n_steps + rows),
            _edge(h_node, 2 * n_steps + h_step),
            _edge(n_steps + rows, 2 * n_steps + rows)]


def _consecutive_steps(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The previous step's end E to the step's start S, for consecutive steps."""
    s_start, s_end = steps["start_ns"].to_numpy("int64"), steps["end_ns"].to_numpy("int64")
    numbers = steps["step"].to_numpy("int64")
    joined = np.flatnonzero((numbers[1:] == numbers[:-1] + 1) & (s_end[:-1] <= s_start[1:]))
    return _edge(len(steps) + joined, joined + 1)


def _device_edges(events: pd.DataFrame, n_steps: int, cols: _Columns,
                  calls: _Calls) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each op to its step's T; a launch to its op, or, for an op that ended before its launch
    call returned (a blocking copy), the op to that call and the host event before the call to
    the op; the ops of one stream in order; a synchronisation after the device op it waited
    for."""
    host, dev, launch_of, new_chain = calls.host, calls.dev, calls.launch_of, calls.new_chain
    ts, end = cols.ts, cols.end
    h_node = 3 * n_steps + np.arange(len(host))
    k_node = 3 * n_steps + len(host) + np.arange(len(dev))
    edges = [_edge(k_node, 2 * n_steps + calls.h_step[launch_of])]
    launch_end = end[host][launch_of]
    blocking = end[dev] <= launch_end
    edges.append(_edge(h_node[launch_of[~blocking]], k_node[~blocking]))
    edges.append(_edge(k_node[blocking], h_node[launch_of[blocking]]))
    chain_prev = np.where(new_chain, calls.h_step, np.concatenate([[0], h_node[:-1]]))
    edges.append(_edge(chain_prev[launch_of[blocking]], k_node[blocking]))
    # Stream order: each op after the previous one on its stream, where that ended before it
    # started.
    stream = events["stream"].to_numpy("int64")[dev]
    by_stream = np.lexsort((ts[dev], stream))
    same = stream[by_stream][1:] == stream[by_stream][:-1]
    prev, this = by_stream[:-1][same], by_stream[1:][same]
    follows = end[dev][prev] <= ts[dev][this]
    edges.append(_edge(k_node[prev[follows]], k_node[this[follows]]))
    # Synchronisation: the last device op that ended before the call returned, launched before
    # the call began, and ending after it began (any stream: the trace does not say which).
    is_sync = cols.syncs[host]
    at = np.searchsorted(end[dev], end[host][is_sync], side="right") - 1
    waited = np.clip(at, 0, None)
    sync_nodes = h_node[is_sync]
    ok = ((at >= 0) & (ts[host][launch_of[waited]] < ts[host][is_sync])
          & (end[dev][waited] > ts[host][is_sync]))
    edges.append(_edge(k_node[waited[ok]], sync_nodes[ok]))
    return edges


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


def held_before(graph: RankGraph, nodes: np.ndarray, lo: np.ndarray,
                hi: np.ndarray) -> np.ndarray:
    """Per device node, the part of [lo, hi) before the ops it queued behind on its stream
    ended (graph.stream_before): that earlier work's time, its gaps included."""
    before = graph.stream_before[nodes]
    held = np.clip(np.where(before == dag.NEVER, lo, before) - lo, 0, None)
    return np.minimum(held, np.maximum(hi - lo, 0))


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

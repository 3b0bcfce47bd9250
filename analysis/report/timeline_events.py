"""Chrome-trace / Perfetto events of the merged timeline, from per-rank frames on one clock.

Pure functions: frames with nanosecond times on the common clock in, lists of trace-event
dicts out (the Trace Event Format's `ph` X, C, s, f and M). `analysis.timeline` gathers the
frames from a loaded run and writes the file; the layout is described in docs/viewing.md.

Every slice of one track must nest in the others (a viewer draws a track as a stack): slices
that overlap only partly, such as an asynchronous gloo op outliving the op that started it, are
moved to an extra track of their own, named after the track they came from.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# Track numbers (`tid`) of the tracks we add to each rank's process; Kineto's own threads and
# streams are numbered after them.
# A track's extra tracks for overlapping slices take the numbers after it, up to LANE_SPACING.
LANE_SPACING = 1000
STEPS_TID = 1 * LANE_SPACING
COLLECTIVES_TID = 2 * LANE_SPACING
FIRST_TRACE_TID = 3 * LANE_SPACING
# The critical path's own process (docs/critical-path.md): one track, drawn above the ranks.
CRITICAL_PATH_PROCESS = "critical path (all ranks)"
CRITICAL_PATH_TRACK = "critical path"
CRITICAL_PATH_TID = 1
# Counter tracks from the device samples: (field, track name, scale)
SAMPLE_COUNTERS = (
    ("sm_util_pct", "GPU SM util %", 1.0),
    ("mem_util_pct", "GPU memory util %", 1.0),
    ("mem_used_bytes", "GPU memory used MiB", 1.0 / 2**20),
    ("power_w", "GPU power W", 1.0),
    ("cpu_process_pct", "CPU process %", 1.0),
    ("rss_bytes", "RSS MiB", 1.0 / 2**20),
)
STEP_MEMORY_COUNTERS = (
    ("cuda_peak_allocated_bytes", "allocated"),
    ("cuda_peak_reserved_bytes", "reserved"),
    ("rss_bytes", "rss"),
)


def us(ns, origin_ns: int):
    """Trace-event microseconds relative to the file's origin, to the nanosecond."""
    return np.round((np.asarray(ns, dtype="int64") - origin_ns) / 1000.0, 3)


def assign_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per slice, the lane (0 = the track itself) on which it nests in every other slice.

    Slices are taken in (start, longest first) order; each goes on the first lane whose open
    slices all contain it, else on a new lane.
    """
    order = np.lexsort((-(ends - starts), starts))
    lane_of = np.zeros(len(starts), dtype="int64")
    stacks: list[list[int]] = []
    for i in order:
        start, end = int(starts[i]), int(ends[i])
        for number, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                lane_of[i] = number
                break
        else:
            stacks.append([end])
            lane_of[i] = len(stacks) - 1
    return lane_of


def metadata(pid: int, name: str, sort_index: int, threads: list[tuple[int, str, int]]
             ) -> list[dict]:
    """process_name/process_sort_index of one rank, thread_name/thread_sort_index per track."""
    events = [
        {"ph": "M", "pid": pid, "tid": 0, "ts": 0, "name": "process_name",
         "args": {"name": name}},
        {"ph": "M", "pid": pid, "tid": 0, "ts": 0, "name": "process_sort_index",
         "args": {"sort_index": sort_index}},
    ]
    for tid, thread, order in threads:
        events.append({"ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": "thread_name",
                       "args": {"name": thread}})
        events.append({"ph": "M", "pid": pid, "tid": tid, "ts": 0, "name": "thread_sort_index",
                       "args": {"sort_index": order}})
    return events


def track_names(events: pd.DataFrame, training: set) -> pd.DataFrame:
    """One row per Kineto track (pid, tid, is_gpu) with its name and sort order."""
    tracks = (events[["pid", "tid", "is_gpu"]].astype({"pid": str, "tid": str})
              .drop_duplicates().reset_index(drop=True))

    def name(row) -> str:
        if row.is_gpu:
            return f"GPU {row.pid} stream {row.tid}"
        main = " (training loop)" if (row.pid, row.tid) in training else ""
        return f"thread {row.tid}{main}"

    tracks["name"] = [name(r) for r in tracks.itertuples()]
    # The training thread first, then other host threads, then device streams.
    tracks["order"] = [(2 if r.is_gpu else 0 if (r.pid, r.tid) in training else 1)
                       for r in tracks.itertuples()]
    tracks = tracks.sort_values(["order", "pid", "tid"], kind="stable").reset_index(drop=True)
    tracks["tid_out"] = FIRST_TRACE_TID + LANE_SPACING * np.arange(len(tracks))
    return tracks


def slices(frame: pd.DataFrame, pid: int, origin_ns: int, track_of: np.ndarray,
           names: dict) -> tuple[list[dict], list[tuple[int, str, int]], np.ndarray]:
    """X events of `frame` (name, cat, ts_ns, end_ns, args) placed on `track_of` (output tid per
    row), overlapping slices moved to extra tracks; returns (events, new tracks, tid per row)."""
    tid = np.asarray(track_of, dtype="int64").copy()
    new_tracks: list[tuple[int, str, int]] = []
    starts, ends = frame["ts_ns"].to_numpy("int64"), frame["end_ns"].to_numpy("int64")
    for track in np.unique(tid):
        rows = np.flatnonzero(tid == track)
        lanes = assign_lanes(starts[rows], ends[rows])
        for lane in range(1, int(lanes.max()) + 1 if len(lanes) else 1):
            new_tracks.append((int(track) + lane, f"{names[int(track)]} (overlapping {lane})",
                               int(track) + lane))
        tid[rows] += lanes
    ts = us(starts, origin_ns)
    dur = np.round((ends - starts) / 1000.0, 3)
    args = frame["args"].tolist() if "args" in frame.columns else [None] * len(frame)
    events = []
    for name, cat, t, d, track, extra in zip(frame["name"].astype(str), frame["cat"].astype(str),
                                              ts.tolist(), dur.tolist(), tid.tolist(), args):
        event = {"ph": "X", "pid": pid, "tid": track, "ts": t, "dur": d, "name": name,
                 "cat": cat}
        if extra:
            event["args"] = extra
        events.append(event)
    return events, new_tracks, tid


def sample_counters(samples: pd.DataFrame, pid: int, origin_ns: int) -> list[dict]:
    """C events, one track per measured field, from a rank's device samples (t_ns common)."""
    events = []
    if samples is None or samples.empty:
        return events
    ts = us(samples["t_ns"], origin_ns).tolist()
    for field, track, scale in SAMPLE_COUNTERS:
        if field not in samples.columns:
            continue
        values = pd.to_numeric(samples[field], errors="coerce").to_numpy("float64") * scale
        for t, value in zip(ts, values.tolist()):
            if value == value:
                events.append({"ph": "C", "pid": pid, "tid": 0, "ts": t, "name": track,
                               "args": {"value": round(value, 3)}})
    return events


def step_memory_counters(steps: pd.DataFrame, pid: int, origin_ns: int) -> list[dict]:
    """One C event per step at its start: the step's peak memory (MiB) from the step records."""
    present = [(f, k) for f, k in STEP_MEMORY_COUNTERS if f in steps.columns]
    if steps is None or steps.empty or not present:
        return []
    events = []
    ts = us(steps["start_ns"], origin_ns).tolist()
    values = {k: pd.to_numeric(steps[f], errors="coerce").to_numpy("float64") / 2**20
              for f, k in present}
    for i, t in enumerate(ts):
        args = {k: round(float(v[i]), 3) for k, v in values.items() if v[i] == v[i]}
        if args:
            events.append({"ph": "C", "pid": pid, "tid": 0, "ts": t,
                           "name": "step peak memory MiB", "args": args})
    return events


def op_label(op: str, nbytes: float, pg: str) -> str:
    size = "? B" if nbytes != nbytes else f"{nbytes / 1e6:.3g} MB"
    return f"{op} {size} (pg {pg})"


def flows(ops: pd.DataFrame, tid_of_row: dict, origin_ns: int) -> list[dict]:
    """Per matched instance: a flow from the last arriver's op to each member that waited.

    `ops` holds crossrank's waits frame (common clock) with a `row` column naming the op's X
    event; `tid_of_row` gives that event's (pid, tid). The start sits at the last arrival inside
    the last arriver's op, the end at the same instant inside the waiter's op.
    """
    events = []
    matched = ops[ops["instance"] >= 0]
    for instance, group in matched.groupby("instance", sort=True):
        last = group[group["rank"] == group["last_rank"]]
        if last.empty:
            continue
        source = last.iloc[0]
        waiters = group[(group["rank"] != source["rank"]) & (group["wait_ns"] > 0)]
        if waiters.empty:
            continue
        pid, tid = tid_of_row[int(source["row"])]
        at = int(np.clip(source["last_arrival_ns"], source["issue_ns"], source["end_ns"]))
        label = f"{source['op']}: rank {int(source['rank'])} arrived last"
        for number, waiter in enumerate(waiters.itertuples()):
            flow_id = int(instance) * 1024 + number + 1
            w_pid, w_tid = tid_of_row[int(waiter.row)]
            w_at = int(np.clip(at, waiter.issue_ns, waiter.end_ns))
            events.append({"ph": "s", "pid": pid, "tid": tid, "ts": float(us(at, origin_ns)),
                           "id": flow_id, "name": label, "cat": "waited for"})
            events.append({"ph": "f", "bp": "e", "pid": w_pid, "tid": w_tid,
                           "ts": float(us(w_at, origin_ns)), "id": flow_id, "name": label,
                           "cat": "waited for"})
    return events


def critical_path_events(segments: pd.DataFrame, pid: int, origin_ns: int) -> list[dict]:
    """The critical path as one process `critical path (all ranks)` with one track: an X event
    per segment (crossrank.critical_path's critical_path_segments: step, rank, category,
    start_ns, end_ns on the common clock), named "rank R category", its step, rank, category
    and ms in its arguments; sorted before every rank. Segments that overlap (clock error
    between ranks) go to extra tracks as any track's do."""
    if segments is None or segments.empty:
        return []
    frame = pd.DataFrame({
        "name": [f"rank {int(r)} {c}" for r, c in zip(segments["rank"], segments["category"])],
        "cat": "critical path", "ts_ns": segments["start_ns"].to_numpy("int64"),
        "end_ns": segments["end_ns"].to_numpy("int64"),
        "args": [{"step": int(s), "rank": int(r), "category": c, "ms": round((e - b) / 1e6, 3)}
                 for s, r, c, b, e in zip(segments["step"], segments["rank"],
                                          segments["category"], segments["start_ns"],
                                          segments["end_ns"])]})
    names = {CRITICAL_PATH_TID: CRITICAL_PATH_TRACK}
    events, extra, _ = slices(frame, pid, origin_ns, np.full(len(frame), CRITICAL_PATH_TID),
                              names)
    tracks = [(CRITICAL_PATH_TID, CRITICAL_PATH_TRACK, 0), *extra]
    return events + metadata(pid, CRITICAL_PATH_PROCESS, -1, tracks)

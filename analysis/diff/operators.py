"""Operators and kernels of a rank, with their call-stack position, for comparing two runs
(docs/diff.md#operators-and-kernels). Pure: a RankTrace in, a DataFrame out."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

OP_COLUMNS = ["kind", "name", "path", "calls", "total_ns", "self_ns"]
HOST_CATS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
PATH_SEPARATOR = " > "
# A step's number would make every step's stack different.
_STEP_NAME = re.compile(r"^ProfilerStep#\d+$")


def empty_ops() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype="int64") for c in OP_COLUMNS})
    for column in ("kind", "name", "path"):
        frame[column] = frame[column].astype(object)
    return frame


def _in_windows(events: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """The events that start inside an analysed step (all of them for a trace without steps)."""
    if steps is None or steps.empty:
        return events
    starts = np.sort(steps["start_ns"].to_numpy(np.int64))
    order = np.argsort(steps["start_ns"].to_numpy(np.int64))
    ends = steps["end_ns"].to_numpy(np.int64)[order]
    ts = events["ts_ns"].to_numpy(np.int64)
    slot = np.searchsorted(starts, ts, side="right") - 1
    inside = (slot >= 0) & (ts < ends[np.clip(slot, 0, None)])
    return events[inside]


def _stack_paths(host: pd.DataFrame) -> tuple[list[str], np.ndarray]:
    """For each host event (in `host`'s order): the names of the events enclosing it on its
    thread, outermost first, and its self time (its duration less its direct children's)."""
    paths = [""] * len(host)
    self_ns = host["dur_ns"].to_numpy(np.int64).copy()
    names = [_STEP_NAME.sub("ProfilerStep", str(n)) for n in host["name"]]
    ts = host["ts_ns"].to_numpy(np.int64)
    ends = host["end_ns"].to_numpy(np.int64)
    durations = host["dur_ns"].to_numpy(np.int64)
    keys = list(zip(host["pid"].astype(str), host["tid"].astype(str)))
    order = sorted(range(len(host)), key=lambda i: (keys[i], ts[i], -durations[i]))
    stack: list[int] = []
    thread = None
    for i in order:
        if keys[i] != thread:
            thread, stack = keys[i], []
        # Spans that do not hold this one are done with; a span that overlaps it only in part
        # (the optimizer's annotation running into the next ProfilerStep) is no parent of it.
        while stack and (ends[stack[-1]] <= ts[i] or ends[stack[-1]] < ends[i]):
            stack.pop()
        if stack:
            self_ns[stack[-1]] -= durations[i]
        paths[i] = PATH_SEPARATOR.join(names[j] for j in stack)
        stack.append(i)
    return paths, np.clip(self_ns, 0, None)


def rank_ops(trace) -> pd.DataFrame:
    """One row per (kind, name, path) of the rank's analysed steps: `kind` is "op" (a cpu_op)
    or "kernel" (a device kernel, whose path is its launch's); calls, total and self time."""
    events = getattr(trace, "events", None)
    if events is None or events.empty:
        return empty_ops()
    events = _in_windows(events, trace.steps)
    cat = events["cat"].astype(str)
    host = events[cat.isin(HOST_CATS) & ~events["is_gpu"]].reset_index(drop=True)
    paths, self_ns = _stack_paths(host)
    host = host.assign(path=paths, self_ns=self_ns)
    ops = host[host["cat"].astype(str) == "cpu_op"].assign(kind="op")
    launches = host[host["cat"].astype(str).isin(("cuda_runtime", "cuda_driver"))
                    & (host["correlation"] >= 0)]
    launch_path = dict(zip(launches["correlation"], launches["path"] + PATH_SEPARATOR
                           + launches["name"].astype(str)))
    kernels = events[cat == "kernel"]
    kernels = kernels.assign(
        kind="kernel", self_ns=kernels["dur_ns"],
        path=[launch_path.get(c, "") for c in kernels["correlation"]])
    frame = pd.concat([ops[["kind", "name", "path", "dur_ns", "self_ns"]],
                       kernels[["kind", "name", "path", "dur_ns", "self_ns"]]],
                      ignore_index=True)
    if frame.empty:
        return empty_ops()
    frame["name"] = frame["name"].astype(str)
    table = frame.groupby(["kind", "name", "path"], sort=True).agg(
        calls=("dur_ns", "size"), total_ns=("dur_ns", "sum"), self_ns=("self_ns", "sum"))
    return table.reset_index()[OP_COLUMNS]


def keyed(a: pd.DataFrame, b: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both sides' tables with a `key`: the name alone where the name has one call-stack
    position in each run, else name and position, so a name that repeats in a run is matched
    where it sits in the stack."""
    repeated = set()
    for side in (a, b):
        positions = side[["kind", "name", "path"]].drop_duplicates().groupby(
            ["kind", "name"]).size()
        repeated |= set(positions[positions > 1].index)

    def key(frame: pd.DataFrame) -> pd.DataFrame:
        labels = [f"{n} @ {p}" if (k, n) in repeated and p else n
                  for k, n, p in zip(frame["kind"], frame["name"], frame["path"])]
        return frame.assign(key=labels)

    return key(a), key(b)

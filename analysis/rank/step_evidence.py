"""What the cause tests of a late rank and the straggler's evidence read of one rank's events,
computed by the per-rank reduction (analysis.rank.reduction) from its one decode, so that the
findings and the cross-rank pass never read the events again (docs/report.md, "Why a rank is
late"; docs/cross-rank.md).

- `step_evidence(trace)`: per traced step, each compute op (GEMM, convolution, attention) with its
  input shapes (Kineto's `Input Dims`) and its duration, counted by step, name, shapes, kind and
  duration (`compute_ops` gives the rows back, one per op); the step's time, the time in the
  DataLoader's next batch and the time outside every host op (`host`); and the time in each host
  op name (`names`).
- `host_op_spans(trace)`: every host op's name, start and end, and the span of all the rank's
  events: what the rank ran in the windows the others waited for it
  (analysis.crossrank.culprit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.core.event_kinds import DATA_LOADING_RE, HOST_OP_CATS, KERNEL_CAT, OP_ARGS_COLUMN
from analysis.core.events import cat_is, matches
from analysis.core.op_names import is_compute_op
from analysis.core.steps import step_at

COMPUTE_OP_COLUMNS = ["rank", "step", "name", "dims", "dur_ns", "device"]
HOST_COLUMNS = ["rank", "step", "step_ns", "loading_ns", "outside_ns"]
NAME_COLUMNS = ["rank", "step", "name", "dur_ns"]
# The compute ops counted: one row per distinct (step, name, shapes, kind, duration), in the
# order each first occurs, with its `count`.
_OP_KEYS = ["step", "name", "dims", "device", "dur_ns"]
# The host ops whose time the straggler's evidence reads (its events' categories).
SPAN_CATS = ("cpu_op", "user_annotation")


def object_frame(columns: list[str]) -> pd.DataFrame:
    """An empty frame of `columns`, each of objects."""
    return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})


@dataclass(frozen=True, eq=False)
class StepEvidence:
    """One rank's evidence per traced step (the module's docstring says what each frame holds):
    `op_counts` the compute ops counted (_OP_KEYS and `count`), `host` (HOST_COLUMNS) and
    `names` (NAME_COLUMNS)."""

    rank: int
    op_counts: pd.DataFrame
    host: pd.DataFrame
    names: pd.DataFrame

    def compute_ops(self) -> pd.DataFrame:
        """The compute ops, one row per op (COMPUTE_OP_COLUMNS), each key's ops together in the
        order its first op occurs: every shape first occurs where it did among the ops."""
        counts = self.op_counts
        if counts.empty:
            return object_frame(COMPUTE_OP_COLUMNS)
        rows = np.repeat(np.arange(len(counts)), counts["count"].to_numpy(dtype=np.int64))
        return pd.DataFrame({
            "rank": np.full(len(rows), self.rank, dtype=np.int64),
            "step": counts["step"].to_numpy(dtype=np.int64)[rows],
            "name": counts["name"].to_numpy(dtype=object)[rows],
            "dims": counts["dims"].to_numpy(dtype=object)[rows],
            "dur_ns": counts["dur_ns"].to_numpy(dtype=np.int64)[rows],
            "device": counts["device"].to_numpy(dtype=bool)[rows]})


def step_of(at: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step number of each time `at` (-1 outside every step)."""
    if steps is None or steps.empty:
        return np.full(len(at), -1)
    ordered = steps.sort_values("start_ns", kind="stable")
    found = step_at(at, ordered["start_ns"].to_numpy(dtype=np.int64),
                    ordered["end_ns"].to_numpy(dtype=np.int64),
                    ordered["step"].to_numpy(dtype=np.int64))
    return np.nan_to_num(found, nan=-1).astype(np.int64)


def _dims_text(text) -> str | None:
    """The `Input Dims` of an op_args text as compact JSON ("[[64, 512], [512, 512]]")."""
    try:
        dims = json.loads(text)[0]
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return json.dumps(dims) if isinstance(dims, list) else None


def _named(events: pd.DataFrame, rule, among: np.ndarray | None = None) -> np.ndarray:
    """Whether each event's name meets `rule` (a function of the name), asked once per distinct
    name (of the rows `among` only, where given; the others read False)."""
    return matches(events["name"], rule, among)


def _loading(name: str) -> bool:
    return DATA_LOADING_RE.search(name) is not None


def _texts(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """The categorical column's values at `rows` as text (objects), NaN where missing."""
    values = column.array
    texts = np.array([str(c) for c in values.categories] + [np.nan], dtype=object)
    return texts.take(values.codes[rows])


def _op_counts(events: pd.DataFrame, steps: pd.DataFrame, host_cat: np.ndarray,
               loading: np.ndarray) -> pd.DataFrame:
    """The rank's compute ops in its steps counted by _OP_KEYS, each key where its first op is:
    host ops with their `Input Dims` (not those inside the DataLoader's next batch: a dataset's
    own matmuls are data loading), then compute kernels. Built from arrays: an op repeated in
    a step with the same time (a layer's GEMM, at the trace's microsecond resolution) is one
    row. `host_cat`: the host ops; `loading`: the DataLoader's among them."""
    args = events[OP_ARGS_COLUMN]
    host = host_cat & args.notna().to_numpy() & _named(events, is_compute_op, host_cat)
    kernels = (events["is_gpu"].to_numpy(dtype=bool) & ~events["is_comm"].to_numpy(dtype=bool)
               & cat_is(events, {KERNEL_CAT}))
    host_rows = np.flatnonzero(host)
    codes, distinct = pd.factorize(args.to_numpy(dtype=object)[host_rows])
    dims = np.array([_dims_text(t) for t in distinct] + [None], dtype=object).take(codes)
    shaped = np.array([d is not None for d in dims], dtype=bool)
    rows = np.concatenate([host_rows[shaped], np.flatnonzero(kernels)])
    if not len(rows):
        return pd.DataFrame({c: pd.Series(dtype="object") for c in [*_OP_KEYS, "count"]})
    device = np.zeros(len(rows), dtype=bool)
    device[int(shaped.sum()):] = True
    dims = np.concatenate([dims[shaped], np.full(len(rows) - int(shaped.sum()), "", dtype=object)])
    ts = events["ts_ns"].to_numpy(dtype=np.int64)[rows]
    if loading.any():
        starts, ends = intervals.union(events["ts_ns"].to_numpy()[loading],
                                       events["end_ns"].to_numpy()[loading])
        index = np.searchsorted(starts, ts, side="right") - 1
        inside = (index >= 0) & (ts < ends[np.clip(index, 0, None)])
        keep = ~inside | device
        rows, device, dims, ts = rows[keep], device[keep], dims[keep], ts[keep]
    step = step_of(ts, steps)
    keep = step >= 0
    rows, device, dims, step = rows[keep], device[keep], dims[keep], step[keep]
    if not len(rows):
        return pd.DataFrame({c: pd.Series(dtype="object") for c in [*_OP_KEYS, "count"]})
    names = events["name"].array.codes[rows].astype(np.int64)
    dims_codes = pd.factorize(dims)[0].astype(np.int64)
    dur = events["dur_ns"].to_numpy(dtype=np.int64)[rows]
    # Equal keys side by side (lexsort is stable: each group's first is its first op), the
    # groups then in the order of their first ops.
    keys = np.stack([step, names, dims_codes, device.astype(np.int64), dur])
    order = np.lexsort(keys[::-1])
    ordered = keys[:, order]
    starts = np.flatnonzero(np.r_[True, (ordered[:, 1:] != ordered[:, :-1]).any(axis=0)])
    counts = np.diff(np.r_[starts, len(order)])
    first = order[starts]
    by_first = np.argsort(first, kind="stable")
    first, counts = first[by_first], counts[by_first]
    # Names and shapes as categoricals: a kernel's name or an op's shapes, often long, is held
    # (and sent back from the worker) once.
    return pd.DataFrame({"step": step[first],
                         "name": pd.Categorical(_texts(events["name"], rows[first])),
                         "dims": pd.Categorical(dims[first]), "device": device[first],
                         "dur_ns": dur[first], "count": counts.astype(np.int64)})


def _host_time(rank: int, events: pd.DataFrame, steps: pd.DataFrame, host_cat: np.ndarray,
               loading: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per traced step: its time, the DataLoader's and the time outside every host op (and host
    comm call); and per step and host op name, the time in that name (the sum of its spans).
    Each step's ops are a slice of arrays sorted by step: per-step frames cost more than the
    sums. `host_cat` and `loading` as in _op_counts."""
    is_comm = events["is_comm"].to_numpy(dtype=bool)
    own = host_cat & ~is_comm & ~_named(events, lambda n: n.startswith("ProfilerStep#"), host_cat)
    ts_all, end_all = (events[c].to_numpy(dtype=np.int64) for c in ("ts_ns", "end_ns"))
    found = {}
    for part, rows in (("ops", np.flatnonzero(own)), ("comm", np.flatnonzero(is_comm & host_cat))):
        step = step_of(ts_all[rows], steps)
        order = np.argsort(step, kind="stable")
        found[part] = (rows[order], step[order])
    op_rows, op_steps = found["ops"]
    loading = loading[op_rows]
    comm_rows, comm_steps = found["comm"]
    records = []
    for step, start, end in zip(steps["step"], steps["start_ns"], steps["end_ns"]):
        mine = slice(*np.searchsorted(op_steps, [step, step + 1]).tolist())
        talk = slice(*np.searchsorted(comm_steps, [step, step + 1]).tolist())
        inside, spoken = op_rows[mine], comm_rows[talk]
        starts = np.concatenate([ts_all[inside], ts_all[spoken]])
        ends = np.concatenate([end_all[inside], end_all[spoken]])
        covered = intervals.total(np.clip(starts, start, end), np.clip(ends, start, end))
        fed = inside[loading[mine]]
        records.append({"rank": rank, "step": int(step), "step_ns": int(end - start),
                        "loading_ns": intervals.total(ts_all[fed], end_all[fed]),
                        "outside_ns": int(end - start) - covered})
    return pd.DataFrame(records, columns=HOST_COLUMNS), _name_time(rank, events, op_rows, op_steps)


def _name_time(rank: int, events: pd.DataFrame, rows: np.ndarray, steps: np.ndarray
               ) -> pd.DataFrame:
    """Per step and name of the host ops at `rows` (in steps `steps`, -1 outside every step),
    the sum of their spans, by step then name (a name nested in itself is rare; an op of one
    name per thread runs one at a time)."""
    named = events["name"].array.codes[rows] >= 0
    kept = (steps >= 0) & named
    rows, steps = rows[kept], steps[kept]
    if not len(rows):
        return pd.DataFrame({"rank": pd.Series(dtype=np.int64), "step": pd.Series(dtype=np.int64),
                             "name": pd.Series(dtype="str"), "dur_ns": pd.Series(dtype=np.int64)})
    # Each name's place among the names' texts sorted, from its category code: the groups come
    # out by step, then name, as a groupby sorts them.
    codes = events["name"].array.codes[rows].astype(np.int64)
    used = np.unique(codes)
    texts = np.array([str(c) for c in events["name"].array.categories[used]], dtype=object)
    by_text = np.argsort(texts, kind="stable")
    place = np.empty(len(used), dtype=np.int64)
    place[by_text] = np.arange(len(used))
    keys = steps * len(used) + place[np.searchsorted(used, codes)]
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    spans = (events["end_ns"].to_numpy(dtype=np.int64)[rows]
             - events["ts_ns"].to_numpy(dtype=np.int64)[rows])[order]
    sums = np.add.reduceat(spans, starts)
    groups = keys[starts]
    return pd.DataFrame({"rank": np.full(len(groups), rank, dtype=np.int64),
                         "step": groups // len(used), "name": texts[by_text[groups % len(used)]],
                         "dur_ns": sums})


def step_evidence(trace) -> StepEvidence | None:
    """The rank's StepEvidence over its selected steps; None for a trace without events or
    steps."""
    events, steps = trace.events, trace.steps
    if events is None or events.empty or steps is None or steps.empty:
        return None
    rank = int(trace.rank)
    host_cat = cat_is(events, HOST_OP_CATS)
    loading = _named(events, _loading, host_cat)  # host ops only: asked of their names alone
    host, names = _host_time(rank, events, steps, host_cat, loading)
    return StepEvidence(rank, _op_counts(events, steps, host_cat, loading), host, names)


@dataclass(frozen=True, eq=False)
class HostSpans:
    """A rank's host ops (`ops`: name, ts_ns, end_ns; not ProfilerStep#) and the first start and
    last end of all its events (None without events), on the clock of its ops once `moved`."""

    ops: pd.DataFrame
    first_ns: int | None
    last_ns: int | None

    def moved(self, shift: int) -> HostSpans:
        """These spans `shift` ns earlier."""
        if shift == 0:
            return self
        ops = self.ops.assign(ts_ns=self.ops["ts_ns"] - shift, end_ns=self.ops["end_ns"] - shift)
        return HostSpans(ops, None if self.first_ns is None else self.first_ns - shift,
                         None if self.last_ns is None else self.last_ns - shift)


def host_op_spans(trace) -> HostSpans:
    """The rank's HostSpans, on its trace's clock."""
    events = trace.events
    if events is None or events.empty:
        return HostSpans(pd.DataFrame({"name": [], "ts_ns": [], "end_ns": []}), None, None)
    spanned = cat_is(events, SPAN_CATS)
    host = (~events["is_gpu"].to_numpy(dtype=bool) & spanned
            & ~_named(events, lambda n: n.startswith("ProfilerStep#"), spanned))
    rows = np.flatnonzero(host)
    ops = pd.DataFrame({"name": events["name"].iloc[rows].array,
                        "ts_ns": events["ts_ns"].to_numpy()[rows],
                        "end_ns": events["end_ns"].to_numpy()[rows]})
    return HostSpans(ops, int(events["ts_ns"].min()), int(events["end_ns"].max()))

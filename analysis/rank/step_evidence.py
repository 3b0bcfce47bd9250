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


def _named(events: pd.DataFrame, rule) -> np.ndarray:
    """Whether each event's name meets `rule` (a function of the name), asked once per distinct
    name (the name column is categorical)."""
    names = events["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):
        meets = np.array([bool(rule(str(n))) for n in names.cat.categories] + [False])
        return meets[names.cat.codes.to_numpy()]  # code -1 (no name) reads the last: False
    return np.array([bool(rule(str(n))) for n in names], dtype=bool)


def _names_at(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """The names of the events where `rows` (a bool mask), as text."""
    return events["name"].iloc[np.flatnonzero(rows)].astype(str).to_numpy()


def _loading(name: str) -> bool:
    return DATA_LOADING_RE.search(name) is not None


def _compute_ops(rank: int, events: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    host = (events["cat"].isin(HOST_OP_CATS).to_numpy() & events[OP_ARGS_COLUMN].notna().to_numpy()
            & _named(events, is_compute_op))
    kernels = (events["is_gpu"].to_numpy(dtype=bool) & ~events["is_comm"].to_numpy(dtype=bool)
               & (events["cat"] == KERNEL_CAT).to_numpy())
    frames = []
    if host.any():
        texts = events[OP_ARGS_COLUMN].to_numpy(dtype=object)[host]
        codes, distinct = pd.factorize(texts)
        dims = np.array([_dims_text(t) for t in distinct], dtype=object)[codes]
        frames.append(pd.DataFrame({"name": _names_at(events, host), "dims": dims,
                                    "ts_ns": events["ts_ns"].to_numpy()[host],
                                    "dur_ns": events["dur_ns"].to_numpy()[host],
                                    "device": False}).dropna(subset=["dims"]))
    if kernels.any():
        frames.append(pd.DataFrame({"name": _names_at(events, kernels), "dims": "",
                                    "ts_ns": events["ts_ns"].to_numpy()[kernels],
                                    "dur_ns": events["dur_ns"].to_numpy()[kernels],
                                    "device": True}))
    if not frames:
        return object_frame(COMPUTE_OP_COLUMNS)
    ops = pd.concat(frames, ignore_index=True)
    # Ops inside the DataLoader's next batch (a dataset's own matmuls) are data loading.
    loading = events[events["cat"].isin(HOST_OP_CATS).to_numpy()
                     & _named(events, _loading)]
    if len(loading):
        starts, ends = intervals.union(loading["ts_ns"].to_numpy(), loading["end_ns"].to_numpy())
        at = ops["ts_ns"].to_numpy(dtype=np.int64)
        index = np.searchsorted(starts, at, side="right") - 1
        inside = (index >= 0) & (at < ends[np.clip(index, 0, None)])
        ops = ops[~inside | ops["device"].to_numpy(dtype=bool)]
    ops["step"] = step_of(ops["ts_ns"].to_numpy(dtype=np.int64), steps)
    ops = ops[ops["step"] >= 0].assign(rank=rank)
    return ops[COMPUTE_OP_COLUMNS]


def _op_counts(ops: pd.DataFrame) -> pd.DataFrame:
    """The ops counted by _OP_KEYS, each key where its first op is: an op repeated in a step
    with the same time (a layer's GEMM, at the trace's microsecond resolution) is one row."""
    if ops.empty:
        return pd.DataFrame({c: pd.Series(dtype="object") for c in [*_OP_KEYS, "count"]})
    keyed = ops[_OP_KEYS].astype({"step": np.int64, "dur_ns": np.int64, "device": bool})
    return keyed.groupby(_OP_KEYS, sort=False).size().rename("count").reset_index()


def _host_time(rank: int, events: pd.DataFrame, steps: pd.DataFrame
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per traced step: its time, the DataLoader's and the time outside every host op; and per
    step and host op name, the time in that name (the union of its spans)."""
    ops = events[events["cat"].isin(HOST_OP_CATS).to_numpy()
                 & ~events["is_comm"].to_numpy(dtype=bool)
                 & ~_named(events, lambda n: n.startswith("ProfilerStep#"))]
    ops = ops.assign(step=step_of(ops["ts_ns"].to_numpy(dtype=np.int64), steps),
                     loading=_named(ops, _loading), name=ops["name"].astype(str))
    comm = events[events["is_comm"].to_numpy(dtype=bool)
                  & events["cat"].isin(HOST_OP_CATS).to_numpy()]
    comm = comm.assign(step=step_of(comm["ts_ns"].to_numpy(dtype=np.int64), steps))
    by_step = {step: group for step, group in ops.groupby("step") if step >= 0}
    talk_by_step = {step: group for step, group in comm.groupby("step") if step >= 0}
    empty = ops.iloc[:0]
    rows = []
    for step, start, end in zip(steps["step"], steps["start_ns"], steps["end_ns"]):
        inside = by_step.get(step, empty)
        talk = talk_by_step.get(step, empty)
        starts = np.concatenate([inside["ts_ns"].to_numpy(), talk["ts_ns"].to_numpy()])
        ends = np.concatenate([inside["end_ns"].to_numpy(), talk["end_ns"].to_numpy()])
        covered = intervals.total(np.clip(starts, start, end), np.clip(ends, start, end))
        loading = inside[inside["loading"].to_numpy(dtype=bool)]
        rows.append({"rank": rank, "step": int(step), "step_ns": int(end - start),
                     "loading_ns": intervals.total(loading["ts_ns"].to_numpy(),
                                                   loading["end_ns"].to_numpy()),
                     "outside_ns": int(end - start) - covered})
    # Per step and name, the time in its spans: the sum, where they do not overlap (a name
    # nested in itself is rare; an op of one name per thread runs one at a time).
    kept = ops[ops["step"] >= 0]
    named = (kept.assign(dur=kept["end_ns"] - kept["ts_ns"])
             .groupby(["step", "name"])["dur"].sum().rename("dur_ns").reset_index()
             .assign(rank=rank))
    return (pd.DataFrame(rows, columns=HOST_COLUMNS), named[NAME_COLUMNS])


def step_evidence(trace) -> StepEvidence | None:
    """The rank's StepEvidence over its selected steps; None for a trace without events or
    steps."""
    events, steps = trace.events, trace.steps
    if events is None or events.empty or steps is None or steps.empty:
        return None
    rank = int(trace.rank)
    host, names = _host_time(rank, events, steps)
    return StepEvidence(rank, _op_counts(_compute_ops(rank, events, steps)), host, names)


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
    host = (~events["is_gpu"].to_numpy(dtype=bool) & events["cat"].isin(SPAN_CATS).to_numpy()
            & ~_named(events, lambda n: n.startswith("ProfilerStep#")))
    rows = np.flatnonzero(host)
    ops = pd.DataFrame({"name": events["name"].iloc[rows].array,
                        "ts_ns": events["ts_ns"].to_numpy()[rows],
                        "end_ns": events["end_ns"].to_numpy()[rows]})
    return HostSpans(ops, int(events["ts_ns"].min()), int(events["end_ns"].max()))

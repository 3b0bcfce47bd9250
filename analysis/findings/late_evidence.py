"""What the cause tests of a late rank read (analysis.findings.late_causes), gathered once per run
from every rank's trace and records (docs/report.md, "Why a rank is late"):

- `ops`: per rank and traced step, each compute op (GEMM, convolution, attention) with its input
  shapes (Kineto's `Input Dims`, recorded by default) and its duration; on GPU traces each
  compute kernel too, by name (a kernel's name carries its tile shapes; its time is the
  device's, where a host op's time on a GPU trace is its launch);
- `host`: per rank and traced step, the step's time, the time in the DataLoader's next batch,
  the time outside every host op, and the time in each host op name (`names`);
- `samples`: per rank and recorded step, the sampler's host CPU, process CPU, SM clock, power and
  temperature (medians of the samples inside the step, on the records' clock);
- `ranks`: per rank, its host, device name and the CPUs it may run on (its manifest).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.core.event_kinds import DATA_LOADING_RE, HOST_OP_CATS, KERNEL_CAT, OP_ARGS_COLUMN
from analysis.core.model import UNKNOWN_RANK
from analysis.core.op_names import is_compute_op
from analysis.core.steps import step_at
from tracer import schema

COMPUTE_OP_COLUMNS = ["rank", "step", "name", "dims", "dur_ns", "device"]
HOST_COLUMNS = ["rank", "step", "step_ns", "loading_ns", "outside_ns"]
NAME_COLUMNS = ["rank", "step", "name", "dur_ns"]
SAMPLE_COLUMNS = ["rank", "step", "cpu_system_pct", "cpu_process_pct", "sm_clock_mhz",
                  "power_w", "temp_c"]
MACHINE_COLUMNS = ["rank", "host", "device", "cpus"]


def _frame(columns: list[str]) -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})


@dataclass(frozen=True, eq=False)
class LateEvidence:
    """The evidence of every rank (the module's docstring says what each frame holds)."""

    ops: pd.DataFrame = field(default_factory=lambda: _frame(COMPUTE_OP_COLUMNS))
    host: pd.DataFrame = field(default_factory=lambda: _frame(HOST_COLUMNS))
    names: pd.DataFrame = field(default_factory=lambda: _frame(NAME_COLUMNS))
    samples: pd.DataFrame = field(default_factory=lambda: _frame(SAMPLE_COLUMNS))
    ranks: pd.DataFrame = field(default_factory=lambda: _frame(MACHINE_COLUMNS))


def _step_at(at: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
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
        return _frame(COMPUTE_OP_COLUMNS)
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
    ops["step"] = _step_at(ops["ts_ns"].to_numpy(dtype=np.int64), steps)
    ops = ops[ops["step"] >= 0].assign(rank=rank)
    return ops[COMPUTE_OP_COLUMNS]


def _host_time(rank: int, events: pd.DataFrame, steps: pd.DataFrame
               ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per traced step: its time, the DataLoader's and the time outside every host op; and per
    step and host op name, the time in that name (the union of its spans)."""
    ops = events[events["cat"].isin(HOST_OP_CATS).to_numpy()
                 & ~events["is_comm"].to_numpy(dtype=bool)
                 & ~_named(events, lambda n: n.startswith("ProfilerStep#"))]
    ops = ops.assign(step=_step_at(ops["ts_ns"].to_numpy(dtype=np.int64), steps),
                     loading=_named(ops, _loading), name=ops["name"].astype(str))
    comm = events[events["is_comm"].to_numpy(dtype=bool)
                  & events["cat"].isin(HOST_OP_CATS).to_numpy()]
    comm = comm.assign(step=_step_at(comm["ts_ns"].to_numpy(dtype=np.int64), steps))
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


def _step_samples(rank: int, records) -> pd.DataFrame:
    samples, steps = records.samples, records.steps
    if samples is None or samples.empty or steps is None or steps.empty:
        return _frame(SAMPLE_COLUMNS)
    frame = samples.assign(step=_step_at(samples["t_ns"].to_numpy(dtype=np.int64), steps))
    frame = frame[frame["step"] >= 0]
    columns = [c for c in SAMPLE_COLUMNS[2:] if c in frame.columns]
    if frame.empty or not columns:
        return _frame(SAMPLE_COLUMNS)
    numbers = frame[columns].apply(pd.to_numeric, errors="coerce").astype("float64")
    per = numbers.groupby(frame["step"]).median().reset_index().assign(rank=rank)
    return per.reindex(columns=SAMPLE_COLUMNS)


def _rank_row(trace) -> dict:
    starts = [r for r in (trace.records.manifest if trace.records is not None else [])
              if isinstance(r, schema.RunStart)]
    start = starts[0] if starts else None
    return {"rank": int(trace.rank), "host": getattr(start, "host", None),
            "device": getattr(start, "device_name", None), "cpus": getattr(start, "cpus", None)}


def late_evidence(traces, late: set | frozenset = frozenset(), others: int | None = None
                  ) -> LateEvidence:
    """The evidence of the ranks of `traces` (RankTrace): the samples and manifest of every
    rank; the ops and host times of every rank, or with `others` given, of the `late` ranks and
    at most `others` more (the lowest-numbered: enough for the medians the tests compare, and
    a run of many ranks whose events were dropped reads few of them again). A rank without a
    trace gives its samples and manifest only."""
    ops, host, names, samples, ranks = [], [], [], [], []
    known = sorted(int(t.rank) for t in traces or [] if t.rank != UNKNOWN_RANK)
    read = (set(known) if others is None else
            set(late) | set([r for r in known if r not in late][:others]))
    for trace in traces or []:
        if trace.rank == UNKNOWN_RANK:
            continue
        ranks.append(_rank_row(trace))
        if trace.records is not None:
            samples.append(_step_samples(int(trace.rank), trace.records))
        if (int(trace.rank) not in read or not trace.has_trace
                or not getattr(trace, "event_count", 0)):
            continue
        events = trace.with_events().events
        if events is None or events.empty or trace.steps is None or trace.steps.empty:
            continue
        ops.append(_compute_ops(int(trace.rank), events, trace.steps))
        rank_host, rank_names = _host_time(int(trace.rank), events, trace.steps)
        host.append(rank_host)
        names.append(rank_names)

    def joined(frames: list, columns: list[str]) -> pd.DataFrame:
        frames = [f for f in frames if len(f)]
        return pd.concat(frames, ignore_index=True) if frames else _frame(columns)

    return LateEvidence(ops=joined(ops, COMPUTE_OP_COLUMNS), host=joined(host, HOST_COLUMNS),
                        names=joined(names, NAME_COLUMNS),
                        samples=joined(samples, SAMPLE_COLUMNS),
                        ranks=pd.DataFrame(ranks, columns=MACHINE_COLUMNS))

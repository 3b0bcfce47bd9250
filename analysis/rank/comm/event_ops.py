"""Communication ops derived from a Kineto trace's events (docs/report.md, "Where ops come from").

A kernel is joined to the call that launched it through its runtime launch's correlation id; a
gloo op to the call of the same op and element count. Each op keeps the host thread and time it
was issued at, from which `analysis.rank.issuers` tells who issued it.
"""

from __future__ import annotations

import functools
import operator
from typing import NamedTuple

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.core.comm_names import (
    _DTYPE_SIZES,
    P2P_OPS,
    UNKNOWN_OP,
    canonical_dtype,
    canonical_op,
    comm_kernel_op,
    first_input_type,
    first_tensor_nelems,
    message_bytes,
)
from analysis.core.frames import (
    each_distinct,
    each_text,
    flags,
    list_at,
    texts,
    value_or_none,
    values_at,
    values_or_none,
)
from analysis.rank.comm.enclosing import (
    innermost_among,
    launch_rows,
    launch_values,
    row_thread_ids,
    sorted_positions,
    steps_kept,
)
from analysis.rank.comm.sizes import missing, sized_columns

REQUIRED_EVENT_COLUMNS = ("name", "cat", "ts_ns", "dur_ns", "pid", "tid", "is_gpu", "is_comm")
# The events' columns an op row is made from (_row_from_args).
_ARG_COLUMNS = ("collective", "group_size", "comm_dtype", "in_nelems", "out_nelems", "pg_name",
                "pg_desc", "input_dims", "input_type")


def ops_from_events(events: pd.DataFrame, steps, all_steps, rank, world_size) -> pd.DataFrame:
    """op_columns' ops as a frame, with the trace's `rank` and `origin` "trace"; an empty frame
    when the trace has none."""
    columns = op_columns(events, steps, all_steps, world_size)
    if columns is None:
        return pd.DataFrame()
    step = columns.pop("step")
    frame = pd.DataFrame(columns)
    frame["step"] = step.array if isinstance(step, pd.Series) else step
    return frame.assign(rank=rank, origin="trace")


def op_columns(events: pd.DataFrame, steps, all_steps, world_size,
               join: KernelJoin | None = None) -> dict | None:
    """One op per row as {column: list of values}: the columns of communication.OPS_COLUMNS
    that a trace gives, plus host_ts, host_pid, host_tid (where it was issued) and named (a
    torch.distributed op names it), `step` as a Series or one number (a trace without
    ProfilerStep); in the order the ops ran, those issued in steps outside `steps` left out.
    None when the trace has no op. `join`: the events' KernelJoin, where the caller has it."""
    columns = _op_columns(events, world_size, join)
    if columns is None:
        return None
    step, kept = steps_kept(pd.Series(columns["host_ts"]), steps, all_steps)
    positions = sorted_positions(pd.Series(columns["sort_ts"]), kept).tolist()
    taken = {name: _taken(values, positions) for name, values in columns.items()
             if name != "sort_ts"}
    taken["step"] = step.take(positions) if isinstance(step, pd.Series) else step
    return taken


def _taken(values: list, positions: list) -> list:
    """[values[i] for i in positions], in one call."""
    if len(positions) < 2:
        return [values[i] for i in positions]
    return list(operator.itemgetter(*positions)(values))


def _op_columns(events: pd.DataFrame, world_size, join: KernelJoin | None = None
                ) -> dict | None:
    """The ops of the events as {column of _row_from_args: values}: kernels first, then gloo
    ops, then calls whose execution the trace lacks; None without any."""
    if any(c not in events.columns for c in REQUIRED_EVENT_COLUMNS):
        return None
    join = join if join is not None else KernelJoin(events)
    if join.found is None:
        return None
    comm = join.comm
    calls, gloo = join.calls, join.gloo
    used_calls: set = set()
    columns = _kernel_ops(join, used_calls, world_size)
    rows: list[dict] = []
    if len(gloo.positions):
        rows += _gloo_ops(_with_ops(comm, gloo), _with_ops(comm, calls), used_calls, world_size)
    for position, op in zip(calls.positions.tolist(), calls.ops):
        if comm.labels[position] not in used_calls:
            # Issued but its execution is not in the trace (outside the window, or a CPU-only
            # profile of a GPU run): the bytes are known, the time is not.
            call = comm.record(position, op)
            rows.append(_row_from_args(call, op, call, duration_us=float("nan"),
                                       issued_by=call))
    if rows:
        names = list(rows[0])
        columns = {name: columns.get(name, []) + [row[name] for row in rows] for name in names}
    return columns or None


class _CommEvents:
    """The communication events' columns, addressed by position: as Python values (`column`),
    or as arrays with None for a missing value (`present`), one column at a time."""

    def __init__(self, events: pd.DataFrame, rows: np.ndarray):
        self.events, self.rows = events, rows
        self.labels = events.index.to_numpy()[rows]
        self.known = [c for c in _ROW_COLUMNS if c in events.columns]
        self._lists: dict[str, list] = {}
        self._series: dict[str, pd.Series] = {}
        self.starts = values_at(events["ts_ns"], rows, "int64")
        self.durations = values_at(events["dur_ns"], rows, "int64")
        self.correlation = (values_at(events["correlation"], rows, "float64")
                            if "correlation" in events.columns else np.full(len(rows), np.nan))

    @functools.cached_property
    def frame(self) -> pd.DataFrame:
        """The events' rows, every column."""
        return self.events.take(self.rows)

    def series(self, name: str) -> pd.Series:
        """events[name], taken once."""
        if name not in self._series:
            self._series[name] = self.events[name]
        return self._series[name]

    def column(self, name: str) -> list:
        """The column's values, as Python values."""
        if name not in self._lists:
            self._lists[name] = list_at(self.series(name), self.rows)
        return self._lists[name]

    def present(self, name: str, positions: np.ndarray) -> np.ndarray:
        """The column's values at `positions`, None where missing or where there is no such
        column (_col_value's reading)."""
        if name not in self.events.columns:
            return np.full(len(positions), None, dtype=object)
        return values_or_none(self.series(name), self.rows[positions])

    def texts(self, name: str, positions: np.ndarray) -> np.ndarray:  # str() of each value
        return texts(self.series(name), self.rows[positions])

    def record(self, position, op=None) -> dict:
        """{column: value} of one event, with its op when it has one."""
        row = {c: self.column(c)[position] for c in self.known}
        if op is not None:
            row["op"] = op
        return row

    def innermost(self, chosen: _Chosen, launch: _Launches) -> np.ndarray:
        """innermost_among the chosen events, by their index label, of each launch."""
        positions = chosen.positions
        if not len(positions) or not len(launch.ts):
            return np.full(len(launch.ts), -1, dtype=np.int64)
        # A launch not found has no time: no span holds it, whatever its thread.
        threads = row_thread_ids(self.events, np.concatenate([self.rows[positions],
                                                              launch.rows]))
        thread, query_thread = threads[:len(positions)], threads[len(positions):]
        return innermost_among(
            thread, self.starts[positions].astype("float64"),
            self.durations[positions].astype("float64"), self.labels[positions], query_thread,
            launch.ts)

    @property
    def index(self) -> pd.Index:
        """The events' labels, as self.frame.index."""
        return self.events.index.take(self.rows)


class _Launches(NamedTuple):
    """The runtime launch of each kernel: its events row, whether found, its time, pid and
    tid (NaN/None where not found)."""
    rows: np.ndarray
    found: np.ndarray
    ts: np.ndarray
    pid: np.ndarray
    tid: np.ndarray


def _launches(events, is_gpu, kernel_corr) -> _Launches:
    rows, found = launch_rows(events, is_gpu, kernel_corr)
    return _Launches(rows, found, *launch_values(events, rows, found))


class _Chosen(NamedTuple):
    """Communication events (their positions) and the op of each."""
    positions: np.ndarray
    ops: np.ndarray

    def at_labels(self, comm: _CommEvents, labels: np.ndarray) -> np.ndarray:
        """The index, among these events, of the one with each label (-1 for a label below 0):
        the last with it where several share a label, as a {label: event} lookup gives."""
        found = np.full(len(labels), -1, dtype=np.int64)
        wanted = np.flatnonzero(labels >= 0)
        if not len(wanted):
            return found
        own = comm.labels[self.positions]  # unique: the trace reader numbers its events
        order = np.argsort(own, kind="stable")
        found[wanted] = order[np.searchsorted(own[order], labels[wanted])]
        return found


# An op row's columns (_row_from_args) and what the joins read.
_ROW_COLUMNS = _ARG_COLUMNS + ("name", "ts_ns", "pid", "tid")


def _comm_events(events: pd.DataFrame):
    """(_CommEvents of the communication events, is_gpu of every event, positions of the
    kernels among them, positions of the host events), or None without any."""
    is_comm, is_gpu = flags(events, "is_comm"), flags(events, "is_gpu")
    comm_rows = np.flatnonzero(is_comm)
    if not len(comm_rows):
        return None
    comm_on_gpu = is_gpu[comm_rows]
    comm = _CommEvents(events, comm_rows)
    return comm, is_gpu, np.flatnonzero(comm_on_gpu), np.flatnonzero(~comm_on_gpu)


def _host_ops(comm: _CommEvents, host: np.ndarray) -> tuple[_Chosen, _Chosen, _Chosen]:
    """(calls, gloo ops, hints) among the host communication events at positions `host`:
    record_param_comms calls that name their collective, gloo:* ops, and the nccl:*/c10d:: ops
    whose name gives the collective."""
    names, rows = comm.series("name"), comm.rows[host]
    name_op = each_text(names, rows, canonical_op)
    is_call = each_text(names, rows, lambda name: name == "record_param_comms").astype(bool)
    call_op = each_distinct(comm.present("collective", host[is_call]), canonical_op)
    is_gloo = each_text(names, rows, lambda name: name.startswith("gloo:")).astype(bool)
    has_op = ~is_call & pd.notna(name_op)
    calls, gloo, hints = pd.notna(call_op), has_op & is_gloo, has_op & ~is_gloo
    return (_Chosen(host[is_call][calls], call_op[calls]), _Chosen(host[gloo], name_op[gloo]),
            _Chosen(host[hints], name_op[hints]))


def _ops_series(comm: _CommEvents, chosen: _Chosen) -> pd.Series:
    return pd.Series(chosen.ops.tolist(), index=comm.labels[chosen.positions],
                     dtype=None if len(chosen.ops) else object)


def _with_ops(comm: _CommEvents, chosen: _Chosen) -> pd.DataFrame:
    """The chosen events' rows, with their op in an `op` column."""
    return comm.frame.take(chosen.positions).assign(op=_ops_series(comm, chosen))


class KernelJoin:
    """The communication events of `events` (`found`: _comm_events' tuple, None without any)
    and their host ops, and each kernel's launch and the call and hint around it, each
    computed when first asked for: kernel_host_ops and the ops (op_columns) of one rank read
    them from one join."""

    def __init__(self, events: pd.DataFrame):
        self.events = events
        self.found = (None if any(c not in events.columns for c in REQUIRED_EVENT_COLUMNS)
                      else _comm_events(events))
        if self.found is not None:
            self.comm, self.is_gpu, self.kernels, host_rows = self.found
            self.calls, self.gloo, self.hints = _host_ops(self.comm, host_rows)

    @functools.cached_property
    def launch(self) -> _Launches:
        return _launches(self.events, self.is_gpu, self.comm.correlation[self.kernels])

    @functools.cached_property
    def call_of(self) -> np.ndarray:
        """The label of each kernel's innermost call around its launch, -1 for none."""
        return self.comm.innermost(self.calls, self.launch)

    @functools.cached_property
    def hint_of(self) -> np.ndarray:
        """The label of each kernel's innermost hint around its launch, -1 for none."""
        return self.comm.innermost(self.hints, self.launch)


def kernel_host_ops(events: pd.DataFrame, join: KernelJoin | None = None) -> pd.DataFrame:
    """Per communication kernel of `events` (indexed by its label): `host`, the label of the
    host op around its launch that names it (the innermost record_param_comms call with a
    collective name, else the innermost nccl:*/c10d:: op), -1 where none, and that op's `op`.
    `join`: the events' KernelJoin, where the caller has it.

    The join is _kernel_ops': kernel -> runtime launch with the same correlation id -> the
    launching thread's op whose span holds the launch."""
    join = join if join is not None else KernelJoin(events)
    if join.found is None:
        return pd.DataFrame({"host": pd.Series(dtype="int64"), "op": pd.Series(dtype=object)})
    call_of = join.call_of
    host = np.where(call_of >= 0, call_of, join.hint_of)
    op = _ops_at(join.comm, (join.calls, join.hints), host)
    return pd.DataFrame({"host": host, "op": op}, index=join.comm.index[join.kernels])


def _ops_at(comm: _CommEvents, chosen: tuple, labels: np.ndarray) -> np.ndarray:
    """The op of the chosen event with each label (the first of `chosen` that has it), NaN
    where none has it; None for all where none was chosen."""
    own = np.concatenate([comm.labels[c.positions] for c in chosen])
    if not len(own):
        return np.full(len(labels), None)
    ops = np.concatenate([c.ops for c in chosen]).astype(object)
    distinct, first = np.unique(own, return_index=True)
    at = np.minimum(np.searchsorted(distinct, labels), len(distinct) - 1)
    found = distinct[at] == labels
    result = np.full(len(labels), np.nan, dtype=object)
    result[found] = ops[first[at[found]]]
    return result


def _kernel_ops(join: KernelJoin, used_calls: set, world_size) -> dict:
    """NCCL/RCCL kernels (`join.kernels`, positions in `join.comm`), each joined to the
    record_param_comms call that launched it, as {column of _row_from_args: values} ({}
    without kernels).

    The join: kernel -> runtime launch with the same correlation id -> the innermost call on
    the launching thread whose span holds the launch. Bytes come from the call, time from the
    kernel(s); several kernels of one call are one op timed by the union of their spans. A
    kernel with no call takes its size from its own args, else from the innermost nccl:*/c10d::
    op around its launch ("In msg nelems", else "Input Dims" and "Input type", as on gloo).
    Each column is computed for every op at once, as _row_from_args gives it row by row.
    """
    comm, kernels, calls, hints = join.comm, join.kernels, join.calls, join.hints
    if not len(kernels):
        return {}
    launch = join.launch
    launch_ts, launch_pid, launch_tid = launch.ts, launch.pid, launch.tid
    call_of, hint_of = join.call_of, join.hint_of
    keys = np.where(call_of >= 0, call_of, -1 - comm.labels[kernels].astype(np.int64))
    starts = comm.starts[kernels]
    ends = starts + comm.durations[kernels]

    # One op per call, in the order of its first kernel; a kernel without a call is one op.
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    by_group = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[by_group], np.arange(len(first) + 1))
    groups = np.argsort(first, kind="stable")
    heads = by_group[bounds[groups]]
    kernel_ts = np.minimum.reduceat(starts[by_group], bounds[:-1])[groups]
    duration_us = (ends[heads] - starts[heads]) / 1e3
    launcher = heads.copy()  # the kernel whose launch issued the op, where no call did
    for op_index in np.flatnonzero(np.diff(bounds)[groups] > 1):
        members = by_group[bounds[groups[op_index]]:bounds[groups[op_index] + 1]]
        duration_us[op_index] = intervals.total(starts[members], ends[members]) / 1e3
        launched = members[~np.isnan(launch_ts[members])]
        if len(launched):
            launcher[op_index] = launched[0]

    call = calls.at_labels(comm, call_of[heads])
    hint = hints.at_labels(comm, np.where(call >= 0, -1, hint_of[heads]))
    has_call, has_hint = call >= 0, hint >= 0
    call_at = calls.positions[call[has_call]]
    used_calls.update(comm.labels[call_at].tolist())
    kernel_at = kernels[heads]
    kernel_counted = ~(missing(comm.present("in_nelems", kernel_at))
                       & missing(comm.present("out_nelems", kernel_at)))
    # A kernel with no call: sized by its own args where it has counts or no hint, else by
    # the hint.
    by_hint = has_hint & ~kernel_counted
    size_at = kernel_at.copy()
    size_at[has_call] = call_at
    size_at[by_hint] = hints.positions[hint[by_hint]]

    op = np.full(len(heads), None, dtype=object)
    op[has_call] = calls.ops[call[has_call]]
    no_call = ~has_call
    op[no_call] = each_distinct(comm.present("collective", kernel_at[no_call]), canonical_op)
    named = np.full(len(heads), None, dtype=object)
    named[has_hint] = hints.ops[hint[has_hint]]
    unnamed = no_call & missing(op)
    op[unnamed] = named[unnamed]
    unnamed &= missing(op)
    op[unnamed] = each_distinct(comm.texts("name", kernel_at[unnamed]), comm_kernel_op)
    op[missing(op)] = UNKNOWN_OP

    columns = sized_columns(comm, op, size_at, kernel_at, by_hint, world_size)
    issued_ts, issued_pid, issued_tid = _issued(comm, launcher, kernel_at, has_call, size_at,
                                                kernel_ts, launch_ts, launch_pid, launch_tid)
    return {
        "op": op.tolist(), **columns,  # source, pg, pg_desc, pg_size, dtype, bytes
        "duration_us": duration_us.tolist(),
        "host_ts": issued_ts,
        "host_pid": issued_pid,
        "host_tid": issued_tid,
        "named": (has_call | has_hint).tolist(),
        "sort_ts": kernel_ts.tolist(),
    }


def _issued(comm: _CommEvents, launcher, kernel_at, has_call, size_at, kernel_ts, launch_ts,
            launch_pid, launch_tid) -> tuple[list, list, list]:
    """(host_ts, host_pid, host_tid) of each op: its call's, else its first kernel's launch,
    else the kernel itself (its start, on the kernel's own pid and tid)."""
    ts = np.empty(len(launcher), dtype=object)
    ts[:] = kernel_ts.tolist()
    pid = comm.texts("pid", kernel_at)
    tid = comm.texts("tid", kernel_at)
    launched = ~has_call & ~np.isnan(launch_ts[launcher])
    at = launcher[launched]
    ts[launched] = list(launch_ts[at])  # NumPy floats, as _launches gives them
    pid[launched], tid[launched] = launch_pid[at], launch_tid[at]
    call_at = size_at[has_call]
    ts[has_call] = [comm.column("ts_ns")[p] for p in call_at.tolist()]
    pid[has_call], tid[has_call] = comm.texts("pid", call_at), comm.texts("tid", call_at)
    return ts.tolist(), pid.tolist(), tid.tolist()


# ---- one op row from a call's or a gloo op's arguments ------------------------------------------
def col(frame: pd.DataFrame, name: str):
    if name in frame.columns:
        return frame[name]
    return pd.Series([None] * len(frame), index=frame.index)



def _row_from_args(size_source, op, pg_source, duration_us, issued_by, host_ts=None,
                   sort_ts=None, dtype_source=None, nelems=None, world_size=None,
                   named=True) -> dict:
    """One op row; counts, dtype and group come from `size_source` (a trace event's comm args);
    `issued_by` is the host event (or {ts_ns, pid, tid}) where it was issued."""
    group_size = _col_value(pg_source, "group_size")
    if group_size is None:
        group_size = _col_value(size_source, "group_size")
    if group_size is None and world_size is not None:
        group_size = world_size
    dtype = canonical_dtype(_col_value(dtype_source if dtype_source is not None else size_source,
                                       "comm_dtype"))
    if nelems is not None:
        in_nelems, out_nelems = nelems, None
    else:
        in_nelems = _col_value(size_source, "in_nelems")
        out_nelems = _col_value(size_source, "out_nelems")
    nbytes = message_bytes(op, in_nelems, out_nelems, _DTYPE_SIZES.get(dtype), group_size)
    pg = _col_value(pg_source, "pg_name")
    desc = _col_value(pg_source, "pg_desc")
    if pg is None:
        pg, desc = _col_value(size_source, "pg_name"), _col_value(size_source, "pg_desc")
    host_ts = issued_by["ts_ns"] if host_ts is None else host_ts
    return {
        "op": op,
        "source": "p2p" if op in P2P_OPS else None,
        "pg": None if pg is None else str(pg),
        "pg_desc": None if desc is None else str(desc),
        "pg_size": group_size,
        "dtype": dtype,
        "bytes": nbytes,
        "duration_us": duration_us,
        "host_ts": host_ts,
        "host_pid": str(issued_by["pid"]),
        "host_tid": str(issued_by["tid"]),
        "named": named,
        "sort_ts": host_ts if sort_ts is None else sort_ts,
    }


def _col_value(row, name):
    """The row's (a dict or Series) value in `name`, None where it has none or it is missing."""
    return value_or_none(row.get(name)) if row is not None and hasattr(row, "get") else None


def _gloo_ops(gloo, calls, used_calls: set, world_size) -> list[dict]:
    """gloo:* ops, which run on gloo's worker threads and last as long as the op.

    A gloo op is joined to the first unused record_param_comms call of the same op and element
    count that started no later than it (the call names the group); without one, the op's
    "Input Dims" give the element count and the trace's world size stands in for the group size.
    """
    rows = []
    pending = calls.sort_values("ts_ns") if not calls.empty else calls
    for _, op_event in gloo.sort_values("ts_ns").iterrows():
        op = op_event["op"]
        nelems = first_tensor_nelems(_col_value(op_event, "input_dims"))
        dtype_source = op_event
        if _col_value(op_event, "comm_dtype") is None:
            first_type = first_input_type(_col_value(op_event, "input_type"))
            dtype_source = {"comm_dtype": first_type}
        call = None
        if not pending.empty:
            same = pending[(pending["op"] == op) & (pending["ts_ns"] <= op_event["ts_ns"])
                           & ~pending.index.isin(list(used_calls))]
            if nelems is not None and not same.empty:
                same = same[pd.to_numeric(col(same, "in_nelems"), errors="coerce") == nelems]
            if not same.empty:
                call = same.iloc[0]
        duration_us = float(op_event["dur_ns"]) / 1e3
        if call is not None:
            used_calls.add(call.name)
            rows.append(_row_from_args(call, op, call, duration_us, call,
                                       sort_ts=op_event["ts_ns"]))
        else:
            rows.append(_row_from_args(op_event, op, op_event, duration_us, op_event,
                                       dtype_source=dtype_source, nelems=nelems,
                                       world_size=world_size))
    return rows

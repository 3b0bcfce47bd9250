"""Communication ops derived from a Kineto trace's events (docs/report.md, "Where ops come from").

A kernel is joined to the call that launched it through its runtime launch's correlation id; a
gloo op to the call of the same op and element count. Each op keeps the host thread and time it
was issued at, from which `analysis.issuers` tells who issued it.
"""

from __future__ import annotations

import functools

import numpy as np
import pandas as pd

from analysis import intervals
from analysis.comm_names import (
    _DTYPE_SIZES,
    UNKNOWN_OP,
    canonical_dtype,
    canonical_op,
    comm_kernel_op,
    first_input_type,
    first_tensor_nelems,
    message_bytes,
)
from analysis.enclosing import innermost_among, thread_keys
from analysis.frame_columns import flags, is_numpy_number, list_at, text_matches, texts, values_at
from analysis.steps import WHOLE_TRACE_STEP, step_at

REQUIRED_EVENT_COLUMNS = ("name", "cat", "ts_ns", "dur_ns", "pid", "tid", "is_gpu", "is_comm")
# The events' columns an op row is made from (_row_from_args).
_ARG_COLUMNS = ("collective", "group_size", "comm_dtype", "in_nelems", "out_nelems", "pg_name",
                "pg_desc", "input_dims", "input_type")


def col(frame: pd.DataFrame, name: str):
    if name in frame.columns:
        return frame[name]
    return pd.Series([None] * len(frame), index=frame.index)


def ops_from_events(events: pd.DataFrame, steps, all_steps, rank, world_size) -> pd.DataFrame:
    """One row per op with the columns of communication.OPS_COLUMNS that a trace gives, plus
    host_ts, host_pid, host_tid (where it was issued) and named (a torch.distributed op names it);
    an empty frame when the trace has none."""
    rows = _op_rows(events, world_size)
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    frame["rank"] = rank
    frame["origin"] = "trace"
    step, kept = _steps_kept(frame["host_ts"], steps, all_steps)
    frame["step"] = step
    if kept is not None:
        frame = frame[kept]
    return frame.sort_values("sort_ts", kind="stable").drop(columns="sort_ts")


def op_columns(events: pd.DataFrame, steps, all_steps, world_size) -> dict | None:
    """ops_from_events' frame as {column: list of values, in the frame's order}, `step` as a
    Series or one number, without `rank` and `origin`; None when the trace has no op. For
    callers that convert every column anyway: building that frame costs more than its data."""
    rows = _op_rows(events, world_size)
    if not rows:
        return None
    step, kept = _steps_kept(pd.Series([row["host_ts"] for row in rows]), steps, all_steps)
    positions = _sorted_positions(pd.Series([row["sort_ts"] for row in rows]), kept)
    columns = {name: [rows[i][name] for i in positions] for name in rows[0] if name != "sort_ts"}
    columns["step"] = step.take(positions) if isinstance(step, pd.Series) else step
    return columns


def _sorted_positions(sort_ts: pd.Series, kept) -> np.ndarray:
    """The positions of the kept rows (all for None) in sort_values(kind="stable")'s order:
    through NumPy's stable sort (NaN last, as pandas puts it) on numbers."""
    if sort_ts.dtype.kind not in "iuf":
        return (sort_ts[kept] if kept is not None else sort_ts).sort_values(
            kind="stable").index.to_numpy()
    positions = np.flatnonzero(kept) if kept is not None else np.arange(len(sort_ts))
    return positions[np.argsort(sort_ts.to_numpy()[positions], kind="stable")]


def _steps_kept(host_ts: pd.Series, steps, all_steps):
    """(step of each op, which ops stay: None for all)."""
    has_all = isinstance(all_steps, pd.DataFrame) and not all_steps.empty
    has_selected = isinstance(steps, pd.DataFrame) and not steps.empty
    if not (has_all or has_selected):
        # A trace without ProfilerStep is analysed as one window, which the breakdown numbers
        # -1 (analysis.steps.WHOLE_TRACE_STEP).
        return WHOLE_TRACE_STEP, None
    times_ns = host_ts.to_numpy(dtype="float64")
    values, inside = _step_numbers(times_ns, all_steps if has_all else steps)
    step = pd.Series(pd.arrays.IntegerArray(values, ~inside), index=range(len(times_ns)))
    if not (has_all and has_selected):
        return step, None
    # Ops issued in ProfilerSteps left out of the selection go; ops issued outside every step
    # (before the first, after the last) stay, with no step.
    wanted = steps["step"]
    wanted = (wanted.to_numpy() if wanted.dtype == np.dtype("int64")
              else pd.to_numeric(wanted, errors="coerce").dropna().astype(int).to_numpy())
    return step, ~inside | np.isin(values, wanted)


def _op_rows(events: pd.DataFrame, world_size) -> list[dict]:
    """The op rows (_row_from_args) of the events, kernels first, then gloo ops, then calls
    whose execution the trace lacks."""
    if any(c not in events.columns for c in REQUIRED_EVENT_COLUMNS):
        return []
    found = _comm_events(events)
    if found is None:
        return []
    comm, is_gpu, kernels, host = found
    calls, gloo, hints = _host_ops(comm, host)
    rows: list[dict] = []
    used_calls: set = set()
    rows += _kernel_ops(events, is_gpu, comm, kernels, calls, hints, used_calls, world_size)
    if gloo:
        rows += _gloo_ops(_with_ops(comm, gloo), _with_ops(comm, calls), used_calls, world_size)
    for position, op in calls:
        if comm.labels[position] not in used_calls:
            # Issued but its execution is not in the trace (outside the window, or a CPU-only
            # profile of a GPU run): the bytes are known, the time is not.
            call = comm.record(position, op)
            rows.append(_row_from_args(call, op, call, duration_us=float("nan"),
                                       issued_by=call))
    return rows


class _CommEvents:
    """The communication events' columns as Python values, addressed by position: there are
    few of them, and a pandas call per selection costs more than walking them."""

    def __init__(self, events: pd.DataFrame, rows: np.ndarray):
        self.events, self.rows = events, rows
        self.labels = events.index.to_numpy()[rows]
        self.present = [c for c in _ROW_COLUMNS if c in events.columns]
        # Column by column, from the rows: taking the rows of every column costs more.
        self.values = {c: list_at(events[c], rows) for c in self.present}
        self.starts = values_at(events["ts_ns"], rows, "int64")
        self.durations = values_at(events["dur_ns"], rows, "int64")
        correlation = events["correlation"] if "correlation" in events.columns else None
        if correlation is not None and is_numpy_number(correlation):
            self.correlation = correlation.to_numpy()[rows].astype("float64")
        else:
            self.correlation = pd.to_numeric(col(self.frame, "correlation"),
                                             errors="coerce").to_numpy("float64")

    @functools.cached_property
    def frame(self) -> pd.DataFrame:
        """The events' rows, every column."""
        return self.events.take(self.rows)

    def record(self, position, op=None) -> dict:
        """{column: value} of one event, with its op when it has one."""
        row = {c: self.values[c][position] for c in self.present}
        if op is not None:
            row["op"] = op
        return row

    def innermost(self, chosen: list[tuple[int, str]], pids, tids, times) -> np.ndarray:
        """innermost_among the chosen events."""
        positions = [position for position, _ in chosen]
        return innermost_among(
            thread_keys([self.values["pid"][i] for i in positions],
                         [self.values["tid"][i] for i in positions]),
            self.starts[positions].astype("float64"), self.durations[positions].astype("float64"),
            self.labels[positions], pids, tids, times)


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


def _host_ops(comm: _CommEvents, host: np.ndarray):
    """(calls, gloo ops, hints) among the host communication events at positions `host`, each
    a list of (position, op): record_param_comms calls that name their collective, gloo:* ops,
    and the nccl:*/c10d:: ops whose name gives the collective."""
    op_of = functools.lru_cache(maxsize=None)(canonical_op)  # a trace repeats a few names
    event_names = comm.values["name"]
    collectives = comm.values.get("collective")
    calls, gloo, hints = [], [], []
    for position in host.tolist():
        name = str(event_names[position])
        if name == "record_param_comms":
            call_op = op_of(collectives[position] if collectives is not None else None)
            if call_op is not None:
                calls.append((position, call_op))
        elif (name_op := op_of(name)) is not None:
            (gloo if name.startswith("gloo:") else hints).append((position, name_op))
    return calls, gloo, hints


def _ops_series(comm: _CommEvents, chosen: list[tuple[int, str]]) -> pd.Series:
    return pd.Series([op for _, op in chosen], index=comm.labels[[p for p, _ in chosen]],
                     dtype=None if chosen else object)


def _with_ops(comm: _CommEvents, chosen: list[tuple[int, str]]) -> pd.DataFrame:
    """The chosen events' rows, with their op in an `op` column."""
    return comm.frame.take([p for p, _ in chosen]).assign(op=_ops_series(comm, chosen))


def kernel_host_ops(events: pd.DataFrame) -> pd.DataFrame:
    """Per communication kernel of `events` (indexed by its label): `host`, the label of the
    host op around its launch that names it (the innermost record_param_comms call with a
    collective name, else the innermost nccl:*/c10d:: op), -1 where none, and that op's `op`.

    The join is _kernel_ops': kernel -> runtime launch with the same correlation id -> the
    launching thread's op whose span holds the launch."""
    found = (None if any(c not in events.columns for c in REQUIRED_EVENT_COLUMNS)
             else _comm_events(events))
    if found is None:
        return pd.DataFrame({"host": pd.Series(dtype="int64"), "op": pd.Series(dtype=object)})
    comm, is_gpu, kernels, host_rows = found
    calls, _, hints = _host_ops(comm, host_rows)
    launch_ts, launch_pid, launch_tid = _launches(events, is_gpu, comm.correlation[kernels])
    call_of = comm.innermost(calls, launch_pid, launch_tid, launch_ts)
    hint_of = comm.innermost(hints, launch_pid, launch_tid, launch_ts)
    host = np.where(call_of >= 0, call_of, hint_of)
    ops = pd.concat([_ops_series(comm, calls), _ops_series(comm, hints)])
    ops = ops[~ops.index.duplicated()]
    op = ops.reindex(host).to_numpy() if len(ops) else np.full(len(host), None)
    return pd.DataFrame({"host": host, "op": op}, index=comm.frame.index[kernels])


def _launches(events, is_gpu, kernel_corr) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, pid, tid) of the runtime launch of each kernel, given by its correlation id
    (NaN/None where not found): the first runtime or driver event with that id."""
    correlation = pd.to_numeric(col(events, "correlation"), errors="coerce").to_numpy("float64")
    # Only the launches of these kernels matter: the category test runs on those alone.
    launches = np.flatnonzero(np.isin(correlation, kernel_corr) & (correlation >= 0)
                              & ~np.asarray(is_gpu, dtype=bool))
    launches = launches[text_matches(events["cat"], ("runtime", "driver"), launches)]
    # The first launch of each correlation id, sorted by id for the lookup below.
    launch_corr, first = np.unique(correlation[launches], return_index=True)
    launches = launches[first]
    if len(launch_corr):
        at = np.minimum(np.searchsorted(launch_corr, kernel_corr), len(launch_corr) - 1)
        found = launch_corr[at] == kernel_corr
        rows_of = launches[at]
    else:
        found = np.zeros(len(kernel_corr), dtype=bool)
        rows_of = np.zeros(len(kernel_corr), dtype=np.int64)  # any row: `found` masks it
    launch_ts = np.where(found, events["ts_ns"].to_numpy("float64")[rows_of], np.nan)
    launch_pid = np.where(found, texts(events["pid"], rows_of), None)
    launch_tid = np.where(found, texts(events["tid"], rows_of), None)
    return launch_ts, launch_pid, launch_tid


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
        "source": "p2p" if op in ("send", "recv") else None,
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
    if row is None:
        return None
    value = row.get(name) if hasattr(row, "get") else None
    if value is None:
        return None
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return value


def _kernel_ops(events, is_gpu, comm: _CommEvents, kernels, calls, hints, used_calls: set,
                world_size) -> list[dict]:
    """NCCL/RCCL kernels (positions `kernels` in `comm`), each joined to the record_param_comms
    call that launched it.

    The join: kernel -> runtime launch with the same correlation id -> the innermost call on
    the launching thread whose span holds the launch. Bytes come from the call, time from the
    kernel(s); several kernels of one call are one op timed by the union of their spans. A
    kernel with no call takes its size from its own args, else from the innermost nccl:*/c10d::
    op around its launch ("In msg nelems", else "Input Dims" and "Input type", as on gloo).
    """
    if not len(kernels):
        return []
    launch_ts, launch_pid, launch_tid = _launches(events, is_gpu, comm.correlation[kernels])
    call_of = comm.innermost(calls, launch_pid, launch_tid, launch_ts)
    hint_of = comm.innermost(hints, launch_pid, launch_tid, launch_ts)
    keys = np.where(call_of >= 0, call_of, -1 - comm.labels[kernels].astype(np.int64))
    starts = comm.starts[kernels]
    ends = starts + comm.durations[kernels]
    call_at = {comm.labels[position]: (position, op) for position, op in calls}
    hint_at = {comm.labels[position]: (position, op) for position, op in hints}

    # One op per call, in the order of its first kernel; a kernel without a call is one op.
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    by_group = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[by_group], np.arange(len(first) + 1))
    groups = np.argsort(first, kind="stable")
    heads = by_group[bounds[groups]]
    group_starts = np.minimum.reduceat(starts[by_group], bounds[:-1]) if len(first) else starts
    sizes = np.diff(bounds)
    rows = []
    for group, head in zip(groups, heads):
        first_kernel = comm.record(kernels[head])
        first_kernel["name"] = str(first_kernel["name"])
        if sizes[group] > 1:
            members = by_group[bounds[group]:bounds[group + 1]]
            duration_us = intervals.total(starts[members], ends[members]) / 1e3
        else:
            duration_us = int(ends[head] - starts[head]) / 1e3
        kernel_ts = int(group_starts[group])
        if call_of[head] >= 0:
            call = comm.record(*call_at[call_of[head]])
            used_calls.add(call_of[head])
            # Newer kernels carry the group in their own args; older calls carry it only on the
            # host.
            pg_source = call if _col_value(call, "group_size") is not None else first_kernel
            rows.append(_row_from_args(call, call["op"], pg_source, duration_us, call,
                                       sort_ts=kernel_ts))
            continue
        members = by_group[bounds[group]:bounds[group + 1]]
        launched = members[~np.isnan(launch_ts[members])]
        issued_by = ({"ts_ns": launch_ts[launched[0]], "pid": launch_pid[launched[0]],
                      "tid": launch_tid[launched[0]]} if len(launched) else
                     {"ts_ns": kernel_ts, "pid": first_kernel["pid"], "tid": first_kernel["tid"]})
        hint = comm.record(*hint_at[hint_of[head]]) if hint_of[head] >= 0 else None
        op = (canonical_op(_col_value(first_kernel, "collective"))
              or (hint["op"] if hint is not None else None)
              or comm_kernel_op(first_kernel["name"]) or UNKNOWN_OP)
        if hint is None or _has_counts(first_kernel):
            rows.append(_row_from_args(first_kernel, op, first_kernel, duration_us, issued_by,
                                       sort_ts=kernel_ts, named=hint is not None))
        else:
            rows.append(_hint_row(hint, op, first_kernel, duration_us, issued_by, kernel_ts,
                                  world_size))
    return rows


def _has_counts(event) -> bool:
    return (_col_value(event, "in_nelems") is not None
            or _col_value(event, "out_nelems") is not None)


def _hint_row(hint, op, kernel, duration_us, issued_by, kernel_ts, world_size) -> dict:
    """A kernel sized by the nccl:*/c10d:: op around its launch: that op's message counts when it
    has them, else its first input's "Input Dims" and "Input type"; without a group size the
    trace's world size stands in (right only for the default group)."""
    pg_source = hint if _col_value(hint, "group_size") is not None else kernel
    if _has_counts(hint):
        return _row_from_args(hint, op, pg_source, duration_us, issued_by, sort_ts=kernel_ts,
                              world_size=world_size)
    dtype_source = hint
    if _col_value(hint, "comm_dtype") is None:
        dtype_source = {"comm_dtype": first_input_type(_col_value(hint, "input_type"))}
    nelems = first_tensor_nelems(_col_value(hint, "input_dims"))
    return _row_from_args(hint, op, pg_source, duration_us, issued_by, sort_ts=kernel_ts,
                          dtype_source=dtype_source, nelems=nelems, world_size=world_size)


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


def _step_numbers(times_ns: np.ndarray, steps) -> tuple[np.ndarray, np.ndarray]:
    """(the ProfilerStep whose [start, end) holds each time, whether it is inside one): the
    number is 0 outside every step."""
    values = np.zeros(len(times_ns), dtype="int64")
    inside = np.zeros(len(times_ns), dtype=bool)
    if (isinstance(steps, pd.DataFrame) and not steps.empty and len(times_ns)
            and all(c in steps.columns for c in ("step", "start_ns", "end_ns"))):
        numbers, starts, ends = _step_spans(steps)
        found = step_at(times_ns, starts, ends, numbers.astype("float64"))
        inside = ~np.isnan(found)
        values[inside] = found[inside].astype("int64")
    return values, inside


def _step_spans(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(number, start, end) of the steps with all three known, by start: the order of
    steps.dropna().sort_values("start_ns"), taken with NumPy where the columns are plain
    numbers (pandas' calls cost more than a few steps)."""
    arrays = [steps[c].to_numpy() for c in ("step", "start_ns", "end_ns")]
    if all(a.dtype.kind in "iuf" for a in arrays):
        known = ~np.logical_or.reduce([pd.isna(a) for a in arrays])
        order = arrays[1][known].argsort(kind="quicksort")  # sort_values' default
        numbers, starts, ends = (a[known][order] for a in arrays)
    else:
        ordered = steps.dropna(subset=["step", "start_ns", "end_ns"]).sort_values("start_ns")
        numbers, starts, ends = (ordered[c].to_numpy() for c in ("step", "start_ns", "end_ns"))
    return numbers, starts.astype("float64"), ends.astype("float64")

"""Communication ops derived from a Kineto trace's events (docs/report.md, "Where ops come from").

A kernel is joined to the call that launched it through its runtime launch's correlation id; a
gloo op to the call of the same op and element count. Each op keeps the host thread and time it
was issued at, from which `analysis.issuers` tells who issued it.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from analysis import intervals
from analysis.comm_names import (
    _DTYPE_SIZES,
    UNKNOWN_OP,
    canonical_dtype,
    canonical_op,
    comm_kernel_op,
    message_bytes,
)
from analysis.steps import WHOLE_TRACE_STEP

REQUIRED_EVENT_COLUMNS = ("name", "cat", "ts_ns", "dur_ns", "pid", "tid", "is_gpu", "is_comm")
# The events' columns an op row is made from (_row_from_args).
_ARG_COLUMNS = ("collective", "group_size", "comm_dtype", "in_nelems", "out_nelems", "pg_name",
                "pg_desc", "input_dims", "input_type")
# Queries _innermost steps back through together before it walks the rest one by one.
_VECTOR_STEPS = 64


def col(frame: pd.DataFrame, name: str):
    if name in frame.columns:
        return frame[name]
    return pd.Series([None] * len(frame), index=frame.index)


def ops_from_events(events: pd.DataFrame, steps, all_steps, rank, world_size) -> pd.DataFrame:
    """One row per op with the columns of communication.OPS_COLUMNS that a trace gives, plus
    host_ts, host_pid, host_tid (where it was issued) and named (a torch.distributed op names it);
    an empty frame when the trace has none."""
    if any(c not in events.columns for c in REQUIRED_EVENT_COLUMNS):
        return pd.DataFrame()
    is_comm = events["is_comm"].fillna(False).astype(bool)
    is_gpu = events["is_gpu"].fillna(False).astype(bool)
    comm = events[is_comm]
    if comm.empty:
        return pd.DataFrame()
    kernels = comm[is_gpu[is_comm]]
    calls, gloo, hints = _host_ops(comm[~is_gpu[is_comm]])

    rows: list[dict] = []
    used_calls: set = set()
    rows += _kernel_ops(events, is_gpu, kernels, calls, hints, used_calls, world_size)
    rows += _gloo_ops(gloo, calls, used_calls, world_size)
    unused = calls[~calls.index.isin(list(used_calls))]
    for call in _records(unused, _ARG_COLUMNS + ("op", "ts_ns", "pid", "tid")).values():
        # Issued but its execution is not in the trace (outside the window, or a CPU-only
        # profile of a GPU run): the bytes are known, the time is not.
        rows.append(_row_from_args(call, call["op"], call, duration_us=float("nan"),
                                   issued_by=call))
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    frame["rank"] = rank
    frame["origin"] = "trace"
    host_ts = frame["host_ts"].to_numpy(dtype="float64")
    has_all = isinstance(all_steps, pd.DataFrame) and not all_steps.empty
    has_selected = isinstance(steps, pd.DataFrame) and not steps.empty
    if has_all or has_selected:
        frame["step"] = _steps_of(host_ts, all_steps if has_all else steps)
        if has_all and has_selected:
            # Ops issued in ProfilerSteps left out of the selection go; ops issued outside
            # every step (before the first, after the last) stay, with no step.
            wanted = set(pd.to_numeric(steps["step"], errors="coerce").dropna().astype(int))
            frame = frame[frame["step"].isna() | frame["step"].isin(wanted)]
    else:
        # A trace without ProfilerStep is analysed as one window, which the breakdown numbers
        # -1 (analysis.steps.WHOLE_TRACE_STEP).
        frame["step"] = WHOLE_TRACE_STEP
    return frame.sort_values("sort_ts", kind="stable").drop(columns="sort_ts")


def _host_ops(host: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(calls, gloo ops, hints) among host communication events, each with an `op` column:
    record_param_comms calls that name their collective, gloo:* ops, and the nccl:*/c10d::
    ops whose name gives the collective."""
    # Plain str objects: pandas' own string dtype is slow to walk value by value.
    names = pd.Series([str(name) for name in host["name"]], index=host.index, dtype=object)
    call_op = _map_memoised(col(host, "collective"), canonical_op)
    is_call = (names == "record_param_comms") & call_op.notna()
    calls = host[is_call].assign(op=call_op[is_call])
    is_gloo = names.str.startswith("gloo:")
    gloo = host[is_gloo].assign(op=_map_memoised(names[is_gloo], canonical_op))
    gloo = gloo[gloo["op"].notna()]
    hint_op = _map_memoised(names, canonical_op)
    is_hint = ~is_gloo & (names != "record_param_comms") & hint_op.notna()
    hints = host[is_hint].assign(op=hint_op[is_hint])
    return calls, gloo, hints


def kernel_host_ops(events: pd.DataFrame) -> pd.DataFrame:
    """Per communication kernel of `events` (indexed by its label): `host`, the label of the
    host op around its launch that names it (the innermost record_param_comms call with a
    collective name, else the innermost nccl:*/c10d:: op), -1 where none, and that op's `op`.

    The join is _kernel_ops': kernel -> runtime launch with the same correlation id -> the
    launching thread's op whose span holds the launch."""
    if any(c not in events.columns for c in REQUIRED_EVENT_COLUMNS):
        return pd.DataFrame({"host": pd.Series(dtype="int64"), "op": pd.Series(dtype=object)})
    is_comm = events["is_comm"].fillna(False).astype(bool)
    is_gpu = events["is_gpu"].fillna(False).astype(bool)
    kernels = events[is_comm & is_gpu]
    calls, _, hints = _host_ops(events[is_comm & ~is_gpu])
    launch_ts, launch_pid, launch_tid = _launches(events, is_gpu, kernels)
    call_of = _innermost(calls, launch_pid, launch_tid, launch_ts)
    hint_of = _innermost(hints, launch_pid, launch_tid, launch_ts)
    host = np.where(call_of >= 0, call_of, hint_of)
    ops = pd.concat([calls["op"], hints["op"]])
    ops = ops[~ops.index.duplicated()]
    op = ops.reindex(host).to_numpy() if len(ops) else np.full(len(host), None)
    return pd.DataFrame({"host": host, "op": op}, index=kernels.index)


def _launches(events, is_gpu, kernels) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(time, pid, tid) of the runtime launch of each kernel (NaN/None where not found): the
    first runtime or driver event with the kernel's correlation id."""
    is_launch = ~is_gpu & _text_matches(events["cat"], ("runtime", "driver"))
    correlation = pd.to_numeric(col(events, "correlation"), errors="coerce").to_numpy("float64")
    launches = np.flatnonzero(np.asarray(is_launch) & (correlation >= 0))
    # The first launch of each correlation id, sorted by id for the lookup below.
    launch_corr, first = np.unique(correlation[launches], return_index=True)
    launches = launches[first]
    kernel_corr = pd.to_numeric(col(kernels, "correlation"), errors="coerce").to_numpy("float64")
    if len(launch_corr):
        at = np.minimum(np.searchsorted(launch_corr, kernel_corr), len(launch_corr) - 1)
        found = launch_corr[at] == kernel_corr
        rows_of = launches[at]
    else:
        found = np.zeros(len(kernels), dtype=bool)
        rows_of = np.zeros(len(kernels), dtype=np.int64)  # any row: `found` masks it
    launch_ts = np.where(found, events["ts_ns"].to_numpy("float64")[rows_of], np.nan)
    launch_pid = np.where(found, _texts(events["pid"], rows_of), None)
    launch_tid = np.where(found, _texts(events["tid"], rows_of), None)
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


def _map_memoised(values: pd.Series, function) -> pd.Series:
    """values.map(function), calling `function` once per distinct value: a trace repeats a few
    hundred names over thousands of events."""
    seen: dict = {}

    def once(value):
        if value not in seen:
            seen[value] = function(value)
        return seen[value]

    return values.map(once)


def _text_matches(column: pd.Series, parts) -> np.ndarray:
    """Whether each value, as text, contains any of `parts`; decided once per category of a
    categorical column."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        wanted = [any(p in str(c) for p in parts) for c in column.cat.categories]
        # Code -1 (a missing value) picks the last entry: no match.
        return np.array(wanted + [False])[column.cat.codes.to_numpy()]
    text = column.astype(str)
    return np.asarray(np.logical_or.reduce([text.str.contains(p, regex=False) for p in parts]))


def _records(frame: pd.DataFrame, columns) -> dict:
    """{index label: {column: Python value}} for the `columns` that `frame` has: the rows as
    DataFrame.to_dict("index") gives them, built a column at a time (to_dict boxes cell by
    cell)."""
    present = [c for c in columns if c in frame.columns]
    values = zip(*(frame[c].tolist() for c in present)) if present else ({} for _ in frame.index)
    return {label: dict(zip(present, row)) for label, row in zip(frame.index, values)}


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


def _kernel_ops(events, is_gpu, kernels, calls, hints, used_calls: set, world_size) -> list[dict]:
    """NCCL/RCCL kernels, each joined to the record_param_comms call that launched it.

    The join: kernel -> runtime launch with the same correlation id -> the innermost call on
    the launching thread whose span holds the launch. Bytes come from the call, time from the
    kernel(s); several kernels of one call are one op timed by the union of their spans. A
    kernel with no call takes its size from its own args, else from the innermost nccl:*/c10d::
    op around its launch ("In msg nelems", else "Input Dims" and "Input type", as on gloo).
    """
    if kernels.empty:
        return []
    launch_ts, launch_pid, launch_tid = _launches(events, is_gpu, kernels)
    call_of = _innermost(calls, launch_pid, launch_tid, launch_ts)
    hint_of = _innermost(hints, launch_pid, launch_tid, launch_ts)
    keys = np.where(call_of >= 0, call_of, -1 - kernels.index.to_numpy(dtype=np.int64))
    starts = kernels["ts_ns"].to_numpy(dtype="int64")
    ends = starts + kernels["dur_ns"].to_numpy(dtype="int64")

    # One op per call, in the order of its first kernel; a kernel without a call is one op.
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    by_group = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[by_group], np.arange(len(first) + 1))
    groups = np.argsort(first, kind="stable")
    heads = by_group[bounds[groups]]
    kernel_rows = _records(kernels.iloc[heads], _ARG_COLUMNS + ("name", "ts_ns", "pid", "tid"))
    used = np.unique(call_of[heads][call_of[heads] >= 0])
    call_rows = _records(calls.loc[used], _ARG_COLUMNS + ("op", "ts_ns", "pid", "tid"))
    hinted = np.unique(hint_of[heads][(call_of[heads] < 0) & (hint_of[heads] >= 0)])
    hint_rows = _records(hints.loc[hinted], _ARG_COLUMNS + ("op", "ts_ns", "pid", "tid"))
    group_starts = np.minimum.reduceat(starts[by_group], bounds[:-1]) if len(first) else starts
    sizes = np.diff(bounds)
    rows = []
    for group, head, first_kernel in zip(groups, heads, kernel_rows.values()):
        first_kernel["name"] = str(first_kernel["name"])
        if sizes[group] > 1:
            members = by_group[bounds[group]:bounds[group + 1]]
            duration_us = intervals.total(starts[members], ends[members]) / 1e3
        else:
            duration_us = int(ends[head] - starts[head]) / 1e3
        kernel_ts = int(group_starts[group])
        if call_of[head] >= 0:
            call = call_rows[call_of[head]]
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
        hint = hint_rows.get(hint_of[head]) if hint_of[head] >= 0 else None
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
        dtype_source = {"comm_dtype": _first_input_type(_col_value(hint, "input_type"))}
    nelems = _first_tensor_nelems(_col_value(hint, "input_dims"))
    return _row_from_args(hint, op, pg_source, duration_us, issued_by, sort_ts=kernel_ts,
                          dtype_source=dtype_source, nelems=nelems, world_size=world_size)


def _texts(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """str() of the column's values at the positions `rows`, as an object array."""
    if not len(rows):
        return np.zeros(0, dtype=object)
    return np.array([str(v) for v in np.asarray(column.iloc[rows], dtype=object)], dtype=object)


def _thread_keys(pids, tids) -> np.ndarray:
    return np.array([f"{p}\0{t}" for p, t in zip(pids, tids)], dtype=object)


def _innermost(candidates: pd.DataFrame, pids, tids, times) -> np.ndarray:
    """Per query (pid, tid, time): the index label of the latest-starting candidate on that
    thread whose span holds the time (the first such in frame order on ties), else -1."""
    result = np.full(len(times), -1, dtype=np.int64)
    if candidates is None or candidates.empty or not len(times):
        return result
    query_thread = _thread_keys(pids, tids)
    query_ts = np.asarray(times, dtype="float64")
    thread = _thread_keys(candidates["pid"].to_numpy(), candidates["tid"].to_numpy())
    all_starts = candidates["ts_ns"].to_numpy(dtype="float64")
    all_durations = candidates["dur_ns"].to_numpy(dtype="float64")
    all_labels = candidates.index.to_numpy()
    for key in pd.unique(thread):
        where = np.flatnonzero(query_thread == key)
        if not len(where):
            continue
        mine = np.flatnonzero(thread == key)
        starts = all_starts[mine]
        order = np.lexsort((-np.arange(len(starts)), starts))
        starts = starts[order]
        ends = starts + all_durations[mine][order]
        labels = all_labels[mine][order]
        positions = np.searchsorted(starts, query_ts[where], side="right") - 1
        result[where] = _innermost_on_thread(starts, ends, labels, positions, query_ts[where])
    return result


def _innermost_on_thread(starts, ends, labels, positions, times) -> np.ndarray:
    """Walks back from each query's last candidate starting at or before its time to the first
    whose span holds it, every query one step at a time together; the few still walking after
    _VECTOR_STEPS steps (deeply overlapping spans) finish one by one."""
    found = np.full(len(times), -1, dtype=np.int64)
    # No candidate at or before j holds t once the latest end among them is before t.
    latest_end = np.maximum.accumulate(ends)
    walking = np.flatnonzero(positions >= 0)
    j = positions[walking]
    for _ in range(_VECTOR_STEPS):
        if not len(walking):
            return found
        t = times[walking]
        going = latest_end[j] >= t
        holds = going & (ends[j] >= t)
        found[walking[holds]] = labels[j[holds]]
        keep = going & ~holds & (j > 0)
        walking, j = walking[keep], j[keep] - 1
    for q, at in zip(walking, j):
        t = times[q]
        while at >= 0 and latest_end[at] >= t:
            if ends[at] >= t:
                found[q] = labels[at]
                break
            at -= 1
    return found


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
        nelems = _first_tensor_nelems(_col_value(op_event, "input_dims"))
        dtype_source = op_event
        if _col_value(op_event, "comm_dtype") is None:
            first_type = _first_input_type(_col_value(op_event, "input_type"))
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


def _first_tensor_nelems(dims_text) -> float | None:
    if dims_text is None:
        return None
    try:
        dims = json.loads(dims_text) if isinstance(dims_text, str) else dims_text
    except ValueError:
        return None
    if not isinstance(dims, list) or not dims:
        return None
    first = dims[0]
    if isinstance(first, list) and first and all(isinstance(d, list) for d in first):
        return float(sum(math.prod(d) for d in first))  # a TensorList
    if isinstance(first, list) and all(isinstance(d, (int, float)) for d in first):
        return float(math.prod(first)) if first else None
    return None


def _first_input_type(types_text):
    if types_text is None:
        return None
    try:
        types = json.loads(types_text) if isinstance(types_text, str) else types_text
    except ValueError:
        return types_text if isinstance(types_text, str) else None
    if isinstance(types, list):
        return types[0] if types and isinstance(types[0], str) else None
    return types if isinstance(types, str) else None


def _steps_of(times_ns: np.ndarray, steps) -> pd.Series:
    """The ProfilerStep whose [start, end) holds each time, NA outside every step."""
    result = pd.Series(pd.NA, index=range(len(times_ns)), dtype="Int64")
    if not isinstance(steps, pd.DataFrame) or steps.empty or not len(times_ns):
        return result
    if any(c not in steps.columns for c in ("step", "start_ns", "end_ns")):
        return result
    ordered = steps.dropna(subset=["step", "start_ns", "end_ns"]).sort_values("start_ns")
    starts = ordered["start_ns"].to_numpy(dtype="float64")
    ends = ordered["end_ns"].to_numpy(dtype="float64")
    numbers = ordered["step"].to_numpy()
    position = np.searchsorted(starts, times_ns, side="right") - 1
    inside = (position >= 0) & ~np.isnan(times_ns)
    inside[inside] = times_ns[inside] < ends[position[inside]]
    values = np.where(inside, numbers[np.clip(position, 0, None)] if len(numbers) else 0, 0)
    result[inside] = values[inside].astype("int64")
    return result

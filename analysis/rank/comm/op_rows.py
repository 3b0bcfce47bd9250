"""One op row built from a trace event's communication arguments (docs/report.md, "Where ops
come from"): a call whose execution the trace lacks, and gloo ops, joined to their calls row by
row (analysis.rank.comm.event_ops builds kernels' ops by column)."""

from __future__ import annotations

import pandas as pd

from analysis.core.comm_names import (
    _DTYPE_SIZES,
    P2P_OPS,
    canonical_dtype,
    first_input_type,
    first_tensor_nelems,
    message_bytes,
)
from analysis.core.frame_columns import value_or_none


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

"""Collective and p2p ops per rank, and the collectives table (definitions in docs/report.md).

`comm_ops(trace)` gives one row per op on one rank: from the tracer's comm records when the run
folder has them, else from the Kineto trace's events. `collectives_table(ops)` groups ops by op,
process group and power-of-two message-size bucket. Bandwidths follow nccl-tests through
`tracer.schema.bandwidth_gbps`; bytes are nccl-tests' size S (see `tracer.schema.CommRecord`).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from analysis import intervals
from analysis.load import WHOLE_TRACE_STEP
from tracer import schema

OPS_COLUMNS = [
    "rank", "step", "op", "source", "pg", "pg_size", "dtype", "bytes", "duration_us",
    "algbw_gbps", "busbw_gbps", "origin",
]
COLLECTIVES_COLUMNS = [
    "op", "pg", "pg_size", "size_bucket", "bucket_min_bytes", "count", "total_bytes", "total_us",
    "mean_us", "algbw_gbps", "busbw_gbps", "ranks", "rank_steps", "slowest_rank",
    "slowest_rank_busbw_gbps",
]
# A communication kernel whose collective neither it nor its host side names (e.g. an NCCL
# SendRecv kernel, which serves send, recv and all_to_all alike, launched without
# record_param_comms): its time still counts as communication.
UNKNOWN_OP = "other"
UNKNOWN_PG = "unknown"
UNKNOWN_BUCKET = "unknown"

# ---- names ---------------------------------------------------------------------------------------
# Torch spells one collective many ways: record_param_comms' "Collective name" (allreduce,
# _allgather_base, allgather_into_tensor_coalesced, ...), op names (c10d::allreduce_,
# nccl:all_reduce, gloo:all_gather) and kernel names (ncclDevKernel_AllGather_RING_LL). With the
# prefix and underscores gone, each starts with one of these stems; longer stems come first so
# that "reducescatter" is not read as "reduce" nor "allgather" as "gather".
_OP_STEMS = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("sendrecv", None),  # NCCL's SendRecv kernel: send, recv or all_to_all, the kernel can't tell
    ("send", "send"),
    ("recv", "recv"),
    ("barrier", "barrier"),
)
_NAME_PREFIX_RE = re.compile(
    r"^(?:c10d::|c10d_functional::|_c10d_functional::|nccl:|gloo:|mpi:|ucc:|"
    r"ncclDevKernel_|ncclKernel_|rcclKernel_?|rcclDevKernel_)",
    re.IGNORECASE,
)


def canonical_op(name) -> str | None:
    """The schema op (one of schema.COMM_OPS) that a torch/NCCL/gloo name stands for, else None.

    None also for names that move no tensor of their own, such as "wait" or "coalesced".
    """
    if not isinstance(name, str) or not name:
        return None
    text = _NAME_PREFIX_RE.sub("", name.strip())
    text = text.split("(")[0].replace("_", "").lower()
    if text.startswith("coalesced") or text.startswith("wait"):
        return None
    for stem, op in _OP_STEMS:
        if text.startswith(stem):
            return op
    return None


# Element sizes in bytes, keyed by every spelling a trace or record uses: torch names
# ("float32"), c10 ScalarType names in record_param_comms ("Float", "BFloat16") and the C++
# type names in gloo ops' "Input type" ("float", "c10::BFloat16", "long int").
_DTYPE_SIZES = {
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "complex32": 4, "complex64": 8,
    "complex128": 16, "uint8": 1, "int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1, "qint8": 1, "quint8": 1,
    "qint32": 4, "quint4x2": 1, "quint2x4": 1,
}
_DTYPE_ALIASES = {
    # c10 ScalarType names
    "float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16",
    "byte": "uint8", "char": "int8", "short": "int16", "int": "int32", "long": "int64",
    "bool": "bool", "complexhalf": "complex32", "complexfloat": "complex64",
    "complexdouble": "complex128", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    # C++ type names
    "c10::half": "float16", "c10::bfloat16": "bfloat16", "long int": "int64",
    "long long": "int64", "int64_t": "int64", "short int": "int16", "signed char": "int8",
    "unsigned char": "uint8", "c10::complex<float>": "complex64",
    "c10::complex<double>": "complex128", "c10::complex<c10::half>": "complex32",
    "c10::float8_e4m3fn": "float8_e4m3fn", "c10::float8_e5m2": "float8_e5m2",
}


def canonical_dtype(name) -> str | None:
    """The torch dtype name (without "torch.") for any spelling above, else None."""
    if not isinstance(name, str) or not name:
        return None
    text = name.strip()
    if text.startswith("torch."):
        text = text[len("torch."):]
    if text in _DTYPE_SIZES:
        return text
    lowered = text.lower()
    if lowered in _DTYPE_SIZES:
        return lowered
    return _DTYPE_ALIASES.get(lowered)


def dtype_size(name) -> int | None:
    dtype = canonical_dtype(name)
    return _DTYPE_SIZES.get(dtype) if dtype else None


def _positive(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def message_bytes(op, in_nelems, out_nelems, element_size, group_size) -> float:
    """nccl-tests' size S in bytes for one op, from its element counts; NaN when unknown.

    all_gather: the gathered output; reduce_scatter: the full input; all_to_all: all one rank
    sends; gather: the gathered output; scatter: the full input; barrier: 0; the rest: the tensor.
    When the count S needs is missing, the other side times the group size stands in for it.
    """
    if op == "barrier":
        return 0.0
    size = _positive(element_size)
    if size is None:
        return float("nan")
    n_in, n_out, n = _positive(in_nelems), _positive(out_nelems), _positive(group_size)
    if op in ("all_gather", "gather"):
        nelems = n_out if n_out is not None else (n_in * n if n_in and n else None)
    elif op in ("reduce_scatter", "scatter"):
        nelems = n_in if n_in is not None else (n_out * n if n_out and n else None)
    elif op == "recv":
        nelems = n_out if n_out is not None else n_in
    else:
        nelems = n_in if n_in is not None else n_out
    if nelems is None:
        # A zero-element op still moved nothing; only a missing count is unknown.
        zero_in = _is_zero(in_nelems) and (_is_zero(out_nelems) or out_nelems is None)
        return 0.0 if zero_in else float("nan")
    return nelems * size


def _is_zero(value) -> bool:
    try:
        return float(value) == 0.0
    except (TypeError, ValueError):
        return False


def _bandwidths(op, nbytes, pg_size, duration_us) -> tuple[float, float]:
    nbytes_ok, duration_ok = _finite(nbytes), _finite(duration_us)
    if not (nbytes_ok and duration_ok):
        return float("nan"), float("nan")
    algbw, busbw = schema.bandwidth_gbps(op, int(round(nbytes)), 1, duration_us / 1e6)
    if not _finite(pg_size) or pg_size < 1:
        return algbw, float("nan")
    return algbw, algbw * schema.bus_factor(op, int(pg_size))


def _finite(value) -> bool:
    try:
        return value is not None and value is not pd.NA and math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def empty_ops() -> pd.DataFrame:
    return _typed_ops(pd.DataFrame({column: [] for column in OPS_COLUMNS}))


def _typed_ops(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.reindex(columns=OPS_COLUMNS)
    for column in ("rank", "step", "pg_size"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").round().astype("Int64")
    for column in ("bytes", "duration_us", "algbw_gbps", "busbw_gbps"):
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype("float64")
    for column in ("op", "source", "pg", "dtype", "origin"):
        frame[column] = frame[column].astype("object").where(frame[column].notna(), None)
    return frame.reset_index(drop=True)


# ---- comm_ops ------------------------------------------------------------------------------------
def comm_ops(trace) -> pd.DataFrame:
    """One row per collective/p2p op on `trace`'s rank, columns OPS_COLUMNS.

    Uses the tracer's comm records when the run folder has any for this rank (they cover every
    step); otherwise derives the ops from the trace's events.
    """
    records = getattr(trace, "records", None)
    comms = getattr(records, "comms", None) if records is not None else None
    rank = getattr(trace, "rank", None)
    if isinstance(comms, pd.DataFrame) and len(comms):
        return _ops_from_records(comms, rank)
    events = getattr(trace, "events", None)
    if not isinstance(events, pd.DataFrame) or events.empty:
        return empty_ops()
    return _ops_from_events(events, getattr(trace, "steps", None),
                            getattr(trace, "all_steps", None), rank,
                            getattr(trace, "world_size", None))


def _ops_from_records(comms: pd.DataFrame, rank) -> pd.DataFrame:
    ops = _col(comms, "op").map(
        lambda op: op if op in schema.COMM_OPS else (canonical_op(op) or UNKNOWN_OP))
    ranks = _col(comms, "rank")
    if rank is not None:
        ranks = ranks.where(ranks.notna(), rank)
    frame = pd.DataFrame({
        "rank": ranks,
        "step": _col(comms, "step"),
        "op": ops,
        "source": _col(comms, "source"),
        "pg": _col(comms, "pg").map(lambda pg: None if pg is None or pd.isna(pg) else str(pg)),
        "pg_size": _col(comms, "pg_size"),
        "dtype": _col(comms, "dtype").map(
            lambda d: canonical_dtype(d) or (d if isinstance(d, str) else None)),
        "bytes": pd.to_numeric(_col(comms, "bytes"), errors="coerce"),
        "duration_us": pd.to_numeric(_col(comms, "duration_us"), errors="coerce"),
        "origin": "records",
    })
    frame.loc[frame["duration_us"] < 0, "duration_us"] = np.nan
    frame = _typed_ops(frame)
    return _with_bandwidths(frame)


def _with_bandwidths(frame: pd.DataFrame) -> pd.DataFrame:
    pairs = [
        _bandwidths(op, nbytes, None if pd.isna(size) else int(size), duration)
        for op, nbytes, size, duration in zip(frame["op"], frame["bytes"], frame["pg_size"],
                                              frame["duration_us"])
    ]
    frame["algbw_gbps"] = [p[0] for p in pairs]
    frame["busbw_gbps"] = [p[1] for p in pairs]
    frame[["algbw_gbps", "busbw_gbps"]] = frame[["algbw_gbps", "busbw_gbps"]].astype("float64")
    return frame


_REQUIRED_EVENT_COLUMNS = ("name", "cat", "ts_ns", "dur_ns", "pid", "tid", "is_gpu", "is_comm")


def _col(frame: pd.DataFrame, name: str):
    return frame[name] if name in frame.columns else pd.Series([None] * len(frame), index=frame.index)


def _ops_from_events(events: pd.DataFrame, steps, all_steps, rank, world_size) -> pd.DataFrame:
    if any(c not in events.columns for c in _REQUIRED_EVENT_COLUMNS):
        return empty_ops()
    is_comm = events["is_comm"].fillna(False).astype(bool)
    is_gpu = events["is_gpu"].fillna(False).astype(bool)
    comm = events[is_comm]
    if comm.empty:
        return empty_ops()
    kernels = comm[is_gpu[is_comm]]
    host = comm[~is_gpu[is_comm]]
    names = host["name"].astype(str)
    call_op = _col(host, "collective").map(canonical_op)
    is_call = (names == "record_param_comms") & call_op.notna()
    calls = host[is_call].assign(op=call_op[is_call])
    is_gloo = names.str.startswith("gloo:")
    gloo = host[is_gloo].assign(op=names[is_gloo].map(canonical_op))
    gloo = gloo[gloo["op"].notna()]
    hint_op = names.map(canonical_op)
    is_hint = ~is_gloo & (names != "record_param_comms") & hint_op.notna()
    hints = host[is_hint].assign(op=hint_op[is_hint])

    rows: list[dict] = []
    used_calls: set = set()
    rows += _kernel_ops(events, is_gpu, kernels, calls, hints, used_calls)
    rows += _gloo_ops(gloo, calls, used_calls, world_size)
    for index, call in calls.iterrows():
        if index in used_calls:
            continue
        # Issued but its execution is not in the trace (outside the window, or a CPU-only
        # profile of a GPU run): the bytes are known, the time is not.
        rows.append(_row_from_args(call, call["op"], call, duration_us=float("nan"),
                                   host_ts=call["ts_ns"]))
    if not rows:
        return empty_ops()
    frame = pd.DataFrame(rows)
    frame["rank"] = rank
    frame["origin"] = "trace"
    host_ts = frame.pop("host_ts").to_numpy(dtype="float64")
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
        # -1 (analysis.load.WHOLE_TRACE_STEP).
        frame["step"] = WHOLE_TRACE_STEP
    frame = frame.sort_values("sort_ts", kind="stable").drop(columns="sort_ts")
    frame = _typed_ops(frame)
    return _with_bandwidths(frame)


def _row_from_args(size_source, op, pg_source, duration_us, host_ts, sort_ts=None,
                   dtype_source=None, nelems=None, world_size=None) -> dict:
    """One op row; counts, dtype and group come from `size_source` (a trace event's comm args)."""
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
    if pg is None:
        pg = _col_value(size_source, "pg_name")
    return {
        "op": op,
        "source": "p2p" if op in ("send", "recv") else None,
        "pg": None if pg is None else str(pg),
        "pg_size": group_size,
        "dtype": dtype,
        "bytes": nbytes,
        "duration_us": duration_us,
        "host_ts": host_ts,
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


def _kernel_ops(events, is_gpu, kernels, calls, hints, used_calls: set) -> list[dict]:
    """NCCL/RCCL kernels, each joined to the record_param_comms call that launched it.

    The join: kernel -> runtime launch with the same correlation id -> the innermost call on
    the launching thread whose span holds the launch. Bytes come from the call, time from the
    kernel(s); several kernels of one call are one op timed by the union of their spans.
    """
    if kernels.empty:
        return []
    correlation = _col(kernels, "correlation")
    categories = events["cat"].astype(str)
    is_launch = ~is_gpu & (categories.str.contains("runtime") | categories.str.contains("driver"))
    launches = events[is_launch & (pd.to_numeric(_col(events, "correlation"), errors="coerce") >= 0)]
    launch_by_corr = launches.drop_duplicates("correlation").set_index("correlation")
    by_thread_calls = {key: group for key, group in calls.groupby(["pid", "tid"], sort=False)}
    by_thread_hints = {key: group for key, group in hints.groupby(["pid", "tid"], sort=False)}

    groups: dict = {}  # call index or ("kernel", kernel index) -> dict
    for index, kernel in kernels.iterrows():
        corr = correlation.get(index)
        launch = None
        if corr is not None and not pd.isna(corr) and corr >= 0 and corr in launch_by_corr.index:
            launch = launch_by_corr.loc[corr]
        call = hint = None
        if launch is not None:
            key = (launch["pid"], launch["tid"])
            call = _innermost(by_thread_calls.get(key), launch["ts_ns"])
            hint = _innermost(by_thread_hints.get(key), launch["ts_ns"])
        group_key = call.name if call is not None else ("kernel", index)
        group = groups.setdefault(group_key, {"call": call, "hint": hint, "kernels": [],
                                              "launch_ts": None})
        group["kernels"].append(kernel)
        if launch is not None and group["launch_ts"] is None:
            group["launch_ts"] = launch["ts_ns"]

    rows = []
    for group in groups.values():
        call, hint, members = group["call"], group["hint"], group["kernels"]
        first = members[0]
        duration_us = intervals.total([k["ts_ns"] for k in members],
                                      [k["ts_ns"] + k["dur_ns"] for k in members]) / 1e3
        kernel_ts = min(k["ts_ns"] for k in members)
        if call is not None:
            used_calls.add(call.name)
            op, size_source = call["op"], call
        else:
            op = (canonical_op(_col_value(first, "collective"))
                  or (hint["op"] if hint is not None else None)
                  or canonical_op(first["name"]) or UNKNOWN_OP)
            size_source = first
        host_ts = call["ts_ns"] if call is not None else (
            group["launch_ts"] if group["launch_ts"] is not None else kernel_ts)
        # Newer kernels carry the group in their own args; older calls carry it only on the host.
        pg_source = size_source if _col_value(size_source, "group_size") is not None else first
        rows.append(_row_from_args(size_source, op, pg_source, duration_us, host_ts,
                                   sort_ts=kernel_ts))
    return rows


def _innermost(candidates, ts_ns):
    """The latest-starting candidate whose span holds `ts_ns`, else None."""
    if candidates is None or candidates.empty:
        return None
    starts = candidates["ts_ns"].to_numpy()
    ends = starts + candidates["dur_ns"].to_numpy()
    holding = (starts <= ts_ns) & (ts_ns <= ends)
    if not holding.any():
        return None
    positions = np.flatnonzero(holding)
    return candidates.iloc[positions[np.argmax(starts[positions])]]


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
                same = same[pd.to_numeric(_col(same, "in_nelems"), errors="coerce") == nelems]
            if not same.empty:
                call = same.iloc[0]
        duration_us = float(op_event["dur_ns"]) / 1e3
        if call is not None:
            used_calls.add(call.name)
            rows.append(_row_from_args(call, op, call, duration_us, call["ts_ns"],
                                       sort_ts=op_event["ts_ns"]))
        else:
            rows.append(_row_from_args(op_event, op, op_event, duration_us, op_event["ts_ns"],
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
    for i, (pos, t) in enumerate(zip(position, times_ns)):
        if pos >= 0 and not math.isnan(t) and t < ends[pos]:
            result.iat[i] = int(numbers[pos])
    return result


# ---- collectives_table ---------------------------------------------------------------------------
_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))


def _size_text(nbytes: int) -> tuple[str, str]:
    for unit, scale in _UNITS:
        if nbytes >= scale:
            return f"{nbytes / scale:g}", unit
    return "0", "B"


def size_bucket(nbytes) -> tuple[str, float]:
    """(label, lower bound) of the power-of-two bucket [2^k, 2^(k+1)) bytes holding `nbytes`.

    0 bytes is its own bucket "0 B"; unknown sizes fall in "unknown" (lower bound NaN).
    """
    if not _finite(nbytes) or nbytes < 0:
        return UNKNOWN_BUCKET, float("nan")
    nbytes = int(round(float(nbytes)))
    if nbytes == 0:
        return "0 B", 0.0
    low = 1 << (nbytes.bit_length() - 1)
    high = low * 2
    low_number, low_unit = _size_text(low)
    high_number, high_unit = _size_text(high)
    if low_unit == high_unit:
        return f"{low_number}-{high_number} {low_unit}", float(low)
    return f"{low_number} {low_unit}-{high_number} {high_unit}", float(low)


def empty_collectives() -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(dtype=_COLLECTIVES_DTYPES.get(column, "object"))
                         for column in COLLECTIVES_COLUMNS})


_COLLECTIVES_DTYPES = {
    "pg_size": "Int64", "bucket_min_bytes": "float64", "count": "int64", "total_bytes": "float64",
    "total_us": "float64", "mean_us": "float64", "algbw_gbps": "float64", "busbw_gbps": "float64",
    "ranks": "int64", "rank_steps": "int64", "slowest_rank": "Int64",
    "slowest_rank_busbw_gbps": "float64",
}


def collectives_table(ops: pd.DataFrame) -> pd.DataFrame:
    """Ops grouped by op, process group (with its size) and power-of-two message-size bucket.

    count: ops; total_bytes: their summed S (known sizes only); total_us: their summed time
    (known times only); mean_us: total_us over the ops with a known time; algbw/busbw: summed
    bytes over summed seconds of the ops whose size and time are both known, through
    schema.bandwidth_gbps; ranks: ranks that ran the group; rank_steps: distinct (rank, step)
    pairs it ran in; slowest_rank: the rank with the lowest busbw on it (NA with one rank).
    Sorted by total_us, largest first.
    """
    if not isinstance(ops, pd.DataFrame) or ops.empty or "op" not in ops.columns:
        return empty_collectives()
    ops = _typed_ops(ops.copy())
    ops = ops[ops["op"].notna()]
    if ops.empty:
        return empty_collectives()
    buckets = [size_bucket(b) for b in ops["bytes"]]
    ops["size_bucket"] = [b[0] for b in buckets]
    ops["bucket_min_bytes"] = [b[1] for b in buckets]
    ops["pg"] = ops["pg"].map(lambda pg: UNKNOWN_PG if pg is None else pg)
    ops["pg_size_key"] = ops["pg_size"].astype("float64").fillna(-1.0)
    ops["bucket_key"] = ops["bucket_min_bytes"].fillna(-1.0)
    timed = ops["bytes"].notna() & ops["duration_us"].notna() & (ops["duration_us"] > 0)
    ops["timed_bytes"] = ops["bytes"].where(timed, 0.0)
    ops["timed_us"] = ops["duration_us"].where(timed, 0.0)

    rows = []
    for (op, pg, size_key, bucket_key), group in ops.groupby(
            ["op", "pg", "pg_size_key", "bucket_key"], sort=False, dropna=False):
        pg_size = None if size_key < 0 else int(size_key)
        algbw, busbw = _group_bandwidth(op, group["timed_bytes"].sum(), group["timed_us"].sum(),
                                        pg_size)
        timed_count = int(group["duration_us"].notna().sum())
        total_us = float(group["duration_us"].sum(min_count=1)) if timed_count else float("nan")
        slowest_rank, slowest_busbw = _slowest_rank(group, op, pg_size)
        rank_steps = group.dropna(subset=["rank", "step"])[["rank", "step"]].drop_duplicates()
        rows.append({
            "op": op, "pg": pg, "pg_size": pg_size,
            "size_bucket": group["size_bucket"].iloc[0],
            "bucket_min_bytes": group["bucket_min_bytes"].iloc[0],
            "count": len(group),
            "total_bytes": float(group["bytes"].sum(min_count=1)) if group["bytes"].notna().any() else float("nan"),
            "total_us": total_us,
            "mean_us": total_us / timed_count if timed_count else float("nan"),
            "algbw_gbps": algbw, "busbw_gbps": busbw,
            "ranks": int(group["rank"].dropna().nunique()),
            "rank_steps": len(rank_steps),
            "slowest_rank": slowest_rank, "slowest_rank_busbw_gbps": slowest_busbw,
        })
    table = pd.DataFrame(rows, columns=COLLECTIVES_COLUMNS)
    for column, dtype in _COLLECTIVES_DTYPES.items():
        table[column] = pd.to_numeric(table[column], errors="coerce").astype(dtype) \
            if dtype != "int64" else table[column].astype("int64")
    table = table.sort_values(["total_us", "op", "pg", "bucket_min_bytes"],
                              ascending=[False, True, True, True], na_position="last",
                              kind="stable")
    return table.reset_index(drop=True)


def _group_bandwidth(op, timed_bytes, timed_us, pg_size) -> tuple[float, float]:
    if timed_us <= 0:
        return float("nan"), float("nan")
    return _bandwidths(op, timed_bytes, pg_size, timed_us)


def _slowest_rank(group: pd.DataFrame, op, pg_size):
    per_rank = group.dropna(subset=["rank"]).groupby("rank")[["timed_bytes", "timed_us"]].sum()
    per_rank = per_rank[per_rank["timed_us"] > 0]
    if len(per_rank) < 2:
        return pd.NA, float("nan")
    # The bus factor is the same for every rank of one group, so algbw ranks them as busbw would.
    bandwidths = {
        rank: _bandwidths(op, row.timed_bytes, pg_size, row.timed_us)
        for rank, row in per_rank.iterrows()
    }
    rank = min(bandwidths, key=lambda r: (bandwidths[r][0], r))
    return int(rank), float(bandwidths[rank][1])

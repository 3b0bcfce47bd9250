"""The message of each op that analysis.rank.comm.event_ops builds from a trace's kernels: its size,
element type and process group, read from the event that sizes it (its call, its own args, or
the nccl:*/c10d:: op around its launch), one column at a time; and the bytes of any ops'
messages, once per distinct message (the cross-rank ops' too)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.comm_names import (
    P2P_OPS,
    canonical_dtype,
    dtype_size,
    first_input_type,
    first_tensor_nelems,
    message_bytes,
)
from analysis.core.frames import each_distinct, object_array


def missing(values: np.ndarray) -> np.ndarray:
    # None is the only missing value that values_or_none leaves.
    return pd.isna(values)


def sized_columns(comm, op, size_at, kernel_at, by_hint, world_size) -> dict:
    """event_ops._row_from_args' source, pg, pg_desc, pg_size, dtype and bytes of each op
    (`comm`: the communication events, read by `comm.present(column, positions)`): sized by
    the event at `size_at`, its group taken from that event where it gives a group size, else
    from the kernel at `kernel_at`; an op sized by its hint (`by_hint`) falls back on the trace's
    world size, and on the hint's "Input Dims" and "Input type" where it has no counts."""
    def both(name):
        values = comm.present(name, np.concatenate([size_at, kernel_at]))
        return values[:len(size_at)], values[len(size_at):]

    size_group, kernel_group = both("group_size")
    size_pg, kernel_pg = both("pg_name")
    size_desc, kernel_desc = both("pg_desc")
    in_nelems = comm.present("in_nelems", size_at)
    out_nelems = comm.present("out_nelems", size_at)
    dtype_text = comm.present("comm_dtype", size_at)

    group_from_size = ~missing(size_group)
    group_size = np.where(group_from_size, size_group, kernel_group)
    if world_size is not None:
        group_size[by_hint & missing(group_size)] = world_size
    pg = np.where(group_from_size, size_pg, kernel_pg)
    desc = np.where(group_from_size, size_desc, kernel_desc)
    pg_missing = missing(pg)
    pg[pg_missing], desc[pg_missing] = size_pg[pg_missing], size_desc[pg_missing]

    # A hint without message counts: its first input's "Input Dims" and "Input type".
    dims = by_hint & missing(in_nelems) & missing(out_nelems)
    in_nelems[dims] = each_distinct(comm.present("input_dims", size_at[dims]), first_tensor_nelems)
    typed = dims & missing(dtype_text)
    dtype_text[typed] = each_distinct(comm.present("input_type", size_at[typed]),
                                      first_input_type)
    dtype = each_distinct(dtype_text, canonical_dtype)
    nbytes = message_sizes(op, in_nelems, out_nelems, dtype, group_size)
    return {
        "source": ["p2p" if o in P2P_OPS else None for o in op],
        "pg": each_distinct(pg, _text).tolist(),
        "pg_desc": each_distinct(desc, _text).tolist(),
        "pg_size": group_size.tolist(),
        "dtype": dtype.tolist(),
        "bytes": nbytes,
    }


def message_sizes(*columns) -> list:
    """message_bytes(op, in_nelems, out_nelems, dtype_size(dtype), group_size) per row, computed
    once per distinct row: the same few messages repeat in every step."""
    sizes, inverse = distinct_message_sizes(*columns)
    return [sizes[i] for i in inverse.tolist()]


def distinct_message_sizes(*columns) -> tuple[list, np.ndarray]:
    """(the sizes of the distinct rows, each row's index among them), the rows keyed as a
    {row: size} dict would key them: every NaN alike, None apart from NaN (message_bytes reads
    a missing output count as None and as NaN differently), and a value that cannot be a key
    (a list) making its row a row of its own."""
    rows, inverse = _distinct_rows(columns)
    sizes = [message_bytes(op, in_nelems, out_nelems, dtype_size(dtype), group_size)
             for op, in_nelems, out_nelems, dtype, group_size in rows]
    return sizes, inverse


def _distinct_rows(columns) -> tuple[list, np.ndarray]:
    """(first row of each distinct row, as Python values; each row's index among them)."""
    combined = np.zeros(len(columns[0]), dtype=np.int64)
    values = []
    for column in columns:
        values.append(column.tolist() if isinstance(column, (pd.Series, np.ndarray))
                      else list(column))
        array = column.to_numpy() if isinstance(column, pd.Series) else column
        if not (isinstance(array, np.ndarray) and array.dtype.kind in "iufb"):
            array = object_array(values[-1])
        combined = np.unique(combined * (len(array) + 2) + _value_codes(array),
                             return_inverse=True)[1]
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # the distinct rows in order of first occurrence
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    rows = [tuple(v[i] for v in values) for i in first[order].tolist()]
    return rows, rank[inverse]


def _value_codes(array: np.ndarray) -> np.ndarray:
    """A code per row, equal where the values are (every NaN alike, None apart), below
    len(array) + 2; each row its own where a value cannot be a key."""
    try:
        codes, uniques = pd.factorize(array)
    except TypeError:  # a value that cannot be hashed
        return np.arange(len(array))
    nulls = np.flatnonzero(codes < 0)
    is_none = np.equal(array[nulls], None).astype(bool) if array.dtype == object else False
    codes[nulls] = len(uniques) + is_none
    return codes


def _text(value) -> str | None:
    return None if value is None else str(value)

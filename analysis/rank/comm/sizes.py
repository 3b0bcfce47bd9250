"""The message of each op that analysis.rank.comm.events builds from a trace's kernels: its size,
element type and process group, read from the event that sizes it (its call, its own args, or
the nccl:*/c10d:: op around its launch), one column at a time; and the bytes of any ops'
messages, once per distinct message (the cross-rank ops' too)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.comm_names import (
    canonical_dtype,
    dtype_size,
    first_input_type,
    first_tensor_nelems,
    message_bytes,
)
from analysis.core.frame_columns import each_distinct


def missing(values: np.ndarray) -> np.ndarray:
    # None is the only missing value that values_or_none leaves.
    return pd.isna(values)


def sized_columns(comm, op, size_at, kernel_at, by_hint, world_size) -> dict:
    """op_rows._row_from_args' source, pg, pg_desc, pg_size, dtype and bytes of each op
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
        "source": ["p2p" if o in ("send", "recv") else None for o in op],
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
    {row: size} dict keys them (every float NaN alike)."""
    found = _distinct_rows(columns)
    if found is not None:
        rows, inverse = found
    else:
        # Every float NaN means the same to message_bytes, but NaNs are not equal as keys.
        keys = {}
        rows, inverse = [], []
        try:
            for row in zip(*columns):
                key = tuple(_NAN_KEY if type(v) is float and v != v else v for v in row)
                if key not in keys:
                    keys[key] = len(rows)
                    rows.append(row)
                inverse.append(keys[key])
        except TypeError:  # a value that cannot be hashed: each row is its own
            rows = list(zip(*columns))
            inverse = range(len(rows))
        inverse = np.array(inverse, dtype=np.int64)
    sizes = [message_bytes(op, in_nelems, out_nelems, dtype_size(dtype), group_size)
             for op, in_nelems, out_nelems, dtype, group_size in rows]
    return sizes, inverse


def _distinct_rows(columns) -> tuple[list, np.ndarray] | None:
    """(first row of each distinct row, as Python values; each row's index among them) by
    pandas' factorize, whose groups are a dict's where the only missing values are float NaN
    in number columns and None (or float NaN) in object columns; None elsewhere."""
    combined = np.zeros(len(columns[0]), dtype=np.int64)
    for column in columns:
        values = column.to_numpy() if isinstance(column, pd.Series) else np.asarray(column)
        if values.dtype.kind not in "iufbO":
            return None
        codes, uniques = pd.factorize(values)
        if values.dtype.kind == "O":
            nulls = values[codes < 0]
            if len(nulls) and not (all(v is None for v in nulls)
                                   or all(type(v) is float for v in nulls)):
                return None
        combined = np.unique(combined * (len(uniques) + 1) + codes + 1, return_inverse=True)[1]
    _, first, inverse = np.unique(combined, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # the distinct rows in order of first occurrence
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    values = [list(column) if not isinstance(column, (pd.Series, np.ndarray)) else
              column.tolist() for column in columns]
    rows = [tuple(v[i] for v in values) for i in first[order].tolist()]
    return rows, rank[inverse]


_NAN_KEY = object()


def _text(value) -> str | None:
    return None if value is None else str(value)

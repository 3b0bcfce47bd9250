"""The message of each op that analysis.comm_events builds from a trace's kernels: its size,
element type and process group, read from the event that sizes it (its call, its own args, or
the nccl:*/c10d:: op around its launch), one column at a time."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.comm_names import (
    _DTYPE_SIZES,
    canonical_dtype,
    first_input_type,
    first_tensor_nelems,
    message_bytes,
)
from analysis.frame_columns import each_distinct


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
    nbytes = _message_bytes(op, in_nelems, out_nelems, [_DTYPE_SIZES.get(d) for d in dtype],
                            group_size)
    return {
        "source": ["p2p" if o in ("send", "recv") else None for o in op],
        "pg": each_distinct(pg, _text).tolist(),
        "pg_desc": each_distinct(desc, _text).tolist(),
        "pg_size": group_size.tolist(),
        "dtype": dtype.tolist(),
        "bytes": nbytes,
    }


def _message_bytes(*columns) -> list:
    """message_bytes of each op, once per distinct set of arguments: it reads the counts as
    numbers, so equal counts (1, 1.0) give equal bytes."""
    rows = list(zip(*columns))
    try:
        known = dict.fromkeys(rows)
    except TypeError:  # a value that cannot be hashed
        return [message_bytes(*row) for row in rows]
    for row in known:
        known[row] = message_bytes(*row)
    return [known[row] for row in rows]


def _text(value) -> str | None:
    return None if value is None else str(value)

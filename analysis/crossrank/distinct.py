"""Functions of the cross-rank ops' column values computed once per distinct value (or row):
the same few ops, groups and messages repeat in every step of a trace."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.communication import dtype_size, message_bytes


def float64_of(values: list) -> np.ndarray:
    """typed_ops' float64 of a column made from the list."""
    if {type(v) for v in values} <= {int, float, type(None)} and all(
            abs(v) < 1 << 63 for v in values if type(v) is int):
        return np.array(values, dtype="float64")
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy("float64")


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
        for row in zip(*columns):
            key = tuple(_NAN_KEY if type(v) is float and v != v else v for v in row)
            if key not in keys:
                keys[key] = len(rows)
                rows.append(row)
            inverse.append(keys[key])
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
_PLAIN_TYPES = {str, int, float, type(None)}


def by_value(column: pd.Series, function) -> pd.Series:
    """function(value) per row, computed once per distinct value."""
    values = column.to_numpy() if column.dtype == object else column.astype(object).to_numpy()
    found = _distinct_values(values)
    if found is not None:
        codes, distinct = found
        results = np.empty(len(distinct), dtype=object)
        for position, value in enumerate(distinct):
            results[position] = function(value)
        return pd.Series(results[codes], index=column.index, dtype=object, copy=False)
    if set(map(type, values)) <= _PLAIN_TYPES:  # each value is its own key: no call per row
        hashable = values
    else:
        hashable = [v if isinstance(v, (str, int, float)) or v is None else str(v)
                    for v in values]
    results = {v: function(v) for v in pd.unique(np.array(hashable, dtype=object))}
    return pd.Series(list(map(results.__getitem__, hashable)), index=column.index,
                     dtype=object)


def _distinct_values(values: np.ndarray) -> tuple[np.ndarray, list] | None:
    """(each row's index among the distinct values, -1 for None; the distinct values in order
    of first appearance, None where it first appears) by factorize, where every value is a
    str, int or float and None the only missing one; None otherwise."""
    try:
        codes, uniques = pd.factorize(values)
    except TypeError:  # a value that cannot be hashed
        return None
    distinct = uniques.tolist()
    if not set(map(type, distinct)) <= _PLAIN_TYPES:
        return None
    nulls = np.flatnonzero(codes < 0)
    if len(nulls):
        if not all(v is None for v in values[nulls].tolist()):
            return None
        # None keeps its place among the values, as pd.unique gives them.
        before = int(codes[:nulls[0]].max()) + 1 if nulls[0] else 0
        distinct.insert(before, None)
        codes = np.where(codes >= before, codes + 1, codes)
        codes[nulls] = before
    return codes, distinct

"""Functions of the cross-rank ops' column values computed once per distinct value: the same
few ops and groups repeat in every step of a trace. (Message sizes, once per distinct message:
analysis.rank.comm.sizes.message_sizes.)"""

from __future__ import annotations

import numpy as np
import pandas as pd


def float64_of(values: list) -> np.ndarray:
    """typed_ops' float64 of a column made from the list."""
    if {type(v) for v in values} <= {int, float, type(None)} and all(
            abs(v) < 1 << 63 for v in values if type(v) is int):
        return np.array(values, dtype="float64")
    return pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy("float64")


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

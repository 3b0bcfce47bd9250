"""Functions of the cross-rank ops' column values computed once per distinct value: the same
few ops and groups repeat in every step of a trace. (Message sizes, once per distinct message:
analysis.rank.comm.sizes.message_sizes.)"""

from __future__ import annotations

import numpy as np
import pandas as pd


def float64_of(values: list) -> np.ndarray:
    """typed_ops' float64 of a column made from the list (numbers, None for missing)."""
    return np.array(values, dtype="float64")


def by_value(column: pd.Series, function) -> pd.Series:
    """function(value) per row, computed once per distinct value (text or numbers): once for
    None and once for the other missing values (NaN), each passed as the column holds it."""
    values = column.to_numpy(dtype=object)
    codes, distinct = pd.factorize(values)
    results = np.empty(len(distinct) + 2, dtype=object)
    for position, value in enumerate(distinct.tolist()):
        results[position] = function(value)
    nulls = np.flatnonzero(codes < 0)
    is_none = np.equal(values[nulls], None).astype(bool)
    for slot, rows in ((len(distinct), nulls[is_none]), (len(distinct) + 1, nulls[~is_none])):
        if len(rows):
            results[slot] = function(values[rows[0]])
            codes[rows] = slot
    return pd.Series(results[codes], index=column.index, dtype=object, copy=False)

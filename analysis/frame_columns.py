"""Reading a frame's columns at given rows as plain arrays and lists, without the Series that
pandas would build on the way: per rank, those calls cost more than the few rows they read."""

from __future__ import annotations

import numpy as np
import pandas as pd


def is_numpy_number(column: pd.Series) -> bool:
    return isinstance(column.dtype, np.dtype) and column.dtype.kind in "iuf"


def values_at(column: pd.Series, rows: np.ndarray, dtype=None) -> np.ndarray:
    """column.take(rows).to_numpy(dtype), without the Series where the column is a NumPy
    array."""
    if isinstance(column.dtype, np.dtype):
        values = column.to_numpy()[rows]
        return values if dtype is None else values.astype(dtype)
    return column.take(rows).to_numpy(dtype)


def list_at(column: pd.Series, rows: np.ndarray) -> list:
    """column.take(rows).tolist(), without the Series where the column is a NumPy array or a
    categorical of objects (whose missing values pandas lists as NaN)."""
    if isinstance(column.dtype, np.dtype):
        return column.to_numpy()[rows].tolist()
    if (isinstance(column.dtype, pd.CategoricalDtype)
            and column.cat.categories.dtype == np.dtype(object)):
        categories = column.cat.categories.to_numpy()
        values = np.empty(len(categories) + 1, dtype=object)
        values[:-1] = categories
        values[-1] = np.nan  # code -1
        return values[column.cat.codes.to_numpy()[rows]].tolist()
    return column.take(rows).tolist()


def flags(events: pd.DataFrame, column: str) -> np.ndarray:
    values = events[column]
    if values.dtype == np.dtype(bool):
        return values.to_numpy()  # nothing missing, nothing to convert
    return values.fillna(False).astype(bool).to_numpy()


def text_matches(column: pd.Series, parts, rows: np.ndarray) -> np.ndarray:
    """Whether each value at `rows`, as text, contains any of `parts`; decided once per category
    of a categorical column."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        wanted = [any(p in str(c) for p in parts) for c in column.cat.categories]
        # Code -1 (a missing value) picks the last entry: no match.
        return np.array(wanted + [False])[column.cat.codes.to_numpy()[rows]]
    text = column.take(rows).astype(str)
    return np.asarray(np.logical_or.reduce([text.str.contains(p, regex=False) for p in parts]))


def texts(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """str() of the column's values at the positions `rows`, as an object array."""
    if not len(rows):
        return np.zeros(0, dtype=object)
    return np.array([str(v) for v in list_at(column, rows)], dtype=object)

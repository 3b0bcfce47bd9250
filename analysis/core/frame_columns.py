"""Reading the events frame's columns (analysis.core.frames: NumPy arrays, and categoricals for
name, cat, pid and tid) at given rows as plain arrays and lists, without the Series that pandas
would build on the way: per rank, those calls cost more than the few rows they read."""

from __future__ import annotations

import numpy as np
import pandas as pd


def values_at(column: pd.Series, rows: np.ndarray, dtype=None) -> np.ndarray:
    """column.take(rows).to_numpy(dtype), without the Series."""
    values = column.to_numpy()[rows]
    return values if dtype is None else values.astype(dtype)


def list_at(column: pd.Series, rows: np.ndarray) -> list:
    """column.take(rows).tolist(), without the Series: a NumPy column's values, or a categorical's
    (NaN for code -1, as pandas lists a missing value)."""
    if isinstance(column.dtype, np.dtype):
        return column.to_numpy()[rows].tolist()
    categories = column.cat.categories.to_numpy()
    values = np.empty(len(categories) + 1, dtype=object)
    values[:-1] = categories
    values[-1] = np.nan  # code -1
    return values[column.cat.codes.to_numpy()[rows]].tolist()


def flags(events: pd.DataFrame, column: str) -> np.ndarray:
    """A bool column (is_gpu, is_comm) as its array."""
    return events[column].to_numpy()


def category_matches(column: pd.Series, parts) -> np.ndarray:
    """Whether each value of a categorical column, as text, contains any of `parts`; decided
    once per category."""
    wanted = [any(p in str(c) for p in parts) for c in column.cat.categories]
    # Code -1 (a missing value) picks the last entry: no match.
    return np.array(wanted + [False])[column.cat.codes.to_numpy()]


def texts(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """str() of a categorical column's values at the positions `rows`, as an object array; once
    per category (code -1 prints "nan", as str() of list_at's NaN)."""
    categories = column.cat.categories.tolist() + [np.nan]
    return object_array([str(c) for c in categories])[column.cat.codes.to_numpy()[rows]]


def each_text(column: pd.Series, rows: np.ndarray, function) -> np.ndarray:
    """function(text) of a categorical column's values at `rows` (texts(column, rows)), as an
    object array: once per category found there."""
    codes = column.cat.codes.to_numpy()[rows]
    used = np.unique(codes)
    printed = column.cat.categories.to_numpy(dtype=object)
    table = np.empty(len(printed) + 1, dtype=object)  # the last for code -1
    table[used] = [function(str(printed[code]) if code >= 0 else "nan")
                   for code in used.tolist()]
    return table[codes]


def values_or_none(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """The values of a NumPy column (the events' arguments: objects, float64) at `rows`, as an
    object array with None for every missing value (each v for which `pd.isna(v)` is true)."""
    values = column.to_numpy()[rows]
    result = values.astype(object)
    result[pd.isna(values)] = None
    return result


def value_or_none(value):
    """The value, None where pd.isna calls it missing (a list-like is missing where pd.isna of
    it is true as a whole)."""
    if value is None:
        return None
    try:
        if pd.isna(value):
            return None
    except (TypeError, ValueError):  # a list-like of several values
        pass
    return value


def each_value(values, function) -> np.ndarray:
    """function(value) for each value, as an object array."""
    return object_array([function(v) for v in values])


def each_distinct(values: np.ndarray, function) -> np.ndarray:
    """function(value) for each of the values (an object array), computed once per distinct
    value: by hashing where they are text (missing values aside) or where every value is an
    integer, a bool or None (equal values of one such type print alike, unlike 0.0 and -0.0);
    else once per value."""
    if pd.api.types.infer_dtype(values, skipna=True) in ("string", "empty"):
        codes, uniques = pd.factorize(values)
        missing = codes == -1
        missing_values = values[missing]
        none_only = len(missing_values) and set(map(type, missing_values)) == {type(None)}
        table = [function(u) for u in uniques] + [function(None) if none_only else None]
        result = object_array(table)[codes]
        if len(missing_values) and not none_only:
            result[missing] = _each_exact(missing_values, function)
        return result
    return _each_exact(values, function)


def _each_exact(values: np.ndarray, function) -> np.ndarray:
    if not set(map(type, values)) <= _EXACT_TYPES:
        return each_value(values, function)
    keys = list(zip(map(type, values), values))
    results = dict.fromkeys(keys)
    for key in results:
        results[key] = function(key[1])
    return object_array([results[key] for key in keys])


_EXACT_TYPES = frozenset({str, int, bool, type(None)})


def object_array(values: list) -> np.ndarray:
    """The values as a one-dimensional object array, list-likes among them kept whole."""
    array = np.empty(len(values), dtype=object)
    if set(map(type, values)) <= _SCALAR_TYPES:
        array[:] = values
        return array
    for i, value in enumerate(values):
        array[i] = value
    return array


_SCALAR_TYPES = _EXACT_TYPES | {float}


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


def category_matches(column: pd.Series, parts) -> np.ndarray:
    """text_matches of every value of a categorical column."""
    wanted = [any(p in str(c) for p in parts) for c in column.cat.categories]
    return np.array(wanted + [False])[column.cat.codes.to_numpy()]


def texts(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """str() of the column's values at the positions `rows`, as an object array; once per
    category of a categorical of objects."""
    if not len(rows):
        return np.zeros(0, dtype=object)
    if object_categories(column):
        categories = column.cat.categories.tolist() + [np.nan]  # code -1: list_at's NaN
        return object_array([str(c) for c in categories])[column.cat.codes.to_numpy()[rows]]
    return object_array([str(v) for v in list_at(column, rows)])


def each_text(column: pd.Series, rows: np.ndarray, function) -> np.ndarray:
    """each_distinct(texts(column, rows), function): once per category found at `rows` where
    the column is a categorical of objects."""
    if not (object_categories(column) and len(rows)):
        return each_distinct(texts(column, rows), function)
    codes = column.cat.codes.to_numpy()[rows]
    used = np.unique(codes)
    printed = column.cat.categories.to_numpy(dtype=object)
    table = np.empty(len(printed) + 1, dtype=object)  # the last for code -1
    table[used] = [function(str(printed[code]) if code >= 0 else "nan")
                   for code in used.tolist()]
    return table[codes]


# infer_dtype's kinds of an object array holding only scalars (missing values aside).
_SCALAR_KINDS = frozenset({"string", "floating", "integer", "mixed-integer-float", "boolean",
                           "empty"})


def values_or_none(column: pd.Series, rows: np.ndarray) -> np.ndarray:
    """list_at(column, rows) as an object array, with None for every missing value (each value
    v for which `pd.isna(v)` is true); by array, or once per category, where the values are
    plain scalars."""
    dtype = column.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "iub":
        return column.to_numpy()[rows].astype(object)
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        values = column.to_numpy()[rows]
        result = values.astype(object)
        result[np.isnan(values)] = None
        return result
    if object_categories(column):
        categories = column.cat.categories.tolist() + [None]  # code -1: missing
        return each_value(categories, value_or_none)[column.cat.codes.to_numpy()[rows]]
    if dtype == np.dtype(object):
        values = column.to_numpy()[rows]
        if pd.api.types.infer_dtype(values, skipna=True) in _SCALAR_KINDS:
            result = values.copy()
            result[pd.isna(values)] = None
            return result
    return each_value(list_at(column, rows), value_or_none)


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


def object_categories(column: pd.Series) -> bool:
    return (isinstance(column.dtype, pd.CategoricalDtype)
            and column.cat.categories.dtype == np.dtype(object))

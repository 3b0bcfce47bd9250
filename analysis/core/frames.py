"""The frame contract: the dtype of each column of the events frame and of the steps frame, as
the trace parser (analysis.ingest.parsed_trace) makes them and every floor above reads them
(docs/analysis.md, "Using the analysis from Python").

`events_frame` and `steps_frame` build a frame from its columns, for the parser and for tests
alike, and check it: `check_events` and `check_steps` raise TypeError naming the column, the
dtype expected and the dtype found. A check compares dtypes only, nothing per row, so that the
parser pays nothing measurable for it.

The columns are read at given rows as plain arrays and lists (`values_at`, `list_at`, `texts`,
...), without the Series that pandas would build on the way: per rank, those calls cost more than
the few rows they read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from analysis.core.event_kinds import EVENT_COLUMNS, NUMBER_COLUMNS, STEP_COLUMNS, TEXT_COLUMNS
from analysis.core.model import UNKNOWN_RANK

INT64, FLOAT64, BOOL, OBJECT = (np.dtype(t) for t in ("int64", "float64", "bool", "object"))
# A pandas categorical whose categories are str in an object Index, as the parser makes them:
# pandas' own str categories (a Parquet file's, a concatenation's) are read by other code paths.
CATEGORY = "category of object"

_TYPED = {"name": CATEGORY, "cat": CATEGORY, "ts_ns": INT64, "dur_ns": INT64, "end_ns": INT64,
          "pid": CATEGORY, "tid": CATEGORY, "stream": INT64, "correlation": INT64,
          "is_gpu": BOOL, "is_comm": BOOL}
EVENT_DTYPES = {c: OBJECT if c in TEXT_COLUMNS else FLOAT64 if c in NUMBER_COLUMNS else _TYPED[c]
                for c in EVENT_COLUMNS}
STEP_DTYPES = {c: INT64 for c in STEP_COLUMNS}
# Wherever a checked frame has a rank column, it is int64, UNKNOWN_RANK where unknown.
RANK_COLUMN = "rank"
# The columns that an events frame built here may leave out, and what an event without them has.
_DEFAULTS = {"stream": -1, "correlation": -1, "is_gpu": False, "is_comm": False,
             **{c: None for c in TEXT_COLUMNS}, **{c: np.nan for c in NUMBER_COLUMNS}}
_REQUIRED = [c for c in EVENT_COLUMNS if c not in _DEFAULTS and c != "end_ns"]


# ---- the commands' text columns -----------------------------------------------------------------
def text_in_python():
    """A context in which the frames made keep their text as Python strings (pandas'
    `mode.string_storage` "python"), not as Arrow arrays (its default where pyarrow is
    installed): the same `str` dtype, NaN where missing, the same results; the commands' tables
    are small, and converting each of their text columns to Arrow cost the breakdown of a 50 MB
    trace 40 ms of its 0.56 s (docs/benchmarks.md). The commands analyse in it; a notebook that
    calls the analysis keeps its own setting."""
    return pd.option_context("mode.string_storage", "python")


def with_text_in_python(command: Callable[..., int]) -> Callable[..., int]:
    """`command` (a command's main) run in text_in_python()."""
    @functools.wraps(command)
    def run(*args, **kwargs) -> int:
        with text_in_python():
            return command(*args, **kwargs)
    return run


# ---- checks -------------------------------------------------------------------------------------
def check_events(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` itself, once every column of EVENT_DTYPES is there with its dtype."""
    return _checked(frame, EVENT_DTYPES, "events")


def check_steps(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` itself, once `step`, `start_ns` and `end_ns` are there, each int64."""
    return _checked(frame, STEP_DTYPES, "steps")


def _checked(frame: pd.DataFrame, dtypes: dict, what: str) -> pd.DataFrame:
    found = dict(zip(frame.columns, frame.dtypes))
    for column, expected in dtypes.items():
        if column not in found:
            raise TypeError(f"{what} frame: no column {column!r} ({expected} expected)")
        if not _is(found[column], expected):
            raise TypeError(f"{what} frame column {column!r}: expected {expected}, found "
                            f"{_described(found[column])}")
    if RANK_COLUMN in found and not _is(found[RANK_COLUMN], INT64):
        raise TypeError(f"{what} frame column {RANK_COLUMN!r}: expected {INT64} "
                        f"({UNKNOWN_RANK} for an unknown rank), found "
                        f"{_described(found[RANK_COLUMN])}")
    return frame


def _is(dtype, expected) -> bool:
    if expected is CATEGORY:
        return isinstance(dtype, pd.CategoricalDtype) and dtype.categories.dtype == OBJECT
    return isinstance(dtype, np.dtype) and dtype == expected


def _described(dtype) -> str:
    if isinstance(dtype, pd.CategoricalDtype):
        return f"category of {dtype.categories.dtype}"
    return str(dtype)


# ---- building -----------------------------------------------------------------------------------
def events_frame(columns: Mapping[str, object]) -> pd.DataFrame:
    """The events frame of `columns` ({column: values}), checked.

    Arrays, Series and Categoricals are taken as they are (the parser's: one of another dtype
    raises TypeError). Lists and tuples are typed here as the parser types what it decodes:
    text as a categorical of str in order of first appearance (None reads ""), whole numbers
    as int64 (a list of floats stays float64, and raises), `in_nelems` and the like as float64,
    flags as bool, the communication arguments as objects. Left out, `end_ns` is
    `ts_ns + dur_ns`, `stream` and `correlation` are -1, the flags False and the communication
    arguments missing (None, NaN); the other columns are needed."""
    rows = len(columns["ts_ns"]) if "ts_ns" in columns else 0
    built = {}
    for column, dtype in EVENT_DTYPES.items():
        if column in columns:
            values = columns[column]
            if isinstance(values, (list, tuple)):
                values = _typed(values, dtype)
        elif column == "end_ns" and "ts_ns" in built and "dur_ns" in built:
            values = np.asarray(built["ts_ns"]) + np.asarray(built["dur_ns"])
        elif column in _DEFAULTS:
            values = np.full(rows, _DEFAULTS[column], dtype=dtype)
        else:
            raise TypeError(f"events frame: no column {column!r} ({dtype} expected)")
        if dtype is OBJECT and isinstance(values, np.ndarray):
            # As a Series of objects: pandas would otherwise infer (and convert mostly-None
            # text to) its str dtype, which costs more than decoding the trace.
            values = pd.Series(values, dtype=object, copy=False)
        built[column] = values
    return check_events(pd.DataFrame(built, copy=False))


def empty_events() -> pd.DataFrame:
    """The events frame of a trace without complete events."""
    return events_frame({c: () for c in _REQUIRED})


def steps_frame(step=(), start_ns=(), end_ns=()) -> pd.DataFrame:
    """The steps frame of its three columns, checked: lists and tuples of whole numbers become
    int64 (empty ones too); arrays are taken as they are."""
    return check_steps(pd.DataFrame({"step": _whole(step), "start_ns": _whole(start_ns),
                                     "end_ns": _whole(end_ns)}, copy=False))


def contract_categories(events: pd.DataFrame) -> pd.DataFrame:
    """`events` with its name, cat, pid and tid as the contract's categoricals, where they are
    not (a Parquet file gives str categories, a concatenation of frames of other categories
    gives objects): categories made objects with the codes kept; objects made categories of
    their sorted distinct values, the order that grouping the objects had."""
    for column in (c for c, dtype in EVENT_DTYPES.items() if dtype is CATEGORY):
        values = events[column]
        if _is(values.dtype, CATEGORY):
            continue
        if not isinstance(values.dtype, pd.CategoricalDtype):
            values = values.astype("category")
        events[column] = pd.Categorical.from_codes(
            values.cat.codes.to_numpy(), validate=False,
            categories=pd.Index(values.cat.categories.to_numpy(dtype=object), dtype=object))
    return events


def _typed(values, dtype):
    if dtype is CATEGORY:
        texts = ["" if v is None else str(v) for v in values]
        position = {text: code for code, text in enumerate(dict.fromkeys(texts))}
        codes = np.fromiter(map(position.__getitem__, texts), dtype=np.int32, count=len(texts))
        return pd.Categorical.from_codes(codes, categories=pd.Index(list(position), dtype=object))
    if dtype is OBJECT:
        array = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):  # one at a time: a list value stays one value
            array[i] = value
        return array
    if dtype is FLOAT64:
        return np.asarray(values, dtype=np.float64)
    return np.asarray(values) if len(values) else np.zeros(0, dtype=dtype)


def _whole(values):
    if isinstance(values, (list, tuple)):
        return np.asarray(values) if len(values) else np.zeros(0, dtype=INT64)
    return values


# ---- reading the columns at given rows ----------------------------------------------------------
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

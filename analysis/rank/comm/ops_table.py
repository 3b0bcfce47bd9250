"""The ops table (analysis.rank.comm.comm_ops.comm_ops): its columns and their types, Int64 counts,
float64 measures and object text with None for missing, built from any frame or from arrays."""

from __future__ import annotations

import numpy as np
import pandas as pd

OPS_COLUMNS = [
    "rank", "step", "op", "source", "issuer", "pg", "pg_desc", "pg_size", "dtype", "bytes",
    "duration_us", "algbw_gbps", "busbw_gbps", "origin", "time_from",
]


def empty_ops() -> pd.DataFrame:
    return typed_ops(pd.DataFrame({column: [] for column in OPS_COLUMNS}))


def typed_ops(frame: pd.DataFrame) -> pd.DataFrame:
    return frame_of(typed_columns(frame))


_FLOAT_COLUMNS = ("bytes", "duration_us", "algbw_gbps", "busbw_gbps")
_NUMBER_COLUMNS = frozenset({"rank", "step", "pg_size", *_FLOAT_COLUMNS})


def typed_columns(frame: pd.DataFrame, names: list = OPS_COLUMNS) -> dict:
    """{column: array} of the columns `names` of OPS_COLUMNS in their types: Int64 counts,
    float64 measures, object text with None for missing."""
    frame = frame.reindex(columns=names)
    columns = {}
    for column in names:
        values = frame[column]
        if column in ("rank", "step", "pg_size"):
            columns[column] = int64(values)
        elif column in _FLOAT_COLUMNS:
            columns[column] = float64(values)
        else:
            columns[column] = objects(values.to_numpy(dtype=object, copy=True))
    return columns


def int64(values: pd.Series):
    # Integers as they are: converting and rounding them changes nothing but costs.
    if values.dtype == np.dtype("int64"):
        return pd.arrays.IntegerArray(values.to_numpy(copy=True), np.zeros(len(values), bool))
    if values.dtype == "Int64":
        return values.array.copy()
    return pd.to_numeric(values, errors="coerce").round().astype("Int64").array


def float64(values: pd.Series) -> np.ndarray:
    return pd.to_numeric(values, errors="coerce").to_numpy(dtype="float64")


def objects(values) -> np.ndarray:
    """The values as an object array, None for every missing value."""
    objects = np.empty(len(values), dtype=object)
    objects[:] = values
    objects[pd.isna(objects)] = None
    return objects


def frame_of(columns: dict) -> pd.DataFrame:
    # One Series per column on one shared index: pandas neither aligns them nor reads the text
    # columns as its string dtype (they stay object, None for missing).
    index = pd.RangeIndex(len(columns["op"]))
    return pd.DataFrame({
        column: pd.Series(values, index=index, copy=False,
                          dtype=object if column not in _NUMBER_COLUMNS else None)
        for column, values in columns.items()
    }, index=index)

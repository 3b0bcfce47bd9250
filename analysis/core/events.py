"""The events frame: reading its columns (docs/analysis.md describes each).

One `RankTrace.events` frame per rank holds one row per complete (`"ph": "X"`) Kineto event
with the columns of EVENT_COLUMNS. Its columns, the categories and the names that decide which
events count as device work, host ops or communication are analysis.core.event_kinds'; this
module selects events by them.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analysis.core.event_kinds import KERNEL_CAT


# ---- reading the frame --------------------------------------------------------------------------
def matches(column: pd.Series, wanted, among: np.ndarray | None = None) -> np.ndarray:
    """wanted(str(value)) for each row of a categorical column (analysis.core.frames), evaluated
    once per category.

    With `among` (a row mask), only the rows where it holds are asked and the others read
    False: the categories that none of those rows holds are never evaluated (a name pattern
    asked of host events skips the long kernel names)."""
    values = column.array  # the Categorical itself: no Series built for its codes
    codes = values.codes
    if among is None:
        hits = [wanted(str(c)) for c in values.categories]
    else:
        categories = list(values.categories)
        used = np.bincount(codes[among].astype(np.intp) + 1, minlength=len(categories) + 1)
        hits = [False] * len(categories)
        for code in np.flatnonzero(used[1:]).tolist():
            hits[code] = wanted(str(categories[code]))
    # One slot per category, and a last False that code -1 (missing) reads: take() wraps
    # negative indices, and costs a third of fancy indexing with int8 codes.
    return np.array(hits + [False], dtype=bool).take(codes)


def cat_is(events: pd.DataFrame, cats) -> np.ndarray:
    """Rows whose category is one of `cats`."""
    return matches(events["cat"], lambda c: c in cats)


def distinct_names(names: pd.Series) -> list[str]:
    """The categories of a categorical column, as text."""
    return [str(c) for c in names.array.categories]


def mark_comm_kernels(events: pd.DataFrame, patterns) -> pd.DataFrame:
    """`events` with the device kernels whose name matches any of `patterns` marked is_comm."""
    if not patterns or events.empty:
        return events
    extra = re.compile("|".join(f"(?:{getattr(p, 'pattern', p)})" for p in patterns))
    matched = (matches(events["name"], lambda name: bool(extra.search(name)))
               & cat_is(events, {KERNEL_CAT}))
    if not matched.any():
        return events
    events = events.copy()
    events["is_comm"] = events["is_comm"].to_numpy() | matched
    return events

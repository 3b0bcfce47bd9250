"""Selecting events by name and by thread (analysis.core.events.matches,
analysis.rank.layers.on_threads), on hand-built frames with known answers: categorical columns
asked only among some rows, categoricals with many categories, and plain (non-categorical)
columns."""

import numpy as np
import pandas as pd

from analysis.core.events import matches
from analysis.rank import layers


def _names(values, categorical=True):
    column = pd.Series(values, dtype="category" if categorical else object)
    return column


def test_matches_among_asks_only_the_rows_given():
    values = ["aten::mm", None, "ncclKernel_AllReduce", "aten::mm", "DataLoader#next"]
    among = np.array([True, True, False, True, True])
    asked = []

    def wanted(name):
        asked.append(name)
        return name.startswith(("aten::", "ncclKernel"))

    categorical = matches(_names(values), wanted, among=among)
    assert categorical.tolist() == [True, False, False, True, False]
    assert "ncclKernel_AllReduce" not in asked  # a category only unasked rows hold
    full = matches(_names(values), wanted)
    assert full.tolist() == [True, False, True, True, False]
    assert (categorical == (full & among)).all()
    no_missing = [v or "" for v in values]
    plain = matches(_names(no_missing, categorical=False), wanted, among=among)
    assert plain.tolist() == matches(_names(no_missing), wanted, among=among).tolist()
    assert plain.tolist() == [True, False, False, True, False]


def test_matches_reads_missing_values_as_false_past_127_categories():
    # int8 codes: code 127 plus one would wrap to -128 without the widening.
    texts = [f"op{i}" for i in range(130)]
    column = pd.Series(pd.Categorical([texts[129], None, texts[127], texts[0]], categories=texts))
    among = np.array([True, True, True, False])
    found = matches(column, lambda n: n in ("op127", "op129", "op0"), among=among)
    assert found.tolist() == [True, False, True, False]
    assert matches(column, lambda n: True).tolist() == [True, False, True, True]


def _thread_frame(pid_categories):
    pid = pd.Categorical(["1", "1", "2", None, "2", "1"], categories=pid_categories)
    tid = pd.Categorical(["7", "8", "7", "7", None, "7"], categories=["7", "8", "9"])
    return pd.DataFrame({"pid": pid, "tid": tid})


def test_on_threads_of_small_and_large_categoricals_and_plain_columns():
    wanted = {("1", "7"), ("2", "7"), ("3", "9")}
    expected = [True, False, True, False, False, True]
    small = _thread_frame(["1", "2", "3"])  # a code table of 4 x 4 flags
    # Thousands of unused pid categories: the table would outgrow the frame, pair numbers used.
    large = _thread_frame(["1", "2", "3"] + [f"x{i}" for i in range(3000)])
    plain = small.astype(object).where(small.notna(), np.nan)
    for frame in (small, large, plain):
        assert layers.on_threads(frame, wanted).tolist() == expected
    assert not layers.on_threads(small, {("9", "9")}).any()
    assert not layers.on_threads(large, {("9", "9")}).any()

"""The terminal report's text tables (analysis.report.text_tables): pandas' own layout, missing
values as "-" in every column type, at most TEXT_MAX_ROWS rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.report.text_tables import TEXT_MAX_ROWS, text_table


def test_text_table_by_hand():
    frame = pd.DataFrame({
        "rank": pd.array([0, None], dtype="Int64"),
        "step": np.array([3, 12], dtype="int64"),
        "name": pd.Series(["ab", None], dtype="str"),
        "ms": np.array([1.5, np.nan]),
        "status": pd.Series([None, "ok"], dtype=object),  # None printed as such: not a NaN
    })
    assert text_table(frame, "Title", note="a note") == (
        "Title\n"
        "a note\n"
        "rank  step name  ms status\n"
        "   0     3   ab 1.5   None\n"
        "   -    12    -   -     ok\n")


def test_an_empty_table_says_none():
    assert text_table(pd.DataFrame({"x": []}), "Title") == "Title\n  (none)\n"


def test_table_more_rows_than_shown():
    frame = pd.DataFrame({"i": range(TEXT_MAX_ROWS + 2)})
    text = text_table(frame, "title")
    assert text.splitlines()[1] == " i"
    assert len(text.splitlines()) == 1 + 1 + TEXT_MAX_ROWS + 1
    assert text.splitlines()[-1] == ("  ... 2 more rows (all of them with --format csv or "
                                     "--out DIR)")

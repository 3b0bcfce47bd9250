"""The report's fast paths give what the pandas calls they replace give: the text tables
(analysis.report.output._plain_text_grid against DataFrame.to_string) and the per-step spread across
ranks (analysis.rank.tables._step_spread), on small built frames with hand-computed answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis.rank import tables as ranks
from analysis.report import output


def _pandas_text(frame: pd.DataFrame) -> str:
    return output._printable(frame).to_string(index=False, na_rep="-")


def test_text_grid_by_hand():
    frame = pd.DataFrame({
        "rank": pd.array([0, None], dtype="Int64"),
        "step": np.array([3, 12], dtype="int64"),
        "name": pd.Series(["ab", None], dtype="str"),
        "ms": np.array([1.5, np.nan]),
        "status": pd.Series([None, "ok"], dtype=object),
    })
    expected = ("rank  step name  ms status\n"
                "   0     3   ab 1.5   None\n"
                "   -    12    -   -     ok")
    assert output._plain_text_grid(frame) == expected
    assert _pandas_text(frame) == expected


@pytest.mark.parametrize("values", [
    [1.0, 2.5, np.nan],  # trailing zeros trimmed to the longest decimals
    [0.0, -0.0, 100.0],
    [1234567.25, 1.0, 3.0],  # large but short: fixed notation
    [123456789.123, 1.0, np.inf],
    [0.3333333333, 2.0, -7.125],
    [np.nan, np.nan, np.nan],
    [-np.inf, 5e-7, 1.0],  # a value pandas prints in scientific notation: pandas formats it
    [1e15, 0.5, 2.0],  # long and large: scientific, pandas formats it
])
def test_text_grid_floats_as_pandas(values):
    frame = pd.DataFrame({"value": np.array(values, dtype="float64"), "n": [1, 22, 333]})
    grid = output._plain_text_grid(frame)
    if grid is not None:
        assert grid == _pandas_text(frame)
    assert output._table(frame, "t") == f"t\n{_pandas_text(frame)}\n"


def test_text_grid_columns_as_pandas():
    frame = pd.DataFrame({
        "": pd.Series(["", "x", "longer text"], dtype=object),
        "wide header": pd.Series(["a", None, "c"], dtype="str"),
        "ints": pd.array([None, -5, 70], dtype="Int64"),
        "unsigned": np.array([1, 2, 3], dtype="uint8"),
        "mixed": pd.Series([1, "two", None], dtype=object),
        "cat": pd.Categorical(["p", None, "q"]),
    })
    assert output._plain_text_grid(frame) == _pandas_text(frame)


@pytest.mark.parametrize("frame", [
    pd.DataFrame({"flag": [True, False]}),  # bool: pandas formats it
    pd.DataFrame({"text": ["tab\there", "x"]}),  # escaped by pandas
    pd.DataFrame({" lead": ["a", "b"]}),
    pd.DataFrame({0: ["a", "b"]}),  # a label that is not text
    pd.DataFrame({"f32": np.array([1.5, 2.0], dtype="float32")}),
    pd.DataFrame({"obj": pd.Series([1.5, None], dtype=object)}),
])
def test_text_grid_leaves_the_rest_to_pandas(frame):
    assert output._plain_text_grid(frame) is None
    assert output._table(frame, "t") == f"t\n{_pandas_text(frame)}\n"


def test_text_grid_follows_display_options():
    frame = pd.DataFrame({"x": [1.123456789, 2.0]})
    with pd.option_context("display.precision", 3):
        assert output._plain_text_grid(frame) == _pandas_text(frame) == "    x\n1.123\n2.000"
    with pd.option_context("display.float_format", "{:.1f}".format):
        assert output._plain_text_grid(frame) is None


def test_table_more_rows_than_shown():
    frame = pd.DataFrame({"i": range(output.TEXT_MAX_ROWS + 2)})
    text = output._table(frame, "title")
    assert text.splitlines()[1] == " i"
    assert text.splitlines()[-1] == ("  ... 2 more rows (all of them with --format csv or "
                                     "--out DIR)")


def test_step_spread_by_hand():
    frame = pd.DataFrame({
        "rank": pd.array([0, 1, 2, 0, 1, 0, 1, 0], dtype="Int64"),
        "step": pd.array([2, 2, 2, 1, 1, 3, 3, 4], dtype="Int64"),
        # step 2: ranks 0 and 2 tie for the slowest (the first is named); step 1: rank 1's
        # NaN leaves rank 0 alone (no slowest); step 3: mean 0; step 4: one rank.
        "step_ns": [10.0, 4.0, 10.0, 6.0, np.nan, 0.0, 0.0, 5.0],
    })
    spread = ranks._step_spread(frame)
    assert spread["step"].tolist() == [1, 2, 3, 4]
    assert str(spread["step"].dtype) == "Int64"
    assert spread["ranks_max_step_ns"].tolist() == [6.0, 10.0, 0.0, 5.0]
    assert spread["ranks_min_step_ns"].tolist() == [6.0, 4.0, 0.0, 5.0]
    assert spread["ranks_mean_step_ns"].tolist() == [6.0, 8.0, 0.0, 5.0]
    slowest = spread["slowest_rank"].tolist()
    assert slowest[0] is pd.NA and slowest[1:3] == [0, 0] and slowest[3] is pd.NA
    imbalance = spread["imbalance_pct"].tolist()
    assert imbalance[0] == 0.0 and imbalance[1] == 25.0 and math.isnan(imbalance[2])
    assert imbalance[3] == 0.0


def test_step_spread_empty():
    frame = pd.DataFrame({"rank": pd.array([0], dtype="Int64"),
                          "step": pd.array([None], dtype="Int64"), "step_ns": [1.0]})
    spread = ranks._step_spread(frame)
    assert spread.empty
    assert list(spread.columns) == ["step", "ranks_max_step_ns", "ranks_min_step_ns",
                                    "ranks_mean_step_ns", "slowest_rank", "imbalance_pct"]
    assert str(spread["step"].dtype) == "Int64"

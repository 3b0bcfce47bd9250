"""Column values taken as the comm code reads them (analysis.core.frames): None for each
missing value of the events' arguments (float64 numbers, objects), and one call per distinct
value."""

import numpy as np
import pandas as pd
import pytest

from analysis.core import frames
from helpers.comm_events import same


@pytest.mark.parametrize("column, expected", [
    (pd.Series([1.5, np.nan, 2.0]), [1.5, None, 2.0]),
    (pd.Series(["a", None, "b"], dtype=object), ["a", None, "b"]),
    (pd.Series(["a", np.nan, pd.NA], dtype=object), ["a", None, None]),
    # an argument of another JSON type beside the texts: kept as it is
    (pd.Series([7, None, "7"], dtype=object), [7, None, "7"]),
])
def test_values_or_none_leaves_none_for_each_missing_value(column, expected):
    found = frames.values_or_none(column, np.array([0, 1, 2]))
    assert found.dtype == object and same(found.tolist(), expected)


def test_each_distinct_keeps_values_that_compare_equal_but_print_apart():
    values = frames.object_array([0.0, -0.0, 1, True, 1.0, None, "x", "x"])
    assert frames.each_distinct(values, str).tolist() == [
        "0.0", "-0.0", "1", "True", "1.0", "None", "x", "x"]
    texts = frames.object_array(["b", None, "a", "b", np.nan])
    assert frames.each_distinct(texts, repr).tolist() == [
        "'b'", "None", "'a'", "'b'", "nan"]


"""Column values taken as the comm code reads them (analysis.core.frame_columns): None for each
missing value, one call per distinct value, and a categorical's text, on every column kind a
loaded trace may hold."""

import numpy as np
import pandas as pd
import pytest

from analysis.core import frame_columns
from helpers.comm_events import same


@pytest.mark.parametrize("column, expected", [
    (pd.Series([1.5, np.nan, 2.0]), [1.5, None, 2.0]),
    (pd.Series([3, 4, 5]), [3, 4, 5]),
    (pd.Series(["a", None, "b"], dtype=object), ["a", None, "b"]),
    (pd.Series(["a", np.nan, pd.NA], dtype=object), ["a", None, None]),
    (pd.Series(["a", None, "a"], dtype="category"), ["a", None, "a"]),
    (pd.Series(["a", None, "b"], dtype="str"), ["a", None, "b"]),
    (pd.Series([1, None, 3], dtype="Int64"), [1, None, 3]),
    # pd.isna of a one-value list-like is that value's: [nan] is missing, [1, 2] is not.
    (pd.Series([[np.nan], [1, 2], None], dtype=object), [None, [1, 2], None]),
])
def test_values_or_none_leaves_none_for_each_missing_value(column, expected):
    found = frame_columns.values_or_none(column, np.array([0, 1, 2]))
    assert found.dtype == object and same(found.tolist(), expected)


def test_each_distinct_keeps_values_that_compare_equal_but_print_apart():
    values = frame_columns.object_array([0.0, -0.0, 1, True, 1.0, None, "x", "x"])
    assert frame_columns.each_distinct(values, str).tolist() == [
        "0.0", "-0.0", "1", "True", "1.0", "None", "x", "x"]
    texts = frame_columns.object_array(["b", None, "a", "b", np.nan])
    assert frame_columns.each_distinct(texts, repr).tolist() == [
        "'b'", "None", "'a'", "'b'", "nan"]


def test_texts_of_a_categorical_print_a_missing_value_as_nan():
    column = pd.Series(["x", None, 7], dtype=pd.CategoricalDtype(pd.Index(["x", 7],
                                                                          dtype=object)))
    assert frame_columns.texts(column, np.array([2, 1, 0])).tolist() == ["7", "nan", "x"]

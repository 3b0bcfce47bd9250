"""The JSON document's per-rank fields (analysis.report.text_report): each rank's analysed steps and
what it was analysed over, as the document prints them."""

import json

import pandas as pd
import pytest

from analysis.report.values import (
    WINDOW_NONE,
    WINDOW_STEPS,
    WINDOW_WHOLE_TRACE,
    steps_by_rank,
    window_of,
)


@pytest.mark.parametrize("rank_dtype", ["Int64", "float64"])
def test_steps_by_rank_and_window_as_the_document_prints_them(rank_dtype):
    per_step = pd.DataFrame({
        "rank": pd.array([1, 0, None, 1, 2], dtype=rank_dtype),
        "step": [4, 2, 5, 3, -1],  # table order kept: rank 1 is [4, 3]
    })
    by_rank = steps_by_rank(per_step)
    assert by_rank == {1: [4, 3], 0: [2], None: [5], 2: [-1]}
    printed = {rank: {"window": window_of(by_rank.get(rank, [])),
                      "steps_analysed": by_rank.get(rank, [])} for rank in (0, 1, 2, 3)}
    assert json.loads(json.dumps(printed)) == {
        "0": {"window": WINDOW_STEPS, "steps_analysed": [2]},
        "1": {"window": WINDOW_STEPS, "steps_analysed": [4, 3]},
        "2": {"window": WINDOW_WHOLE_TRACE, "steps_analysed": [-1]},
        "3": {"window": WINDOW_NONE, "steps_analysed": []},
    }
    assert (WINDOW_STEPS, WINDOW_WHOLE_TRACE, WINDOW_NONE) == ("steps", "whole trace", "none")
    assert steps_by_rank(per_step.iloc[:0]) == {}

"""The cross-rank ops' steps found for one rank without grouping (crossrank.frames)."""

import numpy as np
import pandas as pd

from analysis.crossrank.frames import _steps_by_rank


def _steps(rank, rows):
    return pd.DataFrame({"rank": rank, "step": [r[0] for r in rows],
                         "start_ns": [r[1] for r in rows], "end_ns": [r[2] for r in rows]})


def test_one_rank_steps_given_out_of_order():
    steps = _steps(3, [(2, 200, 300), (1, 100, 150), (3, 300, 400)])
    times = np.array([99, 100, 149, 150, 250, 300, 399, 400], dtype=np.int64)
    found = _steps_by_rank(np.full(len(times), 3, dtype=np.int64), times, steps)
    np.testing.assert_array_equal(found, [np.nan, 1, 1, np.nan, 2, 3, 3, np.nan])
    assert found.dtype == np.float64


def test_one_rank_with_steps_of_another_rank_only():
    steps = _steps(1, [(1, 100, 200)])
    found = _steps_by_rank(np.array([0, 0]), np.array([150, 160]), steps)
    np.testing.assert_array_equal(found, [np.nan, np.nan])


def test_ranks_each_in_their_own_steps():
    steps = pd.concat([_steps(0, [(1, 100, 200)]), _steps(1, [(5, 150, 250)])],
                      ignore_index=True)
    found = _steps_by_rank(np.array([0, 1, 0, 1]), np.array([160, 160, 220, 90]), steps)
    np.testing.assert_array_equal(found, [1, 5, np.nan, np.nan])

"""The cross-rank pass's step of each op, found on arrays for every rank at once, on a small frame
with answers worked out by hand and against step_at rank by rank."""

import numpy as np
import pandas as pd

from analysis.core.steps import step_at
from analysis.crossrank.frames import _steps_by_rank

# ---- the cross-rank pass: each op's step on its own rank ----------------------------------------
CROSS_RANK_STEPS = pd.DataFrame(
    # Rank 1's steps straddle rank 0's: at 120 ns rank 0 is in step 2, rank 1 in step 1.
    [(1, 2, 150, 260), (0, 2, 100, 200), (2, 7, 1000, 1100), (1, 1, 50, 150), (0, 1, 0, 100)],
    columns=["rank", "step", "start_ns", "end_ns"])
# (rank, time, step): a step holds [start, end); rank 3 has no steps.
CROSS_RANK_TIMES = [
    (0, 50, 1.0), (1, 50, 1.0), (0, 120, 2.0), (1, 120, 1.0), (0, 150, 2.0), (1, 150, 2.0),
    (3, 60, np.nan), (0, 200, np.nan), (1, 40, np.nan), (2, 1000, 7.0), (2, 1100, np.nan),
    (1, 259, 2.0),
]


def test_steps_by_rank_equals_step_at_rank_by_rank():
    rank, times, expected = (np.array(column) for column in zip(*CROSS_RANK_TIMES))
    found = _steps_by_rank(rank, times, CROSS_RANK_STEPS)
    np.testing.assert_array_equal(found, expected)
    one_by_one = np.full(len(times), np.nan)
    for r in np.unique(rank):
        own = CROSS_RANK_STEPS[CROSS_RANK_STEPS["rank"] == r].sort_values("start_ns")
        if len(own):
            one_by_one[rank == r] = step_at(times[rank == r], own["start_ns"].to_numpy(),
                                            own["end_ns"].to_numpy(),
                                            own["step"].to_numpy(dtype="float64"))
    np.testing.assert_array_equal(found, one_by_one)
    assert np.isnan(_steps_by_rank(rank, times, CROSS_RANK_STEPS.iloc[:0])).all()


def test_step_at_outside_every_step_and_without_steps():
    starts, ends, numbers = np.array([0.0, 100.0]), np.array([50.0, 200.0]), np.array([3.0, 4.0])
    found = step_at(np.array([0.0, 49.0, 50.0, 100.0, 199.0, 200.0, np.nan, -1.0]), starts, ends,
                    numbers)
    np.testing.assert_array_equal(found, [3.0, 3.0, np.nan, 4.0, 4.0, np.nan, np.nan, np.nan])
    assert np.isnan(step_at(np.array([1.0, 2.0]), np.zeros(0), np.zeros(0), np.zeros(0))).all()

"""Idle gaps summed by host activity: a hand-built answer, and the array path against pandas'."""

import numpy as np
import pandas as pd
import pytest

from analysis.rank.idle_activity import _on_arrays, _on_frames, idle_by_activity


def _steps(keys):
    return pd.DataFrame({"rank": [float(r) for r, _ in keys], "step": [float(s) for _, s in keys],
                         "step_ns": 1000.0})


def _gaps(rows):
    return pd.DataFrame(rows, columns=["rank", "step", "dur_ns", "host_activity"]).astype(
        {"rank": "int64", "step": "int64", "dur_ns": "int64", "host_activity": "str"})


def test_known_answer():
    steps = _steps([(0, 1), (1, 1), (1, 2)])
    gaps = _gaps([
        (0, 1, 30, "launch"), (1, 1, 50, "launch"), (1, 2, 50, "launch"),  # two longest: first
        (0, 2, 999, "launch"),  # step 2 of rank 0 is not analysed
        (1, 2, 0, "sync"),  # zero-length
        (0, 1, 20, "data_loading"), (1, 2, 5, "data_loading"),
    ])
    activities, by_rank = idle_by_activity(steps, gaps)
    assert activities.to_dict("records") == [
        {"host_activity": "data_loading", "dur_ns": 25, "gaps": 2, "longest_ns": 20,
         "longest_rank": 0, "longest_step": 1},
        {"host_activity": "launch", "dur_ns": 130, "gaps": 3, "longest_ns": 50,
         "longest_rank": 1, "longest_step": 1},
    ]
    assert by_rank.to_dict("records") == [
        {"host_activity": "data_loading", "rank": 0, "dur_ns": 20},
        {"host_activity": "data_loading", "rank": 1, "dur_ns": 5},
        {"host_activity": "launch", "rank": 0, "dur_ns": 30},
        {"host_activity": "launch", "rank": 1, "dur_ns": 100},
    ]


@pytest.mark.parametrize("seed", range(40))
def test_arrays_equal_frames(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    gaps = _gaps(list(zip(rng.integers(0, 4, n).tolist(), rng.integers(0, 3, n).tolist(),
                          (rng.integers(-1, 5, n) * 10 ** int(rng.integers(0, 9))).tolist(),
                          rng.choice(["launch", "sync", "data_loading"], n).tolist())))
    gaps.loc[rng.random(n) < 0.1, "host_activity"] = None
    steps = _steps([(r, s) for r in range(4) for s in range(3) if rng.random() < 0.7] or [(0, 0)])
    fast = _on_arrays(steps, gaps)
    assert fast is not None
    slow = _on_frames(steps, gaps)
    for got, want in zip(fast, slow):
        pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True),
                                      check_dtype=False, check_exact=True)


def test_what_arrays_cannot_take_goes_through_pandas():
    steps = _steps([(0, 1), (0, 1)])  # one (rank, step) twice: the merge counts gaps twice
    gaps = _gaps([(0, 1, 10, "launch")])
    assert _on_arrays(steps, gaps) is None
    activities, _ = idle_by_activity(steps, gaps)
    assert activities["dur_ns"].tolist() == [20]
    floats = gaps.astype({"dur_ns": "float64"})
    assert _on_arrays(_steps([(0, 1)]), floats) is None
    assert idle_by_activity(_steps([(0, 1)]), floats)[0]["dur_ns"].tolist() == [10.0]

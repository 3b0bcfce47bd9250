"""analysis.rank.comm.enclosing: the join of a launch to the innermost call around it, against a
brute-force reading of its definition, on nested, overlapping and deeply stacked spans; the
threads the joins compare and each kernel's runtime launch."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.rank.comm import enclosing
from helpers.comm_events import event, events_frame, same


def _brute_force(candidates: pd.DataFrame, pids, tids, times) -> list[int]:
    """The definition: on the query's thread, the candidate with the latest start whose
    [start, end] holds the time, the first in frame order on ties; -1 when none does."""
    rows = list(zip(candidates.index.tolist(), map(str, candidates["pid"]),
                    map(str, candidates["tid"]), candidates["ts_ns"].tolist(),
                    candidates["dur_ns"].tolist()))
    found = []
    for pid, tid, t in zip(pids, tids, times):
        best = -1
        best_start = None
        for label, row_pid, row_tid, start, duration in rows:
            if row_pid != str(pid) or row_tid != str(tid):
                continue
            if not (start <= t <= start + duration):
                continue
            if best_start is None or start > best_start:
                best, best_start = label, start
        found.append(best)
    return found


def _candidates(starts, durations, tids) -> pd.DataFrame:
    frame = pd.DataFrame({"pid": "100", "tid": [str(t) for t in tids],
                          "ts_ns": np.asarray(starts, dtype=np.int64),
                          "dur_ns": np.asarray(durations, dtype=np.int64)})
    # Labels as an events frame gives them: not 0..n-1, not in time order.
    frame.index = np.arange(len(frame)) * 7 + 3
    return frame


def test_innermost_matches_its_definition_on_random_overlapping_spans():
    generator = np.random.default_rng(12)
    starts = generator.integers(0, 2_000, 400)
    # Equal starts (ties) and spans of very different lengths, some holding hundreds of others.
    starts[::9] = starts[1::9][: len(starts[::9])]
    durations = generator.choice([0, 3, 40, 500, 5_000], size=400)
    tids = generator.integers(1, 4, 400)
    candidates = _candidates(starts, durations, tids)
    times = np.concatenate([generator.integers(-10, 8_000, 600).astype("float64"), [np.nan]])
    query_tids = np.concatenate([generator.integers(1, 5, 600), [1]])
    pids = ["100"] * len(times)
    found = enclosing.innermost(candidates, pids, query_tids.astype(str), times)
    expected = _brute_force(candidates, pids, query_tids.astype(str), times)
    assert found.tolist() == expected
    assert (found >= 0).sum() > 300 and (found == -1).sum() > 50


def test_innermost_walks_back_past_many_short_spans_to_a_long_outer_one():
    # One long call, then 200 short ones that end before the query: the answer lies further
    # back than the steps taken for all queries together.
    starts = [0] + [10 + 5 * i for i in range(200)] + [5_000]
    durations = [100_000] + [2] * 200 + [10]
    candidates = _candidates(starts, durations, [1] * len(starts))
    times = np.array([2_000.0, 5_005.0, 11.0, 100_001.0])
    found = enclosing.innermost(candidates, ["100"] * 4, ["1"] * 4, times)
    labels = candidates.index.to_numpy()
    assert found.tolist() == [labels[0], labels[-1], labels[1], -1]
    assert found.tolist() == _brute_force(candidates, ["100"] * 4, ["1"] * 4, times)


def test_thread_ids_are_equal_where_pid_and_tid_print_alike():
    threads, queries = enclosing.thread_ids([1, "1", "2"], ["5", 5, "5"],
                                            ["1", "2", None, "1"], [5, "5", None, "6"])
    assert threads[0] == threads[1] != threads[2]
    assert queries[0] == threads[0] and queries[1] == threads[2]
    assert queries[2] not in threads and queries[3] not in threads


def test_launches_are_the_first_runtime_or_driver_event_of_each_id():
    rows = [
        event("cudaLaunchKernel", "cuda_runtime", 100, 5, correlation=1, tid="3"),
        event("cudaLaunchKernel", "cuda_runtime", 200, 5, correlation=1, tid="4"),
        event("cuLaunchKernel", "cuda_driver", 300, 5, correlation=2, tid="5"),
        event("aten::mm", "cpu_op", 400, 5, correlation=3),  # not a launch
        event("other_kernel", "kernel", 450, 5, correlation=4, is_gpu=True),
        event("ncclKernel", "kernel", 500, 5, correlation=1, is_gpu=True, is_comm=True),
    ]
    events = events_frame(rows)
    is_gpu = events["is_gpu"].to_numpy()
    ts, pid, tid = enclosing.launches(events, is_gpu, np.array([2.0, 1.0, 3.0, 4.0, np.nan]))
    assert same(ts.tolist(), [300.0, 100.0, math.nan, math.nan, math.nan])
    assert pid.tolist() == ["100", "100", None, None, None]
    assert tid.tolist() == ["5", "3", None, None, None]

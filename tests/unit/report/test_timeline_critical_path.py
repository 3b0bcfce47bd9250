"""The merged timeline's critical path track (analysis.timeline, analysis.report.
timeline_events): one process with a slice per path segment, on the common clock
(docs/viewing.md, "The merged timeline")."""

import pandas as pd

from analysis import timeline
from analysis.report import timeline_events as te

MS = 1_000_000
ORIGIN = 10 * MS


def segments(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["step", "rank", "category", "start_ns", "end_ns"])


def test_each_segment_is_a_slice_named_by_rank_and_category_on_its_own_process():
    path = segments([(1, 1, "compute", ORIGIN, ORIGIN + 35 * MS),
                     (1, 1, "transfer", ORIGIN + 35 * MS, ORIGIN + 37 * MS)])
    events = te.critical_path_events(path, pid=2, origin_ns=ORIGIN)
    slices = [e for e in events if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"], e["pid"], e["tid"]) for e in slices] == [
        ("rank 1 compute", 0.0, 35000.0, 2, te.CRITICAL_PATH_TID),
        ("rank 1 transfer", 35000.0, 2000.0, 2, te.CRITICAL_PATH_TID)]
    assert slices[0]["args"] == {"step": 1, "rank": 1, "category": "compute", "ms": 35.0}
    names = {e["name"]: e["args"] for e in events if e["ph"] == "M"}
    assert names["process_name"] == {"name": te.CRITICAL_PATH_PROCESS}
    assert names["process_sort_index"] == {"sort_index": -1}  # above every rank
    assert names["thread_name"] == {"name": "critical path"}
    assert te.critical_path_events(segments([]), 2, ORIGIN) == []


def _rank(steps: pd.DataFrame) -> dict:
    return {"events": None, "trace_steps": steps.iloc[:0], "record_steps": steps,
            "samples": None, "host": None, "training": set(), "ops": None}


def test_the_timeline_draws_the_path_of_the_windows_steps_after_its_ranks():
    steps = pd.DataFrame({"step": [1, 2], "start_ns": [ORIGIN, ORIGIN + 50 * MS],
                          "end_ns": [ORIGIN + 40 * MS, ORIGIN + 90 * MS]})
    path = segments([(1, 0, "compute", ORIGIN, ORIGIN + 40 * MS),
                     (2, 1, "compute", ORIGIN + 50 * MS, ORIGIN + 90 * MS)])
    gathered = {"ranks": {0: _rank(steps), 1: _rank(steps)}, "ops": None,
                "critical_path": path}
    window = timeline.window_steps(gathered["ranks"], [1])
    document = timeline.build(gathered, window)
    on_path = [e for e in document["traceEvents"] if e.get("cat") == "critical path"]
    # step 1 only, on the process after rank 1's, times from the window's start
    assert [(e["name"], e["pid"], e["ts"], e["dur"]) for e in on_path] == [
        ("rank 0 compute", 2, 0.0, 40000.0)]
    without = timeline.build({**gathered, "critical_path": None}, window)
    assert not [e for e in without["traceEvents"] if e.get("cat") == "critical path"]

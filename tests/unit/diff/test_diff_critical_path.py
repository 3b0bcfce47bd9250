"""Whether a change moved the critical path (analysis.diff): each side's path by rank and
category, mean ms per analysed step, side by side, and the one line that says it, on hand-built
frames (docs/diff.md, "The critical path")."""

import pandas as pd
import pytest

from analysis.core.contracts import CriticalPath
from analysis.core.step_spec import PathWindow
from analysis.diff import compare as diff_compare
from analysis.diff import side as diff_side
from analysis.diff import writers as diff_output
from analysis.diff.compare import EVERY_RANK
from helpers.synthetic import TraceBuilder, trace_name

ROLES = {0: "rank 0", 1: "rank 1"}


def path(rows) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["rank", "category", "ms"])


class FakeRun:
    def __init__(self, rows, steps):
        self.critical = None if rows is None else CriticalPath(
            critical_path=pd.DataFrame(rows, columns=["step", "rank", "category", "ms"]),
            critical_path_steps=pd.DataFrame({"step": steps}),
            critical_path_segments=pd.DataFrame())


def test_a_sides_path_is_the_mean_over_every_runs_analysed_steps():
    # run 1: two steps, rank 1 computes 30 and 40 ms on the path; run 2: one step of 20 ms;
    # a run without a path adds no step
    runs = [FakeRun([(1, 1, "compute", 30.0), (2, 1, "compute", 40.0), (2, 0, "transfer", 3.0)],
                    [1, 2]),
            FakeRun([(1, 1, "compute", 20.0)], [1]), FakeRun(None, [])]
    side = diff_side.Side(path="a", runs=runs)
    table = diff_side.critical_path(side).set_index(["rank", "category"])["ms"]
    assert table.to_dict() == {(0, "transfer"): 1.0, (1, "compute"): 30.0}


def test_a_path_that_moved_from_one_rank_and_category_to_another_says_so():
    a = path([(1, "compute", 39.0), (1, "transfer", 2.0), (0, "compute", 1.0)])
    b = path([(0, "transfer", 12.0), (0, "compute", 10.0)])
    table = diff_compare.critical_path_deltas(a, b, ROLES, ROLES)
    assert table[["role", "category"]].values.tolist()[:2] == [["rank 1", "compute"],
                                                               ["rank 0", "transfer"]]
    moved = table.set_index(["role", "category"])
    # off B's path: 0 there
    assert moved.loc[("rank 1", "compute"), ["b", "delta"]].tolist() == [0.0, -39.0]
    assert moved.loc[("rank 0", "compute"), ["a", "b", "delta"]].tolist() == [1.0, 10.0, 9.0]
    assert diff_compare.critical_path_line(table) == (
        "the critical path moved from rank 1 compute (39.00 ms per step in A) to rank 0 "
        "transfer (12.00 ms per step in B)")


def test_a_path_on_the_same_rank_and_category_stayed():
    table = diff_compare.critical_path_deltas(path([(1, "compute", 39.0)]),
                                              path([(1, "compute", 14.5), (0, "transfer", 2.0)]),
                                              ROLES, ROLES)
    assert diff_compare.critical_path_line(table) == (
        "the critical path stayed on rank 1 compute (39.00 \u2192 14.50 ms per step)")


def test_ranks_compared_as_their_mean_sum_the_paths_time_on_any_of_them():
    a = path([(0, "compute", 10.0), (1, "compute", 30.0)])
    b = path([(r, "compute", 5.0) for r in range(4)])
    every_a, every_b = dict.fromkeys([0, 1], EVERY_RANK), dict.fromkeys(range(4), EVERY_RANK)
    table = diff_compare.critical_path_deltas(a, b, every_a, every_b)
    assert table.values.tolist() == [[EVERY_RANK, "compute", 40.0, 20.0, -20.0]]


def test_a_side_without_a_path_is_named_and_neither_gives_no_line():
    empty = path([])
    table = diff_compare.critical_path_deltas(path([(1, "compute", 39.0)]), empty, ROLES, ROLES)
    assert diff_compare.critical_path_line(table) == (
        "the critical path is not known in B: nothing to compare it with")
    nothing = diff_compare.critical_path_deltas(empty, empty, ROLES, ROLES)
    assert nothing.empty and diff_compare.critical_path_line(nothing) is None


def test_the_text_json_and_csv_carry_the_path_and_its_line():
    table = diff_compare.critical_path_deltas(path([(1, "compute", 39.0)]),
                                              path([(0, "transfer", 12.0)]), ROLES, ROLES)
    line = diff_compare.critical_path_line(table)
    empty = pd.DataFrame(columns=["role", "category", "metric", "a", "b", "delta"])
    change = {k: None for k in diff_output.CHANGE_KEYS}
    result = {"verdict": "v", "coverage": "c", "change": change,
              "layout": {"note": None, "a": {}, "b": {}}, "problems": [],
              "categories": empty, "resources": empty, "pipeline": empty,
              "critical_path": table, "critical_path_line": line,
              "operators": pd.DataFrame(columns=["kind", "key"]),
              "collectives": pd.DataFrame(), "findings": pd.DataFrame(
                  columns=["status", "finding", "share_pct_a", "share_pct_b", "share_pct_delta",
                           "ranks_a", "ranks_b"])}

    class Side:
        path = "runs/x"
        runs = []

    document = diff_output.document(result, Side, Side, None)
    assert document["critical_path_line"] == line
    assert document["critical_path"][0] == {"role": "rank 1", "category": "compute",
                                            "a_ms": 39.0, "b_ms": 0.0, "delta_ms": -39.0}
    text = diff_output.text_report(result, Side, Side)
    assert f"Critical path: {line}" in text and "The critical path by rank and category" in text
    csv = diff_output.csv_text(result)
    assert "critical_path,rank 0,transfer,ms,0.0,12.0,12.0" in csv
    assert f"Critical path: {line}" in diff_output.html_page(result, Side, Side)


def test_the_compared_tables_hold_the_path_from_each_runs_critical_result():
    assert pytest.approx(30.0) == diff_side.critical_path(diff_side.Side(
        path="a", runs=[FakeRun([(1, 1, "compute", 30.0)], [1])]))["ms"].iloc[0]


def test_both_sides_take_the_window_given(tmp_path):
    # One rank, two occurrences of "## forward ##" a side; the forward launches one kernel of
    # 100 us in A and 50 us in B. --window compares the windows' paths, not the whole trace.
    for name, kernel in (("a", 100), ("b", 50)):
        b = TraceBuilder(rank=0, world_size=1)
        for start in (0, 1000):
            b.annotation("## forward ##", start, start + 30).op("aten::a", start + 5, start + 12)
            b.compute(start + 20, start + 20 + kernel, launch_at=start + 10)
        b.write(tmp_path / name / trace_name(0))
    window = PathWindow("## forward ##", 1)
    a, b = (diff_side.load_side(tmp_path / name, None, use_cache=False, window=window)
            for name in ("a", "b"))
    paths = [diff_side.critical_path(side).set_index("category")["ms"] for side in (a, b)]
    # Instance 1 alone: from its start (1000 us) to its kernel's end.
    assert [p["kernel"] for p in paths] == [pytest.approx(0.100), pytest.approx(0.050)]
    assert [p.sum() for p in paths] == [pytest.approx(0.120), pytest.approx(0.070)]

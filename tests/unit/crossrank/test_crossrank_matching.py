"""Matching collectives across the members of their group (analysis.crossrank.matching) on small
hand-built op frames whose members, positions, instances and mismatches are worked out by hand,
including the frames a run can give at the edges: no op, one rank, ranks outside the world,
steps a rank's trace does not cover, unknown sizes and p2p ops beside collectives."""

import numpy as np
import pandas as pd

from analysis.crossrank.matching import MISMATCH_COLUMNS, group_members, match_ops
from analysis.crossrank.run_frames import OP_COLUMNS, empty_ops, typed_ops


def op(rank, issue, step=0, pg="0", size=3, name="all_reduce", nbytes=4096.0, dtype="float32",
       peer=None):
    return {"rank": rank, "pg": pg, "pg_size": size, "op": name, "bytes": nbytes,
            "dtype": dtype, "step": step, "issue_ns": issue, "end_ns": issue + 5,
            "peer": np.nan if peer is None else peer, "queue": pg}


def ops_of(rows) -> pd.DataFrame:
    return typed_ops(pd.DataFrame(rows))


def coverage(pairs) -> pd.DataFrame:
    return pd.DataFrame(pairs, columns=["rank", "step"])


def missing_of(mismatches: pd.DataFrame) -> dict:
    """{(pg, step, position): missing ranks} of the mismatches."""
    return {(pg, step, position): missing for pg, step, position, missing in zip(
        mismatches["pg"], mismatches["step"], mismatches["position"],
        mismatches["missing_ranks"])}


# ---- members and positions -----------------------------------------------------------------------
def test_group_members_in_order_of_first_use_then_the_whole_world_groups():
    frame = ops_of([op(2, 0, pg="b", size=2), op(0, 1, pg="w"), op(0, 2, pg="b", size=2),
                    op(2, 3, pg="b", size=2), op(1, 4, pg="a", size=2), op(1, 5, pg="a", size=1),
                    op(1, 6, pg="p", size=2, name="send", peer=0)])  # p2p ops make no group
    members = group_members(frame, 3)
    assert members.to_dict("list") == {"pg": ["b", "b", "a", "w", "w", "w"],
                                       "rank": [2, 0, 1, 0, 1, 2]}
    assert members["pg"].dtype == object and members["rank"].dtype == "int64"
    assert all(type(pg) is str for pg in members["pg"])


def test_a_run_without_ops_has_no_members_no_instance_and_no_mismatch():
    members = group_members(empty_ops(), 4)
    assert members.empty and list(members.columns) == ["pg", "rank"]
    assert members["pg"].dtype == object and members["rank"].dtype == "int64"
    matched, mismatches = match_ops(empty_ops(), 4)
    assert matched.empty and list(matched.columns) == OP_COLUMNS + ["position", "instance"]
    assert (matched[["position", "instance"]].dtypes == "int64").all()
    assert mismatches.empty and list(mismatches.columns) == MISMATCH_COLUMNS


def test_positions_count_a_rank_s_ops_per_group_and_step_in_issue_order():
    frame = ops_of([op(1, 0), op(0, 1), op(1, 2, pg="x"), op(1, 3), op(1, 4, step=1), op(0, 5),
                    op(1, 6)])
    matched, _ = match_ops(frame, 2)
    by_op = matched.set_index(["rank", "issue_ns"])["position"]
    assert by_op.to_dict() == {(0, 1): 0, (0, 5): 1, (1, 0): 0, (1, 2): 0, (1, 3): 1,
                               (1, 4): 0, (1, 6): 2}


# ---- instances -----------------------------------------------------------------------------------
def test_instances_are_numbered_in_key_order_and_a_lone_member_is_not_matched():
    # keys sorted by (pg, step, position): ("0", 0, 0), ("0", 0, 1), ("0", 1, 0), ("a", 0, 0)
    rows = [op(r, 10 * r + t, step=s, pg=pg, size=2) for r in (1, 0)
            for t, (pg, s) in enumerate([("a", 0), ("0", 1), ("0", 0), ("0", 0)])]
    rows.append(op(0, 90, step=1, pg="solo", size=1))  # one member: not matched
    matched, mismatches = match_ops(ops_of(rows), 2)
    assert list(matched.columns) == OP_COLUMNS + ["position", "instance"]
    assert matched.set_index(["rank", "issue_ns"])["instance"].to_dict() == {
        (0, 0): 3, (0, 1): 2, (0, 2): 0, (0, 3): 1, (0, 90): -1,
        (1, 10): 3, (1, 11): 2, (1, 12): 0, (1, 13): 1}
    assert mismatches.empty and list(mismatches.columns) == MISMATCH_COLUMNS


def test_one_rank_matches_nothing_and_misses_no_member():
    matched, mismatches = match_ops(ops_of([op(0, 0, size=1), op(0, 10, size=1, step=1)]), 1)
    assert matched["instance"].tolist() == [-1, -1] and mismatches.empty


def test_unknown_sizes_match_what_they_meet_but_another_dtype_does_not():
    rows = [op(0, 0, size=2), op(1, 1, size=2, dtype="float16"),
            op(0, 2, size=2, nbytes=np.nan), op(1, 3, size=2),
            op(0, 4, size=2, nbytes=np.nan), op(1, 5, size=2, nbytes=np.nan)]
    matched, mismatches = match_ops(ops_of(rows), 2)
    assert matched["instance"].tolist() == [-1, 1, 2, -1, 1, 2]
    assert mismatches.to_dict("records") == [{
        "pg": "0", "step": 0, "position": 0, "problem": "members disagree on op, size or dtype",
        "ranks": "all_reduce 4096 B float16 on rank 1; all_reduce 4096 B float32 on rank 0",
        "missing_ranks": ""}]


def test_p2p_ops_beside_collectives_are_numbered_after_them():
    with_p2p = ops_of([op(0, 0, size=2), op(1, 10, size=2), op(0, 20, name="send", peer=1),
                       op(1, 21, name="recv", peer=0), op(0, 30, name="send", peer=1)])
    matched, mismatches = match_ops(with_p2p, 2)
    assert matched["instance"].tolist() == [0, 0, 1, -1, 1]
    assert mismatches["problem"].tolist() == ["a send with no matching recv"]
    assert (matched[["position", "instance"]].dtypes == "int64").all()


# ---- members missing from a position -------------------------------------------------------------
def test_a_member_is_missing_only_from_the_steps_its_trace_covers():
    # world 3: group "0" is the whole world, group "1" holds ranks 0 and 2
    every = [op(r, 10 * r, step=s) for s in (0, 1) for r in (0, 1, 2)]
    group_1 = [op(0, 1, pg="1", size=2), op(2, 21, pg="1", size=2)]
    all_covered = coverage([(r, s) for r in (0, 1, 2) for s in (0, 1)])
    _, mismatches = match_ops(ops_of(every + group_1), 3, all_covered)
    assert mismatches.empty

    # rank 2 has no step 1 in its trace: it is not expected there ...
    no_step_1 = [row for row in every if not (row["rank"] == 2 and row["step"] == 1)]
    partly = coverage([(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)])
    matched, mismatches = match_ops(ops_of(no_step_1), 3, partly)
    assert mismatches.empty and (matched["instance"] >= 0).all()
    # ... but where it covers step 1, it is missing there
    _, mismatches = match_ops(ops_of(no_step_1), 3, all_covered)
    assert missing_of(mismatches) == {("0", 1, 0): "2"}
    assert mismatches["problem"].tolist() == ["some members never issued it"]

    # group "1": rank 2 misses its second op of step 0
    second = group_1 + [op(0, 2, pg="1", size=2)]
    _, mismatches = match_ops(ops_of(every + second), 3, all_covered)
    assert missing_of(mismatches) == {("1", 0, 1): "2"}


def test_a_rank_outside_the_world_is_no_member_of_the_whole_world_group():
    every = [op(r, 10 * r, step=s) for s in (0, 1) for r in (0, 1, 2)]
    matched, mismatches = match_ops(ops_of(every + [op(3, 30)]), 3,
                                    coverage([(r, s) for r in range(4) for s in (0, 1)]))
    assert mismatches.empty
    assert matched.loc[matched["rank"] == 3, "instance"].tolist() == [0]


def test_the_missing_members_are_named_by_their_ranks():
    rows = [op(r, 10 * r, step=s, size=6) for s in (0, 1) for r in (0, 1, 2, 3, 5)]
    rows += [op(0, 50, step=1, size=6), op(3, 51, step=1, size=6)]
    matched, mismatches = match_ops(ops_of(rows), 6)
    # rank 4 issued nothing and covers no step; ranks 1, 2 and 5 miss the second op of step 1
    assert mismatches.to_dict("records") == [{
        "pg": "0", "step": 1, "position": 1, "problem": "some members never issued it",
        "ranks": "all_reduce 4096 B float32 on ranks 0, 3", "missing_ranks": "1-2, 5"}]
    assert sorted(matched["instance"].tolist()) == [-1, -1] + [0] * 5 + [1] * 5


def test_match_ops_without_coverage_expects_members_in_the_steps_they_issued_in():
    rows = [op(r, 10 * r, step=s) for s in (0, 1) for r in (0, 1, 2)] + [op(0, 50, step=1)]
    matched, mismatches = match_ops(ops_of(rows), 3)
    assert mismatches.to_dict("records") == [{
        "pg": "0", "step": 1, "position": 1, "problem": "some members never issued it",
        "ranks": "all_reduce 4096 B float32 on rank 0", "missing_ranks": "1-2"}]
    assert sorted(matched["instance"].tolist()) == [-1, 0, 0, 0, 1, 1, 1]

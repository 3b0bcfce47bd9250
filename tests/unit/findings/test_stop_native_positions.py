"""The stop diagnosis keeps the two position namespaces apart: the hooks' ops and the native ops
read from torch's Flight Recorder (source "native") are matched by (group, namespace,
position), so a native op never meets a hook-issued op of the same number."""

from __future__ import annotations

import pandas as pd

from analysis.findings import stop_diagnosis as stop

T0 = 1_800_000_000_000_000_000
BUCKET = 1_062_952


def issue(rank, position, source="native", op="all_reduce", nbytes=BUCKET, peer=None, at=0):
    return {"rank": rank, "step": 0, "op": op, "source": source, "pg": "0", "pg_size": 2,
            "position": position, "dtype": "float32", "bytes": nbytes, "peer": peer,
            "issue_ns": T0 + at + position * 1_000_000 + rank, "async_op": False}


def done(record):
    return {**{k: v for k, v in record.items() if k != "issue_ns"},
            "start_ns": record["issue_ns"], "end_ns": record["issue_ns"], "timing": "issue"}


def ddp_hang():
    """DDP on 2 ranks, default options: the hooks' parameter broadcast (#0) and native ops #0-#7
    done on both; rank 1 hangs before step 3, rank 0 issued bucket #8 and waits in it."""
    hooked = [issue(r, 0, source="ddp", op="broadcast", nbytes=2_115_624) for r in (0, 1)]
    native = [issue(r, p) for r in (0, 1) for p in range(8)]
    issued = hooked + native + [issue(0, 8, at=50_000_000)]
    return pd.DataFrame(issued), pd.DataFrame([done(i) for i in hooked + native])


def test_the_bucket_a_rank_waited_in_is_named_in_the_native_namespace():
    ops = stop.stop_ops(*ddp_hang())
    groups = stop.diagnose_groups(ops, {0: "failed", 1: "interrupted"}, 2)
    assert len(groups) == 1
    row = groups.iloc[0]
    assert (row["pg"], row["space"], row["kind"], row["op"], row["position"]) == (
        "0", "native", "missing", "all_reduce", 8)
    assert row["issued_ranks"] == [0] and row["missing_ranks"] == [1]
    assert row["last_completed_position"] == 7
    assert row["text"].startswith("rank 1 never issued all_reduce #8 on group 0 (native: ")


def test_a_native_and_a_hooked_op_of_the_same_number_never_collide():
    # Both namespaces have a #0 on group 0: a broadcast (hooks) and an all_gather (native).
    issued, completed = ddp_hang()
    native_zero = (issued["source"] == "native") & (issued["position"] == 0)
    issued.loc[native_zero, "op"] = "all_gather"
    completed.loc[(completed["source"] == "native") & (completed["position"] == 0), "op"] = (
        "all_gather")
    ops = stop.stop_ops(issued, completed)
    at_zero = ops[ops["position"] == 0]
    assert sorted(zip(at_zero["space"], at_zero["op"], at_zero["completed"])) == [
        ("", "broadcast", True), ("", "broadcast", True),
        ("native", "all_gather", True), ("native", "all_gather", True)]
    groups = stop.diagnose_groups(ops, {0: "failed", 1: "interrupted"}, 2)
    assert list(groups["kind"]) == ["missing"]  # no "mismatch" at #0


def test_native_send_and_recv_are_left_to_the_hooks_in_the_p2p_diagnosis():
    issued = pd.DataFrame([issue(0, 0, op="send", peer=1), issue(1, 1, op="recv", peer=0)])
    ops = stop.stop_ops(issued, pd.DataFrame(columns=["rank", "pg", "op", "peer", "position",
                                                      "start_ns", "source"]))
    assert stop.diagnose_p2p(ops, [], stop.GROUP_COLUMNS).empty

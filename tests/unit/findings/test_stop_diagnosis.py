"""The stop diagnosis (analysis.findings.stop_diagnosis) on hand-built records whose answers are
known."""

from __future__ import annotations

import inspect

import msgspec
import pandas as pd

from analysis import open_run
from analysis.findings import stop_diagnosis as stop
from analysis.ingest import stop_records
from analysis.report import text_report
from helpers.tracer_files import stack_dump, write_jsonl
from tracer import schema
from tracer.hangs import stack_dumps

T0 = 1_800_000_000_000_000_000
MB = 1_062_952


def issue(rank, position, op="all_reduce", nbytes=MB, pg="0", pg_size=4, dtype="float32",
          peer=None, at=None):
    return {"rank": rank, "step": 0, "op": op, "source": "c10d", "pg": pg, "pg_size": pg_size,
            "position": position, "dtype": dtype, "bytes": nbytes, "peer": peer,
            "issue_ns": T0 + (at if at is not None else position * 1_000_000 + rank),
            "async_op": False}


def done(record, failed=False):
    return {**{k: v for k, v in record.items() if k != "issue_ns"},
            "start_ns": record["issue_ns"], "end_ns": record["issue_ns"] + 500,
            "failed": failed}


def frames(issued, completed):
    return pd.DataFrame(issued), pd.DataFrame(completed)


def no_frames():
    return pd.DataFrame(columns=stop_records.FRAME_COLUMNS)


def hang_on_rank_2():
    """4 ranks; positions 0-2 done everywhere; rank 2 never issues #3, the others wait in it."""
    issued = [issue(r, p) for r in range(4) for p in range(3)]
    completed = [done(i) for i in issued]
    issued += [issue(r, 3, at=5_000_000 + r) for r in (0, 1, 3)]
    return frames(issued, completed)


def test_a_rank_that_never_issued_the_next_collective_is_named_with_the_op_and_position():
    ops = stop.stop_ops(*hang_on_rank_2())
    statuses = {0: "failed", 1: "failed", 2: "crashed", 3: "failed"}
    groups = stop.diagnose_groups(ops, statuses, 4)
    assert len(groups) == 1
    row = groups.iloc[0]
    assert (row["kind"], row["position"], row["op"], row["bytes"]) == ("missing", 3,
                                                                       "all_reduce", MB)
    assert row["missing_ranks"] == [2] and row["issued_ranks"] == [0, 1, 3]
    assert row["last_completed_position"] == 2 and row["dead_ranks"] == [2]
    assert row["waiting_since_ns"] == T0 + 5_000_000
    assert row["text"] == (
        f"rank 2 never issued all_reduce #3 on group 0 (1.1 MB float32), which ranks 0-1, 3 "
        f"waited in from {stop.clock_text(T0 + 5_000_000)}; rank 2 died (no run_end); last "
        f"position every member completed: #2")


def test_members_that_issued_one_position_differently_are_a_mismatch():
    issued = [issue(r, p, pg_size=2) for r in range(2) for p in range(5)]
    completed = [done(i) for i in issued]
    issued += [issue(0, 5, nbytes=4, pg_size=2), issue(1, 5, nbytes=4096, pg_size=2)]
    ops = stop.stop_ops(*frames(issued, completed))
    row = stop.diagnose_groups(ops, {0: "failed", 1: "failed"}, 2).iloc[0]
    assert (row["kind"], row["position"], row["last_completed_position"]) == ("mismatch", 5, 4)
    assert row["missing_ranks"] == [] and row["issued_ranks"] == [0, 1]
    assert row["signatures"] == "all_reduce 4 B float32 on rank 0; all_reduce 4.1 kB float32 " \
                                "on rank 1"
    assert row["dead_ranks"] == []


def test_on_four_ranks_the_one_that_issued_differently_is_named():
    issued = [issue(r, 0, nbytes=4096 if r == 2 else 4) for r in range(4)]
    ops = stop.stop_ops(*frames(issued, []))
    row = stop.diagnose_groups(ops, {r: "failed" for r in range(4)}, 4).iloc[0]
    assert (row["kind"], row["odd_ranks"], row["last_completed_position"]) == ("mismatch", [2], -1)
    assert row["text"].startswith("rank 2 issued all_reduce #0 on group 0 unlike the others: "
                                  "all_reduce 4 B float32 on ranks 0-1, 3; all_reduce 4.1 kB "
                                  "float32 on rank 2")


def test_a_dead_ranks_missing_completions_prove_nothing():
    """Its completions of the last second died with it; its issue records did not."""
    issued = [issue(r, p, pg_size=2) for r in range(2) for p in range(3)]
    completed = [done(i) for i in issued if i["rank"] == 1]
    issued += [issue(0, 3, pg_size=2, nbytes=4), issue(1, 3, pg_size=2, nbytes=4096)]
    ops = stop.stop_ops(*frames(issued, completed))
    row = stop.diagnose_groups(ops, {0: "crashed", 1: "interrupted"}, 2).iloc[0]
    assert (row["kind"], row["position"], row["last_completed_position"]) == ("mismatch", 3, 2)
    assert row["dead_ranks"] == [0] and row["odd_ranks"] == []


def test_a_position_every_member_issued_and_none_completed_is_reported_as_such():
    issued = [issue(r, p, pg_size=2) for r in range(2) for p in range(2)]
    completed = [done(i) for i in issued if i["position"] == 0]
    completed += [done(i, failed=True) for i in issued if i["position"] == 1 and i["rank"] == 0]
    ops = stop.stop_ops(*frames(issued, completed))
    assert ops.loc[(ops["rank"] == 0) & (ops["position"] == 1), "failed"].item()
    row = stop.diagnose_groups(ops, {0: "failed", 1: "interrupted"}, 2).iloc[0]
    assert (row["kind"], row["position"], row["last_completed_position"]) == (
        "not_completed", 1, 0)


def test_completion_records_alone_give_positions_in_issue_order():
    """Files written before issue records: no position, no failed flag."""
    rows = [done(issue(r, p, pg_size=2)) for r in range(2) for p in range(4)]
    rows = [{k: v for k, v in r.items() if k not in ("position", "failed")} for r in rows
            if not (r["rank"] == 1 and r["step"] == 0 and r["start_ns"] >= T0 + 3_000_000)]
    ops = stop.stop_ops(pd.DataFrame(columns=list(issue(0, 0))), pd.DataFrame(rows[::-1]))
    assert sorted(ops.loc[ops["rank"] == 1, "position"]) == [0, 1, 2]
    row = stop.diagnose_groups(ops, {0: "failed", 1: "crashed"}, 2).iloc[0]
    assert (row["kind"], row["position"], row["missing_ranks"]) == ("missing", 3, [1])


def test_a_subgroup_counts_only_its_members_and_p2p_is_left_out():
    issued = [issue(r, 0, pg="5", pg_size=2) for r in (2, 3)]
    issued += [issue(r, 0, pg="0", pg_size=4) for r in range(4)]
    issued += [issue(0, 0, op="send", pg="0", pg_size=4, peer=1)]
    completed = [done(i) for i in issued if i["pg"] == "0" and i["op"] != "send"]
    completed += [done(issued[0])]
    ops = stop.stop_ops(*frames(issued, completed))
    groups = stop.diagnose_groups(ops, {r: "failed" for r in range(4)}, 4)
    assert list(groups["pg"]) == ["5"]
    assert groups.iloc[0]["missing_ranks"] == [] and groups.iloc[0]["issued_ranks"] == [2, 3]
    assert groups.iloc[0]["kind"] == "not_completed"


def test_a_run_every_rank_ended_ok_gets_no_diagnosis():
    issued, completed = hang_on_rank_2()
    ops = stop.stop_ops(issued, completed)
    assert stop.stop_diagnosis(ops, no_frames(), {r: "ok" for r in range(4)}, 4) is None
    diagnosis = stop.stop_diagnosis(ops, no_frames(), {0: "ok", 1: "ok", 2: "crashed",
                                                       3: "ok"}, 4)
    assert diagnosis.lines[0].startswith("rank 2 never issued all_reduce #3")
    assert diagnosis.lines[-2] == "rank 2 (crashed) no stack dump"


# ---- wired into the report ----------------------------------------------------------------------

def _run_folder(tmp_path):
    for rank in (0, 1):
        start = schema.RunStart(
            schema_version=schema.SCHEMA_VERSION, run_name="r", rank=rank, local_rank=rank,
            world_size=2, host="h", pid=1, start_ns=T0, argv=[], script="t.py", script_args=[],
            torch_version="x", config={})
        ends = [schema.RunEnd(rank=0, end_ns=T0 + 10**10, status="failed", exit_code=1,
                              steps=0, windows=0, samples=0, comm_ops=3, bytes_written=0,
                              errors=0, world_size=2,
                              exception="RuntimeError: Timed out\nmore")] if rank == 0 else []
        write_jsonl(tmp_path / schema.MANIFEST_FILE.format(rank=rank), [start] + ends)
        positions = range(3) if rank == 0 else range(2)
        issued = [schema.IssueRecord(**{k: v for k, v in issue(rank, p, pg_size=2).items()
                                        if k != "rank"}) for p in positions]
        write_jsonl(tmp_path / schema.ISSUED_FILE.format(rank=rank), issued)
        write_jsonl(tmp_path / schema.COMMS_FILE.format(rank=rank), [
            schema.CommRecord(**{**{k: v for k, v in done(msgspec.structs.asdict(i)).items()},
                                 "duration_us": 0.5, "timing": "host", "algbw_gbps": 1.0,
                                 "busbw_gbps": 1.0}) for i in issued[:2]])
    write_jsonl(tmp_path / schema.STACKS_FILE.format(rank=1),
                [stack_dump("sigterm", "sleepy", 45, 1)])


def test_the_report_opens_with_the_diagnosis_and_json_holds_it(tmp_path):
    _run_folder(tmp_path)
    run = open_run(str(tmp_path), use_cache=False)
    document = run.document()["stop_diagnosis"]
    group = document["groups"][0]
    assert (group["kind"], group["position"], group["missing_ranks"], group["dead_ranks"]) == (
        "missing", 2, [1], [1])
    assert document["ranks"][1]["frames"][0] == {"file": "/x/train.py", "line": 45,
                                                 "function": "sleepy", "code": ""}
    text = text_report.text_report(run.report)
    first_table = min(i for i in (text.find("Collectives"), text.find("Ranks")) if i >= 0)
    assert text.index("Stop diagnosis") < first_table
    assert "rank 1 never issued all_reduce #2 on group 0" in text
    assert "rank 1 (crashed) was in sleepy at /x/train.py:45" in text
    assert document["ranks"][0]["text"] == ("rank 0 (failed) no stack dump; the script raised "
                                            "RuntimeError: Timed out")


def _raise_here():
    raise RuntimeError("timed out")


def test_an_exception_dump_written_after_unwinding_gives_the_frames_it_was_raised_through(
        tmp_path, monkeypatch):
    monkeypatch.setattr(stack_dumps, "_dumps", 0)
    monkeypatch.setattr(stack_dumps, "_dumped", [])
    path = tmp_path / "rank0.stacks.jsonl"
    try:
        _raise_here()
    except RuntimeError as exc:
        caught = exc
    try:
        raise ValueError("wrapped") from caught
    except ValueError as exc:
        wrapped = exc
    assert not stack_dumps.was_dumped(wrapped)
    assert stack_dumps.dump(str(path), 0, "exception", [], caught, where_raised=True)
    assert stack_dumps.was_dumped(caught) and stack_dumps.was_dumped(wrapped)
    assert not stack_dumps.was_dumped(RuntimeError("another"))
    dump = msgspec.json.decode(path.read_bytes(), type=schema.StackDump)
    main = next(t for t in dump.threads if t.main).frames
    source, first = inspect.getsourcelines(
        test_an_exception_dump_written_after_unwinding_gives_the_frames_it_was_raised_through)
    call_line = first + next(i for i, line in enumerate(source) if "_raise_here()" in line)
    assert [(f.function, f.line) for f in main[-2:]] == [
        ("test_an_exception_dump_written_after_unwinding_gives_the_frames_it_was_raised_through",
         call_line), ("_raise_here", _raise_here.__code__.co_firstlineno + 1)]
    assert dump.exception == "RuntimeError: timed out"


def p2p_ops(issued, completed, statuses=None):
    ops = stop.stop_ops(*frames(issued, completed))
    return stop.stop_diagnosis(ops, no_frames(), statuses or {0: "failed", 1: "interrupted"}, 2)


def test_a_recv_never_posted_is_named_by_its_pair_and_order():
    # rank 0 sends three activations to rank 1 and gets two gradients back; rank 1 stops after
    # its second recv: send #2 waits for a recv that never comes.
    sends = [issue(0, p, op="send", peer=1, pg_size=2, at=10 * p) for p in range(3)]
    recvs = [issue(1, p, op="recv", peer=0, pg_size=2, at=10 * p + 1) for p in range(2)]
    back = [issue(1, p, op="send", peer=0, pg_size=2, nbytes=64, at=10 * p + 5)
            for p in range(2)] + [issue(0, p, op="recv", peer=1, pg_size=2, nbytes=64,
                                        at=10 * p + 6) for p in range(2)]
    issued = sends + recvs + back
    completed = [done(i) for i in sends[:2] + recvs + back]
    found = p2p_ops(issued, completed)
    [row] = found.groups.to_dict("records")
    assert (row["kind"], row["op"], row["position"], row["src"], row["dst"]) == (
        "missing", "send", 2, 0, 1)
    assert row["issued_ranks"] == [0] and row["missing_ranks"] == [1]
    assert row["last_completed_position"] == 1 and row["waiting_since_ns"] == T0 + 20
    assert row["text"].startswith("rank 1 never posted recv #2 from rank 0 on group 0, for "
                                  "rank 0's send (1.1 MB float32) waiting from ")
    assert row["text"].endswith("; last pair both completed: #1")


def test_a_send_never_posted_and_a_size_mismatch_are_told_apart():
    waiting = issue(1, 0, op="recv", peer=0, pg_size=2)
    found = p2p_ops([waiting], [])
    [row] = found.groups.to_dict("records")
    assert (row["kind"], row["op"], row["missing_ranks"], row["last_completed_position"]) == (
        "missing", "recv", [0], -1)
    assert row["text"].startswith("rank 0 never posted send #0 to rank 1 on group 0, for "
                                  "rank 1's recv")
    issued = [issue(0, 0, op="send", peer=1, pg_size=2, nbytes=4),
              issue(1, 0, op="recv", peer=0, pg_size=2, nbytes=4096)]
    [row] = p2p_ops(issued, []).groups.to_dict("records")
    assert (row["kind"], row["issued_ranks"], row["missing_ranks"]) == ("mismatch", [0, 1], [])
    assert row["signatures"] == "send 4 B float32 on rank 0; recv 4.1 kB float32 on rank 1"


def test_p2p_ops_that_all_completed_give_no_row_and_a_dead_sender_is_not_blamed():
    issued = [issue(0, 0, op="send", peer=1, pg_size=2), issue(1, 0, op="recv", peer=0,
                                                                pg_size=2)]
    found = p2p_ops(issued, [done(i) for i in issued])
    assert found.groups.empty
    # rank 0 died right after its send: its completion record was never flushed
    found = p2p_ops(issued, [done(issued[1])], {0: schema.STATUS_NO_END, 1: "failed"})
    assert found.groups.empty


def test_a_run_killed_outright_is_diagnosed_from_its_records_alone():
    # kill -9 of the launcher: no rank has run_end nor a stack dump; the issue records (written
    # through) still name the op rank 2 never issued.
    ops = stop.stop_ops(*hang_on_rank_2())
    statuses = {r: schema.STATUS_NO_END for r in range(4)}
    found = stop.stop_diagnosis(ops, no_frames(), statuses, 4)
    [row] = found.groups.to_dict("records")
    assert (row["kind"], row["position"], row["missing_ranks"]) == ("missing", 3, [2])
    assert row["dead_ranks"] == [0, 1, 2, 3]
    assert [r["text"] for r in found.ranks] == [
        f"rank {r} ({schema.STATUS_NO_END}) no stack dump" for r in range(4)]


def test_a_run_without_any_comms_record_does_not_claim_every_op_completed(tmp_path):
    # --no-comms: the ranks' ends and stacks are known, their ops are not
    issued, _, problems = stop_records.read_stop_inputs(tmp_path, [0, 1])
    assert problems == []
    ops = stop.stop_ops(issued, pd.DataFrame())
    assert ops.empty
    found = stop.stop_diagnosis(ops, no_frames(), {0: "failed", 1: "interrupted"}, 2)
    assert found.groups.empty
    assert found.lines[0] == stop.NO_OPS_LINE
    assert found.lines[1:] == ["rank 0 (failed) no stack dump",
                                  "rank 1 (interrupted) no stack dump"]

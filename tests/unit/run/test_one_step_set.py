"""One step set for every table (analysis.run): set-up collectives (records of step 0) apart from
the analysed steps' ops, --steps applied to record-derived ops, collectives ranked by their cost
per analysed step of each op's source; waiting for peers split out of communication in the
breakdown (docs/definitions.md, "Waiting for peers"); and every recorded step an analysed step,
the profiled ones with their kernel-level split (docs/definitions.md, "Analysed steps"), read on
tests/data/ddp_cpu: steps 1-4 recorded on both ranks, 2-3 profiled."""

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import open_run
from analysis.crossrank.waits import split_communication
from analysis.rank.comm.comm_ops import analysed_ops, collectives_table, typed_ops
from analysis.rank.step_breakdown import rank_totals
from analysis.rank.tables import per_rank_table

RUN = Path(__file__).resolve().parents[2] / "data" / "ddp_cpu"


def _recorded_step_ns(rank: int) -> dict:
    rows = [json.loads(line) for line in (RUN / f"rank{rank}.steps.jsonl").open()]
    return {r["step"]: r["end_ns"] - r["start_ns"] for r in rows if r["step"] >= 1}


def _op(rank, step, origin, duration_us, issuer="c10d", op="all_reduce", nbytes=4096.0):
    return {"rank": rank, "step": step, "op": op, "source": issuer, "issuer": issuer, "pg": "0",
            "pg_desc": None, "pg_size": 2, "dtype": "float32", "bytes": nbytes,
            "duration_us": duration_us, "algbw_gbps": np.nan, "busbw_gbps": np.nan,
            "origin": origin}


def _ops():
    # Per rank: a set-up broadcast (step 0), one 1 ms c10d all-reduce recorded in each of steps
    # 1-30, and DDP's 5 ms bucket all-reduce seen in the 3 profiled steps 8-10 only.
    rows = []
    for rank in (0, 1):
        rows.append(_op(rank, 0, "records", 9_000.0, issuer="ddp", op="broadcast"))
        rows += [_op(rank, s, "records", 1_000.0) for s in range(1, 31)]
        rows += [_op(rank, s, "trace", 5_000.0, issuer="ddp", nbytes=2.0 ** 20)
                 for s in (8, 9, 10)]
    return typed_ops(pd.DataFrame(rows))


def test_set_up_collectives_are_kept_apart_from_the_steps():
    ops, setup = analysed_ops(_ops(), None)
    assert setup[["rank", "step", "op"]].values.tolist() == [[0, 0, "broadcast"],
                                                            [1, 0, "broadcast"]]
    assert (ops["step"] >= 1).all() and len(ops) == 2 * (30 + 3)


def test_steps_select_the_records_ops_too():
    ops, setup = analysed_ops(_ops(), [9, 10])
    assert sorted(set(ops["step"])) == [9, 10]
    assert ops.groupby("origin").size().to_dict() == {"records": 4, "trace": 4}
    assert len(setup) == 2  # set-up belongs to no step: shown apart whatever is selected


def test_a_run_that_never_passed_set_up_keeps_its_ops():
    ops, setup = analysed_ops(_ops().query("step == 0").reset_index(drop=True), None)
    assert len(ops) == 2 and setup.empty


def test_collectives_are_ranked_by_cost_per_step_of_their_source():
    ops, _ = analysed_ops(_ops(), None)
    table = collectives_table(ops, {(r, "records"): 30 for r in (0, 1)}
                              | {(r, "trace"): 3 for r in (0, 1)})
    # By total, c10d's 60 ms would come before DDP's 30 ms; per step DDP costs 5 ms, c10d 1 ms.
    assert table[["issuer", "total_us", "ms_per_step"]].values.tolist() == [
        ["ddp", 30_000.0, 5.0], ["c10d", 60_000.0, 1.0]]
    # Without the caller's counts, the steps of each rank's source come from its ops.
    assert collectives_table(ops)["ms_per_step"].tolist() == [5.0, 1.0]


def _breakdown():
    return pd.DataFrame({"rank": [0, 0, 1, 1], "step": [1, 2, 1, 2],
                         "comm_only_ns": [10e6, 4e6, 2e6, 3e6],
                         "step_ns": [50e6] * 4, "kind": "cpu"})


def test_waiting_for_peers_is_split_out_of_communication():
    waits = pd.DataFrame({"rank": [0, 0, 1], "step": [1, 2, 1],
                          "wait_for_peers_ms": [7.0, 9.0, 0.0]})
    split = split_communication(_breakdown(), waits)
    # Rank 0 step 2 waited 9 ms by the op records but had 4 ms of communication only: the wait
    # is at most that (the rest overlapped its compute). Rank 1 step 2: no waits known.
    assert split["peer_wait_ns"].tolist()[:3] == [7e6, 4e6, 0.0]
    assert split["transfer_ns"].tolist()[:3] == [3e6, 0.0, 2e6]
    assert math.isnan(split["peer_wait_ns"].iloc[3]) and math.isnan(split["transfer_ns"].iloc[3])
    assert split_communication(_breakdown(), None)["peer_wait_ns"].isna().all()


def test_the_split_is_summed_per_rank_and_averaged_per_step():
    waits = pd.DataFrame({"rank": [0, 0, 1], "step": [1, 2, 1],
                          "wait_for_peers_ms": [7.0, 9.0, 0.0]})
    frame = split_communication(_breakdown(), waits)
    for column in ("compute_only_ns", "overlap_ns", "memcpy_ns", "idle_ns", "exposed_comm_ns"):
        frame[column] = 0.0
    frame["overlap_pct"] = np.nan
    totals = rank_totals(frame).set_index("rank")
    assert totals.loc[0, "peer_wait_ns"] == 11e6 and totals.loc[0, "transfer_ns"] == 3e6
    assert totals.loc[1, "peer_wait_ns"] == 0.0 and totals.loc[1, "transfer_ns"] == 2e6
    per_rank = per_rank_table(frame, []).set_index("rank")
    assert per_rank.loc[0, "peer_wait_ns"] == pytest.approx(5.5e6)
    assert per_rank.loc[1, "transfer_ns"] == pytest.approx(2e6)  # the step it is known in
    columns = per_rank.columns.tolist()
    assert columns[columns.index("comm_only_ns") + 1:][:2] == ["transfer_ns", "peer_wait_ns"]


def test_every_recorded_step_is_a_row_and_the_profiled_ones_keep_their_split():
    run = open_run(RUN, use_cache=False)
    table = run.per_step
    waits = run.cross_rank.waits.set_index(["rank", "step"])["wait_for_peers_ms"]
    profiled = run.breakdown.set_index(["rank", "step"])["step_ns"]
    for rank in (0, 1):
        rows = table[table["rank"] == rank].set_index("step")
        assert rows.index.tolist() == [1, 2, 3, 4]
        for step, row in rows.iterrows():
            if step in (2, 3):  # the profiled steps: the trace's ProfilerStep span and split
                assert row["step_ns"] == profiled[(rank, step)]
                assert row["compute_only_ns"] > 0
                assert row["peer_wait_ns"] <= row["comm_only_ns"]
            else:  # the record's step time and its whole wait, no kernel-level part
                assert row["step_ns"] == _recorded_step_ns(rank)[step]
                assert math.isnan(row["compute_only_ns"]) and math.isnan(row["idle_ns"])
                assert row["peer_wait_ns"] == pytest.approx(waits[(rank, step)] * 1e6)
                assert math.isnan(row["transfer_ns"])


def test_the_ranks_table_and_the_verdict_cover_the_analysed_steps():
    run = open_run(RUN, use_cache=False)
    table = run.per_step
    per_rank = run.per_rank.set_index("rank")
    waits = run.cross_rank.waits
    for rank in (0, 1):
        mine = table[table["rank"] == rank]
        assert per_rank.loc[rank, "steps"] == 4
        assert per_rank.loc[rank, "mean_step_ns"] == pytest.approx(mine["step_ns"].mean())
        # idle is known in the profiled steps only: its share is of their time alone
        profiled = mine[mine["idle_ns"].notna()]
        assert per_rank.loc[rank, "idle_pct"] == pytest.approx(
            profiled["idle_ns"].sum() / profiled["step_ns"].sum() * 100)
        mean_wait = waits[waits["rank"] == rank]["wait_for_peers_ms"].mean()
        assert per_rank.loc[rank, "peer_wait_ns"] == pytest.approx(mean_wait * 1e6)
        assert f"rank {rank} {mean_wait:.2f} ms" in run.verdict.waits
    assert run.verdict.step_ms == pytest.approx(table["step_ns"].mean() / 1e6)


def test_findings_measured_in_the_profiled_steps_say_so_and_share_one_mean_step():
    run = open_run(RUN, use_cache=False)
    findings = run.findings.set_index("finding")
    mean_step_ms = run.per_step["step_ns"].mean() / 1e6
    said = "Measured in the 4 profiled of the 8 analysed rank-steps"
    assert said in findings.loc["idle: other host work", "evidence"]
    assert said in findings.loc["exposed transfer", "evidence"]
    # waiting for peers is measured in every analysed step, from the records
    assert said not in findings.loc["waiting for peers", "evidence"]
    for name, row in findings.iterrows():
        assert row["ms_per_step"] == pytest.approx(row["share_pct"] / 100 * mean_step_ms), name


def test_steps_and_hta_compatibility_hold_the_analysed_steps_to_the_profiled_window():
    selected = open_run(RUN, steps="3", use_cache=False)
    assert sorted(set(selected.per_step["step"])) == [3]
    assert selected.per_step["compute_only_ns"].notna().all()
    hta = open_run(RUN, hta_compatible=True, use_cache=False)
    assert hta.per_step[["rank", "step"]].values.tolist() == \
        hta.breakdown[["rank", "step"]].values.tolist()


def test_a_step_outside_every_window_keeps_its_whole_wait():
    frame = pd.DataFrame({"rank": [0], "step": [5], "comm_only_ns": [np.nan]})
    waits = pd.DataFrame({"rank": [0], "step": [5], "wait_for_peers_ms": [12.5]})
    split = split_communication(frame, waits)
    assert split["peer_wait_ns"].tolist() == [12.5e6]
    assert math.isnan(split["transfer_ns"].iloc[0])


def test_the_text_report_says_which_steps_its_tables_cover():
    from analysis.report.text_report import text_report
    text = text_report(open_run(RUN, use_cache=False).report)
    assert ("steps: 4 analysed (1-4, every recorded step); the kernel-level split (time "
            "breakdown, idle, the findings that say so) is measured in the 2 profiled (2-3)"
            ) in text
    assert "Time breakdown per rank (share of step time, profiled steps)" in text
    only = text_report(open_run(RUN, steps="3", use_cache=False).report)
    assert "steps: " not in only and "Time breakdown per rank (share of step time)\n" in only

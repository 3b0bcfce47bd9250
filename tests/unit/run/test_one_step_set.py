"""One step set for every table (analysis.run): set-up collectives (records of step 0) apart from
the analysed steps' ops, --steps applied to record-derived ops, collectives ranked by their cost
per analysed step of each op's source; and waiting for peers split out of communication in the
breakdown (docs/definitions.md, "Waiting for peers")."""

import math

import numpy as np
import pandas as pd
import pytest

from analysis.crossrank.waits import split_communication
from analysis.rank.comm.ops import collectives_table
from analysis.rank.comm.ops_table import typed_ops
from analysis.rank.step_breakdown import rank_totals
from analysis.rank.tables import per_rank_table
from analysis.run import analysed_ops


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

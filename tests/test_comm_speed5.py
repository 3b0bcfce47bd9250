"""The cross-rank pass's early path when no op matched (a lone rank's trace) against
hand-computed answers on small built frames: typed empty tables, zero waits per step."""

import numpy as np
import pandas as pd

from analysis.crossrank import analyse
from analysis.crossrank.frames import typed_ops
from analysis.crossrank.waits import no_waits, rank_step_waits


def op(rank, issue, step, pg="0"):
    return {"rank": rank, "pg": pg, "pg_size": 2, "op": "all_reduce", "bytes": 4096.0,
            "dtype": "float32", "step": step, "issue_ns": issue, "end_ns": issue + 5,
            "peer": np.nan, "queue": pg}


def lone_rank_ops():
    return typed_ops(pd.DataFrame([op(1, 10, 0), op(1, 30, 0), op(1, 50, 1)]))


def steps_of(pairs):
    return pd.DataFrame({"rank": [r for r, _ in pairs], "step": [s for _, s in pairs],
                         "start_ns": [0] * len(pairs), "end_ns": [100] * len(pairs)})


NO_CLOCK_SYNC = pd.DataFrame(columns=["rank", "offset_ns", "uncertainty_ns"])


def test_a_lone_rank_gets_typed_empty_tables_and_zero_waits():
    # rank 1 of a world of 2: every op waits for rank 0, which is absent
    steps = steps_of([(1, 1), (1, 0), (1, 1)])  # unsorted, with a repeat
    result = analyse(lone_rank_ops(), steps, NO_CLOCK_SYNC, 2)
    ops = result["ops"]
    assert ops.empty and isinstance(ops.index, pd.RangeIndex)
    added = ["position", "instance", "arrival_ns", "last_arrival_ns", "last_rank", "wait_ns",
             "transfer_ns", "queued_ns", "transfer_algbw_gbps", "transfer_busbw_gbps"]
    assert list(ops.columns) == list(lone_rank_ops().columns) + added
    assert [str(ops[c].dtype) for c in added] == ["int64"] * 8 + ["float64"] * 2
    waits = result["waits"]
    assert waits.to_dict("list") == {"rank": [1, 1], "step": [0, 1],
                                     "wait_for_peers_ms": [0.0, 0.0],
                                     "transfer_ms": [0.0, 0.0], "queued_ms": [0.0, 0.0],
                                     "ops": [0, 0]}
    assert list(waits.dtypes.astype(str)) == ["int64"] * 2 + ["float64"] * 3 + ["int64"]
    for name in ("bandwidth", "stragglers", "pipeline"):
        assert result[name].empty and len(result[name].columns) > 3, name
    assert list(result["clock"]["rank"]) == [0, 1]
    assert list(result["clock"]["source"]) == ["reference", "none"]


def test_zero_waits_of_steps_not_int64_are_the_same():
    pairs = [(2, 3), (0, 1), (2, 3), (0, 0)]
    nothing = no_waits(typed_ops(pd.DataFrame([op(0, 10, 0)])).assign(position=0, instance=-1))
    as_int = rank_step_waits(nothing, steps_of(pairs))
    as_float = rank_step_waits(nothing, steps_of(pairs).astype({"step": "float64"}))
    assert as_int[["rank", "step"]].values.tolist() == [[0, 0], [0, 1], [2, 3]]
    pd.testing.assert_frame_equal(as_int, as_float, check_exact=True)


def test_no_early_path_where_an_op_matched_or_times_are_not_int64():
    ops = typed_ops(pd.DataFrame([op(0, 10, 0), op(1, 12, 0)])).assign(position=0)
    assert no_waits(ops.assign(instance=[0, 0])) is None
    floats = ops.assign(instance=-1).astype({"issue_ns": "float64"})
    assert no_waits(floats) is None
    assert no_waits(ops.assign(instance=-1)) is not None
    matched = analyse(ops.drop(columns="position"), steps_of([(0, 0), (1, 0)]), NO_CLOCK_SYNC, 2)
    assert len(matched["ops"]) == 2 and list(matched["waits"]["ops"]) == [1, 1]

"""A synthetic 2-rank run through the cross-rank pass and the critical path, with one rank late
from a given step: the phases' tests (tests/unit/crossrank/test_phases.py) and their cost
(benchmarks/phases_cost.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis import crossrank
from analysis.crossrank import critical_path
from helpers.crossrank_ops import MS, frame, op, synced

RNG_SEED = 7


def synthetic_inputs(steps: int, slow_from: int, slow_ms: float = 60.0, work_ms: float = 1.0,
                     either: tuple[int, int, float] | None = None
                     ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(ops, steps) of a 2-rank run with one all_reduce per step: each rank works `work_ms`
    before it (rank 1 `slow_ms` more from step `slow_from`; `either` (first, last, ms): in
    those steps one rank drawn at random `ms` more), the op ends 0.1 ms after its last member
    arrives, the step 0.2 ms later."""
    rng = np.random.default_rng(RNG_SEED)
    ops, step_rows, t = [], [], 0
    for step in range(1, steps + 1):
        work = {r: (work_ms + rng.uniform(0, 0.05)) * MS for r in (0, 1)}
        if step >= slow_from:
            work[1] += slow_ms * MS
        if either is not None and either[0] <= step <= either[1]:
            work[int(rng.integers(2))] += either[2] * MS
        end = t + max(work.values()) + 0.1 * MS
        for rank in (0, 1):
            ops.append(op(rank, t + work[rank], end, step=step))
            step_rows.append({"rank": rank, "step": step, "start_ns": int(t),
                              "end_ns": int(end + 0.2 * MS)})
        t = end + 0.2 * MS
    return frame(ops), pd.DataFrame(step_rows)


def analysed(ops: pd.DataFrame, steps: pd.DataFrame):
    """(the cross-rank pass, its critical path) of synthetic_inputs' run."""
    cross = crossrank.analyse(ops, steps, synced([0, 1]), world_size=2)
    return cross, critical_path.analyse(cross)


def synthetic_run(steps: int, slow_from: int, slow_ms: float = 60.0, work_ms: float = 1.0,
                  either: tuple[int, int, float] | None = None):
    """synthetic_inputs' run analysed: (per_step rows with the pass's waits, the cross-rank
    pass, its critical path)."""
    ops, steps_frame = synthetic_inputs(steps, slow_from, slow_ms, work_ms, either)
    cross, path = analysed(ops, steps_frame)
    waits = cross.waits[["rank", "step", "wait_for_peers_ms"]]
    rows = steps_frame.merge(waits, on=["rank", "step"], how="left")
    rows = rows.assign(step_ns=rows["end_ns"] - rows["start_ns"],
                       peer_wait_ns=rows["wait_for_peers_ms"] * MS)
    return rows, cross, path

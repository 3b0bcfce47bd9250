"""Times for ops the records hold without one, taken from the profiled steps (docs/report.md,
"Ops timed from the profiled steps").

A comm record timed at issue only (`timing` "issue": gloo's Flight Recorder entries, NCCL's
without TORCH_NCCL_ENABLE_TIMING) says when the op was issued, not how long it lasted. Where a
profiler window holds the rank's step, its trace holds the same op with a start and an end (a
`gloo:*` op on gloo's worker thread, an NCCL kernel on GPU). A record and a trace op are the same
op when they are of one rank, one step and one op, and the k-th of their kind in issue order on
both sides; Kineto's gloo ops carry no group nor sequence number, so the order stands in for
the sequence number, and the group and size are checked where the trace gives them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.comm_names import UNKNOWN_PG

# ops' `time_from`: where an op's time comes from.
FROM_RECORDS = "records"  # the comm record's own (CUDA events, or host time around completion)
FROM_TRACE = "trace"  # an op read from the trace alone
FROM_PROFILED = "profiled steps"  # a record timed at issue only, timed by its profiled step's op
# A group of ops is paired by order first over (step, op), and where the two sides hold unequal
# counts there (the trace dropped an event, or a size the trace misread), over (step, op, bytes).
_BY_SIZE = (False, True)


def _side(frame: pd.DataFrame) -> list[tuple]:
    """(step, op, pg, bytes) of each row of one side: pg None where not named, bytes None where
    unknown, step None where missing."""
    steps = pd.to_numeric(frame["step"], errors="coerce").to_numpy("float64")
    nbytes = pd.to_numeric(frame["bytes"], errors="coerce").to_numpy("float64")
    pgs = (frame["pg"].to_numpy(dtype=object) if "pg" in frame.columns
           else np.full(len(frame), None, dtype=object))
    return [(None if step != step else step, op if isinstance(op, str) else None,
             pg if isinstance(pg, str) and pg != UNKNOWN_PG else None,
             None if size != size else size)
            for step, op, pg, size in zip(steps.tolist(), frame["op"].tolist(), pgs.tolist(),
                                          nbytes.tolist())]


def _groups(rows: list[tuple], wanted, by_size: bool) -> dict:
    """{key: positions in order} of the rows at `wanted` positions that have a step and an op
    (and a size, `by_size`), keyed by (step, op) or (step, op, bytes)."""
    groups: dict = {}
    for at in wanted:
        step, op, _, size = rows[at]
        if step is None or op is None or (by_size and size is None):
            continue
        groups.setdefault((step, op, size) if by_size else (step, op), []).append(at)
    return groups


def pair_with_profiled(records: pd.DataFrame, profiled: pd.DataFrame) -> np.ndarray:
    """Per row of `records` (one rank's ops: step, op, pg, bytes, in issue order), the position
    in `profiled` (the same rank's ops read from its trace, same columns, in issue order) of the
    same op; -1 where none is.

    Within each (step, op) that both sides hold equally often, the k-th record is the k-th trace
    op; a group whose counts differ is tried again split by size. A pair must agree on the group
    and the size wherever both sides give them, or its whole group stays unpaired: an order that
    disagrees once cannot be trusted for the rest."""
    found = np.full(len(records), -1, dtype=np.int64)
    if not len(records) or not len(profiled):
        return found
    mine, theirs = _side(records), _side(profiled)
    used = np.zeros(len(theirs), dtype=bool)
    for by_size in _BY_SIZE:
        left = _groups(mine, np.flatnonzero(found < 0).tolist(), by_size)
        right = _groups(theirs, np.flatnonzero(~used).tolist(), by_size)
        for key, rows in left.items():
            others = right.get(key)
            if others is None or len(others) != len(rows):
                continue
            if all(_agree(mine[a], theirs[b]) for a, b in zip(rows, others)):
                found[rows] = others
                used[others] = True
    return found


def _agree(record: tuple, traced: tuple) -> bool:
    """A record and a trace op of one (step, op) agree on the group and the size wherever the
    trace gives them (a record always names its group)."""
    _, _, pg, size = record
    _, _, traced_pg, traced_size = traced
    return ((traced_pg is None or traced_pg == pg)
            and (traced_size is None or size is None or traced_size == size))

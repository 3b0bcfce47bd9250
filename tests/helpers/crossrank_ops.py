"""Cross-rank op frames built by hand for the tests: one op per row, as typed_ops types them."""

import numpy as np
import pandas as pd

from analysis.crossrank.run_frames import typed_ops

MS = 1_000_000
NO_SYNC = pd.DataFrame(columns=["rank", "offset_ns", "uncertainty_ns"])


def synced(ranks, uncertainty_ns=1_000):
    """clock_sync records measuring every rank's clock equal to rank 0's: ops that place no
    clock of their own (p2p alone, issue times alone) are then read on one clock."""
    return pd.DataFrame({"rank": list(ranks), "offset_ns": 0, "uncertainty_ns": uncertainty_ns})


def op(rank, issue, end, step=0, name="all_reduce", pg="0", size=2, nbytes=4096,
       dtype="float32", peer=None, queue=None, timed=True):
    """One op; `timed` False: timed at issue only (its end is its issue, as the records say)."""
    return {"rank": rank, "pg": pg, "pg_size": size, "op": name, "bytes": nbytes,
            "dtype": dtype, "step": step, "issue_ns": int(issue),
            "end_ns": int(end if timed else issue),
            "peer": np.nan if peer is None else peer,
            "queue": queue or (pg if peer is None else f"{pg}:{name}:{peer}"), "timed": timed}


def issue_only(rank, issue, step=0, **kwargs):
    """An op timed at issue only (a gloo Flight Recorder record: no completion)."""
    return op(rank, issue, issue, step=step, timed=False, **kwargs)


def frame(rows):
    return typed_ops(pd.DataFrame(rows))


def steps_frame(ranks, steps, step_ns=100 * MS):
    return pd.DataFrame([{"rank": r, "step": s, "start_ns": s * step_ns,
                          "end_ns": (s + 1) * step_ns} for r in ranks for s in steps])

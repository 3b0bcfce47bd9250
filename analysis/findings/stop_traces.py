"""The stop diagnosis of a run without the tracer's comms records (a foreign run, or one traced
with --no-comms): each rank's Kineto trace(s) hold the collectives it issued in its profiler
windows, and ranks whose traces part in a step they all cover are named (docs/reliability.md,
From Kineto traces alone).

Only what the traces show is compared: a step's collectives on one group, by position, among
the members whose traces cover that step. A trace shows no completion (gloo's op spans and NCCL
kernels of a stopped op may or may not be in it), so there is no "not completed" kind, and a
rank whose trace holds fewer steps than the others is not blamed for the steps it does not
cover: its window may simply have ended earlier.

`trace_ops` reads the loaded ranks; `diagnose_traces` is pure, DataFrame in, dict out.
"""

from __future__ import annotations

import pandas as pd

from analysis.core.comm_names import P2P_OPS, UNKNOWN_PG
from analysis.core.model import UNKNOWN_RANK
from analysis.findings.stop_diagnosis import group_members
from analysis.findings.stop_text import mbytes, op_signature, ranks_text
from analysis.rank.comm.event_ops import ops_from_events
from analysis.rank.reduced import reduced_table

TRACE_OP_COLUMNS = ["rank", "step", "pg", "pg_size", "op", "bytes", "dtype", "issue_ns"]
COVERAGE_COLUMNS = ["rank", "step"]
TRACE_GROUP_COLUMNS = ["pg", "kind", "step", "position", "op", "bytes", "dtype",
                       "last_alike", "issued_ranks", "missing_ranks", "odd_ranks",
                       "covering_ranks", "signatures", "text"]
CAVEAT = ("from Kineto traces alone: each covers only its profiler window, so a rank is named "
          "only in a step its trace covers")


def trace_ops(ranks) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(collectives, coverage) of loaded ranks (analysis.core.model.RankTrace) from their traces:
    every collective in every window, the step it was issued in, and the steps each trace
    covers. A trace without ProfilerStep is one window, numbered as analysis.core.steps does."""
    ops, coverage = [], []
    for trace in ranks:
        if trace.rank == UNKNOWN_RANK or not trace.has_trace:
            continue
        every = trace.all_steps if trace.all_steps is not None else trace.steps
        # Built where the rank was reduced (its events are dropped once it is), else here.
        frame = reduced_table(trace, "stop_trace_ops", lambda t, every=every: ops_from_events(
            t.events, every, every, t.rank, t.world_size))
        if not frame.empty:
            # gloo's CPU ops name no group: one unnamed group, its members those that issued
            ops.append(frame.rename(columns={"host_ts": "issue_ns"})
                       .reindex(columns=TRACE_OP_COLUMNS)
                       .assign(pg=lambda f: f["pg"].fillna(UNKNOWN_PG)))
        steps = (every["step"].dropna().astype("int64").tolist()
                 if isinstance(every, pd.DataFrame) and not every.empty else [])
        if not steps and not frame.empty:
            steps = sorted(frame["step"].dropna().astype("int64").unique())
        coverage += [{"rank": int(trace.rank), "step": int(s)} for s in steps]
    ops_frame = (pd.concat(ops, ignore_index=True) if ops
                 else pd.DataFrame(columns=TRACE_OP_COLUMNS))
    return ops_frame, pd.DataFrame(coverage, columns=COVERAGE_COLUMNS).drop_duplicates()


def diagnose_traces(ops: pd.DataFrame, coverage: pd.DataFrame, world_size: int) -> dict | None:
    """Per process group, the first (step, position) in a step that two or more members'
    traces cover where some of them hold no collective (kind `missing`: their trace ends short)
    or hold different ones (`mismatch`); None when every group's traces agree (a run whose
    traces agree, clean or not, gets no diagnosis from them)."""
    collectives = ops[~ops["op"].isin(P2P_OPS) & ops["step"].notna()].copy()
    collectives["step"] = collectives["step"].astype("int64")
    collectives = collectives.sort_values(["rank", "issue_ns"], kind="stable")
    collectives["position"] = collectives.groupby(["rank", "pg", "step"]).cumcount()
    covered = coverage.groupby("step")["rank"].agg(lambda r: set(int(x) for x in r))
    rows = []
    for pg in sorted(collectives["pg"].dropna().unique(), key=str):
        members = group_members(collectives, pg, world_size)
        found = _first_parting(collectives[collectives["pg"] == pg], members, covered)
        if found is not None:
            rows.append({"pg": pg, **found})
    if not rows:
        return None
    groups = pd.DataFrame(rows, columns=TRACE_GROUP_COLUMNS)
    groups["text"] = [group_text(row) for row in groups.to_dict("records")]
    return {"groups": groups, "ranks": [], "lines": list(groups["text"]) + [CAVEAT]}


def _first_parting(group: pd.DataFrame, members: list[int], covered: pd.Series) -> dict | None:
    last = None
    for step, in_step in group.groupby("step", sort=True):
        covering = sorted(r for r in members if r in covered.get(step, set()))
        if len(covering) < 2:
            continue
        in_step = in_step[in_step["rank"].isin(covering)]
        for position, at in in_step.groupby("position", sort=True):
            at = at.drop_duplicates("rank").sort_values("rank")
            issued = [int(r) for r in at["rank"]]
            signatures = at.apply(op_signature, axis=1)
            if len(issued) < len(covering):
                kind = "missing"
            elif signatures.nunique() > 1:
                kind = "mismatch"
            else:
                last = (int(step), int(position))
                continue
            counts = signatures.value_counts()
            odd = []
            if kind == "mismatch" and counts.iloc[0] > counts.iloc[1]:
                odd = [r for r, s in zip(issued, signatures) if s != counts.index[0]]
            first = at.iloc[0]
            return {"kind": kind, "step": int(step), "position": int(position),
                    "op": first["op"], "bytes": first["bytes"], "dtype": first["dtype"],
                    "last_alike": last, "issued_ranks": issued,
                    "missing_ranks": [r for r in covering if r not in issued],
                    "odd_ranks": odd, "covering_ranks": covering,
                    "signatures": "; ".join(
                        f"{sig} on {ranks_text(list(at['rank'][signatures == sig]))}"
                        for sig in dict.fromkeys(signatures))}
    return None


def group_text(row: dict) -> str:
    where = f"#{row['position']} of step {row['step']} on group {row['pg']}"
    last = ("step {} #{}".format(*row["last_alike"]) if row["last_alike"] is not None
            else "none")
    if row["kind"] == "missing":
        known = [part for part, ok in ((mbytes(row["bytes"]), row["bytes"] == row["bytes"]),
                                       (str(row["dtype"]), isinstance(row["dtype"], str))) if ok]
        size = f" ({' '.join(known)})" if known else ""
        text = (f"the trace of {ranks_text(row['missing_ranks'])} holds no {row['op']} "
                f"{where}{size}, which the trace of {ranks_text(row['issued_ranks'])} holds")
    elif row["odd_ranks"]:
        text = (f"{ranks_text(row['odd_ranks'])} issued collective {where} unlike the others: "
                f"{row['signatures']}")
    else:
        text = f"ranks issued collective {where} differently: {row['signatures']}"
    return text + f"; last position every trace holds alike: {last}"

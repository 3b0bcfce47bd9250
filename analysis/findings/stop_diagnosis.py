"""The stop diagnosis of a run that did not end well (hung, failed, interrupted, crashed): per
process group, the last position every member completed, the first position where members
parted (some never issued it, or issued it differently), who waited there since when, which rank
died, and where each rank's main thread was (docs/reliability.md, Stop diagnosis).

Collectives are compared by their position on each group; a send and its recv pair as the k-th
send from rank S to rank D and the k-th recv by D from S on one group. A run without the tracer's
comms records (a foreign run, or one traced with --no-comms) is diagnosed from the collectives
each rank's Kineto trace(s) hold in its profiler windows (From Kineto traces alone).

What it reads (issue records, stack dumps, comm records, how each rank ended) is ingest's
(analysis.ingest.stop_records: a StopInputs); everything here is pure, DataFrame in, DataFrame
out, and `diagnose` gives the StopDiagnosis.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS, UNKNOWN_PG
from analysis.core.contracts import StopDiagnosis, StopInputs
from analysis.core.model import UNKNOWN_RANK
from analysis.core.step_spec import format_ranges
from tracer import schema

OP_COLUMNS = ["rank", "pg", "space", "pg_size", "position", "op", "bytes", "dtype", "peer",
              "issue_ns", "completed", "failed"]
GROUP_COLUMNS = ["pg", "space", "kind", "position", "op", "bytes", "dtype",
                 "last_completed_position",
                 "issued_ranks", "missing_ranks", "odd_ranks", "waiting_since_ns", "dead_ranks",
                 "signatures", "text"]
NO_OPS_LINE = ("no rank has comms records (traced with --no-comms, or none written), so the "
               "ops at the stop are unknown")
BAD_ENDS = ("failed", "interrupted", schema.STATUS_NO_END)


# ---- the ops each rank issued and completed -----------------------------------------------------
NATIVE_SPACE = "native"  # positions of ops torch's C++ code issued (tracer.schema.IssueRecord)


def position_space(frame: pd.DataFrame) -> pd.Series:
    """Which namespace each op's position counts in: NATIVE_SPACE for source "native" (the
    Flight Recorder's sequence numbers), "" for the hooks' own count."""
    source = frame["source"] if "source" in frame else pd.Series("", index=frame.index)
    return pd.Series(
        [NATIVE_SPACE if s == schema.NATIVE_SOURCE else "" for s in source], index=frame.index,
        dtype=object)


def _with_positions(completed: pd.DataFrame) -> pd.DataFrame:
    """Completion records of a rank written before issue records: positions counted as the
    tracer counts them, in issue order."""
    frame = completed.sort_values(["rank", "start_ns"], kind="stable").copy()
    peer = frame["peer"].astype("float64").fillna(-1) if "peer" in frame else -1
    frame["_key"] = frame["pg"].astype(str) + "|" + frame["space"] + "|" + frame["op"].where(
        frame["op"].isin(P2P_OPS), "") + "|" + pd.Series(peer, index=frame.index).astype(str)
    counted = frame.groupby(["rank", "_key"]).cumcount()
    if "position" in frame:
        frame["position"] = frame["position"].fillna(counted)
    else:
        frame["position"] = counted
    return frame.drop(columns="_key")


def stop_ops(issued: pd.DataFrame, completed: pd.DataFrame) -> pd.DataFrame:
    """One row per (rank, pg, op kind, peer, position): what was issued, and whether it
    completed without error. Ranks without issue records are known by their completions."""
    done = completed.copy()
    done["space"] = position_space(done)
    issued = issued.copy()
    issued["space"] = position_space(issued)
    if "failed" not in done:
        done["failed"] = False
    done["failed"] = done["failed"].fillna(False).astype(bool)
    if not done.empty:
        done = _with_positions(done)
    done = done.rename(columns={"start_ns": "issue_ns"})
    done = done.reindex(columns=OP_COLUMNS[:-2] + ["failed"])
    done["completed"] = ~done["failed"]
    key = ["rank", "pg", "space", "op", "peer", "position"]
    for frame in (done, issued):
        # Typed alike even when empty (a rank with no op): merge refuses object vs float keys.
        frame["rank"] = pd.to_numeric(frame["rank"]).astype("int64")
        frame["pg"] = frame["pg"].astype(object)
        frame["op"] = frame["op"].astype(object)
        frame["space"] = frame["space"].astype(object)
        frame["peer"] = frame["peer"].astype("float64")
        frame["position"] = frame["position"].astype("int64")
    both = issued.reindex(columns=OP_COLUMNS[:-2]).merge(
        done[key + ["completed", "failed"]], on=key, how="left")
    both["completed"] = both["completed"].fillna(False).astype(bool)
    both["failed"] = both["failed"].fillna(False).astype(bool)
    # Completions with no issue record: a rank traced without them, or issue lines lost to a
    # crash before they were flushed.
    seen = both[key].drop_duplicates()
    extra = done.merge(seen, on=key, how="left", indicator=True)
    extra = extra[extra["_merge"] == "left_only"].drop(columns="_merge")
    ops = pd.concat([f for f in (both, extra.reindex(columns=OP_COLUMNS)) if not f.empty]
                    or [pd.DataFrame(columns=OP_COLUMNS)], ignore_index=True)
    return ops.reindex(columns=OP_COLUMNS).sort_values(["pg", "space", "position", "rank"],
                                                       kind="stable").reset_index(drop=True)


# ---- the diagnosis ------------------------------------------------------------------------------
def needs_diagnosis(statuses: dict) -> bool:
    """A run whose ranks did not all end "ok" (a rank without a manifest tells nothing)."""
    return any(s in BAD_ENDS for s in statuses.values())


def group_members(collectives: pd.DataFrame, pg, world_size: int) -> list[int]:
    """The members of group `pg`: the whole world for a group as large as it (a size not known
    counts as smaller), else the ranks that issued a collective on it."""
    rows = collectives[collectives["pg"] == pg]
    if pd.to_numeric(rows["pg_size"], errors="coerce").max() >= world_size:
        return list(range(world_size))
    return sorted(int(r) for r in rows["rank"].unique())


def diagnose_groups(ops: pd.DataFrame, statuses: dict, world_size: int) -> pd.DataFrame:
    """One row per process group whose collectives stopped short: where members parted, or
    the position all issued and not all completed (GROUP_COLUMNS)."""
    collectives = ops[~ops["op"].isin(P2P_OPS)].copy()
    dead = sorted(r for r, s in statuses.items() if s == schema.STATUS_NO_END)
    # A dead rank's completion records of its last second were never flushed (its issue
    # records are written through): its missing completions prove nothing.
    collectives.loc[collectives["rank"].isin(dead), "completed"] = True
    rows = []
    collectives["space"] = collectives["space"].fillna("")
    for (pg, space), group in sorted(collectives.groupby(["pg", "space"], sort=False),
                                     key=lambda item: (str(item[0][0]), item[0][1])):
        members = group_members(collectives, pg, world_size)
        found = _first_parting(group, members)
        if found is None:
            continue
        kind, position, at, last_done = found
        issued = sorted(int(r) for r in at["rank"])
        missing = [r for r in members if r not in issued]
        first = at.iloc[0]
        byop_signature = at.assign(sig=at.apply(op_signature, axis=1)).groupby("sig")["rank"]
        signatures = "; ".join(f"{sig} on {ranks_text(ranks)}" for sig, ranks in sorted(
            byop_signature, key=lambda item: min(item[1])))
        counts = at.assign(sig=at.apply(op_signature, axis=1))["sig"].value_counts()
        odd = []
        if kind == "mismatch" and len(counts) > 1 and counts.iloc[0] > counts.iloc[1]:
            majority = counts.index[0]
            odd = sorted(int(r) for r, sig in zip(at["rank"], at.apply(op_signature, axis=1))
                         if sig != majority)
        rows.append({
            "pg": pg, "space": space, "kind": kind, "odd_ranks": odd, "position": position,
            "op": first["op"],
            "bytes": first["bytes"], "dtype": first["dtype"], "last_completed_position": last_done,
            "issued_ranks": issued, "missing_ranks": missing,
            "waiting_since_ns": int(at["issue_ns"].min()),
            "dead_ranks": [r for r in dead if r in members], "signatures": signatures,
        })
    frame = pd.DataFrame(rows, columns=GROUP_COLUMNS)
    frame["text"] = [group_text(row) for row in frame.to_dict("records")]
    return frame


def _first_parting(group: pd.DataFrame, members: list[int]):
    """(kind, position, that position's rows, last position every member completed) at the
    first position of `group` where the members parted or did not all complete; None if every
    position issued was completed by every member."""
    last_done = -1
    for position, at in group.groupby("position", sort=True):
        at = at.drop_duplicates("rank")
        issued = set(int(r) for r in at["rank"])
        if any(r not in issued for r in members):
            return "missing", int(position), at, last_done
        if at.apply(op_signature, axis=1).nunique() > 1:
            return "mismatch", int(position), at, last_done
        if not at["completed"].all():
            return "not_completed", int(position), at, last_done
        last_done = int(position)
    return None


def group_text(row: dict) -> str:
    native = row.get("space") == NATIVE_SPACE
    group = f"group {row['pg']}" + (" (native)" if native else "")
    what = (f"{row['op']} #{row['position']} on group {row['pg']} ("
            + ("native: issued by torch's C++ code such as DDP's reducer, " if native else "")
            + f"{mbytes(row['bytes'])} {row['dtype']})")
    since = clock_text(row["waiting_since_ns"])
    last = (f"#{row['last_completed_position']}" if row["last_completed_position"] >= 0
            else "none")
    if row["kind"] == "missing":
        text = (f"{ranks_text(row['missing_ranks'])} never issued {what}, which "
                f"{ranks_text(row['issued_ranks'])} waited in from {since}")
    elif row["kind"] == "mismatch" and row["odd_ranks"]:
        text = (f"{ranks_text(row['odd_ranks'])} issued {row['op']} #{row['position']} on {group} "
                f"unlike the others: {row['signatures']} (from {since})")
    elif row["kind"] == "mismatch":
        text = (f"ranks issued {row['op']} #{row['position']} on {group} differently: "
                f"{row['signatures']} (from {since})")
    else:
        text = f"{what} was issued by every member from {since} and never completed"
    if row["dead_ranks"]:
        text += f"; {ranks_text(row['dead_ranks'])} died (no run_end)"
    return text + f"; last position every member completed: {last}"


def rank_text(rank: int, status: str | None, frames: pd.DataFrame,
              exception: str | None = None) -> str:
    """'rank 1 (interrupted) was in before_forward at workloads/common.py:205, called from ...'."""
    own = frames[frames["rank"] == rank].sort_values("depth")
    where = "no stack dump"
    if not own.empty:
        where, depth = "was in ", 0
        for f in own.to_dict("records"):
            if f["depth"] > 0:
                where += ", called from " if f["depth"] == depth + 1 else ", ... called from "
            where += f"{f['function']} at {_short(f['file'])}:{f['line']}"
            where += f" (`{f['code']}`)" if f.get("code") else ""
            depth = f["depth"]
        where += f" ({own.iloc[0]['reason']})"
    raised = ""
    if exception:
        raised = f"; the script raised {exception.strip().splitlines()[0]}"
    return f"rank {rank} ({status or 'no manifest'}) {where}{raised}"


def _short(path: str) -> str:
    """A path from the folder the run was started in where it lies under it."""
    parts = Path(path).parts
    for anchor in ("workloads", "site-packages"):
        if anchor in parts:
            return "/".join(parts[parts.index(anchor) + (anchor == "site-packages"):])
    return path


def diagnose(inputs: StopInputs, ranks) -> StopDiagnosis | None:
    """The stop diagnosis of a run folder from what ingest read (`inputs`), None for a run
    every rank ended "ok"; with no comms record at all, what the ranks' Kineto windows hold is
    compared (`ranks`: the loaded ranks, whose reductions kept their collectives)."""
    ops = stop_ops(inputs.issued, inputs.completed)
    diagnosis = stop_diagnosis(ops, inputs.frames, inputs.statuses, inputs.world_size,
                               inputs.exceptions)
    if diagnosis is None or not ops.empty:
        return diagnosis
    # No comms record (--no-comms): what the ranks' Kineto windows hold is compared.
    traced = diagnose_traces(*trace_ops(ranks), inputs.world_size)
    if traced is None:
        return diagnosis
    return StopDiagnosis(groups=traced.groups, ranks=diagnosis.ranks,
                         lines=traced.lines + [r["text"] for r in diagnosis.ranks])


def stop_diagnosis(ops: pd.DataFrame, frames: pd.DataFrame, statuses: dict,
                   world_size: int, exceptions: dict | None = None) -> StopDiagnosis | None:
    """The diagnosis of the ops each rank issued and completed (stop_ops), None for a run every
    rank ended "ok": `groups` (diagnose_groups), `ranks` (status, top frames and run_end's
    exception of each rank) and `lines` (the plain-text report)."""
    exceptions = exceptions or {}
    if not needs_diagnosis(statuses):
        return None
    dead = sorted(r for r, s in statuses.items() if s == schema.STATUS_NO_END)
    p2p = diagnose_p2p(ops, dead, GROUP_COLUMNS)
    groups = diagnose_groups(ops, statuses, world_size)
    groups = pd.concat([f for f in (groups, p2p) if not f.empty] or [p2p], ignore_index=True)
    ranks = []
    for rank in sorted(statuses):
        own = frames[frames["rank"] == rank].sort_values("depth")
        ranks.append({"rank": int(rank), "status": statuses[rank],
                      "frames": own[["file", "line", "function", "code"]].to_dict("records"),
                      "exception": exceptions.get(rank),
                      "text": rank_text(rank, statuses[rank], frames, exceptions.get(rank))})
    if ops.empty:
        # Nothing recorded (--no-comms, or records lost): nothing to say about the ops.
        fallback = NO_OPS_LINE
    else:
        fallback = ("every collective and send/recv issued was completed by every rank it "
                    "involved; the stop came outside them")
    lines = list(groups["text"]) or [fallback]
    return StopDiagnosis(groups=groups, ranks=ranks,
                         lines=lines + [r["text"] for r in ranks])


# ---- how the diagnosis writes sizes, rank lists and clock times ---------------------------------
def mbytes(nbytes) -> str:
    if nbytes != nbytes:
        return "? B"
    nbytes = int(nbytes)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def ranks_text(ranks) -> str:
    ranks = sorted(int(r) for r in ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranges(ranks)


def clock_text(t_ns) -> str:
    """Local wall-clock time of a host-clock nanosecond stamp."""
    return datetime.datetime.fromtimestamp(int(t_ns) / 1e9).strftime("%H:%M:%S")


def op_signature(row) -> str:
    """What the members must agree on at a position: op, size and dtype."""
    return f"{row['op']} {mbytes(row['bytes'])} {row['dtype']}"


# ---- point-to-point ops -------------------------------------------------------------------------
def diagnose_p2p(ops: pd.DataFrame, dead: list[int], columns: list[str]) -> pd.DataFrame:
    """One row per (group, src, dst) whose sends and recvs stopped short; `dead`: ranks without
    run_end (their unflushed completions prove nothing, as for collectives)."""
    frame = ops[ops["op"].isin(P2P_OPS) & ops["peer"].notna()].copy()
    if "space" in frame:
        # Native send/recv (NCCL's, from C++) count positions over every peer of the group, so
        # send #k and recv #k need not be a pair: left out (the hooks see Python's send/recv).
        frame = frame[frame["space"].fillna("") == ""]
    out_columns = columns + ["src", "dst"]
    if frame.empty:
        return pd.DataFrame(columns=out_columns)
    frame.loc[frame["rank"].isin(dead), "completed"] = True
    sends = frame["op"] == "send"
    frame["src"] = np.where(sends, frame["rank"], frame["peer"]).astype(int)
    frame["dst"] = np.where(sends, frame["peer"], frame["rank"]).astype(int)
    rows = []
    for (pg, src, dst), pair in frame.groupby(["pg", "src", "dst"], sort=True):
        found = _first_unmatched(pair)
        if found is not None:
            rows.append({"pg": pg, "space": "", "src": int(src), "dst": int(dst),
                         "odd_ranks": [],
                         "dead_ranks": [r for r in dead if r in (src, dst)], **found})
    rows.sort(key=lambda row: row["waiting_since_ns"])
    result = pd.DataFrame(rows, columns=out_columns)
    result["text"] = [p2p_text(row) for row in result.to_dict("records")]
    return result


def _first_unmatched(pair: pd.DataFrame) -> dict | None:
    by_op = {op: rows.drop_duplicates("position").set_index("position")
             for op, rows in pair.groupby("op")}
    sends, recvs = by_op.get("send"), by_op.get("recv")
    positions = sorted(set(sends.index if sends is not None else [])
                       | set(recvs.index if recvs is not None else []))
    last_done = -1
    for position in positions:
        send = sends.loc[position] if sends is not None and position in sends.index else None
        recv = recvs.loc[position] if recvs is not None and position in recvs.index else None
        posted = [(op, row) for op, row in (("send", send), ("recv", recv)) if row is not None]
        if len(posted) == 1:
            kind = "missing"
        elif (send["bytes"], send["dtype"]) != (recv["bytes"], recv["dtype"]):
            kind = "mismatch"
        elif not (send["completed"] and recv["completed"]):
            kind = "not_completed"
        else:
            last_done = int(position)
            continue
        first_op, first = posted[0]
        issued = sorted(int(row["rank"]) for _, row in posted)
        src, dst = int(pair["src"].iloc[0]), int(pair["dst"].iloc[0])
        return {"kind": kind, "position": int(position), "op": first_op,
                "bytes": first["bytes"], "dtype": first["dtype"],
                "last_completed_position": last_done, "issued_ranks": issued,
                "missing_ranks": [r for r in (src, dst) if r not in issued],
                "waiting_since_ns": int(min(row["issue_ns"] for _, row in posted)),
                "signatures": "; ".join(f"{op} {mbytes(row['bytes'])} {row['dtype']} on rank "
                                        f"{int(row['rank'])}" for op, row in posted)}
    return None


def p2p_text(row: dict) -> str:
    src, dst, position, pg = row["src"], row["dst"], row["position"], row["pg"]
    since = clock_text(row["waiting_since_ns"])
    last = (f"#{row['last_completed_position']}" if row["last_completed_position"] >= 0
            else "none")
    if row["kind"] == "missing" and row["op"] == "send":
        text = (f"rank {dst} never posted recv #{position} from rank {src} on group {pg}, "
                f"for rank {src}'s send ({mbytes(row['bytes'])} {row['dtype']}) waiting from "
                f"{since}")
    elif row["kind"] == "missing":
        text = (f"rank {src} never posted send #{position} to rank {dst} on group {pg}, "
                f"for rank {dst}'s recv ({mbytes(row['bytes'])} {row['dtype']}) waiting from "
                f"{since}")
    elif row["kind"] == "mismatch":
        text = (f"send/recv #{position} rank {src} -> rank {dst} on group {pg} disagree: "
                f"{row['signatures']} (from {since})")
    else:
        text = (f"send/recv #{position} rank {src} -> rank {dst} on group {pg} "
                f"({mbytes(row['bytes'])} {row['dtype']}) was posted by both from {since} and "
                f"never completed")
    if row["dead_ranks"]:
        text += f"; {ranks_text(row['dead_ranks'])} died (no run_end)"
    return text + f"; last pair both completed: {last}"


# ---- from Kineto traces alone -------------------------------------------------------------------
TRACE_OP_COLUMNS = ["rank", "step", "pg", "pg_size", "op", "bytes", "dtype", "issue_ns"]
COVERAGE_COLUMNS = ["rank", "step"]
TRACE_GROUP_COLUMNS = ["pg", "kind", "step", "position", "op", "bytes", "dtype",
                       "last_alike", "issued_ranks", "missing_ranks", "odd_ranks",
                       "covering_ranks", "signatures", "text"]
CAVEAT = ("from Kineto traces alone: each covers only its profiler window, so a rank is named "
          "only in a step its trace covers")


def trace_ops(ranks) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(collectives, coverage) of loaded ranks (analysis.core.model.RankTrace) from their traces
    (their reductions' stop_trace_ops): every collective in every window, the step it was
    issued in, and the steps each trace covers. A trace without ProfilerStep is one window,
    numbered as analysis.core.steps does."""
    ops, coverage = [], []
    for trace in ranks:
        if trace.rank == UNKNOWN_RANK or not trace.has_trace:
            continue
        # Built where the rank was reduced, for a rank of a run folder without comm records
        # (analysis.rank.reduction.rank_tables); a rank without records has none to compare.
        frame = trace.table("stop_trace_ops")
        if frame is None:
            continue
        every = trace.all_steps if trace.all_steps is not None else trace.steps
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


def diagnose_traces(ops: pd.DataFrame, coverage: pd.DataFrame,
                    world_size: int) -> StopDiagnosis | None:
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
        found = _first_trace_parting(collectives[collectives["pg"] == pg], members, covered)
        if found is not None:
            rows.append({"pg": pg, **found})
    if not rows:
        return None
    groups = pd.DataFrame(rows, columns=TRACE_GROUP_COLUMNS)
    groups["text"] = [trace_group_text(row) for row in groups.to_dict("records")]
    return StopDiagnosis(groups=groups, lines=list(groups["text"]) + [CAVEAT])


def _first_trace_parting(group: pd.DataFrame, members: list[int], covered: pd.Series
                         ) -> dict | None:
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


def trace_group_text(row: dict) -> str:
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

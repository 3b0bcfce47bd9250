"""Waiting for peers versus transfer, per matched op on the common clock (docs/cross-rank.md).

arrival = max(issue, end of the member's previous op on the same queue); a p2p op's is its issue;
wait_for_peers = last arrival of the instance - own arrival, clipped to [0, end - arrival];
transfer = end - max(last arrival, own arrival), at least 0. An op timed at issue only (no end):
its previous op's end is taken no earlier than that op's last arrival, its wait is not clipped
by an end and its transfer is unknown (left out of transfer and bandwidth).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.comm_names import P2P_OPS
from analysis.core.contracts import Breakdown, CrossRank
from analysis.crossrank.grouped import cummax_by_group, group_starts, union_lengths
from analysis.rank.comm.comm_ops import size_bucket
from analysis.rank.idle import idle_summary, label_peer_waits
from analysis.rank.step_breakdown import rank_totals
from tracer import schema

WAITS_COLUMNS = ["rank", "step", "wait_for_peers_ms", "transfer_ms", "queued_ms", "ops"]
# The two parts of a step's communication-only time (docs/definitions.md, "Waiting for peers").
COMM_SPLIT_COLUMNS = ["transfer_ns", "peer_wait_ns"]
BANDWIDTH_COLUMNS = ["op", "pg", "pg_size", "size_bucket", "count", "transfer_us",
                     "transfer_algbw_gbps", "transfer_busbw_gbps"]


def op_waits(common: pd.DataFrame) -> pd.DataFrame:
    """Matched ops (times on the common clock) with arrival, last_arrival, wait_ns, transfer_ns,
    queued_ns and last_rank (the member that arrived last), in the order of rank, queue and
    issue. Unmatched ops are left out.

    An op timed at issue only (`timed` False: its end is unknown) arrives at its issue, or once
    its queue's previous op can have completed: not before that op's last member arrived. Its
    wait is not clipped by an end, and its transfer is unknown (transfer_ns 0, `timed` False)."""
    rank, issue, end = (common[c].to_numpy() for c in ("rank", "issue_ns", "end_ns"))
    timed = (common["timed"].to_numpy(bool) if "timed" in common.columns
             else np.ones(len(common), dtype=bool))
    queue = pd.factorize(common["queue"].to_numpy(object), sort=True, use_na_sentinel=False)[0]
    order = np.lexsort((issue, queue, rank))  # stable, as sort_values(kind="stable")
    rank, issue, end, queue = rank[order], issue[order], end[order], queue[order]
    timed = timed[order]
    first_on_queue = group_starts(rank, queue)
    # P2p ops on one link are not run one after another like a group's collectives; and gloo
    # stamps a send's end only when the schedule waits on it, so a previous send's late end
    # would make the next send look late.
    unqueued = first_on_queue | common["op"].isin(P2P_OPS).to_numpy()[order]
    instance_all = common["instance"].to_numpy()[order]
    matched = instance_all >= 0
    codes = np.full(len(order), -1, dtype=np.int64)
    distinct, codes[matched] = np.unique(instance_all[matched], return_inverse=True)
    done = end.astype("int64")  # when each op completed, or the earliest it can have
    rounds = 1 if timed.all() else max(int(np.bincount(
        np.cumsum(first_on_queue) - 1).max(initial=1)), 1)
    for _ in range(rounds):
        previous = np.empty(len(order), dtype=np.int64)
        previous[1:] = cummax_by_group(done, first_on_queue)[:-1] if len(order) else []
        previous[unqueued] = np.iinfo("int64").min
        # An op cannot arrive after it ended: where the queue is not strictly serial (an
        # earlier op's end stamped late), the previous end is capped at this op's own end.
        arrival = np.maximum(issue, np.where(timed, np.minimum(previous, end), previous))
        if rounds == 1:
            break
        latest = np.full(len(distinct) + 1, np.iinfo("int64").min)  # the last: unmatched
        np.maximum.at(latest, codes[matched], arrival[matched])
        reached = np.where(matched, latest[codes], issue)
        now_done = np.where(timed, end, np.maximum(issue, reached))
        if np.array_equal(now_done, done):
            break
        done = now_done
    rank, issue, end, arrival = rank[matched], issue[matched], end[matched], arrival[matched]
    timed = timed[matched]
    instance = instance_all[matched]
    # Per instance, the member that arrived last: the first of the latest arrivals.
    by_lateness = np.lexsort((-arrival, instance))
    last_of = by_lateness[group_starts(instance[by_lateness])]
    _, of_instance = np.unique(instance, return_inverse=True)
    last_arrival, last_rank = arrival[last_of][of_instance], rank[last_of][of_instance]
    wait = np.where(timed, np.clip(last_arrival - arrival, 0, np.maximum(end - arrival, 0)),
                    np.maximum(last_arrival - arrival, 0))
    return common.take(order[matched]).assign(
        timed=timed, arrival_ns=arrival, last_arrival_ns=last_arrival,
        last_rank=last_rank.astype("int64"), wait_ns=wait,
        transfer_ns=np.where(timed, np.maximum(end - np.maximum(last_arrival, arrival), 0), 0),
        queued_ns=arrival - issue,
    ).reset_index(drop=True)


def rank_step_waits(waits: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank and step: the time spent waiting for peers, in transfer and queued (ms, each the
    union of the rank's intervals in the step, so overlapping ops count once) and matched ops;
    transfer_ms is NaN where every op of the rank's step was timed at issue only.

    Steps in `steps` (rank, step) without a matched op get zeros."""
    pairs = [waits[["rank", "step"]]] + ([steps[["rank", "step"]]] if steps is not None else [])
    rank, step = (np.concatenate([p[c].to_numpy("int64") for p in pairs]) for c in ("rank", "step"))
    order = np.lexsort((step, rank))
    first = group_starts(rank[order], step[order])
    group = np.empty(len(order), dtype=np.int64)
    group[order] = np.cumsum(first) - 1
    groups, of_op = int(first.sum()), group[:len(waits)]
    arrival, end = waits["arrival_ns"].to_numpy("int64"), waits["end_ns"].to_numpy("int64")
    last_arrival = waits["last_arrival_ns"].to_numpy("int64")
    wait_end = arrival + waits["wait_ns"].to_numpy("int64")
    timed = (waits["timed"].to_numpy(bool) if "timed" in waits.columns
             else np.ones(len(waits), dtype=bool))
    ops = np.bincount(of_op, minlength=groups)
    # A rank's step whose ops were all timed at issue only has no known transfer (NaN, not 0).
    untimed = (ops > 0) & (np.bincount(of_op, weights=timed, minlength=groups) == 0)
    transfer = union_lengths(of_op[timed], groups, np.maximum(last_arrival, arrival)[timed],
                             end[timed]) / 1e6
    return pd.DataFrame({
        "rank": rank[order][first], "step": step[order][first],
        "wait_for_peers_ms": union_lengths(of_op, groups, arrival, wait_end) / 1e6,
        "transfer_ms": np.where(untimed, np.nan, transfer),
        "queued_ms": union_lengths(of_op, groups, waits["issue_ns"].to_numpy("int64"),
                                   arrival) / 1e6,
        "ops": ops.astype("int64"),
    })


def with_unknown_waits(table: pd.DataFrame, unknown: pd.DataFrame) -> pd.DataFrame:
    """`table` (rank_step_waits) with its times NaN in the (rank, step) pairs of `unknown`: the
    rank-steps holding an op whose members' clocks cannot be put on one clock, in which waiting
    for peers cannot be told from transfer."""
    if unknown.empty or table.empty:
        return table
    keys = unknown[["rank", "step"]].drop_duplicates().astype("int64").assign(unknown=True)
    hit = table[["rank", "step"]].astype("int64").merge(keys, on=["rank", "step"], how="left")
    mask = hit["unknown"].fillna(False).to_numpy(dtype=bool)
    out = table.copy()
    out.loc[mask, ["wait_for_peers_ms", "transfer_ms", "queued_ms"]] = np.nan
    return out


def _bus_factors(op: pd.Series, size: pd.Series) -> np.ndarray:
    pairs = pd.DataFrame({"op": op, "n": size}).drop_duplicates()
    factors = {(o, n): schema.bus_factor(o, n) for o, n in zip(pairs["op"], pairs["n"])}
    return np.array([factors[(o, n)] for o, n in zip(op, size)], dtype="float64")


def op_bandwidth(waits: pd.DataFrame) -> pd.DataFrame:
    """Per op: transfer-based algbw = bytes / transfer time, busbw = algbw x bus factor."""
    seconds = waits["transfer_ns"].to_numpy(dtype="float64") / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        algbw = np.where(seconds > 0, waits["bytes"].to_numpy() / seconds / 1e9, np.nan)
    return waits.assign(transfer_algbw_gbps=algbw,
                        transfer_busbw_gbps=algbw * _bus_factors(waits["op"], waits["pg_size"]))


def transfer_bandwidth(waits: pd.DataFrame) -> pd.DataFrame:
    """Per (op, pg, pg_size, size bucket) as in the collectives table: summed bytes over summed
    transfer time of ops with both known and a positive transfer."""
    timed = waits[(waits["transfer_ns"] > 0) & waits["bytes"].notna()]
    if timed.empty:
        return pd.DataFrame(columns=BANDWIDTH_COLUMNS)
    labels = {b: size_bucket(b)[0] for b in timed["bytes"].unique()}
    table = (timed.assign(size_bucket=timed["bytes"].map(labels))
             .groupby(["op", "pg", "pg_size", "size_bucket"])
             .agg(count=("bytes", "size"), bytes=("bytes", "sum"), ns=("transfer_ns", "sum"))
             .reset_index())
    table["transfer_us"] = table["ns"] / 1e3
    table["transfer_algbw_gbps"] = table["bytes"] / (table["ns"] / 1e9) / 1e9
    table["transfer_busbw_gbps"] = table["transfer_algbw_gbps"] * _bus_factors(
        table["op"], table["pg_size"])
    return table[BANDWIDTH_COLUMNS].sort_values("transfer_us", ascending=False,
                                                 kind="stable").reset_index(drop=True)


def _on_own_clock(waits: pd.DataFrame, common_ns: np.ndarray, clock: pd.DataFrame) -> np.ndarray:
    """Times on the common clock put back on each op's own rank's clock (offset and drift)."""
    per_rank = clock.set_index("rank")
    t0 = clock.attrs.get("t0", 0)
    offset = waits["rank"].map(per_rank["offset_ns"]).fillna(0).to_numpy(dtype="float64")
    drift = waits["rank"].map(per_rank["drift_ns_per_s"]).fillna(0).to_numpy() / 1e9
    return common_ns + np.rint(offset + drift * (common_ns - t0)).astype("int64")


def transfer_intervals(waits: pd.DataFrame, clock: pd.DataFrame) -> pd.DataFrame:
    """Each op's transfer as [start, end) on its own rank's clock, for exposed-transfer overlap
    with compute: it ends at the op's own end and lasts transfer_ns."""
    own_end = _on_own_clock(waits, waits["end_ns"].to_numpy(), clock)
    return pd.DataFrame({"rank": waits["rank"], "step": waits["step"],
                         "start_ns": own_end - waits["transfer_ns"].to_numpy(),
                         "end_ns": own_end})


def wait_windows(result: CrossRank) -> pd.DataFrame:
    """Each op's waiting for peers as [arrival, arrival + wait_for_peers) on its rank's Kineto
    clock (rank, step, start_ns, end_ns), ops that waited only: the windows idle gaps are
    compared with (docs/definitions.md, "Idle gaps")."""
    ops = result.ops
    if ops is None or ops.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64")
                             for c in ("rank", "step", "start_ns", "end_ns")})
    waited = ops[ops["wait_ns"] > 0]
    start = _on_own_clock(waited, waited["arrival_ns"].to_numpy(), result.clock)
    shift = waited["rank"].map(result.kineto_shift_ns).fillna(0).to_numpy("int64")
    start = start + shift
    return pd.DataFrame({"rank": waited["rank"].to_numpy("int64"),
                         "step": waited["step"].to_numpy("int64"), "start_ns": start,
                         "end_ns": start + waited["wait_ns"].to_numpy("int64")})


def split_communication(per_step: pd.DataFrame, waits: pd.DataFrame | None) -> pd.DataFrame:
    """`per_step` (rows of rank, step, comm_only_ns) with its communication-only time split in
    two (docs/definitions.md, "Waiting for peers"): peer_wait_ns, the rank's wait_for_peers in
    that step (rank_step_waits) but at most its communication-only time, and transfer_ns, the
    rest; both NaN where the cross-rank pass has no waits for the rank's step. A row without
    the kernel-level split (an analysed step no window holds) keeps its whole wait and no
    transfer."""
    frame = per_step.copy()
    comm = pd.to_numeric(frame["comm_only_ns"], errors="coerce").to_numpy("float64")
    wait = np.full(len(frame), np.nan)
    if waits is not None and len(waits) and len(frame):
        keys = frame[["rank", "step"]].astype("float64")
        found = keys.merge(waits[["rank", "step", "wait_for_peers_ms"]].astype("float64"),
                           on=["rank", "step"], how="left")
        wait = found["wait_for_peers_ms"].to_numpy("float64") * 1e6
    # A step outside every profiler window has no communication time to cap its wait by.
    waiting = np.where(np.isnan(comm), wait, np.minimum(wait, comm))
    frame["transfer_ns"] = comm - waiting
    frame["peer_wait_ns"] = waiting
    return frame


def with_waits(per_step: pd.DataFrame, recorded: pd.DataFrame | None, idle_gaps: pd.DataFrame,
               cross: CrossRank | None) -> Breakdown:
    """The breakdown with the cross-rank waits applied, in one step: the profiled rows
    (`per_step`) and the recorded steps no window holds (`recorded`: rank.step_breakdown.
    record_step_rows, or None) with their communication split into transfer and waiting for
    peers (split_communication), the idle gaps inside a wait labelled waiting_for_peers
    (rank.idle.label_peer_waits), and the totals and idle summary of those. Without the pass
    (`cross` None) the split is unknown (NaN) and the gaps keep their labels."""
    waits = cross.waits if cross is not None else None
    split = split_communication(per_step, waits)
    analysed = split
    if recorded is not None and len(recorded):
        analysed = pd.concat([split, split_communication(recorded, waits)], ignore_index=True)
    gaps = label_peer_waits(idle_gaps, wait_windows(cross)) if cross is not None else idle_gaps
    return Breakdown(per_step=split, analysed=analysed, idle_gaps=gaps,
                     totals=rank_totals(split), idle=idle_summary(gaps))

"""Waiting for peers versus transfer, per matched op on the common clock (docs/cross-rank.md).

arrival = max(issue, end of the member's previous op on the same queue); a p2p op's is its issue;
wait_for_peers = last arrival of the instance - own arrival, clipped to [0, end - arrival];
transfer = end - max(last arrival, own arrival), at least 0.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.crossrank.frames import P2P_OPS
from analysis.rank.comm.ops import size_bucket
from tracer import schema

WAITS_COLUMNS = ["rank", "step", "wait_for_peers_ms", "transfer_ms", "queued_ms", "ops"]
BANDWIDTH_COLUMNS = ["op", "pg", "pg_size", "size_bucket", "count", "transfer_us",
                     "transfer_algbw_gbps", "transfer_busbw_gbps"]


def op_waits(common: pd.DataFrame) -> pd.DataFrame:
    """Matched ops (times on the common clock) with arrival, last_arrival, wait_ns, transfer_ns,
    queued_ns and last_rank (the member that arrived last). Unmatched ops are left out."""
    if not (common["instance"].to_numpy() >= 0).any() and _int64_times(common):
        # No op matched (a lone rank's trace): none of the per-queue work below.
        nothing = np.zeros(0, dtype="int64")
        return common.iloc[:0].assign(**{column: nothing for column in _WAIT_COLUMNS}
                                      ).reset_index(drop=True)
    ops = common.sort_values(["rank", "queue", "issue_ns"], kind="stable").copy()
    queues = ["rank", "queue"]
    latest_end = ops.assign(latest=ops.groupby(queues)["end_ns"].cummax())
    previous_end = latest_end.groupby(queues)["latest"].shift(1)
    issue = ops["issue_ns"].to_numpy()
    # P2p ops on one link are not run one after another like a group's collectives; and gloo
    # stamps a send's end only when the schedule waits on it, so a previous send's late end
    # would make the next send look late.
    previous_end = previous_end.where(~ops["op"].isin(P2P_OPS))
    # An op cannot arrive after it ended: where the queue is not strictly serial (an earlier
    # op's end stamped late), the previous end is capped at this op's own end.
    previous = previous_end.fillna(np.iinfo("int64").min).to_numpy(dtype="int64")
    ops["arrival_ns"] = np.maximum(issue, np.minimum(previous, ops["end_ns"].to_numpy()))
    ops = ops[ops["instance"] >= 0]
    by_instance = ops.groupby("instance")["arrival_ns"]
    ops["last_arrival_ns"] = by_instance.transform("max")
    last = ops.loc[by_instance.idxmax(), ["instance", "rank"]].set_index("instance")["rank"]
    ops["last_rank"] = ops["instance"].map(last).astype("int64")
    arrival, end = ops["arrival_ns"].to_numpy(), ops["end_ns"].to_numpy()
    last_arrival = ops["last_arrival_ns"].to_numpy()
    ops["wait_ns"] = np.clip(last_arrival - arrival, 0, np.maximum(end - arrival, 0))
    ops["transfer_ns"] = np.maximum(end - np.maximum(last_arrival, arrival), 0)
    ops["queued_ns"] = ops["arrival_ns"] - ops["issue_ns"]
    return ops.reset_index(drop=True)


# The columns op_waits adds, in its order.
_WAIT_COLUMNS = ("arrival_ns", "last_arrival_ns", "last_rank", "wait_ns", "transfer_ns",
                 "queued_ns")


def no_waits(matched: pd.DataFrame) -> pd.DataFrame | None:
    """op_bandwidth(op_waits(...)) of ops none of which matched, without the clock shift and
    the per-op work: no row, the added columns typed as the full path types them. None where
    an op matched or the times are not int64 (the full path then tells)."""
    if (matched["instance"].to_numpy() >= 0).any() or not _int64_times(matched):
        return None
    nothing, no_bandwidth = np.zeros(0, dtype="int64"), np.zeros(0, dtype="float64")
    return matched.iloc[:0].assign(
        **{column: nothing for column in _WAIT_COLUMNS},
        transfer_algbw_gbps=no_bandwidth, transfer_busbw_gbps=no_bandwidth.copy(),
    ).reset_index(drop=True)


def _int64_times(ops: pd.DataFrame) -> bool:
    return all(ops[column].dtype == np.int64 for column in ("issue_ns", "end_ns"))


def union_per_group(keys: pd.DataFrame, starts, ends) -> pd.Series:
    """Per distinct row of `keys`: the length of the union of its intervals [start, end)
    (empty ones ignored), indexed by the keys; time covered by several intervals counts once."""
    columns = list(keys.columns)
    frame = keys.assign(start_=np.asarray(starts, dtype="int64"),
                        end_=np.asarray(ends, dtype="int64"))
    frame = frame[frame["end_"] > frame["start_"]].sort_values(columns + ["start_"],
                                                               kind="stable")
    if frame.empty:
        return pd.Series(dtype="int64", index=pd.MultiIndex.from_frame(keys.iloc[:0]))
    group = frame.groupby(columns, sort=False).ngroup().to_numpy()
    covered_until = frame.groupby(columns, sort=False)["end_"].cummax().to_numpy("int64")
    # A new piece of the union starts at a group's first interval and where an interval begins
    # after all earlier ones of its group ended (in int64: float64 steps by 256 ns at epoch ns).
    new_piece = np.ones(len(frame), dtype=bool)
    new_piece[1:] = (group[1:] != group[:-1]) | (frame["start_"].to_numpy()[1:]
                                                 > covered_until[:-1])
    pieces = frame.assign(piece=np.cumsum(new_piece)).groupby(columns + ["piece"], sort=False)
    lengths = (pieces["end_"].max() - pieces["start_"].min()).rename("ns").reset_index()
    return lengths.groupby(columns)["ns"].sum()


def rank_step_waits(waits: pd.DataFrame, steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per rank and step: the time spent waiting for peers, in transfer and queued (ms, each the
    union of the rank's intervals in the step, so overlapping ops count once) and matched ops.

    Steps in `steps` (rank, step) without a matched op get zeros."""
    keys = waits[["rank", "step"]].astype("int64")
    if keys.empty and steps is not None and len(steps):  # no matched op: zeros in every step
        return _zero_waits(steps)
    arrival, end = waits["arrival_ns"].to_numpy("int64"), waits["end_ns"].to_numpy("int64")
    last_arrival = waits["last_arrival_ns"].to_numpy("int64")
    sums = pd.DataFrame({
        "wait": union_per_group(keys, arrival, arrival + waits["wait_ns"].to_numpy("int64")),
        "transfer": union_per_group(keys, np.maximum(last_arrival, arrival), end),
        "queued": union_per_group(keys, waits["issue_ns"].to_numpy("int64"), arrival),
        "ops": keys.groupby(["rank", "step"]).size(),
    }).fillna(0)
    if steps is not None and len(steps):
        index = pd.MultiIndex.from_frame(steps[["rank", "step"]].drop_duplicates()
                                         .astype("int64"))
        sums = sums.reindex(sums.index.union(index), fill_value=0)
    table = pd.DataFrame({
        "wait_for_peers_ms": sums["wait"] / 1e6, "transfer_ms": sums["transfer"] / 1e6,
        "queued_ms": sums["queued"] / 1e6, "ops": sums["ops"].astype("int64"),
    }).reset_index()
    return table[WAITS_COLUMNS].sort_values(["rank", "step"]).reset_index(drop=True)


def _zero_waits(steps: pd.DataFrame) -> pd.DataFrame:
    rank, step = steps["rank"].to_numpy(), steps["step"].to_numpy()
    if rank.dtype == np.int64 and step.dtype == np.int64:
        # The distinct (rank, step) pairs in order, on arrays.
        order = np.lexsort((step, rank))
        rank, step = rank[order], step[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (rank[1:] != rank[:-1]) | (step[1:] != step[:-1])
        rank, step = rank[first], step[first]
    else:
        keys = (steps[["rank", "step"]].drop_duplicates().astype("int64")
                .sort_values(["rank", "step"]))
        rank, step = keys["rank"].to_numpy(), keys["step"].to_numpy()
    zeros = np.zeros(len(rank))
    return pd.DataFrame({"rank": rank, "step": step,
                         "wait_for_peers_ms": zeros, "transfer_ms": zeros.copy(),
                         "queued_ms": zeros.copy(), "ops": np.zeros(len(rank), dtype="int64")})


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


def wait_windows(result: dict) -> pd.DataFrame:
    """Each op's waiting for peers as [arrival, arrival + wait_for_peers) on its rank's Kineto
    clock (rank, step, start_ns, end_ns), ops that waited only: the windows idle gaps are
    compared with (docs/definitions.md, "Idle gaps")."""
    ops = result.get("ops")
    if ops is None or ops.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64")
                             for c in ("rank", "step", "start_ns", "end_ns")})
    waited = ops[ops["wait_ns"] > 0]
    start = _on_own_clock(waited, waited["arrival_ns"].to_numpy(), result["clock"])
    shift = waited["rank"].map(result.get("kineto_shift_ns", {})).fillna(0).to_numpy("int64")
    start = start + shift
    return pd.DataFrame({"rank": waited["rank"].to_numpy("int64"),
                         "step": waited["step"].to_numpy("int64"), "start_ns": start,
                         "end_ns": start + waited["wait_ns"].to_numpy("int64")})

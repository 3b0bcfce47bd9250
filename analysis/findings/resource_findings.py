"""Findings about resources rather than the step's parts: low achieved bus bandwidth of large
messages, and memory close to the device's capacity (docs/report.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.contracts import Finding
from analysis.findings.labels import backend_text, finite, group_label, rank_list

MIN_BANDWIDTH_SHARE_PCT = 1.0  # low bus bandwidth: the step time it would save
LARGE_MESSAGE_BYTES = 4 << 20  # buckets from 4 MiB up are judged on bandwidth
BUSBW_FLOOR_GBPS = {"gpu": 5.0, "cpu": 0.1}  # NCCL on GPUs; gloo on CPUs (under gigabit Ethernet)
PEER_BUSBW_FRACTION = 0.5  # below half the best same-size group of the same op and group size
MEMORY_NEAR_CAPACITY_PCT = 90.0
FRAGMENTATION_PCT = 10.0  # reserved - allocated above this share of the device: fragmentation
TOP_COLLECTIVES = 3


# ---- low achieved bus bandwidth -----------------------------------------------------------------
def _low_bus_bandwidth(steps: pd.DataFrame, kind: str, collectives: pd.DataFrame) -> list:
    """Groups of large messages (bucket >= LARGE_MESSAGE_BYTES, not barrier) whose busbw is below
    their expectation: max(the backend floor, PEER_BUSBW_FRACTION x the best busbw of another
    group with the same op, group size and bucket). A group would save
    total_us * (1 - busbw / target) at its target busbw (the peer's best when the peer rule
    flagged it, else the floor). Share: the saved share of all collective time times the share
    of step time the device spent communicating ((comm_only + overlap) / step), so that ops and
    steps covering different windows (records vs profiled steps) still compare.
    """
    needed = ("op", "pg_size", "bucket_min_bytes", "busbw_gbps", "total_us")
    if collectives.empty or steps.empty or any(c not in collectives.columns for c in needed):
        return []
    if _no_large_message_groups(collectives):
        return []
    floor = BUSBW_FLOOR_GBPS[kind]
    table = collectives.copy()
    for column in ("bucket_min_bytes", "busbw_gbps", "total_us"):
        table[column] = pd.to_numeric(table[column], errors="coerce")
    all_comm_us = table.loc[table["total_us"] > 0, "total_us"].sum()
    comm_ns = steps[["comm_only_ns", "overlap_ns"]].sum(axis=1, min_count=1).fillna(0).sum()
    comm_step_share = comm_ns / steps["step_ns"].sum()
    table = table[(table["bucket_min_bytes"] >= LARGE_MESSAGE_BYTES) & (table["op"] != "barrier")
                  & (table["busbw_gbps"] > 0) & (table["total_us"] > 0)]
    if table.empty or all_comm_us <= 0 or comm_step_share <= 0:
        return []
    table["pg_size_key"] = pd.to_numeric(table["pg_size"], errors="coerce").fillna(-1)
    table["peer_best"] = table.groupby(["op", "pg_size_key", "bucket_min_bytes"])["busbw_gbps"] \
        .transform("max")
    table["by_peer"] = table["busbw_gbps"] < PEER_BUSBW_FRACTION * table["peer_best"]
    table["target"] = np.where(table["by_peer"], np.maximum(floor, table["peer_best"]), floor)
    low = table[table["by_peer"] | (table["busbw_gbps"] < floor)].copy()
    if low.empty:
        return []
    saved_us = low["total_us"] * (1 - low["busbw_gbps"] / low["target"])
    low["share"] = saved_us / all_comm_us * comm_step_share * 100
    share = float(low["share"].sum())
    if share < MIN_BANDWIDTH_SHARE_PCT:
        return []
    low = low.sort_values("share", ascending=False)
    parts = []
    for row in low.head(TOP_COLLECTIVES).to_dict("records"):
        reason = (f"under half of {row['peer_best']:.2f} GB/s on another group of the same size"
                  if row["by_peer"]
                  else f"under the {floor:g} GB/s floor for {backend_text(kind)}")
        parts.append(f"{group_label(row)}: busbw {row['busbw_gbps']:.2f} GB/s, {reason}")
    evidence = ("Large messages reach low bus bandwidth: " + "; ".join(parts)
                + f". Reaching the expected bandwidth would save {share:.1f}% of step time "
                  "(less where the collective is hidden under compute).")
    suggestion = ("Check the transport: run with NCCL_DEBUG=INFO and look for NET/Socket where "
                  "NVLink, P2P or InfiniBand is expected, check `nvidia-smi topo -m` and "
                  "NCCL_P2P_DISABLE/NCCL_IB_DISABLE, and compare with nccl-tests "
                  "(all_reduce_perf) on the same nodes. Collective time includes waiting for late "
                  "ranks, so fix a straggler or imbalance finding first."
                  if kind == "gpu" else
                  "Check the network gloo uses (GLOO_SOCKET_IFNAME on the fastest interface, "
                  "not loopback across hosts or a management NIC), and that other processes do "
                  "not saturate the CPUs gloo needs. Collective time includes waiting for late "
                  "ranks, so fix a straggler or imbalance finding first.")
    ranks = rank_list(steps["rank"])
    return [Finding("low bus bandwidth", share, evidence, suggestion, ranks)]


def _no_large_message_groups(collectives: pd.DataFrame) -> bool:
    """True where the numeric columns are float64 and no group passes the filter of large
    messages, barrier left out (the finding is then empty): its frame work is left out."""
    columns = ("bucket_min_bytes", "busbw_gbps", "total_us")
    if any(collectives[c].dtype != np.float64 for c in columns):
        return False
    bucket, busbw, total_us = (collectives[c].to_numpy() for c in columns)
    large = (bucket >= LARGE_MESSAGE_BYTES) & (busbw > 0) & (total_us > 0)
    return not (large & (collectives["op"].to_numpy() != "barrier")).any()



# ---- memory close to capacity -------------------------------------------------------------------
def _memory_near_capacity(per_rank: pd.DataFrame) -> list:
    """Ranks whose peak reserved memory (or, without it, NVML's peak used) exceeds
    MEMORY_NEAR_CAPACITY_PCT of the device's memory.
    """
    if per_rank.empty or "rank" not in per_rank.columns or _below_capacity(per_rank):
        return []
    table = per_rank.copy()
    reserved = pd.to_numeric(table.get("peak_reserved_pct"), errors="coerce") \
        if "peak_reserved_pct" in table.columns else pd.Series(np.nan, index=table.index)
    used = pd.to_numeric(table.get("device_used_pct"), errors="coerce") \
        if "device_used_pct" in table.columns else pd.Series(np.nan, index=table.index)
    table["used_pct"] = reserved.where(reserved.notna(), used)
    table["measure"] = np.where(reserved.notna(), "reserved by PyTorch", "in use (NVML)")
    near = table[table["used_pct"] > MEMORY_NEAR_CAPACITY_PCT]
    if near.empty:
        return []
    worst = near.loc[near["used_pct"].idxmax()]
    total = _number(worst, "device_total_bytes")
    peak = _number(worst, "peak_reserved_bytes") if worst["measure"] == "reserved by PyTorch" \
        else _number(worst, "peak_device_used_bytes")
    evidence = (f"{len(near)} rank(s) peak above {MEMORY_NEAR_CAPACITY_PCT:g}% of device memory; "
                f"worst rank {int(worst['rank'])}: {worst['used_pct']:.1f}% "
                f"{worst['measure']}")
    if finite(peak) and finite(total):
        evidence += f" ({peak / 2**30:.2f} of {total / 2**30:.2f} GiB)"
    allocated = _number(worst, "peak_allocated_bytes")
    if finite(allocated):
        evidence += f", peak allocated {allocated / 2**30:.2f} GiB"
    evidence += "."
    suggestion = ("One allocation spike away from an out-of-memory error: free memory with "
                  "activation "
                  "checkpointing (torch.utils.checkpoint), a smaller micro-batch with gradient "
                  "accumulation, bf16 mixed precision, or sharded optimizer state (FSDP/ZeRO).")
    if (finite(peak) and finite(allocated) and finite(total) and total > 0
            and (peak - allocated) / total * 100 > FRAGMENTATION_PCT):
        suggestion += (" Reserved exceeds allocated by "
                       f"{(peak - allocated) / total * 100:.0f}% of the device: the caching "
                       "allocator is fragmented; try "
                       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
    return [Finding("memory near capacity", float("nan"), evidence, suggestion,
                     rank_list(near["rank"]))]


def _below_capacity(per_rank: pd.DataFrame) -> bool:
    """True where the memory columns are float64 (or absent) and no rank is near capacity: the
    finding's frame work is then left out; anything else is judged by it."""
    used = np.full(len(per_rank), np.nan)
    for column in ("device_used_pct", "peak_reserved_pct"):  # reserved, where known, first
        if column in per_rank.columns:
            if per_rank[column].dtype != np.float64:
                return False
            values = per_rank[column].to_numpy()
            used = np.where(np.isnan(values), used, values)
    return not (used > MEMORY_NEAR_CAPACITY_PCT).any()


def _number(row, column):
    try:
        return float(row[column])
    except (KeyError, TypeError, ValueError):
        return float("nan")

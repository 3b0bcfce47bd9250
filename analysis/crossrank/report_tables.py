"""The cross-rank result as tables for the text report and the CSV files (docs/analysis.md).

Pure: frames of `analysis.crossrank.cross_rank` in, display or CSV frames out; the report
writers render them.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.contracts import CrossRank
from analysis.crossrank.waits import split_communication

MS = 1e6
# The parts of a rank's bar in the reports: with the cross-rank waits, and without them.
BAR_PARTS_CROSS = ["compute", "overlap", "transfer", "waiting", "memcpy", "idle"]
BAR_PARTS_PLAIN = ["compute", "overlap", "comm", "memcpy", "idle"]


def _nothing(frame) -> bool:
    return frame is None or len(frame) == 0


def clock_rows(result: CrossRank) -> pd.DataFrame:
    """Per rank: offset to rank 0's clock and its uncertainty (ms), source, drift (NaN: none
    fitted), and what the collectives' estimate stands on (instances, where their ends come
    from)."""
    clock = result.clock
    if _nothing(clock):
        return pd.DataFrame()
    instances = clock["instances"].astype("int64")
    sources = clock["estimate_from"] if "estimate_from" in clock else pd.Series(None, clock.index)
    estimated = [f"{n} instances" + (f", {s}" if isinstance(s, str) else "") if n else None
                 for n, s in zip(instances.tolist(), sources.tolist())]
    return pd.DataFrame({
        "rank": clock["rank"].astype("int64"),
        "offset ms": clock["offset_ns"] / MS,
        "+- ms": clock["uncertainty_ns"] / MS,
        "source": clock["source"],
        "drift ns/s": clock["drift_ns_per_s"],
        "clock_sync - estimate ms": clock["disagreement_ns"] / MS,
        "estimated from": pd.Series(estimated, index=clock.index, dtype="str"),
    })


def mean_waits(result: CrossRank) -> pd.DataFrame:
    """Per rank: mean wait_for_peers and transfer per analysed step (ms), and the steps."""
    waits = result.waits
    if _nothing(waits):
        return pd.DataFrame(columns=["rank", "steps", "wait_for_peers_ms", "transfer_ms"])
    by_rank = waits.groupby("rank")
    return pd.DataFrame({
        "steps": by_rank["step"].nunique(),
        "wait_for_peers_ms": by_rank["wait_for_peers_ms"].mean(),
        "transfer_ms": by_rank["transfer_ms"].mean(),
    }).reset_index()


def firing_stragglers(result: CrossRank) -> pd.DataFrame:
    """The ranks named by "ranks wait for rank R", largest caused wait first."""
    stragglers = result.stragglers
    if _nothing(stragglers):
        return pd.DataFrame(columns=["rank", "caused_wait_ms_per_step", "share_pct"])
    fires = stragglers[stragglers["fires"].astype(bool)]
    return fires[["rank", "caused_wait_ms_per_step", "share_pct"]].reset_index(drop=True)


def pipeline_rows(result: CrossRank) -> pd.DataFrame:
    pipeline = result.pipeline
    if _nothing(pipeline):
        return pd.DataFrame()
    return pipeline[["rank", "measured_bubble_pct", "theory_bubble_pct", "recv_wait_pct",
                     "transfer_pct", "idle_pct"]]


def text_tables(result: CrossRank) -> list[tuple[str, pd.DataFrame]]:
    """(title, table) of the text report's Cross-rank section, in order."""
    return [
        ("Clock: offset of each rank's clock to rank 0's", clock_rows(result)),
        ("Stragglers: ranks the others wait for (docs/cross-rank.md thresholds)",
         firing_stragglers(result)),
        ("Waiting for peers and transfer, mean per step (ms)", mean_waits(result)),
        ("Mismatched collectives", result.mismatches),
        ("Pipeline bubble per stage, measured against theory (% of step time)",
         pipeline_rows(result)),
    ]


def csv_tables(result: CrossRank) -> dict[str, pd.DataFrame]:
    """File stem -> table written by --out (cross_rank_*.csv)."""
    stragglers = result.stragglers
    return {
        "cross_rank_clock": result.clock,
        "cross_rank_waits": result.waits,
        "cross_rank_stragglers": stragglers.drop(columns=["collectives", "evidence"],
                                                 errors="ignore"),
        "cross_rank_mismatches": result.mismatches,
        "cross_rank_pipeline": result.pipeline,
        "cross_rank_bandwidth": result.bandwidth,
    }


def with_transfer_bandwidth(collectives: pd.DataFrame, cross: CrossRank | None
                            ) -> pd.DataFrame:
    """The collectives table with the cross-rank pass's transfer-based algbw and busbw
    (docs/cross-rank.md) beside the duration-based ones, matched on op, group id, group size
    and size bucket; NaN where no op of the row had a positive transfer."""
    table = collectives.copy()
    bandwidth = cross.bandwidth if cross is not None else None
    columns = ["transfer_us", "transfer_algbw_gbps", "transfer_busbw_gbps"]
    if bandwidth is None or bandwidth.empty or table.empty:
        for column in columns:
            table[column] = np.nan
        return table
    keyed = bandwidth.rename(columns={"pg": "pg_id"}).astype(
        {"pg_id": str, "pg_size": "float64", "size_bucket": str})[
        ["op", "pg_id", "pg_size", "size_bucket", *columns]]
    merged = table.astype({"pg_size": "float64"}).merge(
        keyed, on=["op", "pg_id", "pg_size", "size_bucket"], how="left")
    merged["pg_size"] = table["pg_size"].array  # its own dtype (nullable Int64 included)
    return merged


def rank_bars(per_step: pd.DataFrame, waits: pd.DataFrame | None) -> pd.DataFrame:
    """Per rank, mean ms per step of each bar part. With cross-rank waits for every rank-step,
    the communication that no compute hides is split into waiting for peers (at most that
    rank-step's wait) and transfer (the rest), else it stays one part; the parts add up to the
    mean step."""
    frame = per_step.copy()
    comm = frame["comm_only_ns"].astype("float64")
    split = split_communication(frame, waits) if waits is not None and len(waits) else None
    if split is not None and (split["peer_wait_ns"].notna() | (comm.to_numpy() <= 0)).all():
        frame["waiting"] = split["peer_wait_ns"].fillna(0).to_numpy()
        frame["transfer"] = comm - frame["waiting"]
    else:
        # Some rank-step that communicated has no cross-rank waits: its communication cannot be
        # told apart into transfer and waiting, so the bars show it unsplit rather than guess.
        frame["comm"] = comm
    frame["compute"], frame["overlap"] = frame["compute_only_ns"], frame["overlap_ns"]
    frame["memcpy"], frame["idle"] = frame["memcpy_ns"], frame["idle_ns"]
    parts = BAR_PARTS_CROSS if "waiting" in frame.columns else BAR_PARTS_PLAIN
    means = frame.groupby("rank")[parts].mean() / MS
    return means.reset_index()

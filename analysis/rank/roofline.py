"""Each counted op against the device's roofline: achieved TFLOP/s and GB/s, arithmetic
intensity, and whether it is compute- or memory-bound (docs/mfu.md, "Roofline").

An op's time is its kernels' device time where the trace has kernels launched from inside it
(GPU traces: the runtime launch on the op's thread shares its correlation id with the kernel),
else its host duration (CPU traces).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.core.event_kinds import RUNTIME_CATS, normal_cat
from analysis.core.frame_columns import values_at

ROOFLINE_COLUMNS = ["name", "kind", "dtype", "step", "flops", "bytes", "time_ns", "time_from",
                    "achieved_tflops", "achieved_gbps", "intensity", "ridge", "bound",
                    "roofline_tflops", "pct_of_roofline"]


def device_time_ns(ops: pd.DataFrame, events: pd.DataFrame | None) -> np.ndarray:
    """Per op of `ops` (op_flops rows, counted only): the device time of the kernels launched
    from inside it, -1 where none was (or no events were given)."""
    result = np.full(len(ops), -1, dtype=np.int64)
    if events is None or not len(events) or not len(ops):
        return result
    gpu = np.flatnonzero(events["is_gpu"].to_numpy() & (events["correlation"].to_numpy() >= 0))
    if not gpu.size:
        return result
    device = pd.Series(values_at(events["dur_ns"], gpu)).groupby(
        values_at(events["correlation"], gpu)).sum()
    cats = events["cat"].cat.categories.to_numpy(dtype=object)
    runtime_codes = [i for i, c in enumerate(cats) if normal_cat(c) in RUNTIME_CATS]
    launches = np.flatnonzero(np.isin(events["cat"].cat.codes.to_numpy(), runtime_codes)
                              & (events["correlation"].to_numpy() >= 0))
    if not launches.size:
        return result
    launch = pd.DataFrame({
        "tid": [str(t) for t in events["tid"].to_numpy()[launches]],
        "ts_ns": values_at(events["ts_ns"], launches),
        "device_ns": device.reindex(values_at(events["correlation"], launches)).fillna(0)
        .to_numpy(dtype=np.int64)})
    starts = ops["ts_ns"].to_numpy()
    ends = ops["end_ns"].to_numpy()
    for tid, mine in launch.groupby("tid"):
        rows = np.flatnonzero(ops["tid"].to_numpy() == tid)
        if not rows.size:
            continue
        rows = rows[np.argsort(starts[rows], kind="stable")]
        at = np.searchsorted(starts[rows], mine["ts_ns"].to_numpy(), side="right") - 1
        ok = at >= 0
        owner = rows[np.clip(at, 0, None)]
        ok &= mine["ts_ns"].to_numpy() < ends[owner]
        totals = np.bincount(owner[ok], weights=mine["device_ns"].to_numpy()[ok],
                             minlength=len(ops))
        launched = np.bincount(owner[ok], minlength=len(ops)) > 0
        result[launched] = np.maximum(result[launched], 0) + totals[launched].astype(np.int64)
    return result


def op_roofline(op_table: pd.DataFrame, peak_tflops: float | None, peak_gbps: float | None,
                events: pd.DataFrame | None = None) -> pd.DataFrame:
    """ROOFLINE_COLUMNS for each counted op of `op_table` (analysis.rank.flops.op_flops) with
    known FLOPs and bytes. `ridge` is the intensity (FLOP/byte) where the roofline turns:
    peak FLOP/s / peak bytes/s; an op below it is memory-bound. Without a bandwidth, `bound`,
    `ridge` and the roofline are missing; without a peak, the roofline is."""
    counted = op_table[op_table["counted"].to_numpy()
                       & np.isfinite(op_table["flops"].to_numpy(dtype=float))
                       & np.isfinite(op_table["bytes"].to_numpy(dtype=float))
                       ].reset_index(drop=True)
    device = device_time_ns(counted, events)
    host = (counted["end_ns"] - counted["ts_ns"]).to_numpy()
    time_ns = np.where(device >= 0, device, host)
    seconds = time_ns / 1e9
    flops, nbytes = counted["flops"].to_numpy(float), counted["bytes"].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        achieved = np.where(seconds > 0, flops / seconds / 1e12, np.nan)
        gbps = np.where(seconds > 0, nbytes / seconds / 1e9, np.nan)
        intensity = np.where(nbytes > 0, flops / nbytes, np.nan)
    ridge = (peak_tflops * 1e12 / (peak_gbps * 1e9)) if peak_tflops and peak_gbps else np.nan
    if peak_tflops and peak_gbps:
        bound = np.where(np.isnan(intensity), None,
                         np.where(intensity < ridge, "memory", "compute"))
        roof = np.minimum(peak_tflops, intensity * peak_gbps / 1e3)
    else:
        bound = np.full(len(counted), None, dtype=object)
        roof = np.full(len(counted), float(peak_tflops) if peak_tflops else np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(roof > 0, 100.0 * achieved / roof, np.nan)
    return pd.DataFrame({
        "name": counted["name"], "kind": counted["kind"], "dtype": counted["dtype"],
        "step": counted["step"], "flops": flops, "bytes": nbytes, "time_ns": time_ns,
        "time_from": np.where(device >= 0, "device", "host"), "achieved_tflops": achieved,
        "achieved_gbps": gbps, "intensity": intensity, "ridge": ridge,
        "bound": pd.Series(bound, dtype=object), "roofline_tflops": roof,
        "pct_of_roofline": pct}, columns=ROOFLINE_COLUMNS)


def roofline_by_op(roofline: pd.DataFrame) -> pd.DataFrame:
    """The ops of op_roofline summed by (name, kind, dtype): calls, FLOPs, bytes and time, with
    the achieved rates and intensity of the sums; slowest first."""
    if not len(roofline):
        return pd.DataFrame(columns=["name", "kind", "dtype", "calls", "flops", "bytes",
                                     "time_ns", "achieved_tflops", "achieved_gbps", "intensity"])
    grouped = roofline.fillna({"dtype": "unknown"}).groupby(
        ["name", "kind", "dtype"], as_index=False).agg(
        calls=("flops", "size"), flops=("flops", "sum"), bytes=("bytes", "sum"),
        time_ns=("time_ns", "sum"))
    seconds = grouped["time_ns"].to_numpy() / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        grouped["achieved_tflops"] = np.where(seconds > 0, grouped["flops"] / seconds / 1e12,
                                              np.nan)
        grouped["achieved_gbps"] = np.where(seconds > 0, grouped["bytes"] / seconds / 1e9,
                                            np.nan)
        grouped["intensity"] = np.where(grouped["bytes"] > 0, grouped["flops"] / grouped["bytes"],
                                        np.nan)
    return grouped.sort_values("time_ns", ascending=False, ignore_index=True)

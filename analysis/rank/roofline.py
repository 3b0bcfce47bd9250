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
from analysis.core.frames import values_at

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
    tids = events["tid"].array
    tid_texts = np.array([str(t) for t in tids.categories], dtype=object)
    launch_tid = tid_texts[tids.codes[launches]]
    launch_ts = values_at(events["ts_ns"], launches)
    launch_ns = device.reindex(values_at(events["correlation"], launches)).fillna(0).to_numpy(
        dtype=np.int64)
    starts = ops["ts_ns"].to_numpy()
    ends = ops["end_ns"].to_numpy()
    op_tids = ops["tid"].to_numpy(dtype=object)
    for tid in pd.unique(launch_tid):
        rows = np.flatnonzero(op_tids == tid)
        if not rows.size:
            continue
        mine = launch_tid == tid
        rows = rows[np.argsort(starts[rows], kind="stable")]
        at = np.searchsorted(starts[rows], launch_ts[mine], side="right") - 1
        ok = at >= 0
        owner = rows[np.clip(at, 0, None)]
        ok &= launch_ts[mine] < ends[owner]
        totals = np.bincount(owner[ok], weights=launch_ns[mine][ok], minlength=len(ops))
        launched = np.bincount(owner[ok], minlength=len(ops)) > 0
        result[launched] = np.maximum(result[launched], 0) + totals[launched].astype(np.int64)
    return result


def against_roofline(flops, nbytes, time_ns, peak_tflops: float | None,
                     peak_gbps: float | None) -> dict:
    """The roofline arithmetic, for single ops and sums of ops alike (arrays of FLOPs, bytes and
    ns): achieved_tflops and achieved_gbps (flops or bytes / time), intensity (FLOP/byte),
    ridge (peak FLOP/s over peak bytes/s: where the roofline turns), bound ("memory" below the
    ridge, "compute" at or above), roofline_tflops (min(peak, intensity x bandwidth)) and
    pct_of_roofline (achieved / roofline, %). Without a bandwidth, bound and ridge are missing
    and the roof is the peak; without a peak, the roofline is missing."""
    flops = np.asarray(flops, dtype=float)
    nbytes = np.asarray(nbytes, dtype=float)
    seconds = np.asarray(time_ns, dtype=float) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        achieved = np.where(seconds > 0, flops / seconds / 1e12, np.nan)
        gbps = np.where(seconds > 0, nbytes / seconds / 1e9, np.nan)
        intensity = np.where(nbytes > 0, flops / nbytes, np.nan)
    if peak_tflops and peak_gbps:
        ridge = peak_tflops * 1e12 / (peak_gbps * 1e9)
        bound = np.where(np.isnan(intensity), None,
                         np.where(intensity < ridge, "memory", "compute"))
        roof = np.minimum(peak_tflops, intensity * peak_gbps / 1e3)
    else:
        ridge = np.nan
        bound = np.full(len(flops), None, dtype=object)
        roof = np.full(len(flops), float(peak_tflops) if peak_tflops else np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(roof > 0, 100.0 * achieved / roof, np.nan)
    return {"achieved_tflops": achieved, "achieved_gbps": gbps, "intensity": intensity,
            "ridge": np.full(len(flops), ridge, dtype=float),
            "bound": pd.Series(bound, dtype=object), "roofline_tflops": roof,
            "pct_of_roofline": pct}


def op_times(op_table: pd.DataFrame, events: pd.DataFrame | None = None) -> pd.DataFrame:
    """The counted ops of `op_table` (analysis.rank.flops.op_flops) with known FLOPs and bytes:
    name, kind, dtype, step, flops, bytes, and their time (`time_ns`, `time_from`: the device
    time of their kernels, else their host duration)."""
    counted = op_table[op_table["counted"].to_numpy(dtype=bool)
                       & np.isfinite(op_table["flops"].to_numpy(dtype=float))
                       & np.isfinite(op_table["bytes"].to_numpy(dtype=float))
                       ].reset_index(drop=True)
    device = device_time_ns(counted, events)
    host = (counted["end_ns"] - counted["ts_ns"]).to_numpy()
    return pd.DataFrame({
        **{c: pd.Series(counted[c].to_numpy(dtype=object), dtype=object)
           for c in ("name", "kind", "dtype")},
        "step": counted["step"], "flops": counted["flops"].to_numpy(float),
        "bytes": counted["bytes"].to_numpy(float), "time_ns": np.where(device >= 0, device, host),
        "time_from": pd.Series(np.where(device >= 0, "device", "host").astype(object),
                               dtype=object)})


def op_roofline(op_table: pd.DataFrame, peak_tflops: float | None, peak_gbps: float | None,
                events: pd.DataFrame | None = None) -> pd.DataFrame:
    """ROOFLINE_COLUMNS for each counted op of `op_table` (analysis.rank.flops.op_flops) with
    known FLOPs and bytes: op_times' columns and against_roofline's. `ridge` is the intensity
    (FLOP/byte) where the roofline turns: peak FLOP/s / peak bytes/s; an op below it is
    memory-bound. Without a bandwidth, `bound`, `ridge` and the roofline are missing; without a
    peak, the roofline is."""
    times = op_times(op_table, events)
    judged = against_roofline(times["flops"], times["bytes"], times["time_ns"], peak_tflops,
                              peak_gbps)
    return times.assign(**judged)[ROOFLINE_COLUMNS]


BY_OP_COLUMNS = ["name", "kind", "dtype", "calls", "flops", "bytes", "time_ns", "time_from",
                 "achieved_tflops", "achieved_gbps", "intensity"]
# What against_roofline adds to a sum of ops once the rank's peak is known.
PEAK_COLUMNS = ["ridge", "bound", "roofline_tflops", "pct_of_roofline"]


def roofline_by_op(roofline: pd.DataFrame) -> pd.DataFrame:
    """The ops of op_times (or op_roofline) summed by (name, kind, dtype): calls, FLOPs, bytes and
    time (from
    "device", "host" or "device+host" times), with the achieved rates and intensity of the sums
    (against_roofline's, which need no peak); slowest first."""
    if not len(roofline):
        return pd.DataFrame(columns=BY_OP_COLUMNS)
    dtype = roofline["dtype"].to_numpy(dtype=object)
    dtype = np.where(pd.isna(dtype), "unknown", dtype)
    names, name_codes = _codes(roofline["name"].to_numpy(dtype=object))
    kinds, kind_codes = _codes(roofline["kind"].to_numpy(dtype=object))
    dtypes, dtype_codes = _codes(dtype)
    group = (name_codes * len(kinds) + kind_codes) * len(dtypes) + dtype_codes
    found, of_op = np.unique(group, return_inverse=True)
    groups = len(found)

    def summed(values) -> np.ndarray:
        return np.bincount(of_op, weights=np.asarray(values, dtype=float), minlength=groups)

    time_from = roofline["time_from"].to_numpy()
    device = summed(time_from == "device") > 0
    host = summed(time_from == "host") > 0
    grouped = pd.DataFrame({
        "name": pd.Series(names[found // (len(kinds) * len(dtypes))], dtype=object),
        "kind": pd.Series(kinds[(found // len(dtypes)) % len(kinds)], dtype=object),
        "dtype": pd.Series(dtypes[found % len(dtypes)], dtype=object),
        "calls": np.bincount(of_op, minlength=groups), "flops": summed(roofline["flops"]),
        "bytes": summed(roofline["bytes"]),
        "time_ns": np.bincount(of_op, weights=roofline["time_ns"].to_numpy(dtype=float),
                               minlength=groups).round().astype(np.int64),
        "time_from": pd.Series(np.where(device & host, "device+host",
                                        np.where(device, "device", "host")).astype(object),
                               dtype=object)})
    rates = against_roofline(grouped["flops"], grouped["bytes"], grouped["time_ns"], None, None)
    for column in ("achieved_tflops", "achieved_gbps", "intensity"):
        grouped[column] = rates[column]
    # Slowest first; of equal times, in (name, kind, dtype) order.
    return grouped.sort_values(["time_ns", "name", "kind", "dtype"],
                               ascending=[False, True, True, True], kind="stable",
                               ignore_index=True)[BY_OP_COLUMNS]


def _codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct values (text), sorted; each value's position among them)."""
    codes, distinct = pd.factorize(np.asarray(values, dtype=object), sort=True)
    return np.asarray(distinct, dtype=object), codes


def with_roofline(by_op: pd.DataFrame, peak_tflops: float | None,
                  peak_gbps: float | None) -> pd.DataFrame:
    """roofline_by_op's sums against the roofline of a peak and a bandwidth (either may be
    None): the peak and bandwidth used, then against_roofline's columns."""
    rates = against_roofline(by_op["flops"], by_op["bytes"], by_op["time_ns"], peak_tflops,
                             peak_gbps)
    frame = by_op.copy()
    frame["peak_tflops"] = float(peak_tflops) if peak_tflops else np.nan
    frame["peak_gbps"] = float(peak_gbps) if peak_gbps else np.nan
    for column in ("achieved_tflops", "achieved_gbps", "intensity", *PEAK_COLUMNS):
        values = rates[column]
        frame[column] = values.to_numpy() if isinstance(values, pd.Series) else values
    return frame

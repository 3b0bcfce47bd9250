"""MFU and the roofline as the writers show them: the text report's "MFU" and "Slowest ops
against their roofline" tables, and the JSON document's `mfu` and `roofline` (docs/mfu.md).

The tables are analysis.run's (`mfu`, `roofline`); nothing here reads a trace.
"""

from __future__ import annotations

import pandas as pd

from analysis.rank.flops import LOST_COLUMNS, mfu_per_rank
from analysis.report.text_tables import text_table as _table
from analysis.report.values import _rank, plain, records

ROOFLINE_TEXT_ROWS = 8
NO_FLOPS_NO_OPS = ("no FLOPs counted: no GEMM, convolution or attention op in the profiled "
                   "steps' traces")
NO_FLOPS_NO_SHAPES = ("no FLOPs counted: the traces' GEMMs, convolutions and attention ops have "
                      "no shapes (trace with record_shapes=True: the tracer's --record-shapes, "
                      "on by default)")


def _known(value) -> bool:
    value = plain(value)
    return value is not None


def missing_reason(mfu: pd.DataFrame | None) -> str | None:
    """Why the run has no FLOPs to show, once: no compute op, or none with its shapes; None
    where some rank has FLOPs."""
    if mfu is None:
        return None  # the table failed: its problem and `unavailable` line say so
    flops = pd.to_numeric(mfu["flops_per_step"], errors="coerce") if len(mfu) else pd.Series([])
    if len(mfu) and (flops > 0).any():
        return None
    if len(mfu) and (mfu["ops_without_shapes"] > 0).any():
        return NO_FLOPS_NO_SHAPES
    return NO_FLOPS_NO_OPS


def no_peak_ranks(by_rank: pd.DataFrame) -> list:
    """The ranks with FLOPs but no peak (so no MFU)."""
    flops = pd.to_numeric(by_rank["flops_per_step"], errors="coerce")
    peak = pd.to_numeric(by_rank["peak_tflops"], errors="coerce")
    return [r for r, f, p in zip(by_rank["rank"], flops, peak) if f > 0 and not p > 0]


def _si(value, unit: str = "") -> str:
    """327680 -> "327.7 K": 4 significant digits and a metric prefix; "-" where missing."""
    value = plain(value)
    if value is None:
        return "-"
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.4g} {prefix}{unit}"
    return f"{value:.4g}{' ' + unit if unit else ''}"


def _num(value, spec: str = ".4g") -> str:
    value = plain(value)
    return "-" if value is None else format(value, spec)


def _pct_text(value) -> str:
    """A percentage to 2 decimals; a tiny one (a CPU or a toy trace) to 2 significant digits."""
    value = plain(value)
    if value is None:
        return "-"
    return format(value, ".2g" if 0 < abs(value) < 0.01 else ".2f")


def mfu_text_frame(by_rank: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for row in records(by_rank):
        rows.append({
            "rank": _rank(row["rank"]), "steps": row["steps"],
            "FLOPs/step": _si(row["flops_per_step"]),
            "achieved TFLOP/s": _num(row["achieved_tflops"]),
            "peak TFLOP/s": _num(row["peak_tflops"]), "peak from": row["peak_source"] or "-",
            "MFU %": _pct_text(row["mfu_pct"]),
            **{column.removeprefix("lost_").removesuffix("_pts") + " pts": _num(row[column], ".1f")
               for column in LOST_COLUMNS}})
    return pd.DataFrame(rows)


def roofline_text_frame(roofline: pd.DataFrame) -> pd.DataFrame:
    slowest = roofline.sort_values("time_ns", ascending=False, kind="stable").head(
        ROOFLINE_TEXT_ROWS)
    rows = []
    for row in records(slowest):
        rows.append({
            "rank": _rank(row["rank"]), "op": row["name"], "kind": row["kind"],
            "dtype": row["dtype"], "calls": row["calls"],
            "ms": _num(None if row["time_ns"] is None else row["time_ns"] / 1e6, ".3f"),
            "from": row["time_from"], "TFLOP/s": _num(row["achieved_tflops"]),
            "GB/s": _num(row["achieved_gbps"]), "FLOP/B": _num(row["intensity"], ".3g"),
            "bound": row["bound"] or "-",
            "roofline TFLOP/s": _num(row["roofline_tflops"]),
            "% of roofline": _num(row["pct_of_roofline"], ".1f")})
    return pd.DataFrame(rows)


def mfu_text(mfu: pd.DataFrame | None, roofline: pd.DataFrame | None) -> str | None:
    """The MFU section: one line saying why where no rank has FLOPs, else the MFU table per
    rank (means over its profiled steps) and the slowest ops against their roofline; None where
    the mfu table could not be computed (its problem says why)."""
    if mfu is None:
        return None
    reason = missing_reason(mfu)
    if reason is not None:
        return f"MFU: {reason}\n"
    by_rank = mfu_per_rank(mfu)
    notes = ["  mean over each rank's profiled steps; the lost points (transfer, waiting for "
             "peers, idle, compute below the roofline) add up to 100 - MFU (docs/mfu.md)"]
    missing = no_peak_ranks(by_rank)
    if missing:
        notes.append(f"  no peak for rank(s) {', '.join(_rank(r) for r in missing)} (no "
                     f"--peak-tflops, none recorded, no datasheet row for the device): no MFU")
    if (by_rank["ops_without_shapes"] > 0).any():
        notes.append("  some compute ops lack the shapes (or the stride and padding) their FLOPs "
                     "need: those FLOPs are missing, never guessed")
    parts = [_table(mfu_text_frame(by_rank), "MFU (model FLOPs utilisation)", "\n".join(notes))]
    if roofline is not None and len(roofline):
        parts.append(_table(roofline_text_frame(roofline), "Slowest ops against their roofline",
                            "  ms: over the analysed steps; from: device (kernels) or host "
                            "time; bound and roofline need the device's bandwidth"))
    return "\n".join(parts)


def mfu_json(mfu: pd.DataFrame | None, roofline: pd.DataFrame | None) -> dict:
    """The document's top-level `mfu` (per rank and profiled step, MFU_COLUMNS) and `roofline`
    (each rank's slowest op groups against its roofline); null where the table could not be
    computed (docs/mfu.md)."""
    return {"mfu": None if mfu is None else records(mfu),
            "roofline": None if roofline is None else records(roofline)}


def mfu_bars(mfu: pd.DataFrame | None) -> tuple[list, list, list]:
    """(rank labels, parts, values) of the MFU attribution plot: per rank with an MFU, the mean
    MFU and each lost-point column (negative compute points, a peak set too low, drawn as 0)."""
    parts = ["MFU", "transfer", "waiting", "idle", "compute below roofline"]
    if mfu is None or not len(mfu):
        return [], parts, []
    by_rank = mfu_per_rank(mfu)
    labels, values = [], []
    for row in records(by_rank):
        if not _known(row["mfu_pct"]):
            continue
        labels.append(f"rank {_rank(row['rank'])}")
        values.append([row["mfu_pct"], *(row[c] if _known(row[c]) else 0.0
                                         for c in LOST_COLUMNS)])
    return labels, parts, values

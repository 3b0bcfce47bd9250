"""The scaling study's numbers: one row per run, one row per world size, and where the lost
efficiency went (docs/scaling.md defines every formula used here).

Pure functions from DataFrames to DataFrames; `analysis.scaling` loads the runs and prints.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

# The rule that the ranks compete for cores is the breakdown's (docs/report.md, "Why a rank is
# late"): one threshold, one wording.
from analysis.findings.late_causes import contention_text, cores_compete

MS = 1e6  # ns per ms
# The parts that add up to a step, in ms per step (docs/scaling.md, "Parts of a step").
PARTS = ["compute_ms", "copies_ms", "transfer_ms", "waiting_ms", "idle_ms"]
# Communication that compute hid; it is inside compute_ms, so not one of the PARTS.
HIDDEN = "hidden_comm_ms"
DEFAULT_WARMUP_STEPS = 2
# Relative tolerance when recorded global batches are compared across world sizes.
BATCH_TOLERANCE = 0.01
CAUSES = ["compute", "more communication", "less overlap", "waiting for peers", "idle", "copies"]
SUGGESTIONS = {
    "compute": "per-rank compute did not shrink with the world size: the per-rank batch is too "
               "small to keep a device busy, or ranks share cores or a device; grow the per-rank "
               "batch (weak scaling) or give each rank its own cores or device",
    "more communication": "more time moving data: send fewer bytes (bf16 gradients, "
                          "gradient compression, FSDP/ZeRO trade-offs) or use a faster "
                          "interconnect; compare busbw with the link's",
    "less overlap": "less communication hidden under compute: start it earlier (DDP "
                    "bucket_cap_mb, asynchronous collectives) and remove sync points",
    "waiting for peers": "ranks wait for a late peer: balance work and data loading across "
                         "ranks; see the straggler named by the cross-rank analysis",
    "idle": "the host left the device idle: data loading (DataLoader workers, pinned memory), "
            "launch overhead (torch.compile, CUDA graphs) or synchronisation",
    "copies": "host-device copies: pin memory, copy with non_blocking, keep data on the device",
}
# Where every run's traces are CPU traces, no device waits: what the idle time is there.
CPU_SUGGESTIONS = {
    "idle": "the ranks' threads ran no op: data loading (DataLoader workers), Python between "
            "ops and steps (logging, checkpointing) or synchronisation",
    "copies": "memory copies between ops: keep tensors in place, avoid .contiguous() and dtype "
              "round trips",
}
# A baseline whose timed steps spread more than this is noisy (docs/scaling.md, "Warnings"):
# the coefficient of variation (population standard deviation over mean) or IQR over median.
NOISY_CV_PCT = 10.0
NOISY_IQR_PCT = 10.0
MAX_EFFICIENCY_PCT = 100.0


def timed_steps(steps: pd.DataFrame, warmup_steps: int = DEFAULT_WARMUP_STEPS
                ) -> tuple[pd.DataFrame, str]:
    """The step records that give a run's step time, and which they are: steps numbered from
    `warmup_steps` on that the profiler did not record; if there are none, every step from
    `warmup_steps` on."""
    if steps.empty:
        return steps, "none"
    later = steps[steps["step"] >= warmup_steps]
    profiled = (later["in_profiler_window"].fillna(False).astype(bool)
                if "in_profiler_window" in later.columns else False)
    unprofiled = later[~profiled] if not isinstance(profiled, bool) else later
    if len(unprofiled):
        return unprofiled, "unprofiled"
    return later, "all (every step was profiled)"


def _peak_memory(steps: pd.DataFrame) -> tuple[float, str | None]:
    """The largest per-step peak of any rank: CUDA allocated bytes where recorded, else RSS."""
    for column, kind in (("cuda_peak_allocated_bytes", "cuda_allocated"), ("rss_bytes", "rss")):
        if column in steps.columns and steps[column].notna().any():
            return float(steps[column].max()), kind
    return float("nan"), None


def run_row(steps: pd.DataFrame, shares: dict | None, samples_per_step: float | None = None,
            warmup_steps: int = DEFAULT_WARMUP_STEPS, host_cpu_pct: float = float("nan")
            ) -> dict:
    """One run's figures from its ranks' step records (rank, step, start_ns, end_ns,
    in_profiler_window, memory columns, `samples` where recorded) and the shares of its
    profiled steps' time (`part_shares`; None without a trace).

    `samples_per_step` is the global batch to use where the records have none."""
    timed, which = timed_steps(steps, warmup_steps)
    durations = (timed["end_ns"] - timed["start_ns"]).astype("float64")
    step_ms = float(durations.mean() / MS) if len(timed) else float("nan")
    samples = float("nan")
    if "samples" in timed.columns and timed["samples"].notna().any():
        samples = float(timed["samples"].dropna().mean())
    elif samples_per_step is not None:
        samples = float(samples_per_step)
    peak, memory_kind = _peak_memory(steps)
    spread = step_spread(durations)
    row = {"steps_timed": int(timed["step"].nunique()) if len(timed) else 0,
           "steps_which": which, "step_ms": step_ms, **spread, "samples_per_step": samples,
           "peak_memory_bytes": peak, "memory_kind": memory_kind, "host_cpu_pct": host_cpu_pct}
    for part in [*PARTS, HIDDEN]:
        row[part] = shares[part] * step_ms if shares else float("nan")
    return row


def step_spread(durations: pd.Series) -> dict:
    """How much a run's timed step records spread: {"step_cv_pct": 100 * population standard
    deviation / mean, "step_iqr_pct": 100 * (75th - 25th percentile) / median}; NaN with fewer
    than two records."""
    values = pd.to_numeric(durations, errors="coerce").dropna().to_numpy(dtype="float64")
    if len(values) < 2 or not values.mean() > 0:
        return {"step_cv_pct": float("nan"), "step_iqr_pct": float("nan")}
    q25, median, q75 = np.percentile(values, [25, 50, 75])
    return {"step_cv_pct": float(100.0 * values.std() / values.mean()),
            "step_iqr_pct": float(100.0 * (q75 - q25) / median) if median > 0 else float("nan")}


def part_shares(bars: pd.DataFrame) -> dict | None:
    """Each part's share of the profiled steps' time, from the per-rank mean ms per step of
    `analysis.crossrank.report_tables.rank_bars` (compute, overlap, transfer and waiting or comm,
    memcpy, idle): the mean over ranks of each part over the mean over ranks of their sum."""
    if bars is None or bars.empty:
        return None
    mean = bars.drop(columns="rank").mean()
    waiting = float(mean.get("waiting", 0.0))
    transfer = float(mean["transfer"] if "transfer" in mean.index else mean.get("comm", 0.0))
    overlap = float(mean.get("overlap", 0.0))
    parts = {"compute_ms": float(mean.get("compute", 0.0)) + overlap,
             "copies_ms": float(mean.get("memcpy", 0.0)), "transfer_ms": transfer,
             "waiting_ms": waiting, "idle_ms": float(mean.get("idle", 0.0)), HIDDEN: overlap}
    total = sum(parts[p] for p in PARTS)
    if not total > 0:
        return None
    return {name: value / total for name, value in parts.items()}


def detect_mode(table: pd.DataFrame, given: str | None) -> tuple[str, bool, str | None]:
    """(mode, whether throughput in samples is used, a note or None).

    With a recorded global batch on every world size: strong when it stays the same, weak when it
    grows with the world size, "mixed" otherwise; the speedup then comes from samples/s whatever
    the mode. Without: `given`, else strong, with a note."""
    samples = table["samples_per_step"]
    if len(table) and samples.notna().all() and (samples > 0).all():
        base = table.iloc[0]
        ratio = samples / base["samples_per_step"]
        growth = table["world_size"] / base["world_size"]
        if np.allclose(ratio, 1.0, rtol=BATCH_TOLERANCE):
            detected = "strong"
        elif np.allclose(ratio, growth, rtol=BATCH_TOLERANCE):
            detected = "weak"
        else:
            detected = "mixed"
        note = None
        if given is not None and given != detected:
            note = (f"--mode {given} given, but the recorded global batch says {detected}; "
                    f"speedups come from the recorded samples/s")
        return detected, True, note
    if given is not None:
        return given, False, None
    return "strong", False, ("no global batch recorded: assuming strong scaling (the same global "
                             "batch at every world size); pass --mode weak if it grows with the "
                             "world size")


def scaling_table(runs: pd.DataFrame, mode: str | None = None) -> tuple[pd.DataFrame, dict]:
    """One row per (nnodes, world size), the repeats averaged, with throughput, speedup and
    efficiency against the smallest world size; and {"mode", "by_samples", "note"}.

    `runs`: one row per run (`run_row` plus run, world_size, nnodes)."""
    runs = runs[runs["step_ms"].notna() & (runs["step_ms"] > 0)]
    keys = ["world_size", "nnodes"]
    grouped = runs.groupby(keys, sort=True)
    means = ["step_ms", "samples_per_step", *PARTS, HIDDEN, "host_cpu_pct",
             *(["mfu_pct"] if "mfu_pct" in runs.columns else [])]
    table = grouped[means].mean()
    table["step_ms_min"] = grouped["step_ms"].min()
    table["step_ms_max"] = grouped["step_ms"].max()
    table["runs"] = grouped.size()
    table["peak_memory_bytes"] = grouped["peak_memory_bytes"].max()
    if "trace_kind" in runs.columns:  # "gpu" where any repeat has a GPU trace
        table["trace_kind"] = grouped["trace_kind"].agg(
            lambda kinds: "gpu" if (kinds == "gpu").any() else kinds.dropna().max()
            if kinds.notna().any() else None)
    for column in ("step_cv_pct", "step_iqr_pct"):  # the noisiest repeat's
        table[column] = (grouped[column].max() if column in runs.columns
                         else pd.Series(np.nan, index=table.index))
    table = table.reset_index().sort_values(keys, kind="stable").reset_index(drop=True)
    used, by_samples, note = detect_mode(table, mode)
    if table.empty:
        return table, {"mode": used, "by_samples": by_samples, "note": note}
    base = table.iloc[0]
    growth = table["world_size"] / base["world_size"]
    if by_samples:
        work = table["samples_per_step"] / base["samples_per_step"]
    else:
        work = growth if used == "weak" else pd.Series(1.0, index=table.index)
    # k: the step time an ideal scaling would give, as a fraction of the smallest run's.
    table["ideal_step_ms"] = base["step_ms"] * work / growth
    table["steps_per_s"] = 1e3 / table["step_ms"]
    table["samples_per_s"] = table["samples_per_step"] * table["steps_per_s"]
    table["speedup"] = work * base["step_ms"] / table["step_ms"]
    table["efficiency_pct"] = 100.0 * table["ideal_step_ms"] / table["step_ms"]
    parts = table[PARTS]
    table["comm_share_pct"] = 100.0 * (table["transfer_ms"] + table["waiting_ms"]) / parts.sum(
        axis=1)
    for part in PARTS:
        table[part.replace("_ms", "_pct")] = 100.0 * table[part] / parts.sum(axis=1)
    return table, {"mode": used, "by_samples": by_samples, "note": note}


def _cause_ms(row: pd.Series) -> dict:
    """A world size's parts regrouped by cause: exposed transfer is split into all the
    communication (exposed and hidden) and, negatively, what overlap hid."""
    return {"compute": row["compute_ms"],
            "more communication": row["transfer_ms"] + row[HIDDEN],
            "less overlap": -row[HIDDEN],
            "waiting for peers": row["waiting_ms"], "idle": row["idle_ms"],
            "copies": row["copies_ms"]}


def attribution(table: pd.DataFrame) -> pd.DataFrame:
    """Per world size above the smallest and cause: the ms per step the cause added over the
    ideal (`lost_ms` = cause_N - k * cause_smallest, k = ideal_step_ms / smallest step_ms) and
    the efficiency points it cost (`lost_pct_points` = 100 * lost_ms / step_ms). Over the causes,
    lost_ms adds up to step_ms - ideal_step_ms and the points to 100 - efficiency_pct."""
    columns = ["world_size", "nnodes", "cause", "lost_ms", "lost_pct_points", "suggestion"]
    if len(table) < 2 or table[PARTS].isna().any().any():
        return pd.DataFrame(columns=columns)
    base = table.iloc[0]
    base_causes = _cause_ms(base)
    rows = []
    for _, row in table.iloc[1:].iterrows():
        k = row["ideal_step_ms"] / base["step_ms"]
        for cause, value in _cause_ms(row).items():
            lost = value - k * base_causes[cause]
            suggestion = SUGGESTIONS[cause]
            if cause in CPU_SUGGESTIONS and row.get("trace_kind") == "cpu":
                suggestion = CPU_SUGGESTIONS[cause]
            if cause == "compute" and cores_compete(row["host_cpu_pct"]):
                suggestion = (contention_text(row["host_cpu_pct"]) + "; run fewer ranks per "
                              "host; " + suggestion)
            rows.append({"world_size": int(row["world_size"]), "nnodes": int(row["nnodes"]),
                         "cause": cause, "lost_ms": lost,
                         "lost_pct_points": 100.0 * lost / row["step_ms"],
                         "suggestion": suggestion})
    return pd.DataFrame(rows, columns=columns)


def main_causes(attributed: pd.DataFrame, min_points: float = 5.0) -> pd.DataFrame:
    """Per world size, the causes that cost at least `min_points` efficiency points, largest
    first."""
    kept = attributed[attributed["lost_pct_points"] >= min_points]
    return kept.sort_values(["world_size", "nnodes", "lost_pct_points"],
                            ascending=[True, True, False], kind="stable").reset_index(drop=True)


def warnings(table: pd.DataFrame) -> list[str]:
    """What makes the study's numbers doubtful (docs/scaling.md, "Warnings"): a baseline (the
    smallest world size) whose timed steps are noisy (step_cv_pct above NOISY_CV_PCT or
    step_iqr_pct above NOISY_IQR_PCT), and every world size whose efficiency exceeds 100%."""
    if table.empty:
        return []
    found = []
    base = table.iloc[0]
    cv, iqr = base.get("step_cv_pct", np.nan), base.get("step_iqr_pct", np.nan)
    if (cv > NOISY_CV_PCT) or (iqr > NOISY_IQR_PCT):
        found.append(
            f"the baseline ({int(base['world_size'])} rank(s)) is noisy: its timed steps vary by "
            f"CV {cv:.1f}%, IQR/median {iqr:.1f}% (noisy above {NOISY_CV_PCT:g}% or "
            f"{NOISY_IQR_PCT:g}%); every speedup, efficiency and attribution is measured against "
            f"it: rerun the baseline on a quiet machine, with more steps or repeats")
    for _, row in table.iloc[1:].iterrows():
        if row["efficiency_pct"] > MAX_EFFICIENCY_PCT:
            found.append(
                f"{int(row['world_size'])} ranks: efficiency {row['efficiency_pct']:.1f}% "
                f"exceeds 100%: the baseline's step ({base['step_ms']:.2f} ms) is slower than "
                f"ideal scaling explains; a disturbed or noisy baseline is the usual cause "
                f"(superlinear scaling from caches or memory is rare), and the attribution's "
                f"points at this size are not meaningful")
    return found

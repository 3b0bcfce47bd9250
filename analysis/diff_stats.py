"""The verdict of a run comparison: the change in median step time with a bootstrap interval
(docs/diff.md#the-verdict). Pure: frames of step times in, a dict out."""

from __future__ import annotations

import numpy as np
import pandas as pd

DEFAULT_SEED = 0
DEFAULT_RESAMPLES = 2000
CONFIDENCE = 0.95
MS = 1e6


def _clusters(steps: pd.DataFrame) -> list[list[np.ndarray]]:
    """Per run, one array per step holding that step's time on every rank: the ranks of a step
    are resampled together, because they wait for each other and are not independent."""
    runs = []
    for _, run in steps.groupby("run", sort=True):
        runs.append([group["step_ns"].to_numpy(np.float64)
                     for _, group in run.groupby("step", sort=True)])
    return runs


def _resampled_median(runs: list[list[np.ndarray]], rng: np.random.Generator) -> float:
    """The pooled median of one bootstrap sample: runs drawn with replacement (when there are
    several), then the steps of each drawn run drawn with replacement."""
    chosen = runs if len(runs) == 1 else [runs[i] for i in rng.integers(0, len(runs), len(runs))]
    values = []
    for run in chosen:
        values += [run[i] for i in rng.integers(0, len(run), len(run))]
    return float(np.median(np.concatenate(values)))


def bootstrap_change(a: pd.DataFrame, b: pd.DataFrame, seed: int = DEFAULT_SEED,
                     resamples: int = DEFAULT_RESAMPLES) -> dict:
    """The change of B's median step time against A's, in percent, with the percentile
    bootstrap interval. `a` and `b` have columns run, rank, step, step_ns (one row per rank and
    step). Fewer than two steps on a side gives no interval."""
    result = {
        "median_a_ms": float(np.median(a["step_ns"])) / MS if len(a) else None,
        "median_b_ms": float(np.median(b["step_ns"])) / MS if len(b) else None,
        "change_pct": None, "ci_low_pct": None, "ci_high_pct": None,
        "steps_a": _step_count(a), "steps_b": _step_count(b),
        "runs_a": int(a["run"].nunique()) if len(a) else 0,
        "runs_b": int(b["run"].nunique()) if len(b) else 0,
        "seed": seed, "resamples": resamples, "confidence": CONFIDENCE,
        "significant": False,
    }
    if not result["median_a_ms"] or result["median_b_ms"] is None:
        return result
    result["change_pct"] = (result["median_b_ms"] / result["median_a_ms"] - 1) * 100
    if result["steps_a"] < 2 or result["steps_b"] < 2:
        return result
    rng = np.random.default_rng(seed)
    runs_a, runs_b = _clusters(a), _clusters(b)
    changes = np.empty(resamples)
    for i in range(resamples):
        median_a = _resampled_median(runs_a, rng)
        median_b = _resampled_median(runs_b, rng)
        changes[i] = (median_b / median_a - 1) * 100 if median_a > 0 else np.nan
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.nanpercentile(changes, [tail, 100 - tail])
    result["ci_low_pct"], result["ci_high_pct"] = float(low), float(high)
    result["significant"] = bool(low > 0 or high < 0)
    return result


def _step_count(frame: pd.DataFrame) -> int:
    return int(len(frame[["run", "step"]].drop_duplicates())) if len(frame) else 0


def verdict_text(change: dict) -> str:
    """One sentence: the direction and size of the change, or "no significant change"."""
    a, b = change["median_a_ms"], change["median_b_ms"]
    if a is None or b is None:
        side = "A" if a is None else "B"
        return f"cannot compare step times: {side} has no step"
    medians = f"median {a:.1f} \u2192 {b:.1f} ms"
    if change["ci_low_pct"] is None:
        return (f"cannot tell: too few steps for an interval (A {change['steps_a']}, "
                f"B {change['steps_b']}); {medians} ({change['change_pct']:+.1f}%)")
    interval = (f"{change['confidence']:.0%} CI of the change {_pct(change['ci_low_pct'])} to "
                f"{_pct(change['ci_high_pct'])}")
    basis = (f"bootstrap over {change['steps_a']} + {change['steps_b']} steps pooled across "
             f"ranks, seed {change['seed']}")
    if not change["significant"]:
        return (f"no significant change: {medians} ({change['change_pct']:+.1f}%, {interval}; "
                f"{basis})")
    direction = "lower" if change["change_pct"] < 0 else "higher"
    return (f"B's step time is {abs(change['change_pct']):.1f}% {direction} ({medians}, "
            f"{interval}; {basis})")


def coverage_text(change: dict) -> str:
    """What the interval covers (docs/diff.md#what-the-interval-covers)."""
    if min(change["runs_a"], change["runs_b"]) >= 2:
        return ("the interval covers step-to-step and run-to-run noise: runs were resampled, "
                "then steps within each run")
    return ("the interval covers step-to-step noise within one run per side, not run-to-run "
            "noise (a busier machine during one run); give folders of repeated runs to "
            "include it")


def _pct(value: float) -> str:
    return f"{value:+.1f}%".replace("-", "\u2212")

"""The verdict of a run comparison: the change in median step time, a block bootstrap interval
and the run-to-run noise floor (docs/diff.md#the-verdict). Pure: frames of step times in, a
dict out."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

DEFAULT_SEED = 0
DEFAULT_RESAMPLES = 2000
CONFIDENCE = 0.95
# The least run-to-run noise assumed for a side of one run: repeats of one 400-step DDP run on a
# quiet 2-core machine moved their median by up to 15% (docs/benchmarks.md, tracer overhead).
DEFAULT_NOISE_FLOOR_PCT = 10.0
MS = 1e6


def block_length(steps: int) -> int:
    """Consecutive steps drawn together: n^(1/3) rounded, the usual order for a block
    bootstrap of a median; 1 (single steps) up to 3 steps."""
    return max(1, round(steps ** (1 / 3)))


def _runs(steps: pd.DataFrame) -> list[np.ndarray]:
    """Per run, a (step, rank) matrix of step times in step order, NaN where a rank lacks the
    step: a row is resampled whole, because the ranks of a step wait for each other."""
    runs = []
    for _, run in steps.groupby("run", sort=True):
        runs.append(run.pivot_table(index="step", columns="rank", values="step_ns",
                                    aggfunc="first").sort_index().to_numpy(np.float64))
    return runs


def _block_rows(steps: int, rng: np.random.Generator) -> np.ndarray:
    """Rows of one circular block resample: blocks of consecutive steps from random starts
    (wrapping past the last step), as many as cover `steps`, cut to `steps` rows."""
    length = block_length(steps)
    starts = rng.integers(0, steps, math.ceil(steps / length))
    return ((starts[:, None] + np.arange(length)) % steps).ravel()[:steps]


def _resampled_median(runs: list[np.ndarray], rng: np.random.Generator) -> float:
    """The pooled median of one bootstrap sample: runs drawn with replacement (when there are
    several), then blocks of consecutive steps of each drawn run."""
    chosen = runs if len(runs) == 1 else [runs[i] for i in rng.integers(0, len(runs), len(runs))]
    values = np.concatenate([run[_block_rows(len(run), rng)].ravel() for run in chosen])
    return float(np.nanmedian(values))


def run_spread_pct(steps: pd.DataFrame) -> float | None:
    """max/min - 1 of the runs' pooled medians, in %: the largest change between two runs of
    one command on this side; None with fewer than two runs."""
    if len(steps) == 0 or steps["run"].nunique() < 2:
        return None
    medians = steps.groupby("run")["step_ns"].median()
    return float((medians.max() / medians.min() - 1) * 100) if medians.min() > 0 else None


def step_spread_pct(steps: pd.DataFrame) -> float | None:
    """The interquartile range of the step times (every rank and step) over their median, in
    %; None without steps."""
    if len(steps) == 0:
        return None
    q1, median, q3 = np.percentile(steps["step_ns"].to_numpy(np.float64), [25, 50, 75])
    return float((q3 - q1) / median * 100) if median > 0 else None


def _side_noise(steps: pd.DataFrame, label: str, least_pct: float) -> tuple[float, str]:
    spread = run_spread_pct(steps)
    if spread is not None:
        return spread, f"the spread between {label}'s run medians"
    steps_pct = step_spread_pct(steps) or 0.0
    if steps_pct > least_pct:
        return steps_pct, f"{label}'s step spread, interquartile range / median"
    return float(least_pct), "the least floor for one run, --noise-floor-pct"


def noise_floor(a: pd.DataFrame, b: pd.DataFrame,
                least_pct: float = DEFAULT_NOISE_FLOOR_PCT) -> tuple[float, str]:
    """The run-to-run noise the interval does not cover, in %, and where it comes from
    (docs/diff.md#the-run-to-run-noise-floor): none when both sides' runs were resampled, else
    the larger side's estimate: the spread between its run medians with repeats; with one run,
    its step spread, at least `least_pct`."""
    if run_spread_pct(a) is not None and run_spread_pct(b) is not None:
        return 0.0, "runs resampled on both sides"
    return max(_side_noise(a, "A", least_pct), _side_noise(b, "B", least_pct),
               key=lambda noise: noise[0])


def bootstrap_change(a: pd.DataFrame, b: pd.DataFrame, seed: int = DEFAULT_SEED,
                     resamples: int = DEFAULT_RESAMPLES,
                     noise_floor_pct: float = DEFAULT_NOISE_FLOOR_PCT) -> dict:
    """The change of B's median step time against A's, in percent, with the percentile block
    bootstrap interval and the run-to-run noise floor (`noise_floor_pct`: its least value for a
    side of one run). `a` and `b` have columns run, rank, step, step_ns (one row per rank and
    step). Fewer than two steps on a side gives no interval."""
    floor, floor_source = noise_floor(a, b, noise_floor_pct)
    result = {
        "median_a_ms": float(np.median(a["step_ns"])) / MS if len(a) else None,
        "median_b_ms": float(np.median(b["step_ns"])) / MS if len(b) else None,
        "change_pct": None, "ci_low_pct": None, "ci_high_pct": None,
        "steps_a": _step_count(a), "steps_b": _step_count(b),
        "runs_a": int(a["run"].nunique()) if len(a) else 0,
        "runs_b": int(b["run"].nunique()) if len(b) else 0,
        "block_steps": None, "noise_floor_pct": floor, "noise_floor_source": floor_source,
        "seed": seed, "resamples": resamples, "confidence": CONFIDENCE,
        "excludes_zero": False, "significant": False,
    }
    if not result["median_a_ms"] or result["median_b_ms"] is None:
        return result
    result["change_pct"] = (result["median_b_ms"] / result["median_a_ms"] - 1) * 100
    if result["steps_a"] < 2 or result["steps_b"] < 2:
        return result
    rng = np.random.default_rng(seed)
    runs_a, runs_b = _runs(a), _runs(b)
    result["block_steps"] = max(block_length(len(run)) for run in runs_a + runs_b)
    changes = np.empty(resamples)
    for i in range(resamples):
        median_a = _resampled_median(runs_a, rng)
        median_b = _resampled_median(runs_b, rng)
        changes[i] = (median_b / median_a - 1) * 100 if median_a > 0 else np.nan
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.nanpercentile(changes, [tail, 100 - tail])
    result["ci_low_pct"], result["ci_high_pct"] = float(low), float(high)
    result["excludes_zero"] = bool(low > 0 or high < 0)
    result["significant"] = bool(low > floor or high < -floor)
    return result


def _step_count(frame: pd.DataFrame) -> int:
    return int(len(frame[["run", "step"]].drop_duplicates())) if len(frame) else 0


def verdict_text(change: dict) -> str:
    """One sentence: the direction and size of the change, or "no significant change" and
    whether the interval or the noise floor decided it."""
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
    block = change["block_steps"]
    basis = (f"bootstrap over {change['steps_a']} + {change['steps_b']} steps pooled across "
             f"ranks, in blocks of {block} step{'s' if block != 1 else ''}, seed {change['seed']}")
    floor = (f"the {change['noise_floor_pct']:.1f}% run-to-run noise floor "
             f"({change['noise_floor_source']})")
    if change["significant"]:
        direction = "lower" if change["change_pct"] < 0 else "higher"
        beyond = f", beyond {floor}" if change["noise_floor_pct"] > 0 else ""
        return (f"B's step time is {abs(change['change_pct']):.1f}% {direction} ({medians}, "
                f"{interval}{beyond}; {basis})")
    if change["excludes_zero"]:
        return (f"no significant change: {_pct(change['change_pct'])} ({medians}) is within "
                f"{floor}: the floor, not the steps, decided it ({interval}; {basis})")
    return (f"no significant change: {medians} ({change['change_pct']:+.1f}%, {interval}; "
            f"{basis})")


def coverage_text(change: dict) -> str:
    """What the interval covers (docs/diff.md#what-the-interval-covers)."""
    if min(change["runs_a"], change["runs_b"]) >= 2:
        return ("the interval covers step-to-step and run-to-run noise: runs were resampled, "
                "then blocks of consecutive steps within each run")
    return ("the interval covers step-to-step noise within one run per side, not run-to-run "
            "noise (a busier machine during one run): the noise floor stands in for it; give "
            "folders of repeated runs to measure it")


def _pct(value: float) -> str:
    return f"{value:+.1f}%".replace("-", "\u2212")

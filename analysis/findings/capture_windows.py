"""The capture windows in the run's analysis (docs/report.md, "Capture windows"): each window the
tracer opened on a slow step or on demand (analysis.ingest.capture_records), with what its
steps show against the steps before it: the mean step, each rank's wait for peers, and the
rank the others waited for. The verdict quotes them; the writers print them as they are.
"""

from __future__ import annotations

import pandas as pd

from analysis.findings.verdict import analysed_rows, mean_waits

# The others must wait at least this share of the window's mean step for a rank to be named late.
LATE_SHARE_PCT = 5.0


def _mean_ms(values: pd.Series) -> float | None:
    return float(values.mean() / 1e6) if len(values) else None


def analysed_captures(windows: list[dict], per_step: pd.DataFrame | None,
                      waits: pd.DataFrame | None) -> list[dict]:
    """Each window (group_captures' dict) with: `mean_step_ms` over its analysed rank-steps,
    `before_step_ms` over those before its trigger step (before its first step on demand),
    `wait_ms_per_step` {rank: mean wait for peers over its steps, a step without one 0},
    `late_rank` (the rank that waits least while the others wait at least LATE_SHARE_PCT of the
    mean step; None else) and `text`, the window in words."""
    rows = analysed_rows(per_step)
    found = []
    for window in windows:
        steps = [int(s) for s in window["steps"]]
        inside = rows[rows["step"].isin(steps)]
        start = window["step"] if window.get("step") is not None else window["first_step"]
        before = rows[rows["step"] < start]
        means = mean_waits(inside, waits)
        waited = {} if means is None else {int(r): float(w) for r, w in means.items()}
        mean_ms, before_ms = _mean_ms(inside["step_ns"]), _mean_ms(before["step_ns"])
        late = None
        if len(waited) > 1 and mean_ms:
            least = min(waited, key=lambda r: (waited[r], r))
            others = [w for r, w in waited.items() if r != least]
            if min(others) >= LATE_SHARE_PCT / 100 * mean_ms:
                late = least
        entry = {**window, "mean_step_ms": mean_ms, "before_step_ms": before_ms,
                 "wait_ms_per_step": waited, "late_rank": late}
        entry["text"] = _text(entry)
        found.append(entry)
    return found


def _text(window: dict) -> str:
    steps = window["steps"]
    span = f"steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else f"step {steps[0]}"
    if window["trigger"] == "slow_step" and window.get("rank") is not None:
        why = (f"rank {window['rank']}'s step {window['step']} took {window['ratio']:.1f}x its "
               f"running median")
    else:
        why = "asked on demand"
    ranks = window.get("ranks_with_window") or []
    said = [f"{span} captured on ranks {', '.join(map(str, ranks)) or 'none'} ({why})"]
    if window["mean_step_ms"] is not None:
        before = (f" against {window['before_step_ms']:.2f} ms before"
                  if window["before_step_ms"] is not None else "")
        said.append(f"mean step {window['mean_step_ms']:.2f} ms{before}")
    if window["late_rank"] is not None:
        late = window["late_rank"]
        others = [w for r, w in window["wait_ms_per_step"].items() if r != late]
        said.append(f"the others waited {sum(others) / len(others):.2f} ms per step for rank "
                    f"{late}")
    elif window["wait_ms_per_step"]:
        said.append("no rank was waited for")
    return "; ".join(said) + "."

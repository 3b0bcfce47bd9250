"""What each finding's change would save by the what-if model (docs/critical-path.md), and the
changes to try in that order (docs/report.md, "The verdict").

A finding is priced by the what-if answer of the change it advises: "ranks wait for rank R" (and
the straggler of the per-rank findings) by rank R on time; waiting for peers and load imbalance
by the best rank on time; exposed communication or transfer by the largest saving of a
collective group's transfer overlapped (its send/recv left to the pipeline bubble); the pipeline
bubble by the bubble at its theory; an idle cause by its gaps removed. Other findings (low bus
bandwidth, memory) the model cannot price. Estimates from a formula (more microbatches) and
changes of scale (host work halved) price nothing.
"""

from __future__ import annotations

import math

import pandas as pd

from analysis.core.comm_names import P2P_OPS

ESTIMATES = ("pipeline_microbatches", "host_work_halved")
TRIES = 3  # the verdict's "Try first" and the next two


def _best(answers: list[dict]) -> float | None:
    saved = [a["saved_ms_per_step"] for a in answers
             if a.get("saved_ms_per_step") is not None and math.isfinite(a["saved_ms_per_step"])]
    return max(saved) if saved else None


def price(finding: str, what_if: list[dict] | None) -> float | None:
    """The what-if saving (ms per step) of the change `finding` advises; None where the model
    has no answer for it."""
    answers = [a for a in what_if or [] if a.get("kind") not in ESTIMATES]
    on_time = [a for a in answers if a.get("kind") == "rank_on_time"]
    for named in ("ranks wait for rank ", "straggler: rank "):
        if finding.startswith(named):
            rank = finding[len(named):]
            return _best([a for a in on_time if [str(r) for r in a.get("ranks") or []] == [rank]])
    if finding in ("waiting for peers", "load imbalance across ranks"):
        return _best(on_time)  # balancing the work brings the latest rank on time
    if finding in ("exposed transfer", "exposed communication"):
        return _best([a for a in answers if a.get("kind") == "transfer_overlapped"
                      and str(a.get("change", "")).split(" ")[0] not in P2P_OPS])
    if finding == "pipeline bubble":
        return _best([a for a in answers if a.get("kind") == "pipeline_bubble_theoretical"])
    if ": " in finding and finding.split(": ")[0] in ("device idle", "idle"):
        label = finding.split(": ", 1)[1]
        return _best([a for a in answers if a.get("kind") == "idle_cause_removed"
                      and f"no {label} gaps" in str(a.get("change", ""))])
    return None


def tries(timed: pd.DataFrame, what_if: list[dict] | None, suggestion_of) -> list[dict]:
    """The changes to try (`timed`: the findings with step time at stake): those the what-if
    model prices, largest saving first, then the others by step time at stake; at most TRIES.
    Each: finding, change (suggestion_of(suggestion)), saved_ms_per_step (None: not priced),
    ms_per_step (the finding's time at stake)."""
    rows = [{"finding": str(row["finding"]), "change": suggestion_of(row["suggestion"]),
             "saved_ms_per_step": price(str(row["finding"]), what_if),
             "ms_per_step": float(row["ms_per_step"])} for _, row in timed.iterrows()]
    priced = sorted((r for r in rows if r["saved_ms_per_step"] is not None),
                    key=lambda r: -r["saved_ms_per_step"])
    return (priced + [r for r in rows if r["saved_ms_per_step"] is None])[:TRIES]


def try_line(first: bool, row: dict) -> str:
    """The verdict's line of one change to try."""
    saved = row["saved_ms_per_step"]
    cost = (f"saves {saved:.2f} ms per step by the what-if" if saved is not None else
            f"up to {row['ms_per_step']:.2f} ms per step at stake; the what-if model cannot "
            f"price it")
    return f"{'Try first' if first else 'Then try'} ({cost}): {row['change']}"

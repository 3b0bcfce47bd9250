"""The verdict: the few plain lines the report opens with (docs/report.md, "The verdict").

What limits the step, who waits for whom and for how long, and the one change most worth trying
with the step time at stake, all from the findings, the notes and the cross-rank waits of the
analysed steps. The writers print `lines` as they are; they compute nothing.
"""

from __future__ import annotations

import pandas as pd

from analysis.core.contracts import CriticalPath, CrossRank, Verdict
from analysis.findings import priced
from analysis.findings.labels import rank_list
from analysis.findings.notes import ALONE
from analysis.findings.phase_lines import phase_opening

# What-if kinds the verdict does not quote: estimates from a formula, not the graph; and a
# change of scale that removes no cause (one rank's host work halved, docs/critical-path.md).
from analysis.findings.priced import ESTIMATES

# Verdict.state
PROBLEM, ALONE_STATE, RISK, NOTHING_FOUND, NOTES_ONLY, NO_STEP = (
    "bottleneck", "ranks train alone", "risk", "nothing found", "notes only", "no step")
MIN_WAIT_MS = 0.05  # a rank's mean wait below this per step is "no wait"


def _first_sentence(text: str) -> str:
    """The suggestion up to its first sentence's end."""
    text = str(text or "").strip()
    return text[: text.index(". ") + 1] if ". " in text else text


def analysed_rows(per_step: pd.DataFrame | None) -> pd.DataFrame:
    """The (rank, step, step_ns) rows of the analysed steps: rank and step known, step_ns > 0."""
    if per_step is None or per_step.empty or not {"rank", "step", "step_ns"} <= set(per_step):
        return pd.DataFrame(columns=["rank", "step", "step_ns"])
    rows = per_step[["rank", "step", "step_ns"]].apply(pd.to_numeric, errors="coerce")
    return rows[rows["rank"].notna() & rows["step"].notna() & (rows["step_ns"] > 0)]


def mean_waits(per_step: pd.DataFrame | None, waits: pd.DataFrame | None) -> pd.Series | None:
    """Each rank's mean wait for peers per analysed step, ms (a step without a wait counts 0, a
    step whose wait is unknown does not count: a rank with only such steps is left out); None
    where the cross-rank pass has no waits (`waits`: its waits), or none known."""
    steps = analysed_rows(per_step)
    if waits is None or waits.empty or steps.empty:
        return None
    keys = steps[["rank", "step"]].astype("int64")
    merged = keys.merge(waits[["rank", "step", "wait_for_peers_ms"]].astype(
        {"rank": "int64", "step": "int64"}), on=["rank", "step"], how="left", indicator=True)
    absent = (merged.pop("_merge") == "left_only").to_numpy()
    merged.loc[absent, "wait_for_peers_ms"] = 0.0
    # NaN: the cross-rank pass could not put the step's collectives on one clock.
    merged = merged.dropna(subset=["wait_for_peers_ms"])
    return merged.groupby("rank")["wait_for_peers_ms"].mean() if len(merged) else None


def _waits_line(per_step, findings: pd.DataFrame, cross_rank: CrossRank | None, alone: bool,
                ranks: int) -> str:
    if alone:
        return "No rank waits for another: no collective ran."
    if ranks < 2:
        return "One rank analysed: no other rank in these traces to wait for."
    late = cross_rank.stragglers if cross_rank is not None else None
    waits = cross_rank.waits if cross_rank is not None else None
    if late is not None and len(late) and "fires" in late:
        fired = late[late["fires"].astype(bool)]
        if len(fired):
            parts = [f"rank {int(r['rank'])} ({r['caused_wait_ms_per_step']:.2f} ms per step)"
                     for r in fired.to_dict("records")]
            waited = mean_waits(per_step, waits)
            others = ""
            if waited is not None:
                others = "; each rank's wait: " + ", ".join(
                    f"rank {int(r)} {w:.2f} ms" for r, w in waited.items())
            return "The other ranks wait for " + " and ".join(parts) + others + "."
    waited = mean_waits(per_step, waits)
    if waited is None and waits is not None and len(waits):
        return ("Who waits for whom is not known: no rank's collectives could be put on one clock "
                "(see the notes).")
    if waited is None:
        return "Who waits for whom is not known: the cross-rank pass matched no collective."
    if (waited < MIN_WAIT_MS).all():
        return f"No rank waits for its peers (under {MIN_WAIT_MS:g} ms per step each)."
    order = waited.sort_values(ascending=False, kind="stable")
    listed = ", ".join(f"rank {int(r)} {w:.2f} ms" for r, w in order.items())
    return (f"Ranks wait for their peers per step: {listed}; no rank is late often enough to be "
            f"named.")


def what_if_line(what_if: list | None, steps: int | None = None) -> str | None:
    """The top what-if answer (docs/critical-path.md) in words: "if rank 1 were on time: 15.20
    ms per step instead of 41.00 (-63%)", with the number of steps its means are over where
    given; None without an answer that saves at least MIN_WAIT_MS per step. An estimate that
    is not propagated on the graph (the pipeline with more microbatches), or a change of scale
    (host work halved), is not quoted."""
    answers = [w for w in what_if or [] if w.get("kind") not in ESTIMATES]
    if not answers:
        return None
    top = answers[0]
    saved, predicted = top.get("saved_ms_per_step"), top.get("predicted_step_ms")
    if saved is None or predicted is None or not saved >= MIN_WAIT_MS:
        return None
    measured = predicted + saved
    change = _conditional(top)
    share = f" ({-saved / measured * 100:+.0f}%)" if measured > 0 else ""
    over = f" over the {steps} steps of the critical path" if steps else " by the critical path"
    return (f"if {change}: {predicted:.2f} ms per step instead of {measured:.2f}{share}"
            f"{over} (docs/critical-path.md).")




def _conditional(answer: dict) -> str:
    """The change as the clause of "if ...": "rank 1 were on time", "the pipeline bubble were
    at its theoretical 20.0% (...)", "there were no data loading gaps on rank 1"."""
    kind, change = answer.get("kind"), answer["change"]
    if kind == "rank_on_time" and answer.get("ranks"):
        return f"rank {answer['ranks'][0]} were on time"
    if kind == "pipeline_bubble_theoretical" and change.startswith("pipeline bubble at"):
        return "the pipeline bubble were at" + change[len("pipeline bubble at"):]
    if kind == "idle_cause_removed":
        return f"there were {change}"
    return change


def late_lines(late: dict | None) -> list[str]:
    """One line per late rank: the causes that hold, with their confidence, and the first one's
    proof (analysis.findings.late_ranks)."""
    lines = []
    for rank, item in sorted((late or {}).items()):
        if not item.causes:
            lines.append(f"Why rank {rank} is late: " + (
                "no cause tested holds in its profiled steps" if item.tested else
                "not tested: no profiled step of it is analysed")
                + " (docs/report.md, \"Why a rank is late\").")
            continue
        named = "; ".join(f"{c.cause} ({c.confidence} confidence)" for c in item.causes)
        lines.append(f"Why rank {rank} is late: {named}. {item.causes[0].proof[0].upper()}"
                     f"{item.causes[0].proof[1:]}")
    return lines


def run_verdict(per_step: pd.DataFrame | None, findings: pd.DataFrame | None,
                notes: pd.DataFrame | None, cross_rank: CrossRank | None,
                critical: CriticalPath | None = None, captures: list | None = None,
                late: dict | None = None, memory_line: str | None = None,
                phases: list | None = None) -> Verdict:
    """The verdict of the analysed steps; `critical` is the run's critical path, whose top
    what-if answer (largest saving first) the verdict quotes (`what_if`: that line, or None),
    and whose answers price the changes to try (analysis.findings.priced: "Try first" is the
    finding whose change saves most, the next two follow); `late` the late ranks and their
    causes (analysis.findings.late_ranks), one "Why rank R is late" line each;
    `memory_line` the memory section's ("Memory: ..."), which follows who waits for whom
    (`memory`: that line, or None). A run of several `phases` (analysis.crossrank.phases)
    opens with them instead (analysis.findings.phase_lines): who waits, and the what-if, are
    each phase's, not the whole run's; where the phase that matters most names a late rank,
    the change to try first is about it, and the priced changes follow it.

    state: "ranks train alone" (that finding is there), "bottleneck" (a finding with step time
    at stake), "risk" (only a finding without a time cost: memory near capacity), "notes only"
    (no finding, some note), "nothing found", or "no step". `limits`
    names the finding with the most ms per step; `change` is the first sentence of its
    suggestion; `lines` are the verdict as the writers print it, with one "Captured:" line per
    capture window (analysis.findings.capture_windows)."""
    steps = analysed_rows(per_step)
    if steps.empty:
        line = "No step was analysed: there is no verdict (the warnings say why)."
        return Verdict(state=NO_STEP, limits=None, waits=None, change=None,
                       change_ms_per_step=None, step_ms=None, what_if=None,
                       lines=[line, *([memory_line] if memory_line else [])],
                       memory=memory_line)
    step_ms = float(steps["step_ns"].mean() / 1e6)
    findings = findings if findings is not None else pd.DataFrame()
    notes = notes if notes is not None else pd.DataFrame()
    ranks = steps["rank"].nunique()
    alone = not findings.empty and (findings["finding"] == ALONE).any()
    timed = (findings[findings["ms_per_step"].notna()].sort_values(
        "ms_per_step", ascending=False, kind="stable")
        if not findings.empty and "ms_per_step" in findings else pd.DataFrame())
    waits = _waits_line(per_step, findings, cross_rank, alone, ranks)
    what_if = critical.what_if if critical is not None else None
    to_try = (priced.tries(timed, what_if, _first_sentence)
              if len(timed) and not alone else [])
    state, limits, change, change_ms = _state_of(findings, notes, timed, to_try, alone, steps,
                                                 step_ms)
    opening = phase_opening(phases or [])
    why = [*late_lines(late), *([memory_line] if memory_line else [])]
    phase_change = None
    if opening is not None:
        lines = [*opening.lines, f"Limits the step (whole run): {limits}", *why]
        waits, answer = opening.waits, opening.what_if
        if opening.change is not None and state != ALONE_STATE:
            state, phase_change = PROBLEM, opening.change
            change, change_ms = opening.change, opening.change_ms_per_step
    else:
        lines = [f"Limits the step: {limits}", f"Waiting: {waits}", *why]
        answer = (what_if_line(critical.what_if, len(critical.critical_path_steps))
                  if critical is not None else None)
        if answer:
            lines.append(f"What if: {answer}")
    if phase_change is not None:
        lines.append(f"Try first ({change_ms:.2f} ms per step at stake in those steps): "
                     f"{phase_change}")
        to_try = to_try[:2]
        lines += [priced.try_line(False, row) for row in to_try]
    elif to_try and state == PROBLEM:
        lines += [priced.try_line(n == 0, row) for n, row in enumerate(to_try)]
    elif change:
        at_stake = (f" (up to {change_ms:.2f} ms per step at stake)"
                    if change_ms is not None else "")
        lines.append(f"Try first{at_stake}: {change}")
    elif state in (NOTES_ONLY, NOTHING_FOUND):
        lines.append("Try first: nothing stands out to change"
                     + (f"; see the notes ({notes['note'].iloc[0]})." if len(notes) else "."))
    lines += [f"Captured: {window['text']}" for window in captures or []]
    return Verdict(state=state, limits=limits, waits=waits, change=change,
                   change_ms_per_step=change_ms, step_ms=step_ms, what_if=answer, lines=lines,
                   tries=to_try if state == PROBLEM else [], memory=memory_line)


def _state_of(findings: pd.DataFrame, notes: pd.DataFrame, timed: pd.DataFrame, to_try: list,
              alone: bool, steps: pd.DataFrame, step_ms: float) -> tuple:
    """(state, limits, change, change's ms per step) of the whole run (run_verdict's doc)."""
    change = change_ms = None
    if alone:
        row = findings[findings["finding"] == ALONE].iloc[0]
        state = ALONE_STATE
        limits = (f"The ranks never communicated: ranks {row['ranks']} each trained alone, "
                  f"with no collective in any step (mean step {step_ms:.2f} ms).")
        change = ("Make the ranks join one process group: check the launcher and the "
                  "script's init_process_group and DDP/FSDP model (with Hugging Face Accelerate, "
                  "accelerator.num_processes and accelerator.state.distributed_type).")
    elif len(timed):
        row = timed.iloc[0]
        state = PROBLEM
        change_ms = float(row["ms_per_step"])
        limits = (f"{row['finding'][0].upper()}{row['finding'][1:]} costs {change_ms:.2f} ms of "
                  f"the {step_ms:.2f} ms mean step ({row['share_pct']:.1f}%), ranks "
                  f"{row['ranks']}.")
        change = to_try[0]["change"]
        change_ms = to_try[0]["ms_per_step"]
    elif not notes.empty:
        state = NOTES_ONLY
        limits = (f"No finding passed its threshold (mean step {step_ms:.2f} ms); "
                  f"{len(notes)} note(s) say what could not be told: "
                  f"{notes['note'].iloc[0]}.")
    elif not findings.empty:  # a risk without a time cost: memory near capacity
        row = findings.iloc[0]
        state = RISK
        limits = (f"No finding costs step time past its threshold (mean step {step_ms:.2f} ms); "
                  f"one risk: {row['finding']}, ranks {row['ranks']}.")
        change = _first_sentence(row["suggestion"])
    else:
        state = NOTHING_FOUND
        limits = (f"Nothing found wrong: no finding passed its threshold (mean step "
                  f"{step_ms:.2f} ms over {len(steps)} analysed rank-steps of ranks "
                  f"{rank_list(steps['rank'])}).")
    return state, limits, change, change_ms

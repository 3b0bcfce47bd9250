"""The verdict's lines on a run of several phases (docs/report.md, "The verdict"): the phase
that matters most first, in plain words, then the others in step order; each with its own late
rank, waits and mean step, and the first with its own what-if answer.

A run of one phase gives no line: the verdict then speaks of the run as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.core.contracts import Phase

# What-if kinds the verdict quotes as "if rank R were on time".
RANK_ON_TIME = "rank_on_time"
# Phases besides the lead one told in a line each (its neighbours first): the verdict opens the
# report's one screen.
OTHER_PHASES_TOLD = 3


def lead_phase(phases: list[Phase]) -> Phase:
    """The phase the verdict opens with: one with a late rank, the largest share of the run's
    time first; without any, the slowest."""
    late = [p for p in phases if p.late_rank is not None]
    if late:
        return max(late, key=lambda p: (p.share_pct, -p.first_step))
    return max(phases, key=lambda p: (p.step_ms, -p.first_step))


def span_text(phase: Phase, phases: list[Phase]) -> str:
    """Where the phase lies, in words: "From step 2000 (the last 100 steps", "Until step 35
    (the first 35 steps", "From step 36 to 71 (36 steps"."""
    first, last = phases[0].first_step, phases[-1].last_step
    if phase.first_step > first and phase.last_step == last:
        return f"From step {phase.first_step} (the last {phase.steps} steps"
    if phase.first_step == first and phase.last_step < last:
        return f"Until step {phase.last_step} (the first {phase.steps} steps"
    return f"From step {phase.first_step} to {phase.last_step} ({phase.steps} steps"


def _waits_text(phase: Phase) -> str:
    waits = [(r, v["wait_ms"]) for r, v in sorted(phase.ranks.items())
             if v.get("wait_ms") is not None]
    if not waits:
        return "who waits is not known"
    return "waits: " + ", ".join(f"rank {r} {w:.2f} ms" for r, w in waits)


def _who_text(phase: Phase) -> str:
    """Who is late and who waits in the phase, with its mean step."""
    if phase.late_rank is None:
        return f"no rank is late, {_waits_text(phase)} per step; mean step {phase.step_ms:.2f} ms"
    waiting = phase.waiting_ranks
    who = (f"rank {waiting[0]} waits" if len(waiting) == 1 else
           f"ranks {', '.join(str(r) for r in waiting)} wait" if waiting else "the others wait")
    return (f"rank {phase.late_rank} is late by {phase.late_ms_per_step:.2f} ms per step; "
            f"{who} for it; mean step {phase.step_ms:.2f} ms")


def what_if_text(phase: Phase) -> str | None:
    """The phase's top what-if answer in words: "if rank 1 were on time: 3.31 ms per step
    instead of 65.25 (-95%) over its 100 steps"; None without one."""
    answer = phase.what_if
    if not answer:
        return None
    saved, predicted = answer["saved_ms_per_step"], answer["predicted_step_ms"]
    measured = predicted + saved
    change = (f"rank {answer['ranks'][0]} were on time"
              if answer.get("kind") == RANK_ON_TIME and answer.get("ranks") else
              answer["change"])
    share = f" ({-saved / measured * 100:+.0f}%)" if measured > 0 else ""
    return (f"if {change}: {predicted:.2f} ms per step instead of {measured:.2f}{share} over "
            f"its {answer['steps']} steps of the critical path")


@dataclass(frozen=True)
class PhaseOpening:
    """What the verdict says of a run of several phases: its opening `lines`, who waits
    (`waits`: the phases' lines), the lead phase's what-if in words (or None), and the change
    to try with the ms per step at stake where the lead phase names a late rank (else None)."""

    lines: list[str]
    waits: str
    what_if: str | None
    change: str | None
    change_ms_per_step: float | None


def phase_opening(phases: list[Phase]) -> PhaseOpening | None:
    """The verdict's opening on a run of several phases; None for one phase (or none)."""
    if len(phases) < 2:
        return None
    lead = lead_phase(phases)
    who = [f"{span_text(lead, phases)}, {lead.share_pct:.0f}% of the run's time) "
           f"{_who_text(lead)}."]
    at = phases.index(lead)
    # the lead's neighbours first, then the others by their share of the run's time
    others = sorted((k for k in range(len(phases)) if k != at),
                    key=lambda k: (abs(k - at) > 1, -phases[k].share_pct))
    told = sorted(others[:OTHER_PHASES_TOLD])
    for k in told:
        phase = phases[k]
        where = ("Before that" if k == at - 1 else "After that" if k == at + 1 else "Then")
        who.append(f"{where} (steps {phase.first_step}-{phase.last_step}, "
                   f"{phase.share_pct:.0f}% of the run's time): {_who_text(phase)}.")
    if len(others) > len(told):
        rest = [phases[k] for k in sorted(others[OTHER_PHASES_TOLD:])]
        who.append(f"And {len(rest)} more phase(s), {sum(p.share_pct for p in rest):.0f}% of the "
                   f"run's time (the phases table).")
    answer = what_if_text(lead)
    cuts = ", ".join(str(p.first_step) for p in phases[1:])
    summary = (f"Phases: {len(phases)}, the run changed at step{'s' if len(phases) > 2 else ''} "
               f"{cuts} (docs/definitions.md, \"Phases\"); the tables below cover the whole "
               f"run.")
    lines = [who[0], *([f"What if, in those steps: {answer} (docs/critical-path.md)."]
                       if answer else []), *who[1:], summary]
    change = change_ms = None
    if lead.late_rank is not None:
        change = (f"Find what rank {lead.late_rank} does differently from step "
                  f"{lead.first_step} on: its host (other processes, CPU frequency), its data "
                  f"loader and shard, or work only it does; a capture window of those steps "
                  f"shows it (docs/tracer.md).")
        change_ms = float(lead.late_ms_per_step)
    return PhaseOpening(lines=lines, waits=" ".join(who), what_if=answer, change=change,
                        change_ms_per_step=change_ms)

"""An analysed run as the text report (docs/report.md): its tables as they are, one section each,
the verdict first."""

from __future__ import annotations

import pandas as pd

from analysis.core.contracts import CrossRank, RunReport
from analysis.core.model import known_rank
from analysis.core.step_spec import format_ranges
from analysis.crossrank import report_tables as cross_report
from analysis.report.breakdown_text import breakdown_rows, per_step_rows, split_known, split_note
from analysis.report.critical import critical_path_text
from analysis.report.memory_output import memory_text
from analysis.report.mfu import mfu_text
from analysis.report.phase_table import phase_table
from analysis.report.text_tables import text_table as _table
from analysis.report.values import (
    WINDOW_WHOLE_TRACE,
    _ms,
    _pct,
    _rank,
    _share,
    _us,
    human_bytes,
    plain,
    records,
    steps_by_rank,
    window_of,
)


def hta_text(hta: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for row in records(hta):
        rows.append({
            "rank": _rank(row["rank"]), "idle us": _us(row["idle_us"]),
            "compute us": _us(row["compute_us"]), "non-compute us": _us(row["non_compute_us"]),
            "kernel time us": _us(row["kernel_time_us"]), "note": row["note"] or "",
        })
    return pd.DataFrame(rows)


def idle_text(idle: pd.DataFrame, totals: pd.DataFrame) -> pd.DataFrame:
    step_ns = {plain(r["rank"]): r["step_ns"] for r in records(totals)}
    rows = []
    for row in records(idle):
        rows.append({
            "rank": _rank(row["rank"]), "host was": row["host_activity"], "gaps": row["gaps"],
            "idle ms": _ms(row["total_ns"]),
            "of step time": _share(row["total_ns"], step_ns.get(row["rank"])),
        })
    return pd.DataFrame(rows)


def _optional(frame: pd.DataFrame | None, columns: list[str]) -> pd.DataFrame:
    if frame is None or frame.empty:
        return pd.DataFrame()
    return frame[[c for c in columns if c in frame.columns]]


COLLECTIVES_TEXT = {
    "op": "op", "issuer": "issuer", "pg": "pg", "size_bucket": "size", "count": "count",
    "transfer_busbw_gbps": "busbw GB/s", "transfer_algbw_gbps": "algbw GB/s",
    "ms_per_step": "ms/step", "time_from": "time from",
    "total_us": "total us", "mean_us": "mean us", "busbw_gbps": "busbw by duration",
    "algbw_gbps": "algbw by duration", "ranks": "ranks",
}


def collectives_text(collectives: pd.DataFrame) -> pd.DataFrame:
    """The collectives table as printed: the transfer-based bandwidth first."""
    shown = _optional(collectives, list(COLLECTIVES_TEXT))
    return shown.round(2).rename(columns=COLLECTIVES_TEXT)


SETUP_TEXT = {"op": "op", "issuer": "issuer", "pg": "pg", "size_bucket": "size",
              "count": "count", "total_us": "total us", "mean_us": "mean us", "ranks": "ranks"}


def setup_collectives_text(setup: pd.DataFrame) -> pd.DataFrame:
    """The set-up collectives as printed: what ran before the first step, with its time."""
    return _optional(setup, list(SETUP_TEXT)).round(2).rename(columns=SETUP_TEXT)


def cross_rank_text(result: CrossRank) -> str:
    """The Cross-rank section: clock, stragglers, waits, mismatches, pipeline."""
    parts = ["Cross-rank (docs/cross-rank.md)"]
    for title, frame in cross_report.text_tables(result):
        if frame.empty and "Pipeline" in title:
            continue
        parts.append(_table(frame.round(3), "  " + title))
    return "\n".join(parts)


def window_text(report: RunReport) -> str:
    """What the breakdown covers, as the report's heading says it."""
    if report.steps_spec:
        steps = "selected steps " + report.steps_spec
    else:
        steps = "every complete, finished step"
    if report.hta_compatible:
        steps += ", last step dropped (HTA-compatible)"
    steps_of = steps_by_rank(report.per_step)
    whole = [known_rank(t) for t in report.ranks
             if window_of(steps_of.get(known_rank(t), [])) == WINDOW_WHOLE_TRACE]
    if not whole:
        return steps
    whole_text = "the whole trace as one window (no ProfilerStep)"
    if len(whole) == len(report.ranks):
        return whole_text
    ranks = ", ".join(_rank(r) for r in whole)
    return f"{steps}; {whole_text} on rank(s) {ranks}"


def steps_line(report: RunReport) -> str | None:
    """Which steps the tables cover, where the analysed steps (every recorded one) are more
    than the profiled ones that have the kernel-level split; None where they are the same."""
    analysed = steps_by_rank(report.step_table())
    profiled = steps_by_rank(report.per_step)
    if all(sorted(set(analysed[r])) == sorted(set(profiled.get(r, [])))
           for r in analysed):
        return None
    every = sorted({s for steps in analysed.values() for s in steps})
    sampled = sorted({s for steps in profiled.values() for s in steps if s >= 0})
    split = (f"the kernel-level split (time breakdown, idle, the findings that say so) is "
             f"measured in the {len(sampled)} profiled ({format_ranges(sampled)})"
             if sampled else "no step was profiled: no kernel-level split")
    return (f"steps: {len(every)} analysed ({format_ranges(every)}, every recorded step); "
            f"{split}")


def status_line(report: RunReport) -> str | None:
    ended = {}
    for trace in report.ranks:
        if trace.status and trace.status != "ok":
            ended.setdefault(trace.status, []).append(known_rank(trace))
    if not ended:
        return None
    parts = [f"rank(s) {format_ranges(sorted(r for r in ranks if r is not None))} {status}"
             for status, ranks in sorted(ended.items())]
    return "run ended badly: " + "; ".join(parts) + " (see the warnings)"


def text_report(report: RunReport) -> str:
    """The whole text report of one run: its heading, the verdict and the stop diagnosis, then
    each table's section."""
    title = f"ranktrace analysis of {report.name}  ({report.path})"
    if report.nothing_analysed():
        return f"{title}\nnothing could be analysed: no step and no collective (the reasons " \
               f"are in the warnings on stderr)\n"
    covered = steps_line(report)
    lines = _heading(report, title, covered)
    lines += _breakdown_sections(report, covered)
    lines += _collectives_sections(report)
    if report.critical is not None:
        lines.append(critical_path_text(report.critical, report.path_window))
    lines += _ranks_section(report)
    memory = memory_text(report.memory)
    if memory:
        lines.append(memory)
    if not report.per_step.empty:
        mfu = mfu_text(report.mfu, report.roofline)
        if mfu:
            lines.append(mfu)
    lines += _findings_sections(report)
    if report.cross_rank is not None:
        lines.append(cross_rank_text(report.cross_rank))
    for name, why in report.unavailable.items():
        lines.append(f"{name}: not available ({why})")
    return "\n".join(lines).rstrip() + "\n"


def _heading(report: RunReport, title: str, covered: str | None) -> list[str]:
    """The title, the ranks and window, the steps covered, how the run ended, the verdict and
    the stop diagnosis."""
    kinds = sorted(set(report.totals["kind"])) if not report.totals.empty else []
    ranks = ", ".join(_rank(known_rank(t)) for t in report.ranks) or "none"
    world = f" of world size {report.world_size}" if report.world_size else ""
    lines = [title, f"ranks {ranks}{world}; {'/'.join(kinds) or 'no'} trace; "
                    f"window: {window_text(report)}"]
    if covered:
        lines.append(covered)
    status = status_line(report)
    if status:
        lines.append(status)
    lines.append("")
    if report.verdict is not None:
        lines += ["Verdict"] + [f"  {line}" for line in report.verdict.lines] + [""]
    if len(report.phases) > 1:
        lines.append(_table(phase_table(report.phases).rename(columns=PHASES_TEXT).round(2),
                            "Phases (docs/definitions.md)",
                            "  each phase judged on its own steps: its late rank by the straggler "
                            "rule, waits and what-if on its steps alone; ms per step"))
    if report.stop is not None:
        lines += ["Stop diagnosis"] + [f"  {line}" for line in report.stop.lines] + [""]
    return lines


PHASES_TEXT = {"count": "steps in it", "share_pct": "of run time %", "step_ms": "mean step ms",
               "late_rank": "late rank", "late_ms": "late by ms", "waits": "wait ms",
               "what_if": "what if (its steps)"}


def _breakdown_sections(report: RunReport, covered: str | None) -> list[str]:
    """The time breakdown per rank and per step, HTA's breakdown and the idle time."""
    if report.per_step.empty:
        return ["No step was analysed: no time breakdown (the warnings say why).\n"]
    breakdown, unsplit = breakdown_rows(report.totals)
    steps_shown, steps_unsplit = per_step_rows(report.step_table())
    return [
        _table(breakdown, "Time breakdown per rank (share of step time"
               + (", profiled steps)" if covered else ")"),
               "  compute, transfer, waiting = alone; overlap = compute and communication "
               "at once; comm hidden = overlap / all comm\n" + split_note(unsplit)),
        _table(steps_shown, "Per step (ms)", split_note(steps_unsplit)),
        _table(hta_text(report.hta), "HTA-compatible temporal breakdown (HTA's window: last "
               "ProfilerStep dropped)"),
        _table(idle_text(report.idle, report.totals), "Idle time by what the host was doing"),
    ]


def _collectives_sections(report: RunReport) -> list[str]:
    """The collectives of the analysed steps and the set-up ones."""
    lines = []
    if report.collectives is not None:
        lines.append(_table(collectives_text(report.collectives), "Collectives",
                            "  busbw GB/s: bytes over transfer time (waiting for peers left "
                            "out; docs/cross-rank.md); busbw by duration counts the whole op; "
                            "ms/step = cost per analysed step, the mean per rank (ranked by it)"))
    setup = report.setup_collectives
    if setup is not None and not setup.empty:
        lines.append(_table(setup_collectives_text(setup),
                            "Set-up collectives (before the first step; in no step's time)"))
    return lines


RANKS_TEXT = {"mean_step_ns": "mean step ms", "max_step_ns": "max step ms",
              "transfer_ns": "transfer ms", "peer_wait_ns": "waiting ms",
              "exposed_comm_pct": "exposed comm % (not split)",
              "peak_allocated_bytes": "peak allocated", "peak_rss_bytes": "peak rss"}


def _ranks_section(report: RunReport) -> list[str]:
    """One row per rank: its steps, time, memory and utilisation."""
    if report.per_rank is None:
        return []
    split = split_known(report.per_rank)
    shown = _optional(report.per_rank,
                      ["rank", "steps", "mean_step_ns", "max_step_ns", "idle_pct",
                       *(["transfer_ns", "peer_wait_ns"] if split else ["exposed_comm_pct"]),
                       "peak_allocated_bytes", "peak_rss_bytes",
                       "sm_util_pct", "cpu_process_pct", "slowdown_vs_fastest_pct",
                       "status"]).copy()
    for column in ("mean_step_ns", "max_step_ns", "transfer_ns", "peer_wait_ns"):
        if column in shown:
            shown[column] = shown[column].map(_ms)
    for column in ("peak_allocated_bytes", "peak_rss_bytes"):
        if column in shown:
            shown[column] = shown[column].map(human_bytes)
    shown = shown.rename(columns=RANKS_TEXT)
    return [_table(shown.round(1), "Ranks", "  transfer ms, waiting ms: mean per step"
                   if split else "")]


def _findings_sections(report: RunReport) -> list[str]:
    """The bottlenecks, each with its evidence and suggestion, and the notes."""
    lines = []
    bottlenecks = report.findings
    if bottlenecks is not None and not report.per_step.empty:
        lines.append("Bottlenecks")
        if bottlenecks.empty:
            lines.append("  none found\n")
        for row in records(bottlenecks):
            at_stake = row.get("ms_per_step")
            share = ("" if row.get("share_pct") is None else
                     f"[{_pct(row.get('share_pct'))}"
                     + ("" if at_stake is None else f", {at_stake:.2f} ms/step") + "] ")
            lines.append(f"  {share}{row.get('finding')} (ranks {row.get('ranks')})")
            lines.append(f"      {row.get('evidence')}")
            lines.append(f"      -> {row.get('suggestion')}")
        lines.append("")
    notes = report.notes
    if notes is not None and not notes.empty and not report.per_step.empty:
        lines.append("Notes (what could not be told; not ranked)")
        for row in records(notes):
            ranks = f" (ranks {row['ranks']})" if row.get("ranks") else ""
            lines.append(f"  - {row.get('note')}{ranks}")
            if row.get("evidence"):
                lines.append(f"      {row.get('evidence')}")
            if row.get("suggestion"):
                lines.append(f"      -> {row.get('suggestion')}")
        lines.append("")
    return lines

"""Turning an analysed run into terminal tables, the JSON document, or CSV files.

The JSON document's layout is described in docs/analysis.md; DOCUMENT_VERSION changes whenever
a field is renamed or removed (adding fields does not).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.core.model import known_rank
from analysis.core.steps import WHOLE_TRACE_STEP, format_ranges
from analysis.crossrank import report as cross_report
from analysis.findings.memory_section import MemorySection
from analysis.report.breakdown_text import (  # noqa: F401
    UNSPLIT,
    _breakdown_text,
    _note,
    _per_step_text,
    breakdown_text,
    comm_split,
    per_step_text,
    split_known,
)
from analysis.report.critical import critical_path_json, critical_path_text  # noqa: F401
from analysis.report.memory_output import memory_json, memory_table, memory_text
from analysis.report.mfu import mfu_json, mfu_text
from analysis.report.text_tables import TEXT_MAX_ROWS  # noqa: F401 (the report's limit)
from analysis.report.text_tables import text_table as _table
from analysis.report.values import (  # noqa: F401 (the writers' helpers, used from here)
    _ms,
    _pct,
    _rank,
    _share,
    _us,
    human_bytes,
    plain,
    records,
)
from tracer import schema

DOCUMENT_VERSION = 1
WHAT_IF_COLUMNS = ["change", "kind", "ranks", "saved_ms_per_step", "predicted_step_ms",
                   "assumptions"]
MS = 1e6  # ns per ms


@dataclass
class RunReport:
    """Everything computed for one run; the tables are plain DataFrames."""

    name: str
    path: str
    files: list[str]
    world_size: int | None
    steps_spec: str | None
    hta_compatible: bool
    problems: list[str]
    ranks: list  # RankTrace, as loaded
    per_step: pd.DataFrame  # breakdown_per_step of every rank
    totals: pd.DataFrame  # rank_totals(per_step)
    hta: pd.DataFrame  # hta_temporal_breakdown
    idle: pd.DataFrame  # idle_summary(idle gaps)
    idle_gaps: pd.DataFrame
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # the other analyses' tables
    unavailable: dict[str, str] = field(default_factory=dict)  # table -> why it is missing
    cross_rank: dict | None = None  # analysis.crossrank.cross_rank's frames; None if it failed
    # analysis.findings.stop.stop_diagnosis; None for a run that ended well
    stop: dict | None = None
    # analysis.findings.verdict.run_verdict: the lines the report opens with
    verdict: dict | None = None
    # analysis.crossrank.critical_path.analyse: the critical path per step and the what-if
    # answers; None where the cross-rank pass or the model failed
    critical: dict | None = None
    # analysis.findings.captures.analysed_captures: the capture windows and what they show
    captures: list = field(default_factory=list)
    # analysis.findings.memory_section.memory_section; None without step records
    memory: MemorySection | None = None

    def step_table(self) -> pd.DataFrame:
        """The per-step table: analysis.rank.tables' fuller one where it was built, else ours."""
        return self.tables.get("per_step", self.per_step)


# ---- JSON ---------------------------------------------------------------------------------------
HTA_KEYS = ("idle_us", "compute_us", "non_compute_us", "kernel_time_us")


def run_document(report: RunReport) -> dict:
    hta_by_rank = {plain(r["rank"]): r for r in records(report.hta)}
    totals_by_rank = {plain(r["rank"]): r for r in records(report.totals)}
    per_rank = {plain(r["rank"]): r for r in records(report.tables.get("per_rank"))}
    steps_of = steps_by_rank(report.per_step)
    analysed_of = steps_by_rank(report.step_table())
    ranks = []
    for trace in report.ranks:
        rank = known_rank(trace)
        totals = dict(totals_by_rank.get(rank, {}))
        totals.pop("rank", None)
        hta = hta_by_rank.get(rank, {})
        ranks.append({
            "rank": rank,
            "file": str(trace.path),
            "more_files": [str(p) for p in trace.extra_paths],
            "world_size": trace.world_size,
            "window": window_of(steps_of.get(rank, [])),
            "steps_analysed": analysed_of.get(rank, []),
            "steps_profiled": steps_of.get(rank, []),
            "has_trace": trace.has_trace,
            "status": trace.status,
            "breakdown": totals,
            "hta_compatible": {**{k: hta.get(k) for k in HTA_KEYS},
                               "note": hta.get("note") or None},
            "summary": {k: v for k, v in per_rank.get(rank, {}).items() if k != "rank"},
        })
    return {
        "schema_version": DOCUMENT_VERSION,
        "trace_schema_version": schema.SCHEMA_VERSION,
        "run": {"name": report.name, "path": report.path, "files": report.files,
                "world_size": report.world_size, "ranks_analysed": len(report.ranks)},
        "selection": {"steps": report.steps_spec or "all",
                      "hta_compatible": report.hta_compatible},
        "problems": list(report.problems),
        "ranks": ranks,
        "steps": records(report.step_table()),
        "idle": records(report.idle),
        "collectives": records(report.tables.get("collectives")),
        "setup_collectives": records(report.tables.get("setup_collectives")),
        "verdict": plain(report.verdict),
        "bottlenecks": records(report.tables.get("bottlenecks")),
        "notes": records(report.tables.get("notes")),
        "cross_rank": (cross_rank_json(report.cross_rank)
                       if report.cross_rank is not None else None),
        **critical_path_json(report.critical),
        **mfu_json(report.tables.get("mfu"), report.tables.get("roofline")),
        "captures": plain(report.captures),
        "unavailable": dict(report.unavailable),
        "stop_diagnosis": (None if report.stop is None else {
            "groups": records(report.stop["groups"]), "ranks": plain(report.stop["ranks"]),
            "lines": report.stop["lines"]}),
        # docs/memory.md; absent for a run without step records
        **({"memory": memory_json(report.memory)} if report.memory is not None else {}),
    }


WINDOW_STEPS, WINDOW_WHOLE_TRACE, WINDOW_NONE = "steps", "whole trace", "none"


def steps_by_rank(per_step: pd.DataFrame) -> dict:
    """rank -> the step numbers of its rows in the breakdown, in table order ([-1] for a trace
    analysed whole); rows without a rank are under None. Built once: a lookup per rank, not a
    scan of the table per rank."""
    by_rank: dict = {}
    if per_step.empty:
        return by_rank
    for rank, step in zip(per_step["rank"].astype(object), per_step["step"].astype(object)):
        by_rank.setdefault(None if pd.isna(rank) else rank, []).append(int(step))
    return by_rank


def window_of(steps: list[int]) -> str:
    """What a rank with these analysed steps was analysed over: its steps, its whole trace (no
    ProfilerStep), or none."""
    if not steps:
        return WINDOW_NONE
    return WINDOW_WHOLE_TRACE if steps == [WHOLE_TRACE_STEP] else WINDOW_STEPS


def json_document(reports: list[RunReport]) -> dict:
    """One run's document, or {"schema_version", "runs": [...]} for several (--all)."""
    if len(reports) == 1:
        return run_document(reports[0])
    return {"schema_version": DOCUMENT_VERSION, "runs": [run_document(r) for r in reports]}


def dumps(document: dict) -> str:
    return json.dumps(document, indent=2, allow_nan=False)


# ---- CSV ----------------------------------------------------------------------------------------
def csv_tables(report: RunReport) -> dict[str, pd.DataFrame]:
    """File stem -> table written by --out."""
    tables = {
        "per_step": report.step_table(),
        "rank_totals": report.totals,
        "hta_compatible": report.hta,
        "idle": report.idle,
        "idle_gaps": report.idle_gaps,
    }
    for name in ("per_rank", "comm_ops", "collectives", "setup_collectives", "bottlenecks",
                 "notes", "mfu", "roofline"):
        if name in report.tables:
            tables[name] = report.tables[name]
    if report.critical is not None:
        tables["critical_path"] = report.critical["critical_path"]
        tables["critical_path_steps"] = report.critical["critical_path_steps"]
        tables["what_if"] = pd.DataFrame(report.critical["what_if"],
                                         columns=WHAT_IF_COLUMNS)
    if report.cross_rank is not None:
        tables.update(cross_report.csv_tables(report.cross_rank))
    if report.memory is not None and report.memory.rows:
        tables["memory"] = memory_table(report.memory)
    return tables


def write_csvs(report: RunReport, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, table in csv_tables(report).items():
        path = out_dir / f"{stem}.csv"
        table.to_csv(path, index=False)
        written.append(path)
    return written


# ---- text ---------------------------------------------------------------------------------------
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


def cross_rank_text(result: dict) -> str:
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


def nothing_analysed(report: RunReport) -> bool:
    """No breakdown row and no collective: nothing to show but the reasons."""
    collectives = report.tables.get("collectives")
    return report.per_step.empty and (collectives is None or collectives.empty)


def _status_line(report: RunReport) -> str | None:
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
    kinds = sorted(set(report.totals["kind"])) if not report.totals.empty else []
    ranks = ", ".join(_rank(known_rank(t)) for t in report.ranks) or "none"
    world = f" of world size {report.world_size}" if report.world_size else ""
    title = f"ranktrace analysis of {report.name}  ({report.path})"
    if nothing_analysed(report):
        return f"{title}\nnothing could be analysed: no step and no collective (the reasons " \
               f"are in the warnings on stderr)\n"
    lines = [title, f"ranks {ranks}{world}; {'/'.join(kinds) or 'no'} trace; "
                    f"window: {window_text(report)}"]
    covered = steps_line(report)
    if covered:
        lines.append(covered)
    status = _status_line(report)
    if status:
        lines.append(status)
    lines.append("")
    if report.verdict is not None:
        lines += ["Verdict"] + [f"  {line}" for line in report.verdict["lines"]] + [""]
    if report.stop is not None:
        lines += ["Stop diagnosis"] + [f"  {line}" for line in report.stop["lines"]] + [""]
    if report.per_step.empty:
        lines.append("No step was analysed: no time breakdown (the warnings say why).\n")
    else:
        breakdown, unsplit = _breakdown_text(report.totals)
        steps_shown, steps_unsplit = _per_step_text(report.step_table())
        lines += [
            _table(breakdown, "Time breakdown per rank (share of step time"
                   + (", profiled steps)" if covered else ")"),
                   "  compute, transfer, waiting = alone; overlap = compute and communication "
                   "at once; comm hidden = overlap / all comm\n" + _note(unsplit)),
            _table(steps_shown, "Per step (ms)", _note(steps_unsplit)),
            _table(hta_text(report.hta), "HTA-compatible temporal breakdown (HTA's window: last "
                   "ProfilerStep dropped)"),
            _table(idle_text(report.idle, report.totals), "Idle time by what the host was doing"),
        ]
    if "collectives" in report.tables:
        lines.append(_table(collectives_text(report.tables["collectives"]), "Collectives",
                            "  busbw GB/s: bytes over transfer time (waiting for peers left "
                            "out; docs/cross-rank.md); busbw by duration counts the whole op; "
                            "ms/step = cost per analysed step, the mean per rank (ranked by it)"))
    setup = report.tables.get("setup_collectives")
    if setup is not None and not setup.empty:
        lines.append(_table(setup_collectives_text(setup),
                            "Set-up collectives (before the first step; in no step's time)"))
    if report.critical is not None:
        lines.append(critical_path_text(report.critical))
    split = split_known(report.tables.get("per_rank"))
    per_rank = _optional(report.tables.get("per_rank"),
                         ["rank", "steps", "mean_step_ns", "max_step_ns", "idle_pct",
                          *(["transfer_ns", "peer_wait_ns"] if split else ["exposed_comm_pct"]),
                          "peak_allocated_bytes", "peak_rss_bytes",
                          "sm_util_pct", "cpu_process_pct", "slowdown_vs_fastest_pct", "status"])
    if "per_rank" in report.tables:
        shown = per_rank.copy()
        for column in ("mean_step_ns", "max_step_ns", "transfer_ns", "peer_wait_ns"):
            if column in shown:
                shown[column] = shown[column].map(_ms)
        for column in ("peak_allocated_bytes", "peak_rss_bytes"):
            if column in shown:
                shown[column] = shown[column].map(human_bytes)
        shown = shown.rename(columns={"mean_step_ns": "mean step ms", "max_step_ns": "max step ms",
                                      "transfer_ns": "transfer ms", "peer_wait_ns": "waiting ms",
                                      "exposed_comm_pct": "exposed comm % (not split)",
                                      "peak_allocated_bytes": "peak allocated",
                                      "peak_rss_bytes": "peak rss"})
        lines.append(_table(shown.round(1), "Ranks", "  transfer ms, waiting ms: mean per step"
                            if split else ""))
    memory = memory_text(report.memory)
    if memory:
        lines.append(memory)
    if not report.per_step.empty:
        mfu = mfu_text(report.tables.get("mfu"), report.tables.get("roofline"))
        if mfu:
            lines.append(mfu)
    bottlenecks = report.tables.get("bottlenecks")
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
    notes = report.tables.get("notes")
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
    if report.cross_rank is not None:
        lines.append(cross_rank_text(report.cross_rank))
    for name, why in report.unavailable.items():
        lines.append(f"{name}: not available ({why})")
    return "\n".join(lines).rstrip() + "\n"


def _records_of(frame: pd.DataFrame, columns: list) -> list:
    return records(frame[columns]) if len(frame) else []


def cross_rank_json(result: dict) -> dict:
    """The `cross_rank` object of the JSON document (docs/cross-rank.md)."""
    stragglers = result["stragglers"]
    return {
        "clock": _records_of(result["clock"], ["rank", "offset_ns", "uncertainty_ns", "source",
                                            "drift_ns_per_s", "disagreement_ns",
                                            "estimate_from"]),
        "stragglers": _records_of(stragglers[stragglers["fires"].astype(bool)],
                               ["rank", "caused_wait_ms_per_step", "share_pct", "collectives",
                                "evidence"]),
        "waits": _records_of(result["waits"], ["rank", "step", "wait_for_peers_ms", "transfer_ms"]),
        "mismatches": _records_of(result["mismatches"], list(result["mismatches"].columns)),
        "pipeline": _records_of(result["pipeline"], ["rank", "measured_bubble_pct",
                                                  "theory_bubble_pct", "recv_wait_pct"]),
    }

"""The JSON document of an analysed run (`--format json`): its layout is described in
docs/analysis.md; DOCUMENT_VERSION changes whenever a field is renamed or removed (adding fields
does not). The report's tables and parts as they are, made JSON-ready (analysis.report.values).
"""

from __future__ import annotations

import json

import pandas as pd

from analysis.core.contracts import CrossRank, RunReport
from analysis.core.model import known_rank
from analysis.report.critical import critical_path_json
from analysis.report.memory_output import memory_json
from analysis.report.mfu import mfu_json
from analysis.report.values import plain, records, steps_by_rank, window_of
from tracer import schema

DOCUMENT_VERSION = 1
HTA_KEYS = ("idle_us", "compute_us", "non_compute_us", "kernel_time_us")


def run_document(report: RunReport) -> dict:
    """One run's document."""
    return {
        "schema_version": DOCUMENT_VERSION,
        "trace_schema_version": schema.SCHEMA_VERSION,
        "run": {"name": report.name, "path": report.path, "files": report.files,
                "world_size": report.world_size, "ranks_analysed": len(report.ranks)},
        "selection": {"steps": report.steps_spec or "all",
                      "hta_compatible": report.hta_compatible,
                      "window": getattr(report.path_window, "name", None),
                      "instance": getattr(report.path_window, "instance", None)},
        "problems": list(report.problems),
        "ranks": _ranks(report),
        "steps": records(report.step_table()),
        "idle": records(report.idle),
        "collectives": records(report.collectives),
        "setup_collectives": records(report.setup_collectives),
        "verdict": _verdict(report),
        "bottlenecks": records(report.findings),
        "notes": records(report.notes),
        "late_causes": plain(report.late_causes),
        "cross_rank": (cross_rank_json(report.cross_rank)
                       if report.cross_rank is not None else None),
        **critical_path_json(report.critical),
        **mfu_json(report.mfu, report.roofline),
        "captures": plain(report.captures),
        "phases": plain(report.phases),
        "unavailable": dict(report.unavailable),
        "stop_diagnosis": (None if report.stop is None else {
            "groups": records(report.stop.groups), "ranks": plain(report.stop.ranks),
            "lines": report.stop.lines}),
        # docs/memory.md; absent for a run without step records
        **({"memory": memory_json(report.memory)} if report.memory is not None else {}),
    }


def _verdict(report: RunReport) -> dict | None:
    """The document's `verdict`: the Verdict's fields, `memory` only where it has the line."""
    verdict = plain(report.verdict)
    if verdict is not None and verdict["memory"] is None:
        del verdict["memory"]
    return verdict


def _ranks(report: RunReport) -> list[dict]:
    """The document's `ranks`: each rank's files, window, steps, status, breakdown totals, HTA's
    columns and its per-rank row."""
    hta_by_rank = {plain(r["rank"]): r for r in records(report.hta)}
    totals_by_rank = {plain(r["rank"]): r for r in records(report.totals)}
    per_rank = {plain(r["rank"]): r for r in records(report.per_rank)}
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
    return ranks


def json_document(reports: list[RunReport]) -> dict:
    """One run's document, or {"schema_version", "runs": [...]} for several (--all)."""
    if len(reports) == 1:
        return run_document(reports[0])
    return {"schema_version": DOCUMENT_VERSION, "runs": [run_document(r) for r in reports]}


def dumps(document: dict) -> str:
    return json.dumps(document, indent=2, allow_nan=False)


def _records_of(frame: pd.DataFrame, columns: list) -> list:
    return records(frame[columns]) if len(frame) else []


def cross_rank_json(result: CrossRank) -> dict:
    """The `cross_rank` object of the JSON document (docs/cross-rank.md)."""
    stragglers = result.stragglers
    return {
        "clock": _records_of(result.clock, ["rank", "offset_ns", "uncertainty_ns", "source",
                                            "drift_ns_per_s", "disagreement_ns",
                                            "estimate_from"]),
        "stragglers": _records_of(stragglers[stragglers["fires"].astype(bool)],
                                  ["rank", "caused_wait_ms_per_step", "share_pct",
                                   "collectives", "evidence"]),
        "waits": _records_of(result.waits, ["rank", "step", "wait_for_peers_ms", "transfer_ms"]),
        "mismatches": _records_of(result.mismatches, list(result.mismatches.columns)),
        "pipeline": _records_of(result.pipeline, ["rank", "measured_bubble_pct",
                                                  "theory_bubble_pct", "recv_wait_pct"]),
    }

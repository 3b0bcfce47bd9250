"""Building the standalone HTML report from an analysed run's tables (docs/viewing.md).

`build_html(...)` takes plain DataFrames, the loaded ranks and the cross-rank result and returns
the page; the helpers that pick what to draw (`chosen_steps`, `gantt_rows`) are pure. Every
text that comes from a trace or a file name is escaped.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core import intervals
from analysis.core.contracts import CriticalPath, CrossRank, MemorySection, Phase, Verdict
from analysis.core.model import UNKNOWN_RANK
from analysis.crossrank.report_tables import (
    rank_bars,
    with_transfer_bandwidth,
)
from analysis.report.breakdown_text import split_known
from analysis.report.html import charts as svg
from analysis.report.html.assets import SCRIPT, STYLE
from analysis.report.html.charts import esc
from analysis.report.html.memory_figure import memory_figure
from analysis.report.mfu import mfu_bars, missing_reason
from analysis.report.phase_table import phase_table, step_time_lines

MS = 1e6
SECTIONS = {"header": "Run", "findings": "Findings", "ranks": "Where each rank's step time goes",
            "mfu": "MFU and the points it loses",
            "heatmap": "Step time per rank and step",
            "phases": "Step time over the run, by phase", "gantt": "Chosen steps, per rank",
            "collectives": "Collectives", "critical": "Critical path and what-if",
            "samples": "Device samples and memory",
            "memory": "Memory over steps, per rank (docs/memory.md)",
            "commands": "Look further"}
LONGEST_OPS = 10


def chosen_steps(per_step: pd.DataFrame) -> dict:
    """{"slowest": step, "median": step, "fastest": step} by the mean step time over ranks;
    a step that is both the median and an extreme is shown once, as the extreme."""
    mean = per_step.groupby("step")["step_ns"].mean().sort_values(kind="stable")
    if mean.empty:
        return {}
    slowest, fastest = int(mean.index[-1]), int(mean.index[0])
    median = int(mean.index[(len(mean) - 1) // 2])
    picks = {"slowest": slowest}
    if median not in (slowest, fastest):
        picks["median"] = median
    if fastest != slowest:
        picks["fastest"] = fastest
    return picks


def gantt_rows(ranks: list, step: int) -> tuple[list, float]:
    """Per rank, compute / comm / memcpy bars of one step, in ms from the rank's step start."""
    from analysis.rank.layers import trace_kind, trace_layers

    rows, span = [], 0.0
    for trace in ranks:
        steps = trace.steps[trace.steps["step"] == step] if len(trace.steps) else trace.steps
        if trace.rank == UNKNOWN_RANK or steps.empty or trace.events.empty:
            continue
        start, end = int(steps["start_ns"].iloc[0]), int(steps["end_ns"].iloc[0])
        kind = trace_kind(trace)
        layers, _ = trace_layers(trace, kind)
        wanted = ({"compute": 0, "comm": 1, "memcpy": 2} if kind == "gpu"
                  else {"compute": 0, "comm": 2})
        bars = []
        for category, index in wanted.items():
            starts, ends = intervals.union(*layers[index])
            starts, ends = np.clip(starts, start, end), np.clip(ends, start, end)
            for s, e in zip(starts[ends > starts].tolist(), ends[ends > starts].tolist()):
                bars.append((category, (s - start) / MS, (e - start) / MS,
                             f"rank {trace.rank} {category} {(e - s) / MS:.3f} ms"))
        rows.append((f"rank {trace.rank}", bars))
        span = max(span, (end - start) / MS)
    return rows, span


def longest_ops(ranks: list, step: int) -> pd.DataFrame:
    """The longest events of one step over all ranks: rank, name, category, ms."""
    parts = []
    for trace in ranks:
        steps = trace.steps[trace.steps["step"] == step] if len(trace.steps) else trace.steps
        if trace.rank == UNKNOWN_RANK or steps.empty or trace.events.empty:
            continue
        start, end = int(steps["start_ns"].iloc[0]), int(steps["end_ns"].iloc[0])
        events = trace.events
        inside = events[(events["ts_ns"] >= start) & (events["end_ns"] <= end)
                        & ~events["name"].astype(str).str.startswith("ProfilerStep#")]
        top = inside.nlargest(LONGEST_OPS, "dur_ns")
        parts.append(pd.DataFrame({"rank": trace.rank, "name": top["name"].astype(str),
                                   "cat": top["cat"].astype(str), "ms": top["dur_ns"] / MS}))
    if not parts:
        return pd.DataFrame(columns=["rank", "name", "cat", "ms"])
    return pd.concat(parts).nlargest(LONGEST_OPS, "ms")


def html_table(frame: pd.DataFrame | None, columns: dict, sortable: bool = True) -> str:
    """An HTML table of `columns` {column: (heading, format)}, every text escaped. A format is a
    format spec (".1f"), a function of the value, or None for text; a str value is always text
    (left-aligned), a missing number prints as "-" and sorts first."""
    if frame is None or frame.empty:
        return '<p class="none">none</p>'
    present = {c: spec for c, spec in columns.items() if c in frame.columns}
    head = "".join(f'<th class="{"text" if f is None else "num"}">{esc(h)}</th>'
                   for h, f in present.values())
    body = []
    for row in frame[list(present)].itertuples(index=False):
        cells = []
        for value, (_, fmt) in zip(row, present.values()):
            if fmt is None or isinstance(value, str):
                cells.append(f'<td class="text">{esc("" if value is None else value)}</td>')
            elif value is None or (isinstance(value, float) and value != value):
                cells.append('<td data-v="-1e300">-</td>')
            else:
                shown = fmt(value) if callable(fmt) else format(value, fmt)
                cells.append(f'<td data-v="{esc(value)}">{esc(shown)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    cls = ' class="sortable"' if sortable else ""
    return f"<table{cls}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _ms(ns) -> str:
    """A time in ns shown in ms, as every other time column."""
    return f"{ns / MS:.2f}"


def _section(key: str, content: str) -> str:
    return f'<section id="{key}"><h2>{esc(SECTIONS[key])}</h2>{content}</section>'


def _findings(findings: pd.DataFrame | None, notes: pd.DataFrame | None = None,
              verdict: Verdict | None = None) -> str:
    """The verdict's lines, the findings in their order (analysis.findings.bottlenecks) and the
    notes, which carry no share."""
    parts = []
    if verdict:
        lines = "".join(f"<li>{esc(line)}</li>" for line in verdict.lines)
        parts.append(f'<ul class="verdict">{lines}</ul>')
    if findings is None or findings.empty:
        parts.append('<p class="none">no finding passed its threshold</p>')
    else:
        parts.append(html_table(findings, {
            "finding": ("finding", None), "share_pct": ("share %", ".1f"),
            "ms_per_step": ("ms per step", ".2f"), "ranks": ("ranks", None),
            "evidence": ("evidence", None), "suggestion": ("suggestion", None)}))
    if notes is not None and not notes.empty:
        parts.append("<h3>Notes (what could not be told; not ranked)</h3>" + html_table(
            notes, {"note": ("note", None), "ranks": ("ranks", None),
                    "evidence": ("evidence", None), "suggestion": ("suggestion", None)},
            sortable=False))
    return "".join(parts)


def _collectives(collectives: pd.DataFrame | None, cross: CrossRank | None) -> str:
    if collectives is None or collectives.empty:
        return '<p class="none">no collective or p2p op</p>'
    table = collectives
    if "transfer_busbw_gbps" not in table.columns:
        table = with_transfer_bandwidth(table, cross)
    return html_table(table, {
        "op": ("op", None), "issuer": ("issuer", None), "pg": ("group", None),
        "pg_size": ("size", "d"),
        "size_bucket": ("message size", None), "count": ("count", "d"),
        "ms_per_step": ("ms per step", ".3f"), "time_from": ("time from", None),
        "total_bytes": ("bytes", ".0f"), "mean_us": ("mean µs", ".1f"),
        "transfer_busbw_gbps": ("busbw GB/s (transfer)", ".3f"),
        "busbw_gbps": ("busbw GB/s (duration)", ".3f"),
        "slowest_rank": ("slowest rank", ".0f")})


def _setup_collectives(setup: pd.DataFrame | None) -> str:
    """The collectives issued before the first step, apart from the analysed ones."""
    if setup is None or setup.empty:
        return ""
    return ("<h3>Set-up collectives (before the first step; in no step's time)</h3>"
            + html_table(setup, {
                "op": ("op", None), "issuer": ("issuer", None), "pg": ("group", None),
                "size_bucket": ("message size", None), "count": ("count", "d"),
                "total_us": ("total µs", ".0f"), "mean_us": ("mean µs", ".1f"),
                "ranks": ("ranks", "d")}))


def _mfu(mfu: pd.DataFrame | None, roofline: pd.DataFrame | None) -> str:
    """The MFU attribution plot (per rank: MFU and the points lost to transfer, waiting, idle
    and compute below the roofline, means over its profiled steps) and the slowest ops against
    their roofline."""
    if mfu is None:
        return '<p class="none">not computed (the problems say why)</p>'
    reason = missing_reason(mfu)
    if reason is not None:
        return f'<p class="none">{esc(reason)}</p>'
    labels, parts, values = mfu_bars(mfu)
    plot = (svg.stacked_bars(labels, parts, values, "% of step time (mean)") if labels else
            '<p class="none">no peak known for any rank: no MFU (--peak-tflops gives one)</p>')
    table = "" if roofline is None or roofline.empty else (
        "<h3>Slowest ops against their roofline</h3>" + html_table(roofline, {
            "rank": ("rank", "d"), "name": ("op", None), "kind": ("kind", None),
            "dtype": ("dtype", None), "calls": ("calls", "d"), "time_ns": ("ms", _ms),
            "time_from": ("from", None), "achieved_tflops": ("TFLOP/s", ".4g"),
            "achieved_gbps": ("GB/s", ".4g"), "intensity": ("FLOP/B", ".3g"),
            "bound": ("bound", None), "roofline_tflops": ("roofline TFLOP/s", ".4g"),
            "pct_of_roofline": ("% of roofline", ".1f")}))
    return ("<p>The lost points add up to 100 &minus; MFU (docs/mfu.md).</p>" + plot + table)


def path_ranks(critical: CriticalPath | None, step: int) -> dict:
    """{rank: "category ms, ..."} of the ranks on one step's critical path."""
    if not critical or critical.critical_path.empty:
        return {}
    path = critical.critical_path
    rows = path[path["step"] == step]
    on: dict = {}
    for row in rows.itertuples():
        on.setdefault(int(row.rank), []).append(f"{row.category} {row.ms:.2f} ms")
    return {rank: ", ".join(parts) for rank, parts in on.items()}


def _critical(critical: CriticalPath | None) -> str:
    """The path per analysed step and the what-if answers, largest saving first."""
    if critical is None:
        return '<p class="none">not computed (no cross-rank result)</p>'
    steps = critical.critical_path_steps
    rows = []
    for row in steps.itertuples():
        on = path_ranks(critical, int(row.step))
        rows.append({"step": int(row.step), "path_ms": row.path_ms, "step_ms": row.step_ms,
                     "end_rank": int(row.end_rank), "start_rank": int(row.start_rank),
                     "by_rank": "; ".join(f"rank {r}: {t}" for r, t in sorted(on.items()))})
    table = html_table(pd.DataFrame(rows), {
        "step": ("step", "d"), "path_ms": ("path ms", ".2f"), "step_ms": ("step ms", ".2f"),
        "end_rank": ("ends on rank", "d"), "start_rank": ("starts on rank", "d"),
        "by_rank": ("path time by rank and category", None)}) if rows else \
        '<p class="none">no analysed step</p>'
    answers = pd.DataFrame(critical.what_if)
    return ("<p>Waiting for peers is never on the path (docs/critical-path.md).</p>" + table
            + "<h3>What if (largest saving first)</h3>"
            + html_table(answers, {"change": ("change", None),
                                   "saved_ms_per_step": ("saved ms per step", ".2f"),
                                   "predicted_step_ms": ("predicted step ms", ".2f"),
                                   "assumptions": ("assumptions", None)}, sortable=False))


def _phases(per_step: pd.DataFrame, phases: list[Phase] | None) -> str:
    """Every analysed step's time per rank, the phases shaded (docs/definitions.md, "Phases"),
    and the phases' table where there are several."""
    series = step_time_lines(per_step)
    phases = phases or []
    several = len(phases) > 1
    bands = [(p.first_step - 0.5, p.last_step + 0.5,
              f"steps {p.first_step}-{p.last_step}: mean step {p.step_ms:.2f} ms"
              + (f", rank {p.late_rank} late by {p.late_ms_per_step:.2f} ms per step"
                 if p.late_rank is not None else ""))
             for p in phases] if several else None
    said = (f"<p>{len(phases)} phases: the run changed at step(s) "
            f"{esc(', '.join(str(p.first_step) for p in phases[1:]))}.</p>" if several else
            "<p>One phase: every rank's step time and wait for peers steady over the run.</p>"
            if phases else "")
    table = html_table(phase_table(phases), {
        "steps": ("steps", None), "count": ("count", "d"), "share_pct": ("of run time %", ".1f"),
        "step_ms": ("mean step ms", ".2f"), "late_rank": ("late rank", None),
        "late_ms": ("late ms per step", ".2f"), "waits": ("wait ms per step", None),
        "what_if": ("what if (its steps)", None)}, sortable=False) if several else ""
    return said + svg.lines(series, "step", "step ms", bands=bands) + table


def _samples(ranks: list) -> str:
    """CPU/GPU utilisation and memory over time, per rank (seconds from the first sample)."""
    util, memory = [], []
    firsts = [int(t.records.samples["t_ns"].min()) for t in ranks
              if t.records is not None and len(t.records.samples)]
    if not firsts:
        return '<p class="none">no device samples</p>'
    t0 = min(firsts)
    for trace in ranks:
        samples = trace.records.samples if trace.records is not None else None
        if samples is None or samples.empty:
            continue
        xs = ((samples["t_ns"] - t0) / 1e9).tolist()
        field = "sm_util_pct" if samples.get("sm_util_pct") is not None and \
            samples["sm_util_pct"].notna().any() else "cpu_process_pct"
        if field in samples:
            util.append((f"rank {trace.rank} {field}", xs,
                         pd.to_numeric(samples[field], errors="coerce").tolist()))
        field = "mem_used_bytes" if "mem_used_bytes" in samples and \
            samples["mem_used_bytes"].notna().any() else "rss_bytes"
        if field in samples:
            memory.append((f"rank {trace.rank} {field[:-6]}", xs,
                           (pd.to_numeric(samples[field], errors="coerce") / 2**20).tolist()))
    return (svg.lines(util, "s", "%") + svg.lines(memory, "s", "MiB"))


def build_html(name: str, path: str, world_size, per_step: pd.DataFrame,
               per_rank: pd.DataFrame | None, collectives: pd.DataFrame | None,
               findings: pd.DataFrame | None, ranks: list, problems: list,
               cross: CrossRank | None = None, notes: pd.DataFrame | None = None,
               verdict: Verdict | None = None, setup: pd.DataFrame | None = None,
               critical: CriticalPath | None = None, mfu: pd.DataFrame | None = None,
               roofline: pd.DataFrame | None = None, memory: MemorySection | None = None,
               phases: list[Phase] | None = None) -> str:
    """The whole page. `cross` is analysis.crossrank's result (waits, bandwidth), or None;
    `notes` and `verdict` are analysis.findings.notes' and .verdict's; `setup` the set-up
    collectives; `critical` analysis.crossrank.critical_path's result, whose path marks the
    ranks on it in the chosen steps' Gantt rows; `mfu` and `roofline` analysis.run's tables;
    `phases` the run's phases (analysis.crossrank.phases)."""
    waits = cross.waits if cross else None
    steps = sorted(int(s) for s in per_step["step"].unique()) if len(per_step) else []
    header = (f"<p><b>{esc(name)}</b> &mdash; <code>{esc(path)}</code><br>"
              f"world size {esc(world_size if world_size else '?')}, "
              f"{len([t for t in ranks if t.rank != UNKNOWN_RANK])} ranks analysed, "
              f"steps {esc(', '.join(map(str, steps)) or 'none')}</p>")
    if problems:
        items = "".join(f"<li>{esc(p)}</li>" for p in problems)
        header += f"<details><summary>{len(problems)} problem(s)</summary><ul>{items}</ul>" \
                  f"</details>"
    body = [_section("header", header), _section("findings", _findings(findings, notes, verdict))]
    # The bars and the chosen steps' Gantt rows need the kernel-level split: the profiled
    # ones of the analysed steps; the heat map shows every analysed step.
    profiled = (per_step[per_step["compute_only_ns"].notna()]
                if "compute_only_ns" in per_step.columns else per_step)
    if len(profiled):
        bars = rank_bars(profiled, waits)
        parts = [c for c in bars.columns if c != "rank"]
        body.append(_section("ranks", svg.stacked_bars(
            [f"rank {int(r)}" for r in bars["rank"]], parts, bars[parts].to_numpy().tolist(),
            "ms per step (mean)") + html_table(per_rank, {
                "rank": ("rank", "d"), "steps": ("steps", "d"),
                "mean_step_ns": ("mean step ms", _ms),
                "max_step_ns": ("max step ms", _ms), "idle_pct": ("idle %", ".1f"),
                **({"transfer_ns": ("transfer ms", _ms), "peer_wait_ns": ("waiting ms", _ms)}
                   if split_known(per_rank) else
                   {"exposed_comm_pct": ("exposed comm % (not split)", ".1f")}),
                "status": ("status", None)})))
        body.append(_section("mfu", _mfu(mfu, roofline)))
        grid = per_step.pivot_table(index="rank", columns="step", values="step_ns") / MS
        body.append(_section("heatmap", svg.heat_map(
            [f"rank {int(r)}" for r in grid.index], [str(int(c)) for c in grid.columns],
            grid.to_numpy().tolist(), "ms")))
        body.append(_section("phases", _phases(per_step, phases)))
        parts_html = []
        for label, step in chosen_steps(profiled).items():
            rows, span = gantt_rows(ranks, step)
            on = path_ranks(critical, step)
            on_path = {f"rank {r}" for r in on}  # gantt_rows' labels
            rows = [(f"{name} \u25c6" if name in on_path else name, bars)
                    for name, bars in rows]
            marked = ("<p>\u25c6 on the critical path: " + esc("; ".join(
                f"rank {r}: {t}" for r, t in sorted(on.items()))) + "</p>") if on else ""
            parts_html.append(f"<h3>{label} step: {step}</h3>" + marked
                              + (svg.gantt(rows, span, "ms from the rank's step start")
                                 if rows else '<p class="none">no trace events</p>'))
        slowest = chosen_steps(profiled).get("slowest")
        if slowest is not None:
            parts_html.append(f"<h3>longest events of step {slowest}</h3>" + html_table(
                longest_ops(ranks, slowest), {"rank": ("rank", "d"), "name": ("name", None),
                                              "cat": ("category", None), "ms": ("ms", ".3f")}))
        body.append(_section("gantt", "<p>Wheel to zoom, drag to pan, double-click to reset."
                                      "</p>" + "".join(parts_html)))
    else:
        for key in ("ranks", "mfu", "heatmap", "phases", "gantt"):
            body.append(_section(key, '<p class="none">no step was analysed</p>'))
    body.append(_section("collectives", _collectives(collectives, cross)
                         + _setup_collectives(setup)))
    body.append(_section("critical", _critical(critical)))
    body.append(_section("samples", _samples(ranks)))
    body.append(_section("memory", memory_figure(memory)))
    body.append(_section("commands", (
        f"<p>Every rank on one clock, with flows from the last arriver of each collective:</p>"
        f"<pre>ranktrace timeline {esc(path)}</pre><p>then open "
        f"<code>timeline.trace.gz</code> in https://ui.perfetto.dev or chrome://tracing. "
        f"TensorBoard (scalars and the profiler plugin):</p>"
        f"<pre>tensorboard --logdir {esc(str(Path(path).parent))} --host 127.0.0.1</pre>")))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>ranktrace: {esc(name)}</title><style>{STYLE}</style></head><body>"
            f"<h1>ranktrace report: {esc(name)}</h1><pre id=\"js-errors\"></pre>"
            + "".join(body) + f"<script>{SCRIPT}</script></body></html>")


def write_html_report(report, path) -> dict:
    """Write the page for an analysed run (a RunReport) to `path`, with the run's own
    cross-rank result (none where the pass failed, which report.problems says). Returns
    {"path", "bytes", "seconds"}."""
    started = time.monotonic()
    problems = list(report.problems)
    cross = report.cross_rank
    page = build_html(report.name, report.path, report.world_size, report.step_table(),
                      report.per_rank, report.collectives, report.findings, report.ranks,
                      problems, cross, report.notes, report.verdict, report.setup_collectives,
                      report.critical, report.mfu, report.roofline, report.memory,
                      report.phases)
    data = page.encode("utf-8")
    Path(path).write_bytes(data)
    return {"path": Path(path), "bytes": len(data), "seconds": time.monotonic() - started}

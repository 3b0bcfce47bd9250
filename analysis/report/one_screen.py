"""The default text report: one terminal screen, at most SCREEN_LINES lines of at most
SCREEN_COLUMNS columns (docs/report.md, "The short report").

In this order: the run line; the verdict, as the findings stage wrote it (whatever its lines
are); one row per rank; the top findings, one line each; and a last line saying where the rest
is. The line budget holds by construction: the rank table and the findings have a fixed most,
and the verdict gets what is left, each of its lines wrapped to a few rows, the later ones
left to `--full` when they do not fit. Like every writer, it computes nothing: its values are
the run's tables (the per-rank shares are the "Time breakdown per rank" table's).
"""

from __future__ import annotations

import textwrap
import unicodedata

import pandas as pd

from analysis.core.contracts import RunReport
from analysis.core.model import known_rank
from analysis.core.step_spec import format_ranges
from analysis.core.steps import WHOLE_TRACE_STEP
from analysis.core.terminal import terminal_safe
from analysis.rank.flops import mfu_per_rank
from analysis.rank.tables import slowest_and_fastest
from analysis.report.breakdown_text import UNSPLIT, breakdown_rows
from analysis.report.text_report import status_line, steps_line
from analysis.report.text_tables import printable
from analysis.report.values import _ms, _rank, human_bytes, plain, records, steps_by_rank

SCREEN_LINES = 40
SCREEN_COLUMNS = 100
ALL_RANKS_UP_TO = 16  # above this many ranks, the slowest and fastest few and a line for the rest
SLOWEST_SHOWN, FASTEST_SHOWN = 5, 3
TOP_FINDINGS = 3
CAPTURES_SHOWN = 2  # "Captured:" lines of the verdict shown; the others are counted
ROWS_PER_VERDICT_LINE = 3  # wrapped rows a verdict line may take before it is cut
INDENT = "  "
MORE = "…"


def width(text: str) -> int:
    """Columns `text` takes in a terminal: wide (East Asian) characters take two."""
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def fit(text: str, columns: int = SCREEN_COLUMNS) -> str:
    """`text` cut to `columns` columns, ending with MORE where it was cut."""
    if width(text) <= columns:
        return text
    out, used = [], 0
    for char in text:
        used += width(char)
        if used > columns - 1:
            break
        out.append(char)
    return "".join(out).rstrip() + MORE


def wrapped(line: str, rows: int) -> list[str]:
    """`line` wrapped to the screen's width under INDENT, continued further indented, in at
    most `rows` rows (the last one cut, ending with MORE, where it goes on)."""
    lines = textwrap.wrap(line, width=SCREEN_COLUMNS, initial_indent=INDENT,
                          subsequent_indent=INDENT * 2, break_on_hyphens=False) or [INDENT]
    lines = [fit(text) for text in lines]
    if len(lines) > rows:
        lines = lines[:rows]
        lines[-1] = fit(lines[-1] + " " + MORE)
    return lines


def one_screen_report(report: RunReport) -> str:
    """The short text report of one run (SCREEN_LINES x SCREEN_COLUMNS at most)."""
    head = [fit(terminal_safe(line)) for line in _run_lines(report)]
    if report.nothing_analysed():
        head.append(fit("nothing could be analysed: no step and no collective (the reasons are "
                        "in the warnings on stderr)"))
        return "\n".join(head) + "\n"
    ranks = _rank_lines(report)
    findings = _finding_lines(report)
    last = [fit(terminal_safe(_last_line(report)))]
    fixed = len(head) + 1 + (len(ranks) + 1 if ranks else 0) + (len(findings) + 1
                                                                  if findings else 0) + len(last)
    verdict = _verdict_rows(report, SCREEN_LINES - fixed)
    lines = [*head, "", *verdict]
    if ranks:
        lines += ["", *ranks]
    if findings:
        lines += ["", *findings]
    lines += last
    return "\n".join(lines) + "\n"


def _run_lines(report: RunReport) -> list[str]:
    """The run line (name, ranks, trace kind, steps), and how the run ended where it ended
    badly."""
    kinds = sorted(set(report.totals["kind"])) if not report.totals.empty else []
    known = [known_rank(t) for t in report.ranks]
    analysed = steps_by_rank(report.step_table())
    profiled = steps_by_rank(report.per_step)
    every = sorted({s for steps in analysed.values() for s in steps if s >= 0})
    sampled = sorted({s for steps in profiled.values() for s in steps if s >= 0})
    whole = any(WHOLE_TRACE_STEP in steps for steps in analysed.values())
    steps = f"steps {format_ranges(every)}" if every else "no step"
    if whole:
        steps = (f"{steps}, the whole trace as one window on some ranks" if every
                 else "the whole trace as one window (no ProfilerStep)")
    if steps_line(report) is not None:
        steps += f" (profiled: {format_ranges(sampled)})" if sampled else " (none profiled)"
    count = f"{len(known)} of {report.world_size}" if report.world_size else f"{len(known)}"
    plural = "" if len(known) == 1 and (report.world_size or 1) == 1 else "s"
    line = (f"ranktrace: {report.name}: {count} rank{plural}, "
            f"{'/'.join(kinds) or 'no'} trace, {steps}")
    ended = status_line(report)
    return [line, ended] if ended else [line]


def _verdict_items(report: RunReport) -> list[str]:
    """The verdict's lines and the stop diagnosis's, the capture windows past CAPTURES_SHOWN
    counted on one line."""
    lines = list(report.verdict.lines) if report.verdict is not None else []
    captured = [line for line in lines if line.startswith("Captured:")]
    if len(captured) > CAPTURES_SHOWN:
        hidden = captured[CAPTURES_SHOWN:]
        lines = [line for line in lines if line not in hidden]
        at = lines.index(captured[CAPTURES_SHOWN - 1]) + 1
        lines.insert(at, f"Captured: {len(hidden)} more window{'s' if len(hidden) > 1 else ''} "
                         f"(--full)")
    if report.stop is not None and report.stop.lines:
        lines += [f"Stopped: {report.stop.lines[0]}", *report.stop.lines[1:]]
    return [terminal_safe(line) for line in lines]


def _verdict_rows(report: RunReport, budget: int) -> list[str]:
    """The verdict in at most `budget` rows: each line one row at least, the earlier lines
    first given the rows left to wrap into, up to ROWS_PER_VERDICT_LINE each (cut with a mark
    past that); where even one row each does not fit, the last lines are left to --full."""
    items = _verdict_items(report)
    if not items or budget < 1:
        return []
    if len(items) > budget:
        kept = items[:budget - 1]
        return ([row for item in kept for row in wrapped(item, 1)]
                + [fit(f"{INDENT}{MORE} {len(items) - len(kept)} more verdict line(s): --full")])
    spare, shown = budget - len(items), []
    for item in items:
        rows = wrapped(item, 1 + min(spare, ROWS_PER_VERDICT_LINE - 1))
        spare -= len(rows) - 1
        shown += rows
    return shown


def _rank_lines(report: RunReport) -> list[str]:
    """The heading and one row per rank (the slowest and fastest few, and a line for the rest,
    above ALL_RANKS_UP_TO ranks): mean step, the shares of step time, MFU, peak memory."""
    per_rank = report.per_rank
    if per_rank is None or per_rank.empty or report.per_step.empty:
        return []
    rows = _rank_rows(report)
    if len(rows) > ALL_RANKS_UP_TO:
        chosen = slowest_and_fastest(per_rank, SLOWEST_SHOWN, FASTEST_SHOWN)
        by_rank = {row["rank"]: row for row in rows}
        top = [by_rank[str(r)] for r in chosen["slowest"]]
        bottom = [by_rank[str(r)] for r in chosen["fastest"]]
        table = _table_lines(pd.DataFrame(top + bottom))
        low, high = chosen["rest_min_ns"], chosen["rest_max_ns"]
        spread = (f", mean step {_ms(low)} to {_ms(high)} ms" if low is not None else "")
        rest = f"  {MORE} {chosen['rest']} more ranks{spread} (--full)"
        table = [*table[:1 + len(top)], rest, *table[1 + len(top):]]
        order = ", slowest first"
    else:
        table = _table_lines(pd.DataFrame(rows))
        order = ""
    return [fit(_rank_heading(report, order)), *(fit(line) for line in table)]


def _rank_heading(report: RunReport, order: str) -> str:
    split = steps_line(report) is not None
    return (f"Ranks{order} (step ms: mean of the analysed steps; shares of step time"
            + (" in the profiled ones" if split else "") + ")")


def _rank_rows(report: RunReport) -> list[dict]:
    shares, unsplit = breakdown_rows(report.totals)
    share_of = {row["rank"]: row for row in records(shares)}
    mfu = ({_rank(row["rank"]): row["mfu_pct"] for row in records(mfu_per_rank(report.mfu))}
           if report.mfu is not None else {})
    memory = _memory_column(report.per_rank)
    rows = []
    for row in records(report.per_rank):
        rank = _rank(row["rank"])
        share = share_of.get(rank, {})
        shown = {"rank": rank, "step ms": _ms(row["mean_step_ns"]),
                 "compute": share.get("compute", "-"), "transfer": share.get("transfer", "-"),
                 "waiting": share.get("waiting", "-")}
        if unsplit:
            shown["comm, not split"] = share.get(UNSPLIT, "-")
        shown["idle"] = share.get("idle", "-")
        value = plain(mfu.get(rank))
        shown["MFU %"] = "-" if value is None else format(
            value, ".2g" if 0 < abs(value) < 0.01 else ".2f")
        if memory is not None:
            shown[memory[1]] = human_bytes(row[memory[0]])
        rows.append(shown)
    return rows


def _memory_column(per_rank: pd.DataFrame) -> tuple[str, str] | None:
    """(column, heading) of the peak memory shown: the device's allocated bytes where a rank
    has them, else the process's resident set; None where neither is known."""
    for column, heading in (("peak_allocated_bytes", "peak allocated"),
                            ("peak_rss_bytes", "peak rss")):
        if column in per_rank and pd.to_numeric(per_rank[column], errors="coerce").notna().any():
            return column, heading
    return None


def _table_lines(frame: pd.DataFrame) -> list[str]:
    return printable(frame).to_string(index=False, na_rep="-").splitlines()


def _finding_lines(report: RunReport) -> list[str]:
    """The heading and the top TOP_FINDINGS findings, one line each: share of step time, ms
    per step at stake, the finding and its ranks."""
    findings = report.findings
    if findings is None or report.per_step.empty:
        return []
    if findings.empty:
        return ["Findings: none passed its threshold"]
    lines = [f"Top findings ({min(len(findings), TOP_FINDINGS)} of {len(findings)}; evidence "
             f"and advice: --full)"]
    for row in records(findings.head(TOP_FINDINGS)):
        share, at_stake = row.get("share_pct"), row.get("ms_per_step")
        cost = ("" if share is None else f"{share:.1f}%"
                + ("" if at_stake is None else f", {at_stake:.2f} ms/step"))
        cost = f"[{cost}] " if cost else ""
        lines.append(fit(terminal_safe(f"{INDENT}{cost}{row.get('finding')} "
                                       f"(ranks {row.get('ranks')})")))
    return lines


def _last_line(report: RunReport) -> str:
    """Where the rest is: every table with --full, the HTML report, the JSON document."""
    notes = report.notes
    count = 0 if notes is None else len(notes)
    with_notes = f", {count} note{'s' if count != 1 else ''}" if count else ""
    return (f"More: --full (every table{with_notes}), --html FILE (the HTML report), "
            f"--format json")

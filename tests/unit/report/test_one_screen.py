"""The default text report fits one screen (analysis.report.one_screen): at most 40 lines of at
most 100 columns, the verdict within its first 5 lines, whatever the verdict and the findings
say and however many ranks the run has."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pandas as pd
import pytest

from analysis.core.contracts import StopDiagnosis
from analysis.report.one_screen import (
    SCREEN_COLUMNS,
    SCREEN_LINES,
    fit,
    one_screen_report,
    width,
    wrapped,
)
from analysis.run.analysed_run import open_run
from helpers.launch import DATA


@pytest.fixture(scope="module")
def ddp_report():
    return open_run(DATA / "ddp_cpu", use_cache=False).report


def _within_screen(text: str) -> list[str]:
    lines = text.splitlines()
    assert len(lines) <= SCREEN_LINES
    assert max(width(line) for line in lines) <= SCREEN_COLUMNS
    return lines


def test_the_short_report_of_a_ddp_run_in_its_order(ddp_report):
    lines = _within_screen(one_screen_report(ddp_report))
    assert lines[0] == "ranktrace: ddp_cpu: 2 of 2 ranks, cpu trace, steps 1-4 (profiled: 2-3)"
    assert lines[2] == ("  Limits the step: Waiting for peers costs 6.14 ms of the 23.99 ms "
                        "mean step (25.6%), ranks 0-1.")
    for label in ("  Waiting: ", "  What if: ", "  Try first "):
        assert any(line.startswith(label) for line in lines[2:12]), label
    table = lines.index("rank step ms compute transfer waiting  idle MFU %  peak rss")
    assert lines[table + 1].split() == ["0", "22.13", "58.9%", "12.1%", "0.0%", "22.5%", "-",
                                        "330.3", "MiB"]
    assert lines[table + 2].split()[:6] == ["1", "25.84", "16.2%", "4.4%", "64.0%", "8.6%"]
    top = lines.index("Top findings (3 of 3; evidence and advice: --full)")
    assert lines[top + 1:top + 4] == ["  [25.6%, 6.14 ms/step] waiting for peers (ranks 0-1)",
                                      "  [13.7%, 3.28 ms/step] idle: other host work (ranks 0-1)",
                                      "  [8.3%, 1.98 ms/step] exposed transfer (ranks 0-1)"]
    assert lines[-1] == ("More: --full (every table, 1 note), --html FILE (the HTML report), "
                         "--format json")


def _many_ranks(report, count: int):
    """`report` with `count` ranks, rank r's mean step 10 + r ms, and its shares rank 0's."""
    per_rank = pd.concat([report.per_rank.iloc[[0]].assign(rank=r, mean_step_ns=(10 + r) * 1e6)
                          for r in range(count)], ignore_index=True)
    totals = pd.concat([report.totals.iloc[[0]].assign(rank=r) for r in range(count)],
                       ignore_index=True)
    per_step = pd.concat([report.per_step[report.per_step["rank"] == 0].assign(rank=r)
                          for r in range(count)], ignore_index=True)
    return dataclasses.replace(
        report, per_rank=per_rank, totals=totals, per_step=per_step, step_rows=None,
        world_size=count, ranks=[SimpleNamespace(rank=r, status="ok") for r in range(count)])


def test_above_16_ranks_the_slowest_and_fastest_few_and_a_line_for_the_rest(ddp_report):
    lines = _within_screen(one_screen_report(_many_ranks(ddp_report, 256)))
    heading = next(i for i, line in enumerate(lines) if line.startswith("Ranks, slowest first"))
    rows = lines[heading + 2:heading + 11]
    assert [row.split()[0] for row in rows[:5]] == ["255", "254", "253", "252", "251"]
    assert rows[5] == "  … 248 more ranks, mean step 13.00 to 260.00 ms (--full)"
    assert [row.split()[0] for row in rows[6:]] == ["2", "1", "0"]
    assert rows[0].split()[1] == "265.00" and rows[-1].split()[1] == "10.00"


def test_16_ranks_are_all_shown_in_rank_order(ddp_report):
    lines = _within_screen(one_screen_report(_many_ranks(ddp_report, 16)))
    heading = next(i for i, line in enumerate(lines) if line.startswith("Ranks ("))
    assert [line.split()[0] for line in lines[heading + 2:heading + 18]] == [
        str(r) for r in range(16)]


def test_a_long_verdict_and_many_findings_keep_to_the_budget(ddp_report):
    """A verdict of 22 long lines and 9 capture windows, a stop diagnosis, 10 findings and 64
    ranks: the screen keeps its order and size, a row for each of the first verdict lines,
    cut with a mark, and says what it left out; with fewer lines, the first ones wrap."""
    long = "word " * 80
    verdict = dataclasses.replace(
        ddp_report.verdict,
        lines=[f"Limits the step: {long}", f"Waiting: {long}", *(f"Phase {i}: {long}"
                                                               for i in range(20)),
               *(f"Captured: window {i} {long}" for i in range(9))])
    findings = pd.concat([ddp_report.findings.iloc[[0]]] * 10, ignore_index=True)
    stop = StopDiagnosis(groups=pd.DataFrame(), lines=["group 0: rank 1 never joined", "x"])
    report = dataclasses.replace(_many_ranks(ddp_report, 64), verdict=verdict,
                                 findings=findings, stop=stop)
    lines = _within_screen(one_screen_report(report))
    assert len(lines) == SCREEN_LINES
    assert lines[2].startswith("  Limits the step: word word")
    assert lines[3].startswith("  Waiting: word")
    assert any(line.startswith("  … ") and line.endswith("more verdict line(s): --full")
               for line in lines)
    top = next(i for i, line in enumerate(lines) if line.startswith("Top findings (3 of 10"))
    assert len([line for line in lines[top + 1:-1] if line.startswith("  [")]) == 3
    assert lines[-1].startswith("More: --full")
    shorter = dataclasses.replace(verdict, lines=verdict.lines[:4])
    lines = _within_screen(one_screen_report(dataclasses.replace(report, verdict=shorter)))
    assert [line[:12] for line in lines[2:14]] == [
        "  Limits the", "    word wor", "    word wor", "  Waiting: w", "    word wor",
        "    word wor", "  Phase 0: w", "    word wor", "    word wor", "  Phase 1: w",
        "    word wor", "    word wor"]
    assert lines[4].endswith("…") and lines[14].startswith("  Stopped: group 0")


def test_capture_windows_past_two_are_counted_on_one_line(ddp_report):
    verdict = dataclasses.replace(ddp_report.verdict, lines=[
        *ddp_report.verdict.lines, *(f"Captured: window {i}" for i in range(5))])
    lines = _within_screen(one_screen_report(dataclasses.replace(ddp_report, verdict=verdict)))
    captured = [line for line in lines if line.startswith("  Captured:")]
    assert captured == ["  Captured: window 0", "  Captured: window 1",
                        "  Captured: 3 more windows (--full)"]


def test_control_characters_in_names_are_escaped_before_the_width_is_counted(ddp_report):
    findings = ddp_report.findings.assign(finding="late\x1b[2J" + "x" * 200)
    lines = _within_screen(one_screen_report(dataclasses.replace(
        ddp_report, name="run\x1b]0;title\x07", findings=findings)))
    assert lines[0].startswith("ranktrace: run\\u001b]0;title\\u0007: ")
    assert not any(ord(c) < 0x20 for line in lines for c in line)


def test_wrapping_cuts_a_line_past_its_rows_with_a_mark():
    rows = wrapped("a " * 200, 2)
    assert len(rows) == 2 and rows[-1].endswith("…")
    assert all(width(row) <= SCREEN_COLUMNS for row in rows)
    assert fit("界" * 60) == "界" * 49 + "…" and width(fit("界" * 60)) == 99

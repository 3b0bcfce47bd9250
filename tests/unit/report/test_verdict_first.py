"""The report opens with the verdict (analysis.report.text_report): the text report's first screen,
the JSON document's `verdict` and `notes`, and bytes in the text tables as binary units."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis.report.json_document import run_document
from analysis.report.text_report import text_report
from analysis.report.values import human_bytes, plain
from analysis.run.analysed_run import open_run
from helpers.synthetic import nccl_run


def _run(folder):
    """Two GPU ranks, 3 steps of 9 ms: 6 ms of compute, then a 0.6 ms NCCL kernel."""
    return open_run(nccl_run(folder), use_cache=False)


def test_the_text_report_opens_with_the_verdict_lines(tmp_path):
    run = _run(tmp_path)
    report = run.report
    lines = text_report(report).splitlines()
    assert lines[3] == "Verdict"
    assert lines[4:4 + len(report.verdict.lines)] == [f"  {line}"
                                                         for line in report.verdict.lines]
    assert lines.index("Verdict") < next(i for i, line in enumerate(lines)
                                         if line.startswith("Time breakdown"))
    top = run.findings.iloc[0]
    assert report.verdict.state == "bottleneck"
    # The change tried first is the one the what-if model prices (the all-reduce's transfer
    # overlapped), before the larger cost it cannot price (idle in other host work).
    first = report.verdict.tries[0]
    assert first["finding"] == "exposed transfer" and first["saved_ms_per_step"] > 0
    assert report.verdict.change_ms_per_step == pytest.approx(first["ms_per_step"])
    assert report.verdict.tries[1]["saved_ms_per_step"] is None
    # the step is 9 ms and the finding's ms are its share of it
    assert top["ms_per_step"] == pytest.approx(top["share_pct"] / 100 * 9.0)
    # 2.4 ms of each 9 ms step idle between the kernels: the largest cost
    assert lines[4] == ("  Limits the step: Device idle: other host work costs 2.40 ms of the "
                        "9.00 ms mean step (26.7%), ranks 0-1.")


def test_the_document_carries_the_verdict_and_the_notes(tmp_path):
    run = _run(tmp_path)
    document = run.document()
    # the Verdict as it is; its memory line only where memory has a finding (docs/analysis.md)
    assert run.report.verdict.memory is None and "memory" not in document["verdict"]
    assert document["verdict"] == {k: v for k, v in plain(run.report.verdict).items()
                                   if k != "memory"}
    assert document["verdict"]["lines"][0].startswith("Limits the step: ")
    assert document["notes"] == []  # every rank analysed, no cross-rank note
    assert [b["finding"] for b in document["bottlenecks"]] == run.findings["finding"].tolist()
    assert all("ms_per_step" in b for b in document["bottlenecks"])
    assert run_document(run.report)["verdict"]["step_ms"] == pytest.approx(9.0)


def test_bytes_print_in_binary_units():
    assert human_bytes(331227136) == "315.9 MiB"
    assert human_bytes(3 * 2**30) == "3.0 GiB"
    assert human_bytes(512) == "512 B"
    assert human_bytes(float("nan")) == "-" and human_bytes(None) == "-"
    assert human_bytes(pd.NA) == "-"

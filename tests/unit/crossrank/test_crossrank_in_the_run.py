"""The cross-rank pass wired into a run's analysis (analysis.run): idle gaps labelled by the
waits for peers, the JSON `cross_rank` object, transfer-based bandwidth in the collectives table,
Kineto-only ranks, and a failing pass that costs nothing else. Hand-built runs whose answers are
known exactly (docs/cross-rank.md, docs/definitions.md)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis import breakdown as cli
from analysis import crossrank
from analysis.report.json_document import cross_rank_json
from analysis.run import analysed_run as run_module
from analysis.run.analysed_run import analyse_run
from analysis.run.loading import load_run_path
from helpers.late_rank_run import (
    AHEAD_NS,
    LATE_US,
    RECORDS_CLOCK_NS,
    STEP_US,
    STEPS,
    US,
    late_rank_run,
)


def _report(folder: Path, steps_spec=None):
    loaded = load_run_path(folder, steps_spec, use_cache=False)
    return analyse_run(loaded, name=folder.name, path=str(folder), steps_spec=steps_spec)


def test_idle_gaps_inside_a_wait_for_peers_are_labelled_so(tmp_path):
    report = _report(late_rank_run(tmp_path / "run"))
    assert report.problems == []
    gaps = report.idle_gaps.set_index(["rank", "step", "start_ns"])
    for n in STEPS:
        t = (n - 1) * STEP_US * US
        # rank 0 waits from its issue (100 us) to rank 1's (590 us): the gap 100-600 us is 98%
        # inside that window, on the Kineto clock although the records are on time.time_ns().
        gap = gaps.loc[(0, n, t + 100 * US)]
        assert gap["end_ns"] == t + 600 * US and gap["host_activity"] == "waiting_for_peers"
        assert gaps.loc[(0, n, t + 700 * US), "host_activity"] == "other"
        # rank 1 waits for no one: its gaps keep their labels
        assert gaps.loc[(1, n, t + LATE_US * US), "host_activity"] == "other"
    summary = report.idle.set_index(["rank", "host_activity"])["total_ns"]
    assert summary.loc[(0, "waiting_for_peers")] == 3 * 500 * US
    waits = report.cross_rank.waits.set_index(["rank", "step"])["wait_for_peers_ms"]
    assert waits.loc[0].tolist() == [0.49] * 3 and waits.loc[1].tolist() == [0.0] * 3
    finding = report.findings.set_index("finding")
    assert "device idle: waiting for peers" in finding.index


def test_the_document_has_the_cross_rank_object_and_transfer_bandwidth(tmp_path, capsys):
    folder = late_rank_run(tmp_path / "run")
    assert cli.main([str(folder), "--format", "json", "--no-cache"]) == 0
    document = json.loads(capsys.readouterr().out)
    cross = document["cross_rank"]
    assert set(cross) == {"clock", "stragglers", "waits", "mismatches", "pipeline"}
    assert [(c["rank"], c["source"], c["offset_ns"]) for c in cross["clock"]] == [
        (0, "reference", 0), (1, "clock_sync", AHEAD_NS)]
    assert [(w["rank"], w["step"], w["wait_for_peers_ms"], w["transfer_ms"])
            for w in cross["waits"]] == [
        (0, n, 0.49, 0.11) for n in STEPS] + [(1, n, 0.0, 0.11) for n in STEPS]
    row, = document["collectives"]
    # 1 MiB over the 110 us both ranks spend in transfer, twice per step: transfer-based
    # algbw = 2 x 3 x 1 MiB / (6 x 110 us); busbw x 2(n-1)/n = 1 for n = 2.
    assert row["transfer_us"] == pytest.approx(660.0)
    assert row["transfer_algbw_gbps"] == pytest.approx((1 << 20) / 110e-6 / 1e9)
    assert row["transfer_busbw_gbps"] == pytest.approx(row["transfer_algbw_gbps"])
    assert row["pg"] == "0" and row["pg_id"] == "0" and row["issuer"] == "ddp"


def test_the_text_report_has_the_cross_rank_section(tmp_path, capsys):
    assert cli.main([str(late_rank_run(tmp_path / "run")), "--full", "--no-cache"]) == 0
    text = capsys.readouterr().out
    collectives = text[text.index("Collectives"):text.index("Ranks\n")]
    heading = next(line for line in collectives.splitlines() if line.lstrip().startswith("op"))
    assert heading.split()[:7] == ["op", "issuer", "pg", "size", "count", "busbw", "GB/s"]
    section = text[text.index("Cross-rank"):]
    assert "clock_sync" in section and "reference" in section
    waits = section[section.index("Waiting for peers"):section.index("Mismatched")]
    assert waits.splitlines()[2].split() == ["0", "3", "0.49", "0.11"]


def test_kineto_alone_without_comm_records_gives_the_trace_steps(tmp_path):
    """--no-comms: step and manifest records but no comm records. The ops come from the NCCL
    kernels, put on the records' clock through the steps both hold, so that clock_sync (which
    measures the records' clock) places them; steps are the ProfilerStep numbers."""
    report = _report(late_rank_run(tmp_path / "run", comms=False))
    cross = report.cross_rank
    assert sorted(cross.waits["step"].unique()) == list(STEPS)
    clock = cross.clock.set_index("rank")
    assert (clock.loc[1, "source"], clock.loc[1, "offset_ns"]) == ("clock_sync", AHEAD_NS)
    assert cross.kineto_shift_ns == {0: -RECORDS_CLOCK_NS, 1: -RECORDS_CLOCK_NS - AHEAD_NS}
    # Kernels start together (600 us): on the device nobody waits, all 100 us is transfer.
    assert (cross.waits["transfer_ms"] == 0.1).all()
    assert (cross.waits["wait_for_peers_ms"] == 0.0).all()


def test_steps_selection_applies_to_the_cross_rank_pass(tmp_path):
    report = _report(late_rank_run(tmp_path / "run"), steps_spec="2")
    assert report.cross_rank.waits["step"].tolist() == [2, 2]


def test_a_failing_cross_rank_pass_is_one_problem_and_the_rest_stands(tmp_path, monkeypatch,
                                                                     capsys):
    def broken(*args, **kwargs):
        raise KeyError("offset_ns")

    monkeypatch.setattr(crossrank, "cross_rank", broken)
    folder = late_rank_run(tmp_path / "run")
    assert cli.main([str(folder), "--format", "json", "--no-cache"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["cross_rank"] is None
    assert document["unavailable"]["cross_rank"] == "KeyError: 'offset_ns'"
    warned = [line for line in captured.err.splitlines() if "cross-rank" in line]
    assert len(warned) == 1 and warned[0].startswith("ranktrace: warning: cross-rank analysis")
    assert len(document["steps"]) == 6 and document["collectives"][0]["count"] == 6
    assert pd.isna(document["collectives"][0]["transfer_busbw_gbps"])


def test_the_notebook_front_exposes_the_cross_rank_frames(tmp_path):
    run = run_module.open_run(late_rank_run(tmp_path / "run"), use_cache=False)
    cross = run.cross_rank
    assert all(len(getattr(cross, name)) for name in ("clock", "ops", "waits", "bandwidth",
                                                      "stragglers"))
    assert run.document()["cross_rank"] == cross_rank_json(run.cross_rank)

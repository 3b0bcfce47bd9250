"""The diff command (analysis.diff's main, in this process: `python -m analysis.diff` starts it as
a process in test_capture_slow_steps) on real traced 2-rank runs (gloo on CPU): DDP bucket sizes,
an injected delay, a run against itself and against a second run of the same command, pipeline
microbatches; and two foreign trace sets."""

import json
import os

import pytest

from analysis import diff
from helpers.launch import DATA
from helpers.runs import DDP_DELAY_MS as DELAY_MS
from helpers.runs import overloaded

# The runs (tests/helpers/runs.py): the step times compared are those of the cross-rank tests'
# default-option DDP runs, two without a delay and one with rank 1 late; the rest are `diff-*`.
RUNS = {"base": "ddp-even-0", "again": "ddp-even-1", "late": "ddp-late-default",
        **{name: f"diff-{name}" for name in ("cap25", "cap1", "pp2", "pp8")}}


@pytest.fixture(scope="module")
def runs(shared_runs):
    recorded = {name: shared_runs[run] for name, run in RUNS.items()}
    return {name: run.run_dir for name, run in recorded.items()} | {
        "load": {name: run.load_at_end for name, run in recorded.items()}}


def _skip_if_overloaded(runs, *names: str) -> None:
    # No verdict on two single runs of an overloaded machine can be checked against the truth,
    # nor how long one rank waits for a delayed other.
    load = max(runs["load"][name] for name in names)
    if overloaded(load):
        pytest.skip(f"load average {load:.1f} on {os.cpu_count()} cores during the runs: their "
                    f"step times are not comparable")


def _diff(capsys, a, b, *args) -> dict:
    code = diff.main([str(a), str(b), "--no-cache", "--format", "json", *map(str, args)])
    done = capsys.readouterr()
    assert code == 0, done.err[-2000:]
    return json.loads(done.out)


def _rows(document, section, **match):
    return [r for r in document[section] if all(r.get(k) == v for k, v in match.items())]


def test_smaller_buckets_mean_more_and_smaller_all_reduces(runs, capsys):
    document = _diff(capsys, runs["cap25"], runs["cap1"])
    all_reduce = _rows(document, "collectives", op="all_reduce")
    count_a = sum(r["count_a"] for r in all_reduce)
    count_b = sum(r["count_b"] for r in all_reduce)
    assert count_a >= 1 and count_b > count_a
    bytes_a = sum(r["bytes_a"] or 0 for r in all_reduce)
    bytes_b = sum(r["bytes_b"] or 0 for r in all_reduce)
    # The same gradients each step, cut into more pieces.
    assert bytes_b == pytest.approx(bytes_a, rel=1e-6) and bytes_a > 0
    largest = max(r["bucket_min_bytes"] for r in all_reduce if r["count_a"] > 0)
    assert max(r["bucket_min_bytes"] for r in all_reduce if r["count_b"] > 0) < largest


def test_a_delayed_rank_shows_as_waiting_on_the_other_and_a_longer_step(runs, capsys):
    assert '"all_reduce"' in (runs["late"] / "rank0.comms.jsonl").read_text()
    document = _diff(capsys, runs["base"], runs["late"])
    # Under heavy load rank 0 itself is held up while rank 1 spins, and waits less for it.
    _skip_if_overloaded(runs, "base", "late")
    waiting = _rows(document, "categories", role="rank 0", category="waiting")[0]
    assert waiting["delta_ms"] > DELAY_MS / 2
    assert any(f["finding"] == "ranks wait for rank 1" and f["status"] == "new"
               for f in document["findings"])
    verdict = document["verdict"]
    assert verdict["significant"], verdict["text"]
    assert verdict["ci_low_pct"] > verdict["noise_floor_pct"] >= 10.0
    assert verdict["text"].startswith("B's step time is") and "higher" in verdict["text"]


def test_a_run_against_itself_and_against_the_same_command(runs, capsys):
    itself = _diff(capsys, runs["base"], runs["base"])
    assert itself["verdict"]["change_pct"] == 0
    assert itself["verdict"]["text"].startswith("no significant change")
    assert all(r["delta_ms"] == 0 for r in itself["categories"])
    assert all(f["status"] == "unchanged" for f in itself["findings"])
    # Two separate runs of one command: whatever the machine's load did to each, the change
    # stays within the run-to-run noise floor (docs/diff.md#the-run-to-run-noise-floor).
    again = _diff(capsys, runs["base"], runs["again"])
    verdict = again["verdict"]
    assert verdict["runs_a"] == verdict["runs_b"] == 1
    assert "not run-to-run noise" in verdict["coverage"]
    _skip_if_overloaded(runs, "base", "again")
    assert not verdict["significant"], verdict["text"]
    assert verdict["text"].startswith("no significant change")
    assert verdict["noise_floor_pct"] >= 10.0


def test_more_microbatches_shrink_the_theoretical_bubble(runs, capsys):
    document = _diff(capsys, runs["pp2"], runs["pp8"])
    theory = _rows(document, "pipeline", metric="theory_bubble_pct")
    # (p - 1) / (m + p - 1) for 2 stages: 1/3 with 2 microbatches, 1/9 with 8.
    assert [round(r["a"], 2) for r in theory] == [33.33, 33.33]
    assert [round(r["b"], 2) for r in theory] == [11.11, 11.11]
    assert len(_rows(document, "pipeline", metric="measured_bubble_pct")) == 2


def test_two_foreign_trace_sets_are_compared(tmp_path, capsys):
    html = tmp_path / "diff.html"
    document = _diff(capsys, DATA / "hta" / "trace_filter", DATA / "hta" / "nccl_parser_config",
                     "--html", str(html))
    assert document["layout_note"] and "different ranks" in document["layout_note"]
    assert document["categories"] and document["operators"]
    assert {r["role"] for r in document["categories"]} == {"every rank (mean)"}
    assert html.read_text().startswith("<!DOCTYPE html>")

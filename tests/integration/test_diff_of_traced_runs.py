"""`python -m analysis.diff` on real traced 2-rank runs (gloo on CPU): DDP bucket sizes, an
injected delay, a run against itself and against a second run of the same command, pipeline
microbatches; and two foreign trace sets."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.launch import DATA, REPO

pytestmark = pytest.mark.slow
STEPS = "12"
# The runs whose step times are compared: enough steps that a burst of other work on the machine
# moves their medians less, and that the interval sees drifts within a run.
TIMED_STEPS = "30"
DELAY_MS = 20
# Other work keeping more than this many processes per core runnable (1-minute load average,
# read as each run ends) slows one run of a command up to 3.5-fold against the next
# (docs/benchmarks.md#run-to-run-noise-of-one-command): no verdict on two single runs can then be
# checked against the truth, nor how long one rank waits for a delayed other.
OVERLOAD_PER_CORE = 2.0
LOAD_AT_END: dict[str, float] = {}


def _trace(out: Path, name: str, script: str, *args, tracer_args=(), steps=STEPS) -> Path:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "-m", "tracer.record", "--out", str(out),
               "--run-name", name, *tracer_args, str(REPO / "workloads" / script),
               "--steps", steps, *args]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    if any(n == "lo" for _, n in socket.if_nameindex()):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    LOAD_AT_END[name] = os.getloadavg()[0]
    return out / name


def _skip_if_overloaded(*names: str) -> None:
    load = max(LOAD_AT_END[name] for name in names)
    if load > OVERLOAD_PER_CORE * (os.cpu_count() or 1):
        pytest.skip(f"load average {load:.1f} on {os.cpu_count()} cores during the runs: their "
                    f"step times are not comparable")


def _diff(a, b, *args) -> dict:
    done = subprocess.run([sys.executable, "-m", "analysis.diff", str(a), str(b), "--no-cache",
                           "--format", "json", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("diff")
    # The ops come from the traces here (--no-comms, shapes recorded for their sizes): with
    # --bucket-cap-mb set, the tracer's comm records hold no DDP all-reduce.
    from_trace = ("--no-comms", "--record-shapes")
    # Every DDP bucket in the comm records, so that every step's wait is split from transfer;
    # ten profiled steps, so that one step of a rank held up by other work on the machine does
    # not decide the mean waiting.
    buckets = ("--ddp-bucket-hook", "--active", "10")
    return {
        "base": _trace(out, "base", "ddp.py", tracer_args=buckets, steps=TIMED_STEPS),
        "again": _trace(out, "again", "ddp.py", tracer_args=buckets, steps=TIMED_STEPS),
        "late": _trace(out, "late", "ddp.py", "--straggle", f"1:{DELAY_MS}",
                       tracer_args=buckets, steps=TIMED_STEPS),
        "cap25": _trace(out, "cap25", "ddp.py", "--bucket-cap-mb", "25",
                        tracer_args=from_trace),
        "cap1": _trace(out, "cap1", "ddp.py", "--bucket-cap-mb", "1", tracer_args=from_trace),
        "pp2": _trace(out, "pp2", "pipeline.py", "--microbatches", "2"),
        "pp8": _trace(out, "pp8", "pipeline.py", "--microbatches", "8"),
    }


def _rows(document, section, **match):
    return [r for r in document[section] if all(r.get(k) == v for k, v in match.items())]


def test_smaller_buckets_mean_more_and_smaller_all_reduces(runs):
    document = _diff(runs["cap25"], runs["cap1"])
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


def test_a_delayed_rank_shows_as_waiting_on_the_other_and_a_longer_step(runs):
    assert '"all_reduce"' in (runs["late"] / "rank0.comms.jsonl").read_text()
    document = _diff(runs["base"], runs["late"])
    # Under heavy load rank 0 itself is held up while rank 1 spins, and waits less for it.
    _skip_if_overloaded("base", "late")
    waiting = _rows(document, "categories", role="rank 0", category="waiting")[0]
    assert waiting["delta_ms"] > DELAY_MS / 2
    assert any(f["finding"] == "ranks wait for rank 1" and f["status"] == "new"
               for f in document["findings"])
    verdict = document["verdict"]
    assert verdict["significant"], verdict["text"]
    assert verdict["ci_low_pct"] > verdict["noise_floor_pct"] >= 10.0
    assert verdict["text"].startswith("B's step time is") and "higher" in verdict["text"]


def test_a_run_against_itself_and_against_the_same_command(runs):
    itself = _diff(runs["base"], runs["base"])
    assert itself["verdict"]["change_pct"] == 0
    assert itself["verdict"]["text"].startswith("no significant change")
    assert all(r["delta_ms"] == 0 for r in itself["categories"])
    assert all(f["status"] == "unchanged" for f in itself["findings"])
    # Two separate runs of one command: whatever the machine's load did to each, the change
    # stays within the run-to-run noise floor (docs/diff.md#the-run-to-run-noise-floor).
    again = _diff(runs["base"], runs["again"])
    verdict = again["verdict"]
    assert verdict["runs_a"] == verdict["runs_b"] == 1
    assert "not run-to-run noise" in verdict["coverage"]
    _skip_if_overloaded("base", "again")
    assert not verdict["significant"], verdict["text"]
    assert verdict["text"].startswith("no significant change")
    assert verdict["noise_floor_pct"] >= 10.0


def test_more_microbatches_shrink_the_theoretical_bubble(runs):
    document = _diff(runs["pp2"], runs["pp8"])
    theory = _rows(document, "pipeline", metric="theory_bubble_pct")
    # (p - 1) / (m + p - 1) for 2 stages: 1/3 with 2 microbatches, 1/9 with 8.
    assert [round(r["a"], 2) for r in theory] == [33.33, 33.33]
    assert [round(r["b"], 2) for r in theory] == [11.11, 11.11]
    assert len(_rows(document, "pipeline", metric="measured_bubble_pct")) == 2


def test_two_foreign_trace_sets_are_compared(tmp_path):
    html = tmp_path / "diff.html"
    document = _diff(DATA / "hta" / "trace_filter", DATA / "hta" / "nccl_parser_config",
                     "--html", str(html))
    assert document["layout_note"] and "different ranks" in document["layout_note"]
    assert document["categories"] and document["operators"]
    assert {r["role"] for r in document["categories"]} == {"every rank (mean)"}
    assert html.read_text().startswith("<!DOCTYPE html>")

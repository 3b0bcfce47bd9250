"""The scaling study on real traced sweeps (gloo on CPU): DDP, tensor and pipeline parallel at 1
and 2 ranks, and data parallel at 1 and 4 with one rank delayed by a busy loop, each number
checked against the runs' own step records; the delayed rank's lost efficiency goes to waiting
for peers."""

import json
from pathlib import Path

import pytest

from helpers.alone import alone
from helpers.launch import run_module

# Short runs: profiler window on steps 5-6 (skip 3, wait 1, warm-up 1, active 2), 10 steps.
TRACER = ["--skip-first", "3", "--active", "2"]
WARMUP_STEPS = 2  # analysis.scaling's default: steps 0 and 1 are left out


def _sweep(out: Path, nproc: str, options: list, script: str, *args) -> dict:
    done = run_module("tracer.sweep", "--nproc", nproc, "--out", out, "--format", "json",
                      *options, *TRACER, script, "--steps", "10", *args, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _records(run: Path, kind: str) -> list[dict]:
    rows = []
    for path in sorted(run.glob(f"rank*.{kind}.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line]
    return rows


def _durations(run: Path) -> list[int]:
    """The timed steps (from the warm-up on, outside the profiler window): end_ns - start_ns."""
    timed = [s for s in _records(run, "steps")
             if s["step"] >= WARMUP_STEPS and not s.get("in_profiler_window", False)]
    assert timed
    return [s["end_ns"] - s["start_ns"] for s in timed]


def _step_ms(run: Path) -> float:
    """docs/scaling.md: the mean over ranks and timed steps of end_ns - start_ns."""
    durations = _durations(run)
    return sum(durations) / len(durations) / 1e6


def _cv_pct(run: Path) -> float:
    """docs/scaling.md: 100 x the population standard deviation of the timed steps / their mean."""
    durations = _durations(run)
    mean = sum(durations) / len(durations)
    return 100 * (sum((d - mean) ** 2 for d in durations) / len(durations)) ** 0.5 / mean


def _check_numbers(document: dict, sweep: Path, weak: bool, world_sizes: list[int]):
    runs = {r["world_size"]: r for r in document["runs"]}
    assert sorted(runs) == world_sizes
    sizes = {s["world_size"]: s for s in document["world_sizes"]}
    base = _step_ms(sweep / "ws1-n1-r0")
    for world, size in sizes.items():
        run = sweep / f"ws{world}-n1-r0"
        step = _step_ms(run)
        assert runs[world]["step_ms"] == pytest.approx(step, rel=1e-9)
        assert runs[world]["step_cv_pct"] == pytest.approx(_cv_pct(run), rel=1e-6)
        assert size["step_ms"] == pytest.approx(step, rel=1e-9)
        assert size["steps_per_s"] == pytest.approx(1e3 / step, rel=1e-9)
        speedup = (world if weak else 1) * base / step
        assert size["speedup"] == pytest.approx(speedup, rel=1e-9)
        assert size["efficiency_pct"] == pytest.approx(100 * speedup / world, rel=1e-9)
        peak = max(s["rss_bytes"] for s in _records(run, "steps"))
        assert size["peak_memory_bytes"] == peak
        parts = [size[p] for p in ("compute_ms", "copies_ms", "transfer_ms", "waiting_ms",
                                   "idle_ms")]
        assert sum(parts) == pytest.approx(step, rel=1e-9)
        assert all(p >= 0 for p in parts)
        shares = [size[p] for p in ("compute_pct", "copies_pct", "transfer_pct", "waiting_pct",
                                    "idle_pct")]
        assert sum(shares) == pytest.approx(100.0)
        if world > 1:
            lost = [a for a in document["attribution"] if a["world_size"] == world]
            assert sum(a["lost_pct_points"] for a in lost) == pytest.approx(
                100 - size["efficiency_pct"])
            assert sum(a["lost_ms"] for a in lost) == pytest.approx(
                step - size["ideal_step_ms"])


# Each at two world sizes, which is enough to check their numbers: four ranks on two cores cost
# the most and add no other arithmetic; the four-rank sweep is the straggler's, below.
@pytest.mark.parametrize("script, args, weak, nproc", [
    ("workloads/ddp.py", ["--hidden", "128"], True, "1,2"),   # per-rank batch: weak scaling
    ("workloads/model_parallel.py", ["--hidden", "128"], False, "1,2"),
    ("workloads/pipeline.py", ["--hidden", "128"], False, "1,2"),
])
def test_every_number_follows_from_the_step_records(tmp_path, script, args, weak, nproc):
    mode = ["--mode", "weak"] if weak else []
    document = _sweep(tmp_path / "sweep", nproc, mode, script, *args)
    assert document["mode"] == ("weak" if weak else "strong")
    _check_numbers(document, tmp_path / "sweep", weak, [int(n) for n in nproc.split(",")])
    # the warnings follow from the numbers (docs/scaling.md, "Warnings")
    base = document["world_sizes"][0]
    noisy = base["step_cv_pct"] > 10.0 or base["step_iqr_pct"] > 10.0
    above = [s for s in document["world_sizes"][1:] if s["efficiency_pct"] > 100.0]
    assert len(document["warnings"]) == noisy + len(above)


def test_a_straggler_at_four_ranks_costs_efficiency_in_waiting(tmp_path):
    with alone():  # its waits are timings: nothing else runs meanwhile
        document = _sweep(tmp_path / "sweep", "1,4", ["--mode", "weak"],
                          "tests/scripts/scaling_straggle.py", "--straggle", "3:60")
    _check_numbers(document, tmp_path / "sweep", True, [1, 4])
    lost = [a for a in document["attribution"] if a["world_size"] == 4]
    largest = max(lost, key=lambda a: a["lost_pct_points"])
    assert largest["cause"] == "waiting for peers"
    # the other three ranks of four wait the delay at every step; on an oversubscribed host
    # they wait longer (the late rank's own work is slowed too), never much less
    assert largest["lost_ms"] >= 0.5 * 0.75 * 60
    assert {r["world_size"]: r["stragglers"] for r in document["runs"]}[4] == "3"

"""What-if answers against measurement, and what the critical path costs (docs/critical-path.md).

    python benchmarks/what_if.py [--steps 30] [--straggle 1:25] [--speed-only]
                                 [--speed-steps 1000] [--speed-ranks 8]

1. Speed: the critical path and every what-if of a synthetic run of --speed-steps steps of
   --speed-ranks ranks (four all_reduces per step, one rank late), timed after the cross-rank
   pass that feeds it.
2. Accuracy (CPU, gloo): `workloads/ddp.py --steps N --straggle R:MS` traced with the DDP
   bucket hook, the top what-if from the loaded run, then the same command without the
   straggle: its measured mean step time (rank{R}.steps.jsonl, the steps the what-if covered,
   every rank) beside the predicted one. The aim: within +-20%.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import pandas as pd  # noqa: E402

from analysis.crossrank import analyse as cross_rank_pass  # noqa: E402
from analysis.crossrank import critical_path  # noqa: E402
from analysis.crossrank.frames import run_frames, typed_ops  # noqa: E402
from analysis.run import open_run  # noqa: E402
from tests.helpers.launch import torchrun_env  # noqa: E402

MS = 1_000_000
STEP_NS = 50 * MS


def synthetic(steps: int, ranks: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Ops and steps: per step four all_reduces, each rank 1 ms of work before each, the last
    rank 3 ms more before the first; every op 1 ms of transfer after its last arrival, each
    rank's step end 1 ms after the last."""
    ops, rows = [], []
    for s in range(1, steps + 1):
        base = s * STEP_NS
        arrive = base + MS
        for k in range(4):
            last = arrive + (3 * MS if k == 0 else 0)
            end = last + MS
            for r in range(ranks):
                issue = last if r == ranks - 1 else arrive
                ops.append((r, "0", ranks, "all_reduce", 4096.0, "float32", s, issue, end,
                            float("nan"), "0"))
            arrive = end + MS
        rows += [(r, s, base, arrive + MS) for r in range(ranks)]
    columns = ["rank", "pg", "pg_size", "op", "bytes", "dtype", "step", "issue_ns", "end_ns",
               "peer", "queue"]
    return (typed_ops(pd.DataFrame(ops, columns=columns)),
            pd.DataFrame(rows, columns=["rank", "step", "start_ns", "end_ns"]))


def speed(steps: int, ranks: int) -> None:
    ops, stepped = synthetic(steps, ranks)
    offsets = pd.DataFrame({"rank": range(ranks), "offset_ns": 0, "uncertainty_ns": 0})
    started = time.perf_counter()
    cross = cross_rank_pass(ops, stepped, offsets, ranks)
    crossed = time.perf_counter() - started
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        result = critical_path.analyse(cross, stepped)
        timings.append(time.perf_counter() - started)
    print(f"speed: {steps} steps x {ranks} ranks, {len(ops)} ops: cross-rank pass "
          f"{crossed:.2f} s; critical path + {len(result['what_if'])} what-ifs "
          f"{statistics.median(timings):.3f} s (median of 3)")
    # expected: the four transfers overlapped save 4 ms per step, the late rank on time 3
    for answer in result["what_if"]:
        print(f"  {answer['change']}: saves {answer['saved_ms_per_step']} ms per step")


def traced(out: Path, steps: int, straggle: str | None) -> Path:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "-m", "tracer.record", "--out", str(out),
               "--ddp-bucket-hook", "workloads/ddp.py", "--steps", str(steps)]
    if straggle:
        command += ["--straggle", straggle]
    subprocess.run(command, cwd=REPO, env=torchrun_env(), check=True, capture_output=True,
                   timeout=600)
    return next(p for p in out.iterdir() if p.is_dir())


def step_times(run_dir: Path, steps: set[int]) -> list[float]:
    """Step times (ms) of every rank's steps in `steps`, from its step records."""
    times = []
    for path in sorted(run_dir.glob("rank*.steps.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("step") in steps:
                times.append((record["end_ns"] - record["start_ns"]) / 1e6)
    return times


def accuracy(steps: int, straggle: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        late_dir = traced(Path(tmp) / "late", steps, straggle)
        run = open_run(str(late_dir))
        cross = run.report.cross_rank
        result = critical_path.analyse(cross, run_frames(run.loaded)["steps"])
        analysed = set(int(s) for s in result["critical_path_steps"]["step"])
        late = step_times(late_dir, analysed)
        even_dir = traced(Path(tmp) / "even", steps, None)
        even = step_times(even_dir, analysed)
    top = result["what_if"][0]
    measured = statistics.mean(even)
    error = 100.0 * (top["predicted_step_ms"] - measured) / measured
    print(f"accuracy: workloads/ddp.py --steps {steps} --straggle {straggle}, "
          f"{len(analysed)} analysed steps x 2 ranks")
    print(f"  straggle run measured   {statistics.mean(late):8.2f} ms per step "
          f"(median {statistics.median(late):.2f})")
    print(f"  top what-if             {top['change']}: saves {top['saved_ms_per_step']:.2f} ms")
    print(f"  predicted               {top['predicted_step_ms']:8.2f} ms per step")
    print(f"  measured, no straggle   {measured:8.2f} ms per step "
          f"(median {statistics.median(even):.2f})")
    print(f"  error                   {error:+8.1f} %  (aim: within +-20 %)")
    for answer in result["what_if"][1:4]:
        print(f"  next: {answer['change']}: saves {answer['saved_ms_per_step']:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--straggle", default="1:25")
    parser.add_argument("--speed-only", action="store_true")
    parser.add_argument("--speed-steps", type=int, default=1000)
    parser.add_argument("--speed-ranks", type=int, default=8)
    args = parser.parse_args()
    speed(args.speed_steps, args.speed_ranks)
    if not args.speed_only:
        accuracy(args.steps, args.straggle)


if __name__ == "__main__":
    main()

"""What the cross-rank pass costs on top of the per-rank analysis, on a 64-rank synthetic run.

    python benchmarks/crossrank_cost.py [--ranks 64] [--steps 20] [--repeat 5]

Writes a synthetic GPU run (one Kineto trace per rank: compute kernels and NCCL all-reduce
kernels, each rank late by its own amount at every step) to a temporary folder, loads it once,
then times, round after round, the per-rank pass (`analysis.run.analysed_run.analyse_run`:
breakdown, idle gaps, collectives, per-rank and per-step tables, findings) and the cross-rank pass
(`analysis.crossrank.cross_rank`). Prints the median of each and the ratio
(per-rank + cross-rank) / per-rank; the goal is at most 1.20.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.crossrank import cross_rank  # noqa: E402
from analysis.run.analysed_run import analyse_run  # noqa: E402
from analysis.run.loading import load_run_path  # noqa: E402
from tests.helpers.synthetic import TraceBuilder, trace_name  # noqa: E402

STEP_US = 100_000
KERNELS_PER_STEP = 60
ALL_REDUCES_PER_STEP = 4


def write_run(folder: Path, ranks: int, steps: int) -> Path:
    for rank in range(ranks):
        builder = TraceBuilder(rank=rank, world_size=ranks)
        late = 50 * (rank % 7)  # us: ranks arrive at the all-reduces at different times
        for step in range(steps):
            base = 1_000_000 + step * STEP_US
            builder.step(step, base, base + STEP_US - 10)
            kernel_us = 60_000 // KERNELS_PER_STEP
            for k in range(KERNELS_PER_STEP):
                start = base + 100 + k * kernel_us + late
                builder.compute(start, start + kernel_us - 20, launch_at=start - 50)
            for a in range(ALL_REDUCES_PER_STEP):
                end = base + 70_000 + a * 5_000 + 3_000
                start = base + 70_000 + a * 5_000 + late
                builder.nccl(start, end, launch_at=start - 30)
        builder.write(folder / trace_name(rank))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = write_run(Path(tmp) / "run", args.ranks, args.steps)
        loaded = load_run_path(run_dir, use_cache=False)
        per_rank_s, cross_s = [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            report = analyse_run(loaded, "run", str(run_dir))
            per_rank_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            result = cross_rank(loaded, work=report.per_step.assign(
                work_ns=report.per_step[["compute_only_ns", "overlap_ns", "memcpy_ns"]]
                .sum(axis=1)))
            cross_s.append(time.perf_counter() - started)
    per_rank, cross = statistics.median(per_rank_s), statistics.median(cross_s)
    matched = int((result.ops["instance"] >= 0).sum())
    print(f"{args.ranks} ranks x {args.steps} steps, {matched} matched ops, "
          f"median of {args.repeat}")
    print(f"per-rank pass   {per_rank:.3f} s")
    print(f"cross-rank pass {cross:.3f} s")
    print(f"ratio (per-rank + cross-rank) / per-rank = {(per_rank + cross) / per_rank:.3f} "
          f"(goal <= 1.20)")


if __name__ == "__main__":
    main()

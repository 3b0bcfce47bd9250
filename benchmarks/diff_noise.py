"""Run-to-run noise of one command: how far apart two runs of the same traced command are.

    .venv/bin/python benchmarks/diff_noise.py [--runs 8] [--steps 12] [--out DIR]
                                              [-- WORKLOAD ARGS...]
    .venv/bin/python benchmarks/diff_noise.py --analyse RUN RUN...

Traces `workloads/ddp.py` (2 ranks, gloo on CPU, `--ddp-bucket-hook`, as
tests/integration/test_diff_of_traced_runs.py does) `--runs` times in a row with the same command,
then prints, per run, the median step time (every rank and step pooled, the steps `python -m
analysis.diff` compares), how far apart two run medians are (larger / smaller - 1, over every pair),
and over every ordered pair (A, B) how often the block bootstrap interval alone excludes 0 and how
often the verdict, run-to-run noise floor applied, calls the change significant: it should not, the
runs are of one command (docs/benchmarks.md#run-to-run-noise-of-one-command).
"""


from __future__ import annotations

import argparse
import datetime
import itertools
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis.diff import side as diff_side  # noqa: E402
from analysis.diff import stats as diff_stats  # noqa: E402


def trace_run(out: Path, name: str, steps: int, extra: list[str]) -> Path:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", "-m", "tracer.record", "--out", str(out),
               "--run-name", name, "--ddp-bucket-hook", str(REPO / "workloads" / "ddp.py"),
               "--steps", str(steps), *extra]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    if any(n == "lo" for _, n in socket.if_nameindex()):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return out / name


def summary(frames: list) -> list[str]:
    """The spread of the run medians, and over every ordered pair of runs (A, B) the verdict."""
    medians = np.array([np.median(f["step_ns"]) for f in frames]) / 1e6
    spreads = [max(m, n) / min(m, n) * 100 - 100
               for m, n in itertools.combinations(medians, 2)]
    pairs = list(itertools.permutations(range(len(frames)), 2))
    changes = [diff_stats.bootstrap_change(frames[i], frames[j]) for i, j in pairs]
    steps = [diff_stats.step_spread_pct(f) for f in frames]
    return [
        f"run medians {medians.min():.1f} to {medians.max():.1f} ms; step spread (IQR / median) "
        f"{min(steps):.0f}% to {max(steps):.0f}%",
        f"larger / smaller median - 1 over {len(spreads)} pairs: median {np.median(spreads):.0f}%,"
        f" 90th percentile {np.percentile(spreads, 90):.0f}%, largest {max(spreads):.0f}%",
        f"ordered pairs whose interval alone excludes 0: "
        f"{sum(c['excludes_zero'] for c in changes)} of {len(pairs)}",
        f"ordered pairs called a significant change (noise floor applied): "
        f"{sum(c['significant'] for c in changes)} of {len(pairs)}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=8, help="runs of the command (default 8)")
    parser.add_argument("--steps", type=int, default=12, help="training steps per run")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temp folder)")
    parser.add_argument("--analyse", type=Path, nargs="+", metavar="RUN",
                        help="compare these existing run folders instead of tracing new ones")
    parser.add_argument("extra", nargs="*", help="more arguments for workloads/ddp.py")
    args = parser.parse_args(argv)
    if args.analyse:
        frames = [diff_side.step_times(diff_side.load_side(path, None, use_cache=False))
                  for path in args.analyse]
        print("\n".join(summary(frames)))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or Path(scratch)
        print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
              f"load average {os.getloadavg()[0]:.2f}, {args.runs} runs of ddp.py "
              f"--steps {args.steps} {' '.join(args.extra)}")
        frames = []
        for i in range(args.runs):
            path = trace_run(out, f"run{i}", args.steps, args.extra)
            frames.append(diff_side.step_times(diff_side.load_side(path, None, use_cache=False)))
            median = np.median(frames[-1]["step_ns"]) / 1e6
            print(f"run {i}: median step {median:.2f} ms over {len(frames[-1])} rank-steps, "
                  f"load average {os.getloadavg()[0]:.2f}")
    print("\n".join(summary(frames)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

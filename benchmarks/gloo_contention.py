"""What a gloo all-reduce over loopback takes while neither, one or both ranks compute beside it.

    .venv/bin/python benchmarks/gloo_contention.py [--rounds 60] [--numel 262144] [--repeats 3]

Two ranks on this host (torchrun, gloo, one intra-op thread each). Each round issues two
all-reduces of --numel float32 (1 MiB each by default, as `workloads/ddp.py`'s two gradient
buckets) at once and times them on rank 0 from the issue to both waits done; a thread of each
computing rank runs small matrix products from just before the issue until both are done, as a
rank's backward runs beside its first bucket's all-reduce. The three cases take turns round by
round, so that the machine's noise falls on each alike:

- `neither`: both ranks wait for the all-reduces (a slowed run's early rank, with the late one
  after its backward);
- `one`: rank 1 computes, rank 0 waits (a slowed run: the late rank's backward beside its
  first bucket);
- `both`: both ranks compute (the same run without the cost: both backward passes at once).

Prints, per case, the median over --repeats runs of the per-run median time with its spread
(p25-p75 over the rounds of every run), and the ratios to `neither`. The what-if's processor
sharing (docs/critical-path.md, "The host's cores") gives a transfer that overlaps both ranks'
compute at most 4/3 of its time against one rank's on two cores; what this measures beyond
that is the cost of waking the transfer's threads onto busy cores, which no trace records.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.helpers.launch import torchrun_env  # noqa: E402

CASES = ("neither", "one", "both")


def computes(case: str, rank: int) -> bool:
    return case == "both" or (case == "one" and rank == 1)


def rounds_on_rank(rounds: int, numel: int) -> dict[str, list[float]]:
    """This rank's part of the rounds; on rank 0 the times (ms) per case."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = dist.get_rank()
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    go, ended = threading.Event(), threading.Event()

    def compute() -> None:
        while not ended.is_set():
            go.wait()
            while go.is_set() and not ended.is_set():
                torch.mm(a, b)

    computer = threading.Thread(target=compute, daemon=True)
    computer.start()
    first, second = torch.randn(numel), torch.randn(numel)
    times: dict[str, list[float]] = {case: [] for case in CASES}
    for number in range(rounds * len(CASES)):
        case = CASES[number % len(CASES)]
        dist.barrier()
        if computes(case, rank):
            go.set()
        time.sleep(0.002)  # the compute thread is running before the issue
        started = time.perf_counter()
        works = [dist.all_reduce(first, async_op=True), dist.all_reduce(second, async_op=True)]
        for work in works:
            work.wait()
        times[case].append((time.perf_counter() - started) * 1e3)
        go.clear()
        time.sleep(0.005)
    ended.set()
    go.set()
    computer.join()
    return times


def worker(rounds: int, numel: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    times = rounds_on_rank(rounds, numel)
    if dist.get_rank() == 0:
        warm = max(1, rounds // 6)  # the first rounds of each case set up gloo's buffers
        for case in CASES:
            print(case, " ".join(f"{t:.4f}" for t in times[case][warm:]))
    dist.destroy_process_group()


def launch(rounds: int, numel: int) -> dict[str, list[float]]:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", __file__, "--worker", "--rounds", str(rounds),
               "--numel", str(numel)]
    done = subprocess.run(command, cwd=REPO, env=torchrun_env(), check=True, capture_output=True,
                          text=True, timeout=600)
    times = {}
    for line in done.stdout.splitlines():
        case, *values = line.split()
        if case in CASES:
            times[case] = [float(v) for v in values]
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="rounds of each case per run")
    parser.add_argument("--numel", type=int, default=262144,
                        help="float32 elements of each of the two all-reduces")
    parser.add_argument("--repeats", type=int, default=3, help="runs, one after the other")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.rounds, args.numel)
        return
    runs = [launch(args.rounds, args.numel) for _ in range(args.repeats)]
    medians = {case: statistics.median(statistics.median(run[case]) for run in runs)
               for case in CASES}
    print(f"two all-reduces of {args.numel * 4 / 2**20:.2f} MiB at once, 2 ranks, gloo; "
          f"{args.repeats} runs of {args.rounds} rounds per case")
    for case in CASES:
        every = [t for run in runs for t in run[case]]
        low, _, high = statistics.quantiles(every, n=4)
        per_run = ", ".join(f"{statistics.median(run[case]):.2f}" for run in runs)
        print(f"  {case}: median {medians[case]:.2f} ms (runs {per_run}; p25-p75 "
              f"{low:.2f}-{high:.2f}), {medians[case] / medians['neither']:.2f}x neither")
    print(f"summary: one {medians['one']:.2f} ms, both {medians['both']:.2f} ms: both/one "
          f"{medians['both'] / medians['one']:.2f} (processor sharing: at most 1.33)")


if __name__ == "__main__":
    main()

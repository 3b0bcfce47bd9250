"""What the issue-time record costs each collective: the comms recorder's bookkeeping of one op
(begin, issued, complete, drain) with and without its IssueRecord, side by side in one process.

    .venv/bin/python benchmarks/issue_records.py [--ops 20000] [--repeats 7] [--step-ms 8.0]
        [--ops-per-step 3]

Runs alternate (without, with, without, ...) so machine noise falls on both alike. Prints the
median and spread over repeats of the cost per op in µs, and the extra cost as a share of a step
of --step-ms with --ops-per-step ops (defaults: the CPU DDP overhead benchmark's step, about
8 ms, with DDP's broadcast-free steady state of 2 gradient buckets plus one user all_reduce).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tracer import schema
from tracer.comms.recorder import IssuesFile
from tracer.comms.timing import Timing


class NullWriter:
    """Completion records are encoded as usual and thrown away: only the issue record differs."""

    def write(self, record) -> None:
        schema.ENCODER.encode(record)


def per_op_us(ops: int, issues) -> float:
    timing = Timing(NullWriter(), lambda: 0, False, None, 1.0, lambda *a: None, issues)
    tensor = torch.ones(262_144)
    start = time.perf_counter_ns()
    for _ in range(ops):
        pending = timing.begin("all_reduce", "c10d", "0", 2, tensor, tensor.nbytes, False, None)
        timing.issued(pending)
        timing.complete_now(pending)
        timing.drain()
    return (time.perf_counter_ns() - start) / ops / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--step-ms", type=float, default=8.0)
    parser.add_argument("--ops-per-step", type=int, default=3)
    args = parser.parse_args()
    without, with_issue = [], []
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            without.append(per_op_us(args.ops, None))
            issues = IssuesFile(str(Path(folder) / f"rank{repeat}.comms.jsonl"),
                                lambda *a: None)
            with_issue.append(per_op_us(args.ops, issues))
            issues.close()
    extra = [w - o for w, o in zip(with_issue, without)]
    share = statistics.median(extra) * args.ops_per_step / (args.step_ms * 1e3) * 100
    for name, values in (("without issue record", without), ("with issue record", with_issue),
                         ("extra per op", extra)):
        print(f"{name:>22}: median {statistics.median(values):6.2f} us/op "
              f"(min {min(values):.2f}, max {max(values):.2f}, {args.repeats} repeats of "
              f"{args.ops} ops)")
    print(f"extra per step: {args.ops_per_step} ops x {statistics.median(extra):.2f} us = "
          f"{share:.3f}% of a {args.step_ms:g} ms step")


if __name__ == "__main__":
    main()

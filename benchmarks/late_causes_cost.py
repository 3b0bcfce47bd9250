"""What testing the causes of the late ranks costs (docs/report.md, "Why a rank is late"), side by
side with the rest of one run's analysis.

    python benchmarks/late_causes_cost.py RUN_FOLDER [RUN_FOLDER ...] [--repeats 5]

Per run folder: the CPU time (process time) of the whole analysis (`open_run(...).report`,
no cache) and of the late ranks' cause tests alone (`analysis.findings.late_ranks.late_ranks` on
the same loaded run, its cross-rank pass computed beforehand), medians of --repeats with their
spread, and the share the cause tests take.
"""

from __future__ import annotations

import argparse
import statistics
import time

from analysis import open_run
from analysis.findings.late_ranks import late_ranks


def _cpu(work) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def measure(path: str, repeats: int) -> dict:
    whole, causes = [], []
    for _ in range(repeats):
        whole.append(_cpu(lambda: open_run(path, use_cache=False).report))
        run = open_run(path, use_cache=False)
        cross = run.cross_rank
        steps = run.per_step["step"].dropna().unique()
        causes.append(_cpu(lambda run=run, cross=cross, steps=steps: late_ranks(
            run.loaded.ranks, cross, steps)))
    return {"run": path, "whole_s": statistics.median(whole),
            "whole_spread": (min(whole), max(whole)), "causes_s": statistics.median(causes),
            "causes_spread": (min(causes), max(causes))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print("run | whole analysis CPU s (min-max) | cause tests CPU s (min-max) | share")
    for path in args.runs:
        row = measure(path, args.repeats)
        print(f"{row['run']} | {row['whole_s']:.3f} ({row['whole_spread'][0]:.3f}-"
              f"{row['whole_spread'][1]:.3f}) | {row['causes_s']:.3f} "
              f"({row['causes_spread'][0]:.3f}-{row['causes_spread'][1]:.3f}) | "
              f"{row['causes_s'] / row['whole_s'] * 100:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The whole command on one trace against HTA's whole process, taking turns.

    python benchmarks/one_trace.py --trace FILE [--hta-python PYTHON] [--repeat 5]

Times `python -m analysis.breakdown FILE --no-cache` (the full text report, cold: no Parquet
cache) and, where --hta-python can import HTA 0.5.0, a fresh interpreter that imports HTA, loads
the same file (`TraceAnalysis` on a temporary folder holding a link to it) and runs
`get_temporal_breakdown`: the whole process of each, from start to exit, one after the other
for --repeat rounds after one warm-up round each. Prints each one's median wall time with its
spread (min-max), its peak RSS (the process itself, from the kernel's accounting) and the ratio
of the medians. The package is compiled to bytecode first, as an installed one is.
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from scale import _HTA, hta_problem  # noqa: E402


def run_once(command: list[str]) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MB, exit status) of `command`, its output discarded."""
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, process.returncode


def _summary(runs: list[tuple[float, float, int]]) -> str:
    walls = [r[0] for r in runs]
    return (f"{statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}), "
            f"{statistics.median(r[1] for r in runs):.0f} MB")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="one Kineto trace file")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (median)")
    parser.add_argument("--hta-python", default=sys.executable,
                        help="a python that can import HTA 0.5.0 (default: this one)")
    args = parser.parse_args(argv)
    trace = args.trace.resolve()
    for package in ("analysis", "tracer"):
        compileall.compile_dir(REPO / package, quiet=1)
    hta_missing = hta_problem(args.hta_python)
    ours = [sys.executable, "-m", "analysis.breakdown", str(trace), "--no-cache"]
    with tempfile.TemporaryDirectory(prefix="ranktrace-one-trace-") as folder:
        (Path(folder) / trace.name).symlink_to(trace)
        hta = [args.hta_python, "-c", _HTA, folder]
        commands = {"ranktrace": ours} | ({"HTA": hta} if hta_missing is None else {})
        runs: dict[str, list] = {name: [] for name in commands}
        for round_number in range(args.repeat + 1):
            for name, command in commands.items():
                result = run_once(command)
                if result[2] != 0:
                    print(f"{name} failed with exit status {result[2]}: {' '.join(command)}")
                    return 1
                if round_number:  # the first round only warms the page cache
                    runs[name].append(result)
    print(f"{trace.name}, {os.cpu_count()} cores, {args.repeat} rounds taking turns")
    for name, results in runs.items():
        print(f"{name:>10}: {_summary(results)}")
    if hta_missing is not None:
        print(f"HTA not run: {hta_missing}")
        return 0
    ratio = (statistics.median(r[0] for r in runs["ranktrace"])
             / statistics.median(r[0] for r in runs["HTA"]))
    print(f"ratio of the medians: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

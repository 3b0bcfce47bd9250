"""The whole command on one trace against HTA's whole process, taking turns.

    python benchmarks/one_trace.py --trace FILE [--hta-python PYTHON] [--repeat 7]
        [--against CHECKOUT ...]

Times `python -m analysis.breakdown FILE --no-cache` (the full text report, cold: no Parquet
cache) and, where --hta-python can import HTA 0.5.0, a fresh interpreter that imports HTA, loads
the same file (`TraceAnalysis` on a temporary folder holding a link to it) and runs
`get_temporal_breakdown`: the whole process of each, from start to exit, one after the other
for --repeat rounds after one warm-up round each, each round starting with the next command
(the one that runs right after HTA's seconds at full CPU is the slower for it). `--against`
adds the same command from another checkout of this repository (e.g. `git worktree add
/tmp/old COMMIT`), run from its own folder with the same Python, so that an earlier version is
timed side by side. Prints each one's median wall time with its spread (min-max), its CPU time
(the process and the processes it waited for), its peak RSS (the process itself, from the
kernel's accounting), the ratio of each command's median to HTA's, and the machine's load
average before and after. Every package is compiled to bytecode first, as an installed one
is.
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


def run_once(command: list[str], cwd: Path = REPO) -> tuple[float, float, int, float]:
    """(wall seconds, peak RSS MB, exit status, CPU seconds) of `command` run in `cwd`, its
    output discarded. Without PYTHONPATH: `python -m` finds the package of its folder."""
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    start = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, env=environment)
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    return (wall, usage.ru_maxrss / 1024, process.returncode,
            usage.ru_utime + usage.ru_stime)


def _summary(runs: list[tuple[float, float, int, float]]) -> str:
    walls = [r[0] for r in runs]
    return (f"{statistics.median(walls):.3f} s ({min(walls):.3f}-{max(walls):.3f}), "
            f"CPU {statistics.median(r[3] for r in runs):.3f} s, "
            f"{statistics.median(r[1] for r in runs):.0f} MB")


def _label(checkout: Path) -> str:
    """The checkout's commit, short, else its folder's name."""
    found = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True)
    return found.stdout.strip() or checkout.name


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True, help="one Kineto trace file")
    parser.add_argument("--repeat", type=int, default=7, help="rounds (median)")
    parser.add_argument("--hta-python", default=sys.executable,
                        help="a python that can import HTA 0.5.0 (default: this one)")
    parser.add_argument("--against", type=Path, action="append", default=[],
                        metavar="CHECKOUT",
                        help="another checkout of this repository whose command is timed "
                             "too; repeatable")
    args = parser.parse_args(argv)
    trace = args.trace.resolve()
    checkouts = {"ranktrace": REPO} | {_label(c): c.resolve() for c in args.against}
    for checkout in checkouts.values():
        for package in ("analysis", "tracer"):
            compileall.compile_dir(checkout / package, quiet=1)
    hta_missing = hta_problem(args.hta_python)
    ours = [sys.executable, "-m", "analysis.breakdown", str(trace), "--no-cache"]
    load_before = _load()
    with tempfile.TemporaryDirectory(prefix="ranktrace-one-trace-") as folder:
        (Path(folder) / trace.name).symlink_to(trace)
        hta = [args.hta_python, "-c", _HTA, folder]
        commands = ({name: (ours, checkout) for name, checkout in checkouts.items()}
                    | ({"HTA": (hta, REPO)} if hta_missing is None else {}))
        runs: dict[str, list] = {name: [] for name in commands}
        names = list(commands)
        for round_number in range(args.repeat + 1):
            # Each round starts with the next command: the one that runs right after HTA's
            # seconds at full CPU is the slower for it, and no command always does.
            turn = round_number % len(names)
            for name in names[turn:] + names[:turn]:
                command, cwd = commands[name]
                result = run_once(command, cwd)
                if result[2] != 0:
                    print(f"{name} failed with exit status {result[2]}: {' '.join(command)}")
                    return 1
                if round_number:  # the first round only warms the page cache
                    runs[name].append(result)
    print(f"{trace.name}, {os.cpu_count()} cores, {args.repeat} rounds taking turns, load "
          f"average {load_before} before and {_load()} after (1, 5, 15 min)")
    for name, results in runs.items():
        print(f"{name:>10}: {_summary(results)}")
    if hta_missing is not None:
        print(f"HTA not run: {hta_missing}")
        return 0
    hta_median = statistics.median(r[0] for r in runs["HTA"])
    for name in checkouts:
        ratio = statistics.median(r[0] for r in runs[name]) / hta_median
        print(f"{name} / HTA, ratio of the medians: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What one rank costs a worker: the CPU time of parsing a trace, and of parsing and reducing it
(analysis.ingest.load's per-rank job, as `python -m analysis.breakdown RUN` runs it in its workers).

    python benchmarks/rank_cost.py --trace FILE [--ranks 20] [--repeat 5] [--against CHECKOUT]

Writes --ranks copies of FILE (as benchmarks/scale.py does) in a temporary folder it removes
afterwards. Each round, a fresh process per side reads them all once to warm up, then times a
pass of parses and a pass of whole jobs (CPU time per rank). With --against (a checkout of another
version, e.g. `git worktree add /tmp/before REV`), that version runs in turn with this one, round
after round, so that both share whatever else the machine is doing. Figures: median of the rounds
with the spread (min-max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from scale import build_run

REPO = Path(__file__).resolve().parents[1]

# Run in a fresh process with the side's checkout first on sys.path.
_MEASURE = """
import json, sys, time
from pathlib import Path
from analysis.core import limits
from analysis.ingest import load
from analysis.ingest import parsed_trace
files = sorted(Path(sys.argv[1]).glob("*.json.gz"))
from analysis.rank.reduction import rank_tables
reduction = load.RankReduction(rank_tables, None, False, (), False, drop_events=True)
limit = limits.max_trace_bytes()
for path in files:
    load._read_trace_job((str(path), False, limit, reduction, None))
start = time.process_time()
for path in files:
    parsed_trace.parse_trace(path)
parse = (time.process_time() - start) / len(files) * 1000
start = time.process_time()
for path in files:
    load._read_trace_job((str(path), False, limit, reduction, None))
job = (time.process_time() - start) / len(files) * 1000
print(json.dumps({"parse_ms": parse, "job_ms": job}))
"""


def measure(checkout: Path, folder: Path) -> dict:
    code = f"import sys; sys.path.insert(0, {str(checkout)!r})" + _MEASURE
    done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True,
                          text=True, cwd=checkout)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: the measurement failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def summary(runs: list[dict], key: str) -> str:
    values = [run[key] for run in runs]
    return f"{statistics.median(values):.1f} ms ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True, help="a Kineto trace (.json or .gz)")
    parser.add_argument("--ranks", type=int, default=20, help="copies timed per pass")
    parser.add_argument("--repeat", type=int, default=5, help="rounds (fresh processes)")
    parser.add_argument("--against", type=Path, help="a checkout of another version to compare")
    args = parser.parse_args()
    sides = {"this checkout": REPO}
    if args.against is not None:
        sides = {f"{args.against}": args.against.resolve(), **sides}
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory(prefix="ranktrace-rank-cost-") as tmp:
        build_run(args.trace, args.ranks, Path(tmp))
        for _ in range(args.repeat):
            for name, checkout in sides.items():
                runs[name].append(measure(checkout, Path(tmp)))
    print(f"{args.trace.name}, {args.ranks} ranks, {args.repeat} rounds, CPU time per rank")
    for name, found in runs.items():
        print(f"  {name}: parse {summary(found, 'parse_ms')}, parse + reduce "
              f"{summary(found, 'job_ms')}")


if __name__ == "__main__":
    main()

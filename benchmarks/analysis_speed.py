"""How fast and how lean the analysis is, against plain JSON decoding and against HTA 0.5.0.

    python benchmarks/analysis_speed.py --trace FILE [--hta-python PYTHON] [--repeat N]

On one large Kineto trace, e.g. HTA's df_index_resolver test trace (54 MB of JSON), it prints,
measured side by side in this one run:
  1. our parse + breakdown time / the time to gunzip and orjson.loads the same file (goal <= 1.0);
  2. our time / HTA's TraceAnalysis load + get_temporal_breakdown (goal <= 0.1), when
     holistictraceanalysis is importable by --hta-python (default: this python);
  3. our peak RSS / HTA's (goal <= 0.5).
Every run is a fresh subprocess doing the work once, as one command-line call does (imports are
not timed); the sides take turns, round after round, so that they share whatever else the machine
is doing, and each figure is the median over --repeat rounds. A process's peak RSS is read by a
small meter process through resource.getrusage(RUSAGE_CHILDREN).ru_maxrss. Our figure is cold:
no Parquet cache is read or written; a warm one (from the cache of a temporary copy) is printed
for information, as are CPU times, which a busy machine disturbs less than wall times.
This file imports only the standard library at the top, so HTA's venv can run its worker mode.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Runs one command as its only child and reports that child's peak RSS (KiB on Linux).
_METER = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)\n"
    "sys.stdout.write(done.stdout.decode())\n"
    "print('maxrss_kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(done.returncode)\n"
)


# ---- workers (each runs in its own process) ------------------------------------------------------
def work_baseline(trace: Path) -> None:
    import gzip

    import orjson

    orjson.loads(gzip.decompress(trace.read_bytes()))


def prepare_ours():
    from analysis.rank.hta import hta_temporal_breakdown
    from analysis.run.loading import load_run_path

    def work(trace: Path, use_cache: bool = False) -> None:
        # the per-step breakdown is the per-rank reduction's, computed while loading
        loaded = load_run_path(trace, use_cache=use_cache)
        hta_temporal_breakdown(loaded.ranks)

    return work


def prepare_hta():
    import logging

    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis

    def work(trace: Path) -> None:
        TraceAnalysis(trace_dir=str(trace.parent)).get_temporal_breakdown(visualize=False)

    return work


def prepare_ours_warm():
    work = prepare_ours()
    return lambda trace: work(trace, use_cache=True)


WORKERS = {
    "baseline": lambda: work_baseline,
    "ours": prepare_ours,
    "ours-warm": prepare_ours_warm,
    "hta": prepare_hta,
}


def run_worker_here(name: str, trace: Path) -> dict:
    work = WORKERS[name]()  # imports happen here, outside the timing
    wall, cpu = time.perf_counter(), time.process_time()
    work(trace)
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


# ---- the parent --------------------------------------------------------------------------------
def run_worker(python: str, name: str, trace: Path) -> dict:
    """One fresh worker process: its wall and CPU seconds and its peak RSS in MiB."""
    command = [python, "-c", _METER, python, str(Path(__file__).resolve()), "--worker", name,
               "--trace", str(trace)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or len(lines) < 2:
        raise RuntimeError(f"{name} worker failed (exit {done.returncode})")
    return {**json.loads(lines[-2]), "rss_mib": int(lines[-1].split()[1]) / 1024}


def can_import_hta(python: str) -> bool:
    done = subprocess.run([python, "-c", "import hta.trace_analysis"], capture_output=True)
    return done.returncode == 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, required=True, metavar="FILE",
                        help="a large Kineto trace, e.g. HTA's df_index_resolver test trace "
                             "(tests/data/df_index_resolver/df_index_resolver.json.gz in "
                             "facebookresearch/HolisticTraceAnalysis)")
    parser.add_argument("--hta-python", default=sys.executable,
                        help="a python that can import holistictraceanalysis 0.5.0")
    parser.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(run_worker_here(args.worker, args.trace)))
        return 0
    if not args.trace.is_file():
        parser.error(f"--trace {args.trace}: no such file")

    import gzip

    size = len(gzip.decompress(args.trace.read_bytes())) if args.trace.suffix == ".gz" else \
        args.trace.stat().st_size
    with_hta = can_import_hta(args.hta_python)
    print(f"analysis speed on {args.trace} ({size / 1e6:.1f} MB of JSON), "
          f"{datetime.date.today().isoformat()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; medians over {args.repeat} rounds of fresh processes")
    sides = {
        "baseline": ("gunzip + orjson.loads", sys.executable),
        "ours": ("ranktrace parse + breakdown (cold)", sys.executable),
        "ours-warm": ("ranktrace, warm (Parquet cache)", sys.executable),
    }
    if with_hta:
        sides["hta"] = ("HTA load + get_temporal_breakdown", args.hta_python)
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / args.trace.name
        shutil.copyfile(args.trace, copy)
        run_worker(sys.executable, "ours-warm", copy)  # writes the cache
        for _ in range(args.repeat):
            for name, (_, python) in sides.items():
                runs[name].append(run_worker(python, name, copy if name == "ours-warm"
                                             else args.trace))
    median = {name: {key: statistics.median(r[key] for r in results) for key in results[0]}
              for name, results in runs.items()}
    for name, (label, _) in sides.items():
        m = median[name]
        print(f"  {label:36s} {m['wall_s']:7.3f} s wall {m['cpu_s']:7.3f} s CPU   "
              f"peak RSS {m['rss_mib']:5.0f} MiB")
    ours, base = median["ours"], median["baseline"]
    print()
    print(f"ratio 1, ours / (gunzip + orjson.loads) time:  {ours['wall_s'] / base['wall_s']:.3f}"
          f"  (goal <= 1.0; CPU time {ours['cpu_s'] / base['cpu_s']:.3f})")
    if not with_hta:
        print(f"ratios 2 and 3: holistictraceanalysis is not importable by {args.hta_python}; "
              f"give --hta-python (a venv with holistictraceanalysis==0.5.0)")
        return 0
    hta = median["hta"]
    print(f"ratio 2, ours / HTA time:                      {ours['wall_s'] / hta['wall_s']:.3f}"
          f"  (goal <= 0.1; CPU time {ours['cpu_s'] / hta['cpu_s']:.3f})")
    print(f"ratio 3, ours / HTA peak RSS:                  {ours['rss_mib'] / hta['rss_mib']:.3f}"
          f"  (goal <= 0.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How the analysis scales with the number of ranks: runs made of copies of one real trace.

    python benchmarks/scale.py N [N ...] --trace FILE [--hta-python PYTHON] [--hta-max 64]
                               [--repeat R] [--jobs J] [--scheduler ADDRESS]

For each N it writes N gzipped copies of FILE (a Kineto trace, e.g. HTA's nccl_parser_config
A100 trace) into a temporary folder, each with `distributedInfo` rank 0..N-1 and world size N,
and times `python -m analysis.breakdown FOLDER --no-cache --format json` on it: wall time, and
the peak resident memory of the command and all its worker processes, summed (each process's
own peak, sampled every 50 ms through psutil, added up; the peak of the sum is printed beside
it). Up to --hta-max ranks HTA 0.5.0's TraceAnalysis + get_temporal_breakdown runs on the same
folder, where --hta-python can import it; otherwise the table says that HTA was not run and why.
The folder is removed afterwards. Each figure is the median of --repeat runs, wall times with
their spread (min-max).

A copy is three gzip members written once (the bytes before the rank, between rank and world
size, after it) around two tiny members with the numbers: gzip readers read a file of several
members as one stream, so building 1024 ranks costs seconds, not minutes.
"""

from __future__ import annotations

import argparse
import gzip
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.05
_RANK_RE = re.compile(rb'("rank"\s*:\s*)(-?\d+)')
_WORLD_RE = re.compile(rb'("world_size"\s*:\s*)(-?\d+)')
_INFO_RE = re.compile(rb'"distributedInfo"\s*:\s*\{')


# ---- building the run ----------------------------------------------------------------------------
def _template(trace: Path) -> tuple[bytes, bytes, bytes]:
    """The trace's JSON cut around its rank and world size: (before rank, between, after)."""
    data = trace.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    info = _INFO_RE.search(data)
    if info is None:
        start = data.index(b"{") + 1
        return (data[:start] + b'"distributedInfo": {"rank": ', b', "world_size": ',
                b'}, ' + data[start:])
    rank = _RANK_RE.search(data, info.end())
    world = _WORLD_RE.search(data, info.end())
    if rank is None or world is None:
        raise SystemExit(f"{trace}: distributedInfo has no rank or world_size to set")
    first, second = sorted([rank, world], key=lambda m: m.start())
    if first is not rank:
        raise SystemExit(f"{trace}: distributedInfo gives world_size before rank")
    return (data[:first.end(1)], data[first.end():second.end(1)], data[second.end():])


def build_run(trace: Path, ranks: int, folder: Path) -> int:
    """N copies of `trace` as rank{R}.1.pt.trace.json.gz in `folder`; returns the bytes written."""
    before, between, after = (gzip.compress(part, compresslevel=6) for part in _template(trace))
    world = gzip.compress(str(ranks).encode())
    written = 0
    for rank in range(ranks):
        data = before + gzip.compress(str(rank).encode()) + between + world + after
        (folder / f"rank{rank}.1.pt.trace.json.gz").write_bytes(data)
        written += len(data)
    return written


# ---- measuring -----------------------------------------------------------------------------------
def measure(command: list[str], env: dict | None = None) -> dict:
    """Wall time, summed per-process peak RSS and the peak of the summed RSS of `command` and
    every process it starts, and the last line of its stderr where it failed."""
    start = time.perf_counter()
    process = psutil.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    peaks: dict[int, int] = {}
    peak_sum = 0
    while process.poll() is None:
        total = 0
        try:
            tree = [process, *process.children(recursive=True)]
        except psutil.Error:
            tree = []
        for member in tree:
            try:
                rss = member.memory_info().rss
            except psutil.Error:
                continue
            peaks[member.pid] = max(peaks.get(member.pid, 0), rss)
            total += rss
        peak_sum = max(peak_sum, total)
        time.sleep(SAMPLE_S)
    wall = time.perf_counter() - start
    error = process.stderr.read().decode(errors="replace").strip().splitlines()
    return {"wall_s": wall, "rss_mb": sum(peaks.values()) / 2**20,
            "sum_peak_mb": peak_sum / 2**20, "rc": process.returncode,
            "error": error[-1] if process.returncode and error else ""}


_HTA = """
import logging, sys
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
"""


def hta_problem(python: str) -> str | None:
    """Why HTA cannot run with `python`, or None when it can."""
    try:
        found = subprocess.run([python, "-c", "import hta.trace_analysis"], capture_output=True,
                               timeout=300)
    except OSError as exc:
        return f"{python}: {exc.strerror or exc}"
    if found.returncode:
        return f"holistictraceanalysis is not importable by {python}"
    return None


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _spread(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs]
    return f"{min(values):.1f}-{max(values):.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ranks", nargs="+", type=int, metavar="N", help="ranks per run")
    parser.add_argument("--trace", type=Path, required=True, help="the Kineto trace to copy")
    parser.add_argument("--repeat", type=int, default=1, help="runs per figure (median)")
    parser.add_argument("--jobs", type=int, help="--jobs for analysis.breakdown")
    parser.add_argument("--scheduler", help="--scheduler for analysis.breakdown")
    parser.add_argument("--hta-python", default=sys.executable,
                        help="a python that can import HTA 0.5.0 (default: this one)")
    parser.add_argument("--hta-max", type=int, default=64, help="largest N HTA runs on")
    args = parser.parse_args(argv)

    hta_missing = hta_problem(args.hta_python)
    ours = [sys.executable, "-m", "analysis.breakdown", "--no-cache", "--format", "json"]
    ours += ["--jobs", str(args.jobs)] if args.jobs else []
    ours += ["--scheduler", args.scheduler] if args.scheduler else []
    print(f"trace {args.trace}, {psutil.cpu_count()} cores, repeat {args.repeat}")
    print(f"{'ranks':>6} {'MB gz':>8} {'ours s':>8} {'(min-max)':>12} {'s/rank':>7} "
          f"{'ours MB':>9} {'(sum peak)':>10} {'HTA s':>8} {'(min-max)':>12} {'HTA MB':>8}")
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory(prefix="ranktrace-scale-") as folder:
            written = build_run(args.trace, ranks, Path(folder))
            runs = [measure(ours + [folder]) for _ in range(args.repeat)]
            failed = [r for r in runs if r["rc"] != 0]
            hta = "not run"
            if ranks <= args.hta_max and hta_missing is None:
                hta_runs = [measure([args.hta_python, "-c", _HTA, folder])
                            for _ in range(args.repeat)]
                hta = (f"{_median(hta_runs, 'wall_s'):8.1f} {_spread(hta_runs, 'wall_s'):>12} "
                       f"{_median(hta_runs, 'rss_mb'):8.0f}"
                       if all(r["rc"] == 0 for r in hta_runs) else "HTA failed")
        wall = _median(runs, "wall_s")
        print(f"{ranks:>6} {written / 2**20:8.1f} {wall:8.1f} {_spread(runs, 'wall_s'):>12} "
              f"{wall / ranks:7.3f} {_median(runs, 'rss_mb'):9.0f} "
              f"{_median(runs, 'sum_peak_mb'):10.0f} {hta:>30}")
        for run in failed:
            print(f"       exit status {run['rc']}: {run['error']}")
    if hta_missing is not None:
        print(f"HTA not run: {hta_missing}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The one-rank critical path side by side with HTA 0.5.0's critical_path_analysis.

    python benchmarks/critical_path_vs_hta.py --hta-python PYTHON [--csv FILE] TRACE_DIR...

For each trace folder (one rank's Kineto trace: tests/data/hta/ns_resolution_trace,
nccl_parser_config, amd_trace) and each of its windows, it runs HTA's
`critical_path_analysis(rank, annotation, instance_id)` in --hta-python (a venv with
holistictraceanalysis==0.5.0 and pandas 2.3, which it needs) and ours
(analysis.rank.one_rank_path with the same window), and prints per window both totals and the
time of each of HTA's categories next to ours mapped onto it (docs/critical-path.md, "Side by
side with HTA"):

    cpu_bound                   cpu + idle (the host)
    gpu_compute_bound           kernel + memcpy + memset (+ comm_kernel: HTA's
                                gpu_communication_bound, summed in here)
    gpu_kernel_kernel_overhead  device_idle
    gpu_kernel_launch_overhead  launch
    (none)                      previous_step: shown apart, and left out of "ours w/o prev"

The windows: every ProfilerStep (HTA's instance i is the i-th, ours is its step number), and
with --strip-profiler-steps a copy of the trace without ProfilerStep events, analysed for
each instance of --annotation (default "## forward ##") on its own (--window NAME --instance
N, as HTA takes one instance) and as the whole trace. `--csv` writes
HTA's figures (tests/data/hta-0.5.0-critical-path.csv's columns). Only the standard library is
imported at the top, so HTA's venv can run the worker mode.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HTA_CATEGORIES = ("cpu_bound", "gpu_compute_bound", "gpu_kernel_kernel_overhead",
                  "gpu_kernel_launch_overhead")
OURS_OF = {"cpu_bound": ("cpu", "idle"),
           "gpu_compute_bound": ("kernel", "memcpy", "memset", "comm_kernel"),
           "gpu_kernel_kernel_overhead": ("device_idle",),
           "gpu_kernel_launch_overhead": ("launch",)}


# ---- worker: HTA, in its own venv ------------------------------------------------------------
def hta_worker(trace_dir: str, annotation: str, instances: list[int]) -> None:
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=trace_dir)
    rank = sorted(analysis.t.traces)[0]
    found = []
    for instance in instances:
        try:
            graph, _ = analysis.critical_path_analysis(rank=rank, annotation=annotation,
                                                       instance_id=instance)
            frame = graph.get_critical_path_breakdown()
            by = frame.groupby("bound_by").duration.sum()
            found.append({"instance": instance, "total_us": float(frame.duration.sum()),
                          **{k: float(by.get(k, 0.0)) for k in HTA_CATEGORIES},
                          # communication kernels are compute to the comparison
                          "gpu_communication_bound": float(by.get("gpu_communication_bound",
                                                                  0.0))})
        except Exception as exc:  # noqa: BLE001  (HTA fails on some windows: recorded)
            found.append({"instance": instance, "error": f"{type(exc).__name__}: {exc}"[:120]})
    print(json.dumps(found))


def run_hta(python: str, trace_dir: Path, annotation: str, instances: list[int]) -> list[dict]:
    done = subprocess.run([python, __file__, "--hta-worker", str(trace_dir), annotation,
                           ",".join(map(str, instances))],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"HTA failed on {trace_dir}: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- ours ------------------------------------------------------------------------------------
def ours(trace_dir: Path, window, alone: bool = False) -> tuple[list[dict], list[int]]:
    """Per window: total, per category, and the window numbers. `alone`: each occurrence of
    the window's annotation analysed on its own (--instance N), as HTA takes one instance."""
    sys.path.insert(0, str(REPO))
    from analysis.core.step_spec import PathWindow
    from analysis.rank import one_rank_path
    from analysis.run.loading import load_run_path

    trace = next(t for t in load_run_path(trace_dir, use_cache=False).ranks
                 if t.events is not None)
    result = one_rank_path.analyse(trace, window=window, answer_what_if=False)
    if alone:
        results = [one_rank_path.analyse(trace, window=PathWindow(window.name, int(n)),
                                         answer_what_if=False)
                   for n in result.critical_path_steps["step"]]
        rows = [row for one in results for row in _rows(one)]
        return rows, [int(s) for s in result.critical_path_steps["step"]]
    return _rows(result), [int(s) for s in result.critical_path_steps["step"]]


def _rows(result) -> list[dict]:
    by = result.critical_path.groupby(["step", "category"])["ms"].sum()
    rows = []
    for step in result.critical_path_steps.itertuples():
        mine = by.loc[step.step].to_dict() if step.step in by.index.get_level_values(0) else {}
        rows.append({"window": int(step.step), "total_ms": step.path_ms,
                     "previous_step_ms": mine.get("previous_step", 0.0),
                     **{k: sum(mine.get(c, 0.0) for c in cats) for k, cats in OURS_OF.items()}})
    return rows


def stripped_copy(trace_dir: Path, into: Path) -> Path:
    """A copy of the folder's trace without its ProfilerStep events."""
    source = next(trace_dir.glob("*.json.gz"))
    with gzip.open(source, "rt") as f:
        document = json.load(f)
    document["traceEvents"] = [e for e in document["traceEvents"]
                               if not str(e.get("name", "")).startswith("ProfilerStep")]
    into.mkdir(parents=True, exist_ok=True)
    with gzip.open(into / source.name, "wt") as f:
        json.dump(document, f)
    return into


# ---- the table -------------------------------------------------------------------------------
def compare(name: str, hta: list[dict], mine: list[dict], annotation: str,
            profiler_steps: str) -> list[dict]:
    """Print one line per window and return HTA's rows for --csv."""
    out = []
    for theirs, row in zip(hta, mine):
        line = f"{name:<22} {annotation or '(whole trace)':<14} {theirs['instance']:>2}"
        csv_row = {"trace_dir": name, "profiler_steps": profiler_steps,
                   "annotation": annotation, "instance": theirs["instance"]}
        if "error" in theirs:
            print(f"{line}  HTA: {theirs['error']}; ours {row['total_ms']:.2f} ms")
            out.append({**csv_row, "error": theirs["error"]})
            continue
        theirs["gpu_compute_bound"] += theirs.pop("gpu_communication_bound")
        total = theirs["total_us"] / 1000
        own = row["total_ms"] - row["previous_step_ms"]
        parts = "  ".join(f"{k.split('_', 1)[1][:14]} {theirs[k] / 1000:.2f}/{row[k]:.2f}"
                          for k in HTA_CATEGORIES)
        share_hta = 100 * theirs["cpu_bound"] / theirs["total_us"] if total else 0.0
        share_ours = 100 * row["cpu_bound"] / own if own else 0.0
        print(f"{line}  HTA {total:8.2f}  ours {row['total_ms']:8.2f} (prev "
              f"{row['previous_step_ms']:6.2f}, w/o {own:8.2f}, {100 * (own / total - 1):+5.1f}%)"
              f"  host-bound {share_hta:5.1f}%/{share_ours:5.1f}%  {parts}")
        out.append({**csv_row, "total_us": round(theirs["total_us"]),
                    **{f"{k}_us": round(theirs[k]) for k in HTA_CATEGORIES}, "error": ""})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="*", type=Path, metavar="TRACE_DIR")
    parser.add_argument("--hta-python", help="a python with holistictraceanalysis==0.5.0")
    parser.add_argument("--annotation", default="## forward ##",
                        help="the annotation of the windows without ProfilerStep")
    parser.add_argument("--strip-profiler-steps", action="store_true",
                        help="also analyse a copy of each trace without ProfilerStep events")
    parser.add_argument("--csv", type=Path, help="write HTA's figures to this CSV file")
    parser.add_argument("--hta-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hta_worker:
        trace_dir, annotation, instances = args.hta_worker
        hta_worker(trace_dir, annotation, [int(i) for i in instances.split(",")])
        return 0
    if not args.hta_python or not args.traces:
        parser.error("give --hta-python and at least one TRACE_DIR")
    from analysis.core.step_spec import PathWindow

    print("HTA category: HTA ms / ours ms (ours mapped: docs/critical-path.md)")
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for trace_dir in args.traces:
            mine, _ = ours(trace_dir, PathWindow("ProfilerStep"))
            hta = run_hta(args.hta_python, trace_dir, "ProfilerStep", list(range(len(mine))))
            written += compare(trace_dir.name, hta, mine, "ProfilerStep", "yes")
            if not args.strip_profiler_steps:
                continue
            bare = stripped_copy(trace_dir, Path(tmp) / trace_dir.name)
            try:
                mine, _ = ours(bare, PathWindow(args.annotation), alone=True)
            except ValueError as exc:  # the trace has no such annotation
                print(f"{trace_dir.name:<22} {exc}")
            else:
                hta = run_hta(args.hta_python, bare, args.annotation, list(range(len(mine))))
                written += compare(trace_dir.name, hta, mine, args.annotation, "removed")
            mine, _ = ours(bare, None)
            hta = run_hta(args.hta_python, bare, "", [0])
            written += compare(trace_dir.name, hta, mine, "", "removed")
    if args.csv:
        columns = ["trace_dir", "profiler_steps", "annotation", "instance", "total_us",
                   *(f"{k}_us" for k in HTA_CATEGORIES), "error"]
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns, restval="", lineterminator="\n")
            writer.writeheader()
            writer.writerows(written)
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    raise SystemExit(main())

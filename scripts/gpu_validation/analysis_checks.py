"""`python -m analysis.breakdown` on each traced run, and HTA's own numbers on the same trace."""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

from .config import HTA_TOLERANCE, SUM_TOLERANCE_NS
from .preflight import importable_in_env
from .results import Results
from .runner import Runner, output_tail


def run_analysis(results: Results, runner: Runner, wl: str, run_dir: Path, cfg: dict,
                 gpu: bool) -> dict | None:
    done = runner.run(f"analysis-{wl}", [sys.executable, "-m", "analysis.breakdown", str(run_dir),
                                         "--format", "json", "--no-cache"],
                      timeout=cfg["analysis_timeout"])
    name = f"{wl}.breakdown"
    if done.rc != 0:
        results.record(name, False, None, f"analysis failed: {done.failure()}")
        return None
    try:
        doc = json.loads(done.stdout)
    except ValueError as exc:
        results.record(name, False, None, f"analysis printed no JSON document ({exc}); "
                                          f"stdout tail: {output_tail(done.stdout)}")
        return None
    runner.logs[f"analysis-{wl}.json"] = done.stdout
    parts = ("compute_only_ns", "comm_only_ns", "overlap_ns", "memcpy_ns", "idle_ns")
    problems, worst = [], 0
    steps = doc.get("steps") or []
    if not steps:
        problems.append("no step analysed")
    def has_split(row: dict) -> bool:
        return any(row.get(p) is not None for p in parts)

    profiled = [row for row in steps if has_split(row)]
    if steps and not profiled:
        problems.append("no profiled step: no row has the kernel-level split")
    for row in steps:
        if not has_split(row):  # an analysed step outside every window: its step time alone
            if not (row.get("step_ns") or 0) > 0:
                problems.append(f"rank {row.get('rank')} step {row.get('step')}: step_ns "
                                f"{row.get('step_ns')}")
            continue
        try:
            diff = abs(sum(row[p] for p in parts) - row["step_ns"])
        except (KeyError, TypeError) as exc:
            problems.append(f"step row with some parts missing ({exc}): {row}")
            break
        worst = max(worst, diff)
        if diff > SUM_TOLERANCE_NS:
            problems.append(f"rank {row.get('rank')} step {row.get('step')}: parts sum to "
                            f"{sum(row[p] for p in parts)} ns, step_ns {row['step_ns']}")
        if not row["step_ns"] > 0:
            problems.append(f"rank {row.get('rank')} step {row.get('step')}: step_ns "
                            f"{row['step_ns']}")
    for rank in doc.get("ranks") or []:
        total = rank.get("breakdown") or {}
        if total and abs(sum(total.get(p, 0) for p in parts) - total.get("step_ns", 0)) > \
                SUM_TOLERANCE_NS * max(1, total.get("steps", 1)):
            problems.append(f"rank {rank.get('rank')} totals do not add up: {total}")
    kinds = {row.get("kind") for row in steps}
    expected = "gpu" if gpu else "cpu"
    if steps and kinds != {expected}:
        problems.append(f"breakdown kind {sorted(map(str, kinds))}, expected {expected!r}")
    if doc.get("problems"):
        problems_text = "; analysis problems: " + " | ".join(map(str, doc["problems"]))[:400]
    else:
        problems_text = ""
    unavailable = doc.get("unavailable") or {}
    if unavailable:
        problems.append(f"tables unavailable: {unavailable}")
    first = profiled[0] if profiled else {}
    figure = (f"{len(steps)} steps ({len(profiled)} profiled), max |sum - step| "
              f"{_int(worst)} ns")
    detail = (f"kind {sorted(map(str, kinds))}; step {_int(first.get('step'))}: "
              f"{_int(first.get('step_ns'))} ns = compute {_int(first.get('compute_only_ns'))} + "
              f"comm {_int(first.get('comm_only_ns'))} + overlap {_int(first.get('overlap_ns'))} + "
              f"memcpy {_int(first.get('memcpy_ns'))} + idle {_int(first.get('idle_ns'))}; "
              f"{done.elapsed:.1f} s{problems_text}")
    results.record(name, not problems, figure,
                   ("; ".join(problems) + f" ({detail})") if problems else detail)
    return doc


def _int(value):
    """Whole numbers without the '.0' JSON floats bring; anything else as it is."""
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    return value


def check_hta_columns(results: Results, wl: str, doc: dict | None) -> dict | None:
    name = f"{wl}.hta_columns"
    if doc is None:
        results.record(name, False, None, "no analysis document (see the breakdown check)")
        return None
    ranks = doc.get("ranks") or []
    if not ranks:
        results.record(name, False, None, "no rank in the analysis document")
        return None
    hta = ranks[0].get("hta_compatible") or {}
    columns = ("idle_us", "compute_us", "non_compute_us", "kernel_time_us")
    if any(hta.get(c) is None for c in columns):
        results.record(name, False, None, f"HTA-compatible columns missing: {hta}")
        return None
    diff = abs(hta["idle_us"] + hta["compute_us"] + hta["non_compute_us"] - hta["kernel_time_us"])
    ok = hta["kernel_time_us"] > 0 and diff <= 1.0
    results.record(name, ok, f"kernel time {hta['kernel_time_us']:.0f} us",
                   f"idle {hta['idle_us']:.1f} + compute {hta['compute_us']:.1f} + non-compute "
                   f"{hta['non_compute_us']:.1f} vs kernel time {hta['kernel_time_us']:.1f} us "
                   f"(|diff| {diff:.3f} us)")
    return hta


HTA_CODE = r"""
import json, sys
from hta.trace_analysis import TraceAnalysis
frame = TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
print("HTA_RESULT " + frame.to_json(orient="records"))
"""
HTA_COLUMNS = {"idle_us": "idle_time", "compute_us": "compute_time",
               "non_compute_us": "non_compute_time", "kernel_time_us": "kernel_time"}


def check_hta_match(results: Results, runner: Runner, wl: str, run: dict, ours: dict | None,
                    work: Path, cfg: dict) -> dict | None:
    name = f"{wl}.hta_match"
    if not importable_in_env("hta", runner.env):
        results.skip(name, "skipped: the hta package (holistictraceanalysis) is not importable "
                           "here; optional (docs/gpu-validation.md says how to install it offline)")
        return None
    if ours is None or not run.get("traces"):
        results.record(name, False, None, "nothing to compare: no trace or no HTA-compatible "
                                          "columns of ours")
        return None
    folder = work / f"hta-{wl}"
    folder.mkdir(exist_ok=True)
    for trace in run["traces"]:  # only the trace: HTA reads every *.json(.gz) it finds
        shutil.copy2(trace, folder / trace.name)
    done = runner.run(f"hta-{wl}", [sys.executable, "-c", HTA_CODE, str(folder)],
                      timeout=cfg["hta_timeout"])
    rows = None
    for line in done.stdout.splitlines():
        if line.startswith("HTA_RESULT "):
            rows = json.loads(line[len("HTA_RESULT "):])
    if done.rc != 0 or not rows:
        results.record(name, False, None, f"HTA failed on the trace: {done.failure()}")
        return None
    row = rows[0]
    theirs = {}
    for ours_key, prefix in HTA_COLUMNS.items():
        match = [k for k in row if k.startswith(prefix) and "pctg" not in k]
        theirs[ours_key] = float(row[match[0]]) if match else None
    kernel = theirs.get("kernel_time_us") or 0.0
    if not kernel or any(v is None for v in theirs.values()):
        results.record(name, False, None, f"HTA's row lacks the columns: {row}")
        return None
    deviations = {k: abs(ours[k] - theirs[k]) / kernel for k in HTA_COLUMNS}
    worst = max(deviations.values())
    results.record(name, worst <= HTA_TOLERANCE, f"max {worst:.3%} of kernel time",
                   "; ".join(f"{k}: ours {ours[k]:.1f} vs HTA {theirs[k]:.1f}"
                             for k in HTA_COLUMNS))
    return theirs

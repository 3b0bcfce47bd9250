"""The tracer's overhead per step on the GPU, as benchmarks/tracer_overhead.py defines it."""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from .config import REPO
from .results import Results
from .run_folder import read_jsonl
from .runner import Runner

# The step-stamping worker that benchmarks/tracer_overhead.py uses too: every arm runs through it.
PROBE = REPO / "benchmarks" / "overhead_probe.py"


def profiler_actions(steps: int, skip_first: int, wait: int, warmup: int, active: int,
                     repeat: int) -> list[str]:
    """torch.profiler.schedule's action for each step: none, warmup, record or save (the
    recording step whose end exports a trace)."""
    cycle = wait + warmup + active
    actions = []
    for k in range(steps + 1):
        if k < skip_first or (repeat and (k - skip_first) // cycle >= repeat):
            actions.append("none")
            continue
        mod = (k - skip_first) % cycle
        actions.append("none" if mod < wait else "warmup" if mod < wait + warmup else
                       "save" if mod == cycle - 1 else "record")
    return actions


OVERHEAD_ARMS = ("untraced", "traced", "profiler")


def overhead(results: Results, runner: Runner, work: Path, cfg: dict, gpu: bool,
             max_ratio: float | None = None) -> None:
    """The tracer's cost per step, the way benchmarks/tracer_overhead.py defines it (that
    benchmark is CPU-only and uses two ranks, which one GPU cannot host):

    * outside windows: traced / untraced median step time, over steps that neither record nor
      end by starting the profiler;
    * inside windows: traced / bare torch.profiler (same schedule and activities), over
      recording steps whose end does not export a trace.

    One DDP run (world size 1) per arm and repeat, the arms' order rotating between repeats;
    the first steps are left out. The windows fill the second half of each run back to back.
    """
    steps, discard = cfg["overhead_steps"], cfg["overhead_discard"]
    window = {"skip_first": steps // 2, "wait": 0, "warmup": 1, "active": 3, "repeat": 0}
    actions = profiler_actions(steps, **window)
    outside_steps = [k for k in range(discard, steps)
                     if actions[k] == "none" and actions[k + 1] == "none"]
    inside_steps = [k for k in range(discard, steps) if actions[k] in ("warmup", "record")]
    window_steps = [k for k in range(steps) if actions[k] != "none"]
    spec = ",".join(str(window[k]) for k in ("skip_first", "wait", "warmup", "active", "repeat"))
    tracer_window = [f"--{k.replace('_', '-')}={v}" for k, v in window.items()]
    script = ["workloads/ddp.py", "--steps", str(steps), *cfg["overhead_model"]]
    pooled = {arm: {"outside": [], "inside": []} for arm in OVERHEAD_ARMS}
    per_run = []
    names = ("overhead.outside_windows", "overhead.inside_windows")
    for repeat in range(cfg["overhead_pairs"]):
        shift = repeat % len(OVERHEAD_ARMS)
        for arm in OVERHEAD_ARMS[shift:] + OVERHEAD_ARMS[:shift]:
            out = work / f"overhead-{arm}-{repeat}.json"
            probe = [str(PROBE), "--out", str(out),
                     *(["--profiler", spec] if arm == "profiler" else []), *script]
            if arm == "traced":
                cmd = [sys.executable, "-m", "tracer.record", "--out", str(work), "--run-name",
                       f"overhead-{repeat}", *tracer_window, "--sample-hz",
                       cfg["overhead_sample_hz"], *probe]
            else:
                cmd = [sys.executable, *probe]
            done = runner.run(f"overhead-{arm}-{repeat}", cmd, timeout=cfg["overhead_timeout"])
            problem = None
            if done.rc != 0 or not out.is_file():
                problem = f"{arm} run {repeat} failed: {done.failure()}"
            else:
                stamps = json.loads(out.read_text())
                runner.logs[out.name] = json.dumps(stamps)
                ends = [stamps["start_ns"], *stamps["wall_ns"]]
                ms = [(b - a) / 1e6 for a, b in zip(ends, ends[1:])]
                if len(ms) != steps:
                    problem = f"{arm} run {repeat}: {len(ms)} step times for {steps} steps"
            if arm == "traced" and problem is None:
                records, _ = read_jsonl(work / f"overhead-{repeat}" / "rank0.steps.jsonl")
                marked = [k for k, r in enumerate(records) if r.get("in_profiler_window")]
                if marked != window_steps:
                    problem = (f"traced run {repeat}: steps {marked[:8]}... are marked "
                               f"in_profiler_window, the schedule says {window_steps[:8]}...")
            if problem:
                for name in names:
                    results.record(name, False, None, problem)
                return
            outside = [ms[k] for k in outside_steps]
            inside = [ms[k] for k in inside_steps]
            pooled[arm]["outside"] += outside
            pooled[arm]["inside"] += inside
            per_run.append(f"{arm}{repeat} {statistics.median(outside):.2f}/"
                           f"{statistics.median(inside):.2f}")

    def median(arm, kind):
        return statistics.median(pooled[arm][kind])

    where = (f"DDP {' '.join(cfg['overhead_model'])}, {steps} steps, world size 1 on "
             f"{'NCCL' if gpu else 'gloo'}, {cfg['overhead_pairs']} run(s) per arm; per-run "
             f"medians outside/inside (ms): {', '.join(per_run)}")
    noisy = "" if gpu else " (CPU mode: noisy, says little about a GPU)"
    outside_ratio = median("traced", "outside") / median("untraced", "outside")
    ok = math.isfinite(outside_ratio) and (max_ratio is None or outside_ratio <= max_ratio)
    bar = f"bar {max_ratio:g}x" if max_ratio is not None else "reported, not a pass bar"
    results.record(names[0], ok, f"{outside_ratio:.3f}x",
                   f"traced {median('traced', 'outside'):.3f} ms vs untraced "
                   f"{median('untraced', 'outside'):.3f} ms median step over "
                   f"{len(pooled['traced']['outside'])} steps; project goal < 1.01 "
                   f"(benchmarks/tracer_overhead.py), {bar}{noisy}; {where}")
    inside_ratio = median("traced", "inside") / median("profiler", "inside")
    results.record(names[1], math.isfinite(inside_ratio), f"{inside_ratio:.3f}x",
                   f"traced {median('traced', 'inside'):.3f} ms vs bare torch.profiler "
                   f"{median('profiler', 'inside'):.3f} ms median recording step (exports left "
                   f"out) over {len(pooled['traced']['inside'])} steps; untraced "
                   f"{median('untraced', 'inside'):.3f} ms; project goal < 1.03, reported, not "
                   f"a pass bar{noisy}; {where}")

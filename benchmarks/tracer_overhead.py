"""What the tracer costs a training step: DDP on CPU, 2 ranks, measured side by side.

    .venv/bin/python benchmarks/tracer_overhead.py [--repeats 5] [--steps 400] [--modes ...]

Kinds of run (modes) are launched in turn, `--repeats` times, interleaved so that machine noise
falls on all of them alike:

* bare:           torchrun workloads/ddp.py
* traced:         torchrun -m tracer.record --skip-first <steps - 30> ... (window at the very end)
* baseline:       traced with the tracer of another checkout (`--baseline CHECKOUT`): the same
                  workload and probe, to compare two commits' tracers side by side
* traced-window:  torchrun -m tracer.record with windows back to back (wait 0, warmup 1, active 3)
* profiler:       the same schedule with a bare torch.profiler and tensorboard_trace_handler,
                  with the tracer's default profiler options (operator input shapes recorded)
* profiler-no-shapes: the same without shapes (what recording the shapes costs a step)
* traced-window-memory, profiler-memory: traced-window and profiler with --profile-memory
                  (allocations and Python stacks recorded; `--profile-memory` runs them with
                  bare, traced-window, profiler and bare-again)
* bare-again:     bare once more, as a control: bare-again / bare is the noise floor
* hook:           traced with --ddp-bucket-hook (DDP's buckets are recorded ops)
* hook-no-issue:  hook with --no-issue-records: hook / hook-no-issue is what the issue-time
                  record costs a step (`--issue-records` runs bare, these two and bare-again)
* traced-no-fr:   traced with --no-flight-recorder: traced / traced-no-fr is what reading torch's
                  Flight Recorder costs a step (`--flight-recorder` runs bare, traced, this and
                  bare-again)
* no-capture:     traced with --no-capture: no slow-step watch, no capture thread (traced /
                  no-capture is what watching for slow steps, on by default, costs between
                  windows)
* capture:        traced with --max-captures 0: every step judged and the store read on each
                  pass of the capture thread, and no window opened whatever the machine does

and the bisecting modes, outside windows only: `off` is the tracer with every part switched off
(`--no-comms --no-sampler --no-profiler`, and the parts without an option switched off by the
probe, see `benchmarks/overhead_probe.py --tracer-off`); each `+part` switches one part back on
over `off`: `+comms`, `+sampler`, `+profiler` (its schedule and driver, window at the very end),
`+steps` (the step-end worker thread writing step records), `+memory` and `+scalars` (each with
the step-end worker, which reads RSS and writes the scalars: compare them with `+steps`).

Every run times its steps the same way (`benchmarks/overhead_probe.py`): a global optimizer-step
hook, registered after the tracer's, stamps the end of each step with the wall clock, the
process's CPU time and the main thread's CPU time, so a step includes whatever the tracer does at
its end. Printed per mode, as ratios of median step times against bare:

* outside windows: over steps where the profiler is idle (goal for traced / bare: < 1.01), wall
  time, the main thread's CPU time and the process's CPU time (every thread, the tracer's too);
* inside windows: traced-window / profiler, over recording steps whose end does not export a
  trace (goal < 1.03); with profiler-no-shapes also against a profiler without shapes, and
  profiler / profiler-no-shapes, what the shapes cost.

CPU time is the steadier figure while other work runs on the machine; the per-repeat wall
ratios and the noise floor say how far the wall figures can be trusted. `--count-calls` counts
the main thread's calls per step instead, which no load changes.

The first 10 steps (connection set-up, DDP's bucket rebuild) are left out everywhere. Each rank
is pinned to its own core (all its threads, the tracer's included).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracer.options.config import TracerConfig  # noqa: E402  (the tracer's default profiler options)

# Absolute: a `baseline` run starts in another checkout, whose tracer package it imports.
WORKLOAD = str(REPO / "workloads" / "ddp.py")
PROBE = str(REPO / "benchmarks" / "overhead_probe.py")
DISCARD = 10  # first steps left out of every comparison
WINDOW = dict(wait=0, warmup=1, active=3)
TRACER_SWITCHES = {"comms": "--no-comms", "sampler": "--no-sampler", "profiler": "--no-profiler"}
PROBE_SWITCHES = ("scalars", "memory", "steps")  # parts without an option of their own
# Bisecting modes: the parts switched on over a tracer with every part off.
PARTS_ON = {"off": (), "+comms": ("comms",), "+sampler": ("sampler",),
            "+profiler": ("profiler",), "+steps": ("steps",), "+memory": ("steps", "memory"),
            "+scalars": ("steps", "scalars")}
# Traced with DDP's buckets recorded, with and without their issue-time records.
ISSUE_MODES = {"hook": ["--ddp-bucket-hook"],
               "hook-no-issue": ["--ddp-bucket-hook", "--no-issue-records"]}
# Traced without reading torch's Flight Recorder (DDP's buckets then unrecorded between windows).
FR_MODES = {"traced-no-fr": ["--no-flight-recorder"]}
# Traced without the slow-step watch (on by default), and with it but no window it could open
# among the steps compared.
CAPTURE_MODES = {"no-capture": ["--no-capture"], "capture": ["--max-captures", "0"]}
# Windows back to back with --profile-memory: the tracer's, and a bare torch.profiler's with the
# same options (shapes, memory, Python stacks).
MEMORY_MODES = ("traced-window-memory", "profiler-memory")
MODES = ("bare", "traced", "baseline", *PARTS_ON, "traced-window", "profiler", "profiler-no-shapes",
         "bare-again", *ISSUE_MODES, *FR_MODES, *CAPTURE_MODES, *MEMORY_MODES)
WINDOW_MODES = ("traced-window", "profiler", "profiler-no-shapes",
                *MEMORY_MODES)  # windows back to back
DEFAULT_MODES = ("bare", "traced", "traced-window", "profiler", "bare-again")
CLOCKS = ("wall_ns", "thread_cpu_ns", "process_cpu_ns")
COUNT_SPAN = (20, 50)  # steps whose calls --count-calls counts: before any window of any mode


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs of each kind")
    p.add_argument("--steps", type=int, default=400, help="training steps per run")
    p.add_argument("--nproc", type=int, default=2, help="ranks per run")
    p.add_argument("--modes", nargs="+", choices=MODES, default=DEFAULT_MODES,
                   help="kinds of run (bare is always added)")
    p.add_argument("--bisect", action="store_true", help="run every mode, bisecting ones too")
    p.add_argument("--issue-records", action="store_true",
                   help="run bare, hook, hook-no-issue and bare-again: the issue-time record's "
                        "cost side by side")
    p.add_argument("--flight-recorder", action="store_true",
                   help="run bare, traced, traced-no-fr and bare-again: the Flight Recorder "
                        "part's cost side by side")
    p.add_argument("--profile-memory", action="store_true",
                   help="run bare, traced-window, profiler, traced-window-memory, "
                        "profiler-memory and bare-again: what --profile-memory costs in windows, "
                        "against a bare profiler with the same options")
    p.add_argument("--baseline", metavar="CHECKOUT",
                   help="also run `baseline`: traced with the tracer of another checkout of "
                        "this repository (say `git worktree add /tmp/old COMMIT`), side by side "
                        "with this one's")
    p.add_argument("--part-costs", action="store_true",
                   help="in traced runs, also time each hook of each tracer part on its "
                        "thread's CPU clock and print where the tracer's time goes")
    p.add_argument("--count-calls", action="store_true",
                   help="instead of timing, count the main thread's function calls per step "
                        f"over steps {COUNT_SPAN[0]}-{COUNT_SPAN[1]} of each mode, once (exact "
                        "whatever the machine's load)")
    return p.parse_args()


# ---- the driver ------------------------------------------------------------------------------
def window_skip_first(mode: str, steps: int) -> int:
    return DISCARD if mode in WINDOW_MODES else steps - 30


def command(mode: str, steps: int, nproc: int, stamps: str, out: str,
            count_calls: bool = False, part_costs: bool = False) -> list[str]:
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}"]
    probe = [PROBE, "--out", stamps, "--pin"] + (["--part-costs"] if part_costs else [])
    if count_calls:
        probe += ["--count-calls", f"{COUNT_SPAN[0]}:{COUNT_SPAN[1]}"]
    skip_first = str(window_skip_first(mode, steps))
    if mode in ("traced", "baseline"):
        head += ["-m", "tracer.record", "--out", out, "--skip-first", skip_first]
    elif mode in ISSUE_MODES or mode in FR_MODES or mode in CAPTURE_MODES:
        head += ["-m", "tracer.record", "--out", out, "--skip-first", skip_first]
        head += {**ISSUE_MODES, **FR_MODES, **CAPTURE_MODES}[mode]
    elif mode in ("traced-window", "traced-window-memory"):
        head += ["-m", "tracer.record", "--out", out, "--skip-first", skip_first, "--repeat",
                 "0"] + [f"--{k}={v}" for k, v in WINDOW.items()]
        head += ["--profile-memory"] if mode == "traced-window-memory" else []
    elif mode in ("profiler", "profiler-no-shapes", "profiler-memory"):
        probe += ["--profiler", f"{skip_first},{WINDOW['wait']},{WINDOW['warmup']},"
                                f"{WINDOW['active']},0"]
        if mode != "profiler-no-shapes" and TracerConfig().record_shapes:
            probe += ["--record-shapes"]
        probe += ["--profile-memory"] if mode == "profiler-memory" else []
    elif mode in PARTS_ON:
        on = PARTS_ON[mode]
        head += ["-m", "tracer.record", "--out", out, "--skip-first", skip_first]
        head += [flag for part, flag in TRACER_SWITCHES.items() if part not in on]
        off = [part for part in PROBE_SWITCHES if part not in on]
        if off:
            probe += ["--tracer-off", ",".join(off)]
    return head + probe + [WORKLOAD, "--steps", str(steps)]


def mode_actions(mode: str, steps: int) -> list:
    """torch.profiler.schedule's action for each step of a run of `mode` (NONE without one)."""
    from torch.profiler import ProfilerAction, schedule

    if mode in ("traced", "baseline", "+profiler", *WINDOW_MODES, *ISSUE_MODES, *FR_MODES,
                *CAPTURE_MODES):
        repeat = 0 if mode in WINDOW_MODES else 1
        fn = schedule(skip_first=window_skip_first(mode, steps), repeat=repeat, **WINDOW)
        return [fn(k) for k in range(steps + 1)]
    return [ProfilerAction.NONE] * (steps + 1)


def selected_periods(result: dict, mode: str, steps: int) -> dict[str, dict[str, list[float]]]:
    """Per clock, step times in ms, split into steps outside and inside profiler windows."""
    from torch.profiler import ProfilerAction

    acts = mode_actions(mode, steps)
    recording = (ProfilerAction.WARMUP, ProfilerAction.RECORD)
    periods = {clock: {"outside": [], "inside": [], "export": []} for clock in CLOCKS}
    for clock in CLOCKS:
        stamps = result[clock]
        for k in range(DISCARD, len(stamps)):
            ms = (stamps[k] - stamps[k - 1]) / 1e6
            # A step's time ends after the step-end work, where the profiler starts, stops,
            # exports.
            if acts[k] == ProfilerAction.NONE and acts[k + 1] == ProfilerAction.NONE:
                periods[clock]["outside"].append(ms)
            elif acts[k] in recording:
                periods[clock]["inside"].append(ms)
            elif acts[k] == ProfilerAction.RECORD_AND_SAVE:  # its end writes the window
                periods[clock]["export"].append(ms)
    # The tracer's own step end on the main thread (us), at the end of the same steps outside
    # windows.
    step_end = result.get("tracer_step_end_ns") or []
    periods["step_end_us"] = [step_end[k] / 1e3 for k in range(DISCARD, min(len(step_end),
                                                                            len(acts) - 1))
                              if acts[k] == ProfilerAction.NONE
                              and acts[k + 1] == ProfilerAction.NONE]
    return periods


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run_all(args, modes: list[str], work: str):
    """Every mode `args.repeats` times, interleaved; pooled and per-repeat step times."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKTRACE_")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    pooled = {m: {c: {"outside": [], "inside": [], "export": []} for c in CLOCKS}
              for m in modes}
    for m in modes:
        pooled[m]["step_end_us"] = []
    per_repeat = {m: [] for m in modes}
    threads = {m: {} for m in modes}
    for repeat in range(args.repeats):
        for mode in modes:
            stamps = os.path.join(work, f"{mode}.{repeat}")
            started = time.monotonic()
            # `python -m tracer.record` imports the tracer of the folder it starts in
            result = subprocess.run(command(mode, args.steps, args.nproc, stamps, work,
                                            part_costs=args.part_costs),
                                    cwd=args.baseline if mode == "baseline" else REPO, env=env,
                                    capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit(f"{mode} run failed:\n{result.stderr[-3000:]}")
            probe = json.loads(Path(stamps + ".rank0").read_text())
            periods = selected_periods(probe, mode, args.steps)
            for clock in CLOCKS:
                for kind in ("outside", "inside", "export"):
                    pooled[mode][clock][kind] += periods[clock][kind]
            pooled[mode]["step_end_us"] += periods["step_end_us"]
            for key, (ns, calls) in (probe.get("part_costs") or {}).items():
                costs = pooled[mode].setdefault("part_costs", {}).setdefault(key, [0, 0, 0])
                costs[0] += ns
                costs[1] += calls
                costs[2] += len(probe["wall_ns"])
            per_repeat[mode].append({kind: median_or_none(periods["wall_ns"][kind])
                                     for kind in ("outside", "inside")})
            first = probe["threads_from_step"]
            measured = len(probe["wall_ns"]) - first
            seconds = (probe["wall_ns"][-1] - probe["wall_ns"][first - 1]) / 1e9
            for name, figures in probe["threads"].items():
                cpu_us, switches = threads[mode].get(name.split("[")[0], (0.0, 0.0))
                threads[mode][name.split("[")[0]] = (
                    cpu_us + figures["cpu_ns"] / 1e3 / measured / args.repeats,
                    switches + figures["voluntary"] / seconds / args.repeats)
            outside = per_repeat[mode][-1]["outside"]
            inside = per_repeat[mode][-1]["inside"]
            print(f"repeat {repeat} {mode:>13}: {time.monotonic() - started:5.1f} s, median step "
                  f"outside {outside or 0:.3f} ms, inside {inside or 0:.3f} ms", flush=True)
    return pooled, per_repeat, threads


def count_calls(args, modes: list[str], work: str) -> None:
    """Each mode once: the main thread's calls per step, and what each mode adds to bare."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKTRACE_")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    per_step = {}
    for mode in modes:
        stamps = os.path.join(work, f"{mode}.calls")
        result = subprocess.run(command(mode, args.steps, args.nproc, stamps, work, True),
                                cwd=args.baseline if mode == "baseline" else REPO, env=env,
                                capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"{mode} run failed:\n{result.stderr[-3000:]}")
        calls = json.loads(Path(stamps + ".rank0").read_text())["calls"]
        per_step[mode] = {name: n / calls["steps"] for name, n in calls["counts"].items()}
    bare = per_step["bare"]
    print(f"\nmain thread, function calls per step (Python and C), rank 0, steps "
          f"{COUNT_SPAN[0]}-{COUNT_SPAN[1]}:")
    for mode in modes:
        calls = per_step[mode]
        added = sorted(((n - bare.get(name, 0), name) for name, n in calls.items()),
                       reverse=True)
        top = ", ".join(f"{name.replace(str(REPO) + '/', '')} {n:+.1f}"
                        for n, name in added[:4] if n >= 0.5)
        total = sum(calls.values())
        print(f"{mode:>13}: {total:7.1f} ({total - sum(bare.values()):+.1f})"
              f"{'; most added: ' + top if top else ''}")


def report(pooled, per_repeat, threads, modes: list[str]) -> None:
    def med(mode, clock, kind="outside"):
        return median_or_none(pooled[mode][clock][kind])

    def paired(a_mode, b_mode, kind="outside"):
        return ", ".join(f"{a[kind] / b[kind]:.3f}" for a, b in
                         zip(per_repeat[a_mode], per_repeat[b_mode]) if a[kind] and b[kind])

    print("\noutside windows, median step (ms) and ratio to bare; CPU: main thread, process")
    print(f"{'mode':>13} {'steps':>6} {'wall':>8} {'ratio':>7} {'main CPU':>9} {'ratio':>7} "
          f"{'proc CPU':>9} {'ratio':>7}   wall ratio per repeat")
    bare = {clock: med("bare", clock) for clock in CLOCKS}
    for mode in modes:
        if mode in WINDOW_MODES:
            continue
        cells = []
        for clock in CLOCKS:
            value = med(mode, clock)
            cells.append(f"{value:9.3f} {value / bare[clock]:7.3f}")
        print(f"{mode:>13} {len(pooled[mode]['wall_ns']['outside']):>6}{''.join(cells)}   "
              f"{paired(mode, 'bare')}")
    if all(mode in modes for mode in ISSUE_MODES):
        issue_report(pooled, per_repeat)
    if "traced" in modes and "traced-no-fr" in modes:
        flight_report(pooled, per_repeat)
    for yardstick_mode in ("profiler", "profiler-no-shapes"):
        if "traced-window" in modes and yardstick_mode in modes:
            inside_report(pooled, paired, "traced-window", yardstick_mode)
    if "profiler" in modes and "profiler-no-shapes" in modes:
        inside_report(pooled, paired, "profiler", "profiler-no-shapes")
    if all(mode in modes for mode in MEMORY_MODES):
        memory_report(pooled, paired, modes)
    print("\nrank 0's threads from step 10 on: CPU per step (us; Python threads from their own "
          "CPU clocks, the others from /proc in 10 ms ticks, so their small figures are coarse) "
          "/ voluntary context switches (wake-ups and GIL waits) per second")
    for mode in modes:
        shown = ", ".join(f"{name} {us:.0f}/{switches:.0f}" for name, (us, switches) in
                          sorted(threads[mode].items(), key=lambda kv: -kv[1][0])
                          if us >= 1 or switches >= 1)
        print(f"{mode:>13}: {shown}")
    tracer_cpu_report(pooled, threads, modes)
    part_costs_report(pooled, modes)


def part_costs_report(pooled, modes: list[str]) -> None:
    """Per traced mode run with --part-costs: CPU per step (the whole run, its window
    included) and per call of each hook, largest first."""
    for mode in modes:
        costs = pooled[mode].get("part_costs")
        if not costs:
            continue
        print(f"\n{mode}: where the tracer's CPU goes, rank 0, every step of the runs (us per "
              f"step, us per call, calls); worker.pass holds the hooks of the worker's passes")
        for key, (ns, calls, steps) in sorted(costs.items(), key=lambda kv: -kv[1][0]):
            if calls:
                print(f"  {key:>32} {ns / 1e3 / steps:8.1f} {ns / 1e3 / calls:9.1f} {calls:7d}")


def tracer_cpu_report(pooled, threads, modes: list[str]) -> None:
    """Per traced mode: the tracer's step end on the main thread (median over steps outside
    windows) and its own threads' CPU per step, against a bare step's main-thread CPU."""
    bare_cpu_us = median_or_none(pooled["bare"]["thread_cpu_ns"]["outside"]) * 1e3
    print("\nthe tracer's CPU per step, rank 0: its step end on the main thread (median outside "
          "windows) + its threads (ranktrace-*), as a share of a bare step's main-thread CPU "
          f"({bare_cpu_us:.0f} us)")
    for mode in modes:
        step_end = median_or_none(pooled[mode]["step_end_us"])
        if step_end is None:
            continue
        own = {name: us for name, (us, _) in threads[mode].items()
               if name.startswith("ranktrace-") and name != "ranktrace-sigterm"}
        total = step_end + sum(own.values())
        parts = ", ".join(f"{name} {us:.0f}" for name, us in sorted(own.items()))
        wall_us = median_or_none(pooled[mode]["wall_ns"]["outside"]) * 1e3
        print(f"{mode:>13}: step end {step_end:.1f} us + {parts} = {total:.0f} us "
              f"({total / bare_cpu_us * 100:.2f}%; {total / wall_us * 100:.2f}% of its "
              f"median step's wall time, {wall_us / 1e3:.2f} ms)")


def inside_report(pooled, paired, mode: str, yardstick_mode: str) -> None:
    """`mode` against `yardstick_mode` over recording steps: pooled medians, wall and CPU."""
    def med(m, clock):
        return median_or_none(pooled[m][clock]["inside"])

    inside, yardstick = med(mode, "wall_ns"), med(yardstick_mode, "wall_ns")
    cpu = med(mode, "thread_cpu_ns") / med(yardstick_mode, "thread_cpu_ns")
    goal = "goal < 1.03; " if (mode, yardstick_mode) in (
        ("traced-window", "profiler"), ("traced-window-memory", "profiler-memory")) else ""
    print(f"\ninside windows: {mode} / {yardstick_mode} = {inside / yardstick:.4f} "
          f"({goal}{inside:.3f} / {yardstick:.3f} ms, {len(pooled[mode]['wall_ns']['inside'])} "
          f"steps); per repeat {paired(mode, yardstick_mode, 'inside')}; main CPU ratio "
          f"{cpu:.4f}")


def memory_report(pooled, paired, modes: list[str]) -> None:
    """--profile-memory: the tracer's windows against a bare profiler with the same options
    (the goal), against its own windows without it (what the option costs a recording step),
    and what a window's last step, which writes the window, costs over a recording step."""
    for mode, yardstick_mode in (("traced-window-memory", "profiler-memory"),
                                 ("traced-window-memory", "traced-window"),
                                 ("profiler-memory", "profiler")):
        if yardstick_mode in modes:
            inside_report(pooled, paired, mode, yardstick_mode)
    print("\nthe step that writes each window (ms, median over windows), and what it adds to a "
          "recording step: the trace's export (and, traced with --profile-memory, torch's "
          "memory profiler over the window)")
    for mode in ("traced-window", "profiler", *MEMORY_MODES):
        if mode not in modes:
            continue
        export = median_or_none(pooled[mode]["wall_ns"]["export"])
        inside = median_or_none(pooled[mode]["wall_ns"]["inside"])
        if export is None or inside is None:
            continue
        print(f"{mode:>21}: {export:8.2f} ms, +{export - inside:.2f} ms over a recording step "
              f"({len(pooled[mode]['wall_ns']['export'])} windows)")


def issue_report(pooled, per_repeat) -> None:
    """hook / hook-no-issue: per repeat (the two ran back to back), and their step-time
    difference as a share of a step."""
    ratios = [a["outside"] / b["outside"] for a, b in
              zip(per_repeat["hook"], per_repeat["hook-no-issue"]) if a["outside"] and b["outside"]]
    if not ratios:
        return
    cost = {}
    for clock in ("wall_ns", "thread_cpu_ns"):
        with_issue = median_or_none(pooled["hook"][clock]["outside"])
        without = median_or_none(pooled["hook-no-issue"][clock]["outside"])
        cost[clock] = (with_issue - without, (with_issue / without - 1) * 100)
    print(f"\nissue-time records, outside windows: hook / hook-no-issue per repeat: median "
          f"{statistics.median(ratios):.4f} (min {min(ratios):.4f}, max {max(ratios):.4f}, "
          f"{len(ratios)} repeats); pooled medians differ by {cost['wall_ns'][0] * 1e3:+.1f} us "
          f"wall ({cost['wall_ns'][1]:+.2f}% of a step), {cost['thread_cpu_ns'][0] * 1e3:+.1f} "
          f"us main-thread CPU ({cost['thread_cpu_ns'][1]:+.2f}%); goal <= 0.5%")


def flight_report(pooled, per_repeat) -> None:
    """traced / traced-no-fr and each against bare: per repeat (run back to back), median with
    its spread, and the pooled medians' difference as a share of a bare step."""
    def per(a_mode, b_mode):
        ratios = [a["outside"] / b["outside"] for a, b in
                  zip(per_repeat[a_mode], per_repeat[b_mode]) if a["outside"] and b["outside"]]
        return (f"median {statistics.median(ratios):.4f} (min {min(ratios):.4f}, max "
                f"{max(ratios):.4f}, {len(ratios)} repeats)") if ratios else "no steps"

    print("\nFlight Recorder, outside windows, wall ratios per repeat:")
    for a_mode, b_mode in (("traced", "bare"), ("traced-no-fr", "bare"),
                           ("traced", "traced-no-fr"), ("bare-again", "bare")):
        if a_mode in per_repeat and b_mode in per_repeat:
            print(f"  {a_mode:>12} / {b_mode:<12} {per(a_mode, b_mode)}")
    bare = {clock: median_or_none(pooled["bare"][clock]["outside"])
            for clock in ("wall_ns", "thread_cpu_ns")}
    for clock, label in (("wall_ns", "wall"), ("thread_cpu_ns", "main-thread CPU")):
        with_fr = median_or_none(pooled["traced"][clock]["outside"])
        without = median_or_none(pooled["traced-no-fr"][clock]["outside"])
        print(f"  pooled medians, {label}: traced - traced-no-fr = "
              f"{(with_fr - without) * 1e3:+.1f} us ({(with_fr - without) / bare[clock] * 100:+.2f}"
              f"% of a bare step); goal <= 1%")


def main() -> None:
    args = parse_args()
    modes = list(MODES) if args.bisect else ["bare"] + [m for m in args.modes if m != "bare"]
    if args.baseline:
        modes += [] if "baseline" in modes else ["baseline"]
    else:
        modes = [m for m in modes if m != "baseline"]
    if args.issue_records:
        modes = ["bare", *ISSUE_MODES, "bare-again"]
    if args.flight_recorder:
        modes = ["bare", "traced", *FR_MODES, "bare-again"]
    if args.profile_memory:
        modes = ["bare", "traced-window", "profiler", *MEMORY_MODES, "bare-again"]
    with tempfile.TemporaryDirectory(prefix="tracer-overhead-") as work:
        print(f"# {datetime.date.today()} {os.cpu_count()} CPUs, {args.nproc} ranks, "
              f"{args.steps} steps per run, {args.repeats} runs of each kind, load average "
              f"{os.getloadavg()[0]:.2f} at the start", flush=True)
        for mode in modes:
            print(f"# {mode}: " + " ".join(command(mode, args.steps, args.nproc, "STAMPS", "OUT")),
                  flush=True)
        if args.count_calls:
            count_calls(args, modes, work)
            return
        pooled, per_repeat, threads = run_all(args, modes, work)
    print(f"load average {os.getloadavg()[0]:.2f} at the end (other work on the machine "
          "shows up in the noise floor, bare-again / bare)")
    report(pooled, per_repeat, threads, modes)


if __name__ == "__main__":
    main()

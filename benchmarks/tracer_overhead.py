"""What the tracer costs a training step: DDP on CPU, 2 ranks, measured side by side.

    .venv/bin/python benchmarks/tracer_overhead.py [--repeats 5] [--steps 200]

Four kinds of run are launched in turn, `--repeats` times, interleaved so that machine noise
falls on all of them alike:

* bare:           torchrun workloads/ddp.py
* traced:         torchrun -m tracer.record --skip-first <steps - 30> ... (window at the very end)
* traced-window:  torchrun -m tracer.record with windows back to back (wait 0, warmup 1, active 3)
* profiler:       the same schedule with a bare torch.profiler and tensorboard_trace_handler
* bare-again:     bare once more, as a control: bare-again / bare is the noise floor

Every run times its steps the same way: a global optimizer-step hook, registered after the
tracer's, stamps the end of each step, so a step's time includes whatever the tracer does at its
end. Two ratios of median step times are printed:

* outside windows: traced / bare, over steps where the profiler is idle (goal < 1.01);
* inside windows: traced-window / profiler, over recording steps whose end does not export a
  trace (goal < 1.03).

Also printed: the noise floor, bare-again / bare, and each ratio per repeat: on a shared 2-core
machine they spread by several percent, so read the goals against the noise floor.

The first 10 steps (connection set-up, DDP's bucket rebuild) are left out everywhere. Each rank
is pinned to its own core (all its threads, the tracer's included).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = "workloads/ddp.py"
DISCARD = 10  # first steps left out of every comparison
WINDOW = dict(wait=0, warmup=1, active=3)
MODES = ("bare", "traced", "traced-window", "profiler", "bare-again")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="runs of each kind")
    p.add_argument("--steps", type=int, default=400, help="training steps per run")
    p.add_argument("--nproc", type=int, default=2, help="ranks per run")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--stamps", help=argparse.SUPPRESS)
    p.add_argument("--skip-first", type=int, default=DISCARD, help=argparse.SUPPRESS)
    p.add_argument("workload", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p.parse_args()


# ---- inside each rank ------------------------------------------------------------------------
def pin_to_one_core(local_rank: int) -> None:
    """Every thread of this rank (the tracer's included) on one core, a different one per rank.

    Left to the scheduler, where two ranks' threads land on two cores changes a step's time by
    up to half from one run to the next, which would drown a 1% difference.
    """
    cores = sorted(os.sched_getaffinity(0))
    core = {cores[local_rank % len(cores)]}
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), core)
        except OSError:
            pass  # a thread that just ended


def run_worker(args) -> None:
    """Run the workload with a step-end stamp (and for `profiler`, a bare torch.profiler)."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    rank = int(os.environ.get("RANK", "0"))
    pin_to_one_core(int(os.environ.get("LOCAL_RANK", "0")))
    profile = None
    if args.worker == "profiler":
        from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler

        trace_dir = tempfile.mkdtemp(prefix="bare-profiler-")
        profile = torch.profiler.profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(skip_first=args.skip_first, repeat=0, **WINDOW),
            on_trace_ready=tensorboard_trace_handler(trace_dir, worker_name=f"rank{rank}",
                                                     use_gzip=True))
        profile.start()
    stamps: list[int] = []

    def on_step(optimizer, _args, _kwargs):
        if profile is not None:
            profile.step()
        stamps.append(time.perf_counter_ns())

    register_optimizer_step_post_hook(on_step)
    script, *script_args = args.workload
    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        if profile is not None:
            profile.stop()
        Path(f"{args.stamps}.rank{rank}").write_text(json.dumps(stamps))


# ---- the driver ------------------------------------------------------------------------------
def command(mode: str, steps: int, nproc: int, stamps: str, out: str) -> list[str]:
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}"]
    skip_first = DISCARD
    if mode == "traced":
        skip_first = steps - 30
        head += ["-m", "tracer.record", "--out", out, "--skip-first", str(skip_first)]
    elif mode == "traced-window":
        head += ["-m", "tracer.record", "--out", out, "--skip-first", str(DISCARD), "--repeat",
                 "0"] + [f"--{k}={v}" for k, v in WINDOW.items()]
    return head + [__file__, "--worker", mode, "--stamps", stamps, "--skip-first",
                   str(skip_first), WORKLOAD, "--steps", str(steps)]


def actions(skip_first: int, repeat: int, steps: int):
    from torch.profiler import schedule

    fn = schedule(skip_first=skip_first, repeat=repeat, **WINDOW)
    return [fn(k) for k in range(steps + 1)]


def selected_periods(stamps: list[int], mode: str, steps: int) -> dict[str, list[float]]:
    """Step times in ms, split into steps outside and inside profiler windows."""
    from torch.profiler import ProfilerAction

    if mode == "traced":
        acts = actions(steps - 30, 1, steps)
    elif mode in ("bare", "bare-again"):
        acts = [ProfilerAction.NONE] * (steps + 1)
    else:
        acts = actions(DISCARD, 0, steps)
    recording = (ProfilerAction.WARMUP, ProfilerAction.RECORD)
    periods = {"outside": [], "inside": []}
    for k in range(DISCARD, len(stamps)):
        ms = (stamps[k] - stamps[k - 1]) / 1e6
        # A step's time ends after the step-end work, where the profiler starts, stops, exports.
        if acts[k] == ProfilerAction.NONE and acts[k + 1] == ProfilerAction.NONE:
            periods["outside"].append(ms)
        elif acts[k] in recording:
            periods["inside"].append(ms)
    return periods


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args)
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKTRACE_")}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    pooled = {mode: {"outside": [], "inside": []} for mode in MODES}
    per_repeat = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="tracer-overhead-") as work:
        print(f"# {datetime.date.today()} {os.cpu_count()} CPUs, {args.nproc} ranks, "
              f"{args.steps} steps per run, {args.repeats} runs of each kind, load average "
              f"{os.getloadavg()[0]:.2f} at the start", flush=True)
        for mode in MODES:
            print(f"# {mode}: " + " ".join(command(mode, args.steps, args.nproc, "STAMPS", "OUT")),
                  flush=True)
        for repeat in range(args.repeats):
            for mode in MODES:
                stamps = os.path.join(work, f"{mode}.{repeat}")
                started = time.monotonic()
                result = subprocess.run(command(mode, args.steps, args.nproc, stamps, work),
                                        cwd=REPO, env=env, capture_output=True, text=True)
                if result.returncode != 0:
                    sys.exit(f"{mode} run failed:\n{result.stderr[-3000:]}")
                periods = selected_periods(json.loads(Path(stamps + ".rank0").read_text()),
                                           mode, args.steps)
                for kind in periods:
                    pooled[mode][kind] += periods[kind]
                per_repeat[mode].append({k: statistics.median(v) if v else None
                                         for k, v in periods.items()})
                print(f"repeat {repeat} {mode:>13}: {time.monotonic() - started:5.1f} s, median "
                      f"step outside {per_repeat[mode][-1]['outside'] or 0:.3f} ms, inside "
                      f"{per_repeat[mode][-1]['inside'] or 0:.3f} ms", flush=True)

    print(f"load average {os.getloadavg()[0]:.2f} at the end (other work on the machine "
          "shows up in the noise floor)")

    def wall(mode, kind):
        return statistics.median(pooled[mode][kind])

    def ratio(a_mode, b_mode, kind):
        paired = sorted(a[kind] / b[kind] for a, b in zip(per_repeat[a_mode], per_repeat[b_mode]))
        return wall(a_mode, kind) / wall(b_mode, kind), paired

    outside, outside_runs = ratio("traced", "bare", "outside")
    control, control_runs = ratio("bare-again", "bare", "outside")
    inside, inside_runs = ratio("traced-window", "profiler", "inside")
    print(f"median step, outside windows: bare {wall('bare', 'outside'):.3f} ms, "
          f"traced {wall('traced', 'outside'):.3f} ms ({len(pooled['traced']['outside'])} steps)")
    print(f"median step, inside windows: profiler {wall('profiler', 'inside'):.3f} ms, traced "
          f"{wall('traced-window', 'inside'):.3f} ms ({len(pooled['traced-window']['inside'])} steps)")
    print(f"noise floor: bare-again / bare = {control:.4f}; "
          f"per repeat {', '.join(f'{r:.3f}' for r in control_runs)}")
    print(f"outside windows: traced / bare = {outside:.4f} (goal < 1.01); "
          f"per repeat {', '.join(f'{r:.3f}' for r in outside_runs)}")
    print(f"inside windows: traced / torch.profiler = {inside:.4f} (goal < 1.03); "
          f"per repeat {', '.join(f'{r:.3f}' for r in inside_runs)}")


if __name__ == "__main__":
    main()

"""What the slow-step watch (on by default) costs between windows, on CPU clocks that a loaded
machine does not change: the capture thread's pass (judging the steps that ended since the last
one, looking for asks, reading the request list) and the step clock's one more append on the
training thread, in one process, measured side by side.

    .venv/bin/python benchmarks/capture_watch_cost.py [--step-ms 1 10] [--passes 300]
        [--repeats 5]

Each pass gets the end times of PERIOD_S worth of steps of --step-ms (steady, with a hiccup
now and then), as the capture thread does every 0.1 s; the request list is read from a local
torchrun-style TCPStore (as a multi-rank run does) or from files (`--files`). Prints, per step
time, the median and spread over repeats of the thread's CPU per step (us) and per pass, and
that CPU as a share of a step. The training thread's share: one deque append per step (timed
here against a loop without it).
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracer.capture.capture_requests import StoreLog  # noqa: E402
from tracer.capture.capture_watch import PERIOD_S, CaptureWatch  # noqa: E402
from tracer.options.config import TracerConfig  # noqa: E402
from tracer.probes.profiler import ProfilerDriver  # noqa: E402
from tracer.session.run_folder import LaunchInfo  # noqa: E402


def watch_cpu_per_step(step_ms: float, passes: int, use_store: bool) -> tuple[float, float]:
    """(us of the capture thread's CPU per step, us per pass) over `passes` passes."""
    import torch.distributed as dist

    with tempfile.TemporaryDirectory() as folder:
        config = TracerConfig()
        driver = ProfilerDriver(config, folder, 0, use_cuda=False)
        driver.start()
        ends: collections.deque = collections.deque()
        watch = CaptureWatch(config, LaunchInfo(rank=0, world_size=1), folder, driver,
                             lambda record: None, ends)
        if use_store:
            server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
            watch.store = watch.log = StoreLog(server, "bench", 0)
        per_pass = max(1, round(PERIOD_S * 1e3 / step_ms))
        t, step, spent = time.time_ns(), 0, 0
        for _ in range(passes):
            for _step in range(per_pass):
                hiccup = 5 if step % 97 == 0 else 1  # one slow step now and then: noise
                t += int(step_ms * hiccup * 1e6)
                ends.append(t)
                step += 1
            driver._step = step
            started = time.thread_time_ns()
            watch.run_pass()
            spent += time.thread_time_ns() - started
        driver.stop()
        return spent / 1e3 / step, spent / 1e3 / passes


def append_ns_per_step(steps: int = 200_000) -> float:
    """The training thread's extra cost of one more end-time queue: a loop with the append
    against one without it, ns a step."""
    ends: collections.deque = collections.deque()
    queues_one, queues_two = (collections.deque(),), (collections.deque(), ends)
    timings = []
    for queues in (queues_one, queues_two):
        started = time.thread_time_ns()
        for step in range(steps):
            for queue in queues:
                queue.append(step)
        timings.append((time.thread_time_ns() - started) / steps)
        for queue in queues:
            queue.clear()
    return timings[1] - timings[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-ms", type=float, nargs="+", default=[1.0, 10.0])
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--files", action="store_true", help="the list in files, not a store")
    args = parser.parse_args()
    import os

    print(f"# load average {os.getloadavg()[0]:.2f}; {args.passes} passes of "
          f"{PERIOD_S} s; list in {'files' if args.files else 'a TCPStore'}")
    for step_ms in args.step_ms:
        runs = [watch_cpu_per_step(step_ms, args.passes, not args.files)
                for _ in range(args.repeats)]
        per_step = [r[0] for r in runs]
        per_pass = [r[1] for r in runs]
        median = statistics.median(per_step)
        print(f"{step_ms:g} ms steps: capture thread {median:.2f} us CPU a step "
              f"({min(per_step):.2f}-{max(per_step):.2f}), {statistics.median(per_pass):.0f} us "
              f"a pass; {median / (step_ms * 1e3) * 100:.3f}% of a step")
    appends = [append_ns_per_step() for _ in range(args.repeats)]
    print(f"training thread: one more append a step, {statistics.median(appends):.0f} ns "
          f"({min(appends):.0f}-{max(appends):.0f})")


if __name__ == "__main__":
    main()

"""The overhead measurement's step-stamping worker.

    python probe.py OUT.json PROFILER SCRIPT [ARGS]


It runs as a script (under `python -m tracer.record` for the traced arm), so it imports nothing
from this package.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.profiler import ProfilerActivity, schedule, tensorboard_trace_handler


def main(argv: list[str]) -> None:
    """Run SCRIPT as __main__, stamping every step end into OUT.json.

    Every arm of the overhead measurement runs through here, so that untraced, traced and
    bare-profiler step times are taken by the same optimizer-step hook. Registered after the
    tracer's hook, it counts the tracer's step-end work in the step. PROFILER is "-" or
    "skip_first,wait,warmup,active,repeat": a bare torch.profiler with that schedule (CPU and, on
    a GPU, CUDA activities, gzipped traces), stepped at each step end, the tracer's yardstick.
    """
    out, profiler_spec, script, *args = argv
    profile = None
    if profiler_spec != "-":
        skip_first, wait, warmup, active, repeat = (int(v) for v in profiler_spec.split(","))
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        profile = torch.profiler.profile(
            activities=activities,
            schedule=schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active,
                              repeat=repeat),
            on_trace_ready=tensorboard_trace_handler(out + ".traces", worker_name="rank0",
                                                     use_gzip=True))
        profile.start()
    stamps: list[int] = []

    def on_step(*_):
        if profile is not None:
            profile.step()
        stamps.append(time.perf_counter_ns())

    register_optimizer_step_post_hook(on_step)
    start = time.perf_counter_ns()
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        if profile is not None:
            profile.stop()
        Path(out).write_text(json.dumps({"start_ns": start, "step_end_ns": stamps}))


if __name__ == "__main__":
    main(sys.argv[1:])

"""What the tracer's collective hooks cost the training thread per collective, side by side.

    .venv/bin/python benchmarks/collective_cost.py [--ops 2000] [--repeats 7] [--numel 4]

One process, a gloo group of one rank, `dist.all_reduce` of a small tensor from Python (the
path of a collective that a script, FSDP or a DDP comm hook issues through torch.distributed):
phases alternate without the comms recorder's hooks and with them (tracer.comms.CommsRecorder
installed, its records written to a temporary folder, the issue-time record on, as by default),
so machine noise falls on both alike. Each phase times every call with the calling thread's CPU
clock; the recorder's drain, which the step-end worker runs, is timed apart, per op. Prints the
medians over repeats of the per-call medians, their spread, and the hooks' cost per collective.

DDP's own gradient all-reduces are issued by its C++ reducer, not through these functions: they
cost the training thread nothing here (torch's Flight Recorder, which records them, is torch's
own and on untraced as well); the step-end worker reads them (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tracer.comms.recorder import CommsRecorder  # noqa: E402
from tracer.parts.record_files import CommsWriter  # noqa: E402


def call_cpu_ns(ops: int, tensor) -> list[int]:
    import torch.distributed as dist

    spent = []
    for _ in range(ops):
        started = time.thread_time_ns()
        dist.all_reduce(tensor)
        spent.append(time.thread_time_ns() - started)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=2000, help="collectives per phase")
    parser.add_argument("--repeats", type=int, default=7, help="phases of each kind")
    parser.add_argument("--numel", type=int, default=4, help="elements of the float32 tensor")
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1)
    tensor = torch.ones(args.numel)
    call_cpu_ns(200, tensor)  # warm up the group
    bare, hooked, drained = [], [], []
    with tempfile.TemporaryDirectory() as folder:
        writer = CommsWriter(os.path.join(folder, "rank0.comms.jsonl"), "comms")
        recorder = CommsRecorder(writer, lambda: 0, False)
        for _ in range(args.repeats):
            bare.append(statistics.median(call_cpu_ns(args.ops, tensor)) / 1e3)
            recorder.install()
            hooked.append(statistics.median(call_cpu_ns(args.ops, tensor)) / 1e3)
            recorder.uninstall()
            started = time.thread_time_ns()
            recorder.drain(wait=True)
            drained.append((time.thread_time_ns() - started) / args.ops / 1e3)
        recorder.close()
        writer.close()
        assert recorder.error is None and recorder.ops == args.ops * args.repeats, recorder.error
    dist.destroy_process_group()
    extra = [h - b for h, b in zip(hooked, bare)]
    print(f"dist.all_reduce of {args.numel} float32, gloo, one rank; calling thread's CPU per "
          f"call, medians of {args.repeats} phases of {args.ops} calls each:")
    for name, values in (("without hooks", bare), ("with hooks", hooked),
                         ("hooks' cost per collective", extra),
                         ("drain per op (the worker's)", drained)):
        print(f"{name:>28}: {statistics.median(values):7.2f} us (min {min(values):.2f}, "
              f"max {max(values):.2f})")


if __name__ == "__main__":
    main()

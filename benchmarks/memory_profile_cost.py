"""What --profile-memory costs a profiler window, measured in one process, side by side.

workloads/ddp.py's model (residual MLP blocks, Adam, one process, no DDP) trains under
torch.profiler in windows of `--active` steps (one warm-up step each), taking turns between:

* `shapes`: the tracer's default options (operator shapes recorded);
* `memory`: what --profile-memory records (shapes, allocations and frees, Python stacks).

For each window, on the training thread's CPU clock: the median recording step, the export of the
trace (gzip included, as the tracer writes it), and, for `memory` windows, torch's memory profiler
over the window as the tracer runs it (tracer.probes.memory_profile.window_record). Medians over
`--windows` windows of each kind with their 10th-90th percentiles; CPU time, so that the machine's
other users are not counted.

    python benchmarks/memory_profile_cost.py --windows 7 [--active 3] [--layers 4]
"""

import argparse
import gzip
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from tracer.probes.memory_profile import window_record  # noqa: E402
from workloads.common import build_model  # noqa: E402

OPTIONS = {"shapes": {"record_shapes": True},
           "memory": {"record_shapes": True, "profile_memory": True, "with_stack": True}}


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    low, high = ordered[int(len(ordered) * 0.1)], ordered[min(len(ordered) - 1,
                                                              int(len(ordered) * 0.9))]
    return f"{statistics.median(values):8.1f} ({low:.1f}-{high:.1f})"


def one_window(kind: str, step, active: int, folder: str) -> dict:
    """One window of `kind`: CPU ms per recording step, of the export, of the memory profiler."""
    from torch.profiler import ProfilerActivity, profile

    recorded = []
    with profile(activities=[ProfilerActivity.CPU], **OPTIONS[kind]) as prof:
        step()  # warm-up, as the tracer's windows have one
        for _ in range(active):
            started = time.thread_time_ns()
            step()
            recorded.append((time.thread_time_ns() - started) / 1e6)
    started = time.thread_time_ns()
    raw = os.path.join(folder, "window.json")
    prof.export_chrome_trace(raw)
    with open(raw, "rb") as src, gzip.open(raw + ".gz", "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    exported = (time.thread_time_ns() - started) / 1e6
    size = os.path.getsize(raw + ".gz")
    categories = None
    if kind == "memory":
        started = time.thread_time_ns()
        record = window_record(prof, 0, "cpu")
        categories = (time.thread_time_ns() - started) / 1e6
        assert record is None or record.peak_bytes > 0
    return {"step": statistics.median(recorded), "export": exported, "size": size,
            "categories": categories}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", type=int, default=7, help="windows of each kind")
    parser.add_argument("--active", type=int, default=3, help="recording steps per window")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build_model(args.hidden, args.layers, 0)
    optimizer = torch.optim.Adam(model.parameters())
    batch = torch.randn(args.batch, args.hidden)

    def step():
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()

    for _ in range(5):
        step()
    results = {kind: [] for kind in OPTIONS}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.windows):
            for kind in OPTIONS:
                results[kind].append(one_window(kind, step, args.active, folder))
    print(f"load average {os.getloadavg()[0]:.1f}; {args.windows} windows of each kind, "
          f"{args.active} recording steps each; CPU ms of the training thread, median "
          f"(10th-90th percentile)")
    for kind, windows in results.items():
        line = (f"{kind:7s} step {spread([w['step'] for w in windows])}  export "
                f"{spread([w['export'] for w in windows])}  trace "
                f"{statistics.median(w['size'] for w in windows) / 1024:.0f} kB")
        if kind == "memory":
            line += f"  memory profiler {spread([w['categories'] for w in windows])}"
        print(line)


if __name__ == "__main__":
    main()

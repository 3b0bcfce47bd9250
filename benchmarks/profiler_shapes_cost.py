"""Cost of recording operator shapes and FLOPs (torch.profiler's record_shapes and with_flops)
inside the profiler's windows, and of the CPU peak measurement at start-up.

A small MLP's training step (forward, backward, SGD) is timed per step, as CPU time of the
training thread (one intra-op thread by default), while torch.profiler records it in each of
three settings: neither option, record_shapes, record_shapes with with_flops. Each setting
profiles `--steps` steps, then exports the trace (its time and gzipped size are reported too),
`--repeat` times in turn; the medians are printed with their spread. Outside the windows there
is no profiler object at all (tracer/probes/profiler.py), so these options cost nothing there by
construction; the first line reports unprofiled steps for reference.

    python benchmarks/profiler_shapes_cost.py --steps 20 --repeat 7
    python benchmarks/profiler_shapes_cost.py --width 32 --steps 50  # tiny ops: the worst case
"""

import argparse
import gzip
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from tracer.probes.peak_tflops import measure_cpu_tflops  # noqa: E402

SETTINGS = {"no shapes": {}, "record_shapes": {"record_shapes": True},
            "record_shapes + with_flops": {"record_shapes": True, "with_flops": True}}


def workload(width: int, layers: int, batch: int):
    torch.manual_seed(0)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, width)

    def step():
        optimizer.zero_grad()
        model(x).square().mean().backward()
        optimizer.step()
    return step


def timed_steps(step, steps: int) -> float:
    """CPU seconds of this thread per step: on a shared machine, wall time measures the other
    users as much as the profiler (with --threads 1 every op runs on this thread)."""
    start = time.thread_time()
    for _ in range(steps):
        step()
    return (time.thread_time() - start) / steps


def one_round(step, steps: int, options: dict, folder: str) -> tuple[float, float, int]:
    """(seconds per profiled step, export seconds, gzipped trace bytes)."""
    with profile(activities=[ProfilerActivity.CPU], **options) as prof:
        per_step = timed_steps(step, steps)
    path = os.path.join(folder, "t.json")
    start = time.perf_counter()
    prof.export_chrome_trace(path)
    export = time.perf_counter() - start
    with open(path, "rb") as src:
        size = len(gzip.compress(src.read(), 6))
    return per_step, export, size


def spread(values) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    step = workload(args.width, args.layers, args.batch)
    timed_steps(step, 5)  # warm-up
    results = {name: [] for name in SETTINGS}
    plain = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(args.repeat):
            plain.append(timed_steps(step, args.steps))
            for name, options in SETTINGS.items():
                results[name].append(one_round(step, args.steps, options, folder))
    print(f"threads {torch.get_num_threads()}, {args.steps} steps x {args.repeat} rounds, "
          f"MLP {args.layers}x{args.width}, batch {args.batch}")
    print(f"unprofiled step ms: {spread([s * 1e3 for s in plain])}")
    base = statistics.median(r[0] for r in results["no shapes"])
    for name, rounds in results.items():
        per_step = [r[0] * 1e3 for r in rounds]
        extra = 100 * (statistics.median(r[0] for r in rounds) / base - 1)
        print(f"{name:28s} step ms {spread(per_step)}  (+{extra:.1f}% vs no shapes)  "
              f"export s {spread([r[1] for r in rounds])}  "
              f"trace kB {statistics.median(r[2] for r in rounds) / 1e3:.0f}")
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        measure_cpu_tflops()
        times.append(time.perf_counter() - start)
    print(f"CPU peak measurement s: {spread(times)}, {measure_cpu_tflops():.4f} TFLOP/s")


if __name__ == "__main__":
    main()

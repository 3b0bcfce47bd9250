"""What reading RSS at a step's end would cost the training thread on CPU: the figure that
decides where tracer.probes.memory reads it (on the training thread if under 5 us; otherwise
off it, each reading stamped with its time and matched to the steps by time); and what the
step record's `cpu_ns` costs, read there twice a step.

A small training loop (an MLP, Adam) runs `--steps` steps; after each optimizer step, in turn,
one of the arms is called and timed on the main thread's CPU clock (time.thread_time_ns):

* `empty`: a no-op, the floor of the timing itself (two clock reads);
* `statm`: tracer.probes.procfs.StatmRss.rss(), /proc/self/statm kept open and read again;
* `psutil`: psutil.Process().memory_info().rss, what the reader falls back to off Linux;
* `cpu_clock`: time.process_time_ns(), the process's CPU clock (a step record's `cpu_ns`).

Each arm's figure is the median over its steps minus `empty`'s, with the 10th-90th percentiles;
the arms take turns, so that the machine's load weighs on them alike. A step between two timed
calls leaves the caches as a training step does (the cost measured cold, as it is paid).
`--sleep-ms` lengthens each step (steps of 10 ms and more read at every end).

    python benchmarks/step_memory_cost.py --steps 3000 [--sleep-ms 0]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import psutil  # noqa: E402
import torch  # noqa: E402

from tracer.probes.procfs import StatmRss  # noqa: E402


def percentile(values: list[int], q: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * q))]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                torch.nn.Linear(args.width, args.width))
    optimizer = torch.optim.Adam(model.parameters())
    batch = torch.randn(32, args.width)
    process = psutil.Process()
    arms = {"empty": lambda: None, "statm": StatmRss().rss,
            "psutil": lambda: process.memory_info().rss, "cpu_clock": time.process_time_ns}
    spent: dict[str, list[int]] = {name: [] for name in arms}
    step_ns = []
    names = list(arms)
    for step in range(args.steps):
        started = time.perf_counter_ns()
        if args.sleep_ms:
            time.sleep(args.sleep_ms / 1e3)
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        optimizer.step()
        step_ns.append(time.perf_counter_ns() - started)
        name = names[step % len(names)]
        call = arms[name]
        cpu = time.thread_time_ns()
        call()
        spent[name].append(time.thread_time_ns() - cpu)
    floor = statistics.median(spent["empty"])
    print(f"load average {os.getloadavg()[0]:.1f}; median step "
          f"{statistics.median(step_ns) / 1e6:.2f} ms; {args.steps} steps; timing floor "
          f"{floor / 1e3:.2f} us (subtracted)")
    for name in names[1:]:
        values = spent[name]
        print(f"{name:7s} median {(statistics.median(values) - floor) / 1e3:6.2f} us  "
              f"p10-p90 {(percentile(values, 0.1) - floor) / 1e3:.2f}-"
              f"{(percentile(values, 0.9) - floor) / 1e3:.2f} us")


if __name__ == "__main__":
    main()

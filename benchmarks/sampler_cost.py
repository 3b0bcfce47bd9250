"""CPU cost of the device sampler: it must stay within 1% of one core at 10 Hz.

Two figures, measured side by side over the same wall time:
  * the sampling thread's own CPU time (time.thread_time inside the thread), and
  * the whole process's CPU time while sampling minus the same process idling (catches cost
    outside the thread, e.g. in the GIL hand-offs it causes).
Samples are written through a real JsonlWriter to a temporary folder, as in a traced run.

    python benchmarks/sampler_cost.py --seconds 10 --hz 10
"""

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tracer.parts.record_files import JsonlWriter  # noqa: E402
from tracer.probes.device_sampler import DeviceSampler  # noqa: E402

BUDGET_PCT = 1.0


def process_cpu_over(seconds, sampler=None):
    started_cpu = time.process_time()
    if sampler is not None:
        sampler.start()
    time.sleep(seconds)
    if sampler is not None:
        sampler.stop()
    return time.process_time() - started_cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=10.0, help="wall time of each measurement")
    parser.add_argument("--hz", type=float, default=10.0, help="sampling rate")
    parser.add_argument("--device", type=int, default=None,
                        help="CUDA device index to sample with NVML (default: none, psutil)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        idle_cpu = process_cpu_over(args.seconds)
        writer = JsonlWriter(os.path.join(folder, "rank0.samples.jsonl"), "sampler")
        sampler = DeviceSampler(writer, args.hz, args.device)
        sampling_cpu = process_cpu_over(args.seconds, sampler)
        writer.close()
        idle_cpu_after = process_cpu_over(args.seconds)

    idle = (idle_cpu + idle_cpu_after) / 2
    thread_pct = sampler.thread_cpu_s / args.seconds * 100
    process_pct = (sampling_cpu - idle) / args.seconds * 100
    per_sample_us = sampler.thread_cpu_s / max(sampler.samples, 1) * 1e6
    print(f"source: {sampler.source}" + (f" ({sampler.reason})" if sampler.reason else ""))
    print(f"{sampler.samples} samples in {args.seconds:g} s at {args.hz:g} Hz, "
          f"{per_sample_us:.0f} us of CPU per sample")
    print(f"sampling thread CPU: {thread_pct:.3f}% of one core")
    print(f"process CPU, sampling vs idle: {sampling_cpu:.4f} s vs {idle:.4f} s "
          f"-> {process_pct:.3f}% of one core")
    worst = max(thread_pct, process_pct)
    verdict = "within" if worst <= BUDGET_PCT else "OVER"
    print(f"budget {BUDGET_PCT:g}% of one core: {verdict} ({worst:.3f}%)")
    if sampler.error or sampler.behind:
        print(f"sampler error: {sampler.error}; behind: {sampler.behind}")


if __name__ == "__main__":
    main()

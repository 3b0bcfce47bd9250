"""One very large trace: the analysis's peak memory on a synthetic Kineto trace of a given size.

    python benchmarks/large_trace.py [--mb 1024] [--limit-mb N] [--repeat R] [--keep DIR]

Writes one uncompressed Kineto trace of about --mb MB of JSON into a temporary folder (removed
afterwards unless --keep names a folder to write it in): ProfilerSteps of a training-like mix,
per step 2,000 host ops each launching a kernel (one in ten an NCCL all-reduce with its
record_param_comms call and message arguments). Then it runs `python -m analysis.breakdown FILE
--no-cache --format json` and reports wall time, peak RSS of the command (psutil, sampled every
50 ms, its children included) and its exit status; with --limit-mb, under
RANKTRACE_MAX_TRACE_MB=N, to show the refusal of a file over the limit (its message is printed).
Each figure is the median of --repeat runs, with the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scale import measure  # this folder: the same sampling of the command's memory

OPS_PER_STEP = 2000
HOST_PID, DEVICE_PID, MAIN_TID = 100, 0, 1
_COMM_ARGS = {"Collective name": "allreduce", "In msg nelems": 1 << 20, "Out msg nelems": 1 << 20,
              "dtype": "Float", "Group size": 8, "Process Group Name": "0",
              "Process Group Description": "default_pg"}


def _step_events(step: int, start_us: int, correlation: int) -> tuple[list[str], int, int]:
    """One ProfilerStep's events as JSON texts; returns (texts, its end, next correlation)."""
    texts = []
    t = start_us
    comm_args = json.dumps(_COMM_ARGS)
    for i in range(OPS_PER_STEP):
        correlation += 1
        comm = i % 10 == 9
        name = "record_param_comms" if comm else "aten::mm"
        args = f', "args": {comm_args}' if comm else ""
        texts.append(f'{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": {HOST_PID}, '
                     f'"tid": {MAIN_TID}, "ts": {t}, "dur": 6{args}}}')
        texts.append(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", '
                     f'"pid": {HOST_PID}, "tid": {MAIN_TID}, "ts": {t + 2}, "dur": 3, '
                     f'"args": {{"correlation": {correlation}}}}}')
        kernel = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)" if comm
                  else "volta_sgemm_128x64_nn")
        stream = 20 if comm else 7
        texts.append(f'{{"ph": "X", "cat": "kernel", "name": "{kernel}", "pid": {DEVICE_PID}, '
                     f'"tid": {stream}, "ts": {t + 5}, "dur": 8, "args": {{"device": 0, '
                     f'"stream": {stream}, "correlation": {correlation}}}}}')
        t += 10
    texts.insert(0, f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", '
                    f'"pid": {HOST_PID}, "tid": {MAIN_TID}, "ts": {start_us}, '
                    f'"dur": {t - start_us}}}')
    return texts, t, correlation


def write_trace(path: Path, megabytes: int) -> int:
    """A trace of about `megabytes` MB of JSON at `path`; returns its size in bytes."""
    target = megabytes << 20
    with path.open("w") as out:
        out.write('{"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, '
                  '"world_size": 8}, "traceEvents": [\n')
        step, t, correlation, written, first = 1, 1_700_000_000_000_000, 0, 0, True
        while written < target:
            texts, t, correlation = _step_events(step, t, correlation)
            chunk = (",\n" if not first else "") + ",\n".join(texts)
            out.write(chunk)
            written += len(chunk)
            step, first = step + 1, False
        out.write("\n]}\n")
    return path.stat().st_size


def _spread(runs: list[dict], key: str) -> str:
    values = [r[key] for r in runs]
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=1024, help="MB of JSON to write")
    parser.add_argument("--limit-mb", type=int, help="RANKTRACE_MAX_TRACE_MB for the command")
    parser.add_argument("--repeat", type=int, default=3, help="runs (median and spread)")
    parser.add_argument("--keep", type=Path, help="write the trace in this folder and keep it")
    args = parser.parse_args(argv)

    env = dict(os.environ)
    if args.limit_mb is not None:
        env["RANKTRACE_MAX_TRACE_MB"] = str(args.limit_mb)
    with tempfile.TemporaryDirectory(prefix="ranktrace-large-") as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        trace = folder / "rank0.1.pt.trace.json"
        started = time.perf_counter()
        size = write_trace(trace, args.mb)
        print(f"wrote {trace.name}: {size / 2**20:.0f} MB of JSON in "
              f"{time.perf_counter() - started:.0f} s")
        command = [sys.executable, "-m", "analysis.breakdown", str(trace), "--no-cache",
                   "--format", "json"]
        runs = [measure(command, env) for _ in range(args.repeat)]
    print(f"limit: {env.get('RANKTRACE_MAX_TRACE_MB', 'default')} MB; {len(runs)} runs, "
          f"median (min-max)")
    print(f"wall s {_spread(runs, 'wall_s')}; peak RSS MB {_spread(runs, 'sum_peak_mb')}; "
          f"exit status {sorted({r['rc'] for r in runs})}")
    if any(r["rc"] for r in runs):
        print(f"last message: {runs[-1]['error']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

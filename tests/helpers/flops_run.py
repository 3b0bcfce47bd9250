"""A run folder of known FLOPs, step time and peak, for the MFU tests: each rank profiles one
step of 1 ms (ProfilerStep#1) holding one aten::mm of [1000, 1000] x [1000, 1000] fp32
(2e9 FLOPs) whose kernel runs 400 us; the rest of the step is idle. Its run_start records the
peak (TFLOP/s, source) and the device name given."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.synthetic import TraceBuilder, trace_name

MM_FLOPS = 2 * 1000 * 1000 * 1000
STEP_US, KERNEL_US = 1000, 400
# [1000, 1000] fp32 twice in, and the [1000, 1000] fp32 output
MM_BYTES = 3 * 1000 * 1000 * 4


def flops_trace(rank: int, world_size: int, with_shapes: bool = True) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=world_size)
    b.step(1, 0, STEP_US)
    args = ({"Input Dims": [[1000, 1000], [1000, 1000]], "Input type": ["float", "float"]}
            if with_shapes else {})
    b.op("aten::mm", 10, 30, args=args)
    b.kernel("volta_sgemm_128x64_nn", 100, 100 + KERNEL_US, launch_at=20)
    return b


def write_flops_run(folder: Path, world_size: int = 1, peak: tuple | None = (10.0, "measured"),
                    device_name: str | None = None, with_shapes: bool = True,
                    steps_ms: tuple = ()) -> Path:
    """The run folder: a trace and a manifest per rank; `steps_ms`: step records of these
    durations (the scaling study times them)."""
    folder.mkdir(parents=True, exist_ok=True)
    for rank in range(world_size):
        flops_trace(rank, world_size, with_shapes).write(folder / trace_name(rank))
        start = {"kind": "run_start", "schema_version": 1, "run_name": folder.name,
                 "rank": rank, "local_rank": rank, "world_size": world_size, "host": "h",
                 "pid": 1, "start_ns": 0, "argv": [], "script": "train.py", "script_args": [],
                 "torch_version": "2", "config": {}}
        if device_name is not None:
            start["device_name"] = device_name
        if peak is not None:
            start["peak_tflops"], start["peak_source"] = peak
        end = {"kind": "run_end", "rank": rank, "end_ns": 1, "status": "ok", "exit_code": 0,
               "steps": max(2, len(steps_ms)), "windows": 1, "samples": 0, "comm_ops": 0,
               "bytes_written": 0, "errors": 0}
        (folder / f"rank{rank}.manifest.jsonl").write_text(
            json.dumps(start) + "\n" + json.dumps(end) + "\n")
        at, lines = 0, []
        for step, ms in enumerate(steps_ms):
            lines.append(json.dumps({"step": step, "start_ns": at,
                                     "end_ns": at + int(ms * 1e6),
                                     "in_profiler_window": step == 1}) + "\n")
            at += int(ms * 1e6)
        if lines:
            (folder / f"rank{rank}.steps.jsonl").write_text("".join(lines))
    return folder

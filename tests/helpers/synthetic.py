"""Small Kineto traces built by hand, so that tests know every answer exactly.

Times are given in microseconds, as Kineto writes them (ints, or floats to test ns traces).
Each device event gets a launching cuda_runtime event with the same correlation id on the host,
so HTA's correlation-based window can be exercised too.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HOST_PID = 100
DEVICE_PID = 0
MAIN_TID = 1


class TraceBuilder:
    def __init__(self, rank: int | None = 0, world_size: int | None = None,
                 backend: str = "nccl", distributed_info: bool = True):
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.distributed_info = distributed_info
        self.events: list[dict] = []
        self._correlation = 1000

    # ---- host side ----
    def op(self, name: str, start, end, tid=MAIN_TID, cat: str = "cpu_op",
           args: dict | None = None) -> TraceBuilder:
        event = {"ph": "X", "cat": cat, "name": name, "pid": HOST_PID, "tid": tid,
                 "ts": start, "dur": end - start}
        if args is not None:
            event["args"] = args
        self.events.append(event)
        return self

    def annotation(self, name: str, start, end, tid=MAIN_TID, args=None) -> TraceBuilder:
        return self.op(name, start, end, tid=tid, cat="user_annotation", args=args)

    def step(self, number: int, start, end, tid=MAIN_TID) -> TraceBuilder:
        return self.annotation(f"ProfilerStep#{number}", start, end, tid=tid)

    # ---- device side ----
    def _device(self, cat: str, name: str, start, end, stream: int, launch_at, tid,
                correlation: int | None) -> TraceBuilder:
        if correlation is None:
            self._correlation += 1
            correlation = self._correlation
        launch_at = start if launch_at is None else launch_at
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                            "pid": HOST_PID, "tid": tid, "ts": launch_at, "dur": 1,
                            "args": {"correlation": correlation}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": DEVICE_PID,
                            "tid": stream, "ts": start, "dur": end - start,
                            "args": {"device": 0, "stream": stream, "correlation": correlation}})
        return self

    def kernel(self, name: str, start, end, stream: int = 7, launch_at=None, tid=MAIN_TID,
               correlation: int | None = None) -> TraceBuilder:
        return self._device("kernel", name, start, end, stream, launch_at, tid, correlation)

    def compute(self, start, end, stream: int = 7, **kw) -> TraceBuilder:
        return self.kernel("volta_sgemm_128x64_nn", start, end, stream, **kw)

    def nccl(self, start, end, stream: int = 20, **kw) -> TraceBuilder:
        return self.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", start, end,
                           stream, **kw)

    def memcpy(self, start, end, stream: int = 7, **kw) -> TraceBuilder:
        return self._device("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", start, end, stream,
                            kw.get("launch_at"), kw.get("tid", MAIN_TID), kw.get("correlation"))

    def memset(self, start, end, stream: int = 7, **kw) -> TraceBuilder:
        return self._device("gpu_memset", "Memset (Device)", start, end, stream,
                            kw.get("launch_at"), kw.get("tid", MAIN_TID), kw.get("correlation"))

    # ---- output ----
    def document(self) -> dict:
        doc: dict = {"schemaVersion": 1, "deviceProperties": []}
        if self.distributed_info:
            info: dict = {"backend": self.backend}
            if self.rank is not None:
                info["rank"] = self.rank
            if self.world_size is not None:
                info["world_size"] = self.world_size
            doc["distributedInfo"] = info
        metadata = [
            {"name": "process_name", "ph": "M", "ts": 0, "pid": HOST_PID, "tid": 0,
             "args": {"name": "python"}},
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": HOST_PID, "tid": MAIN_TID,
             "args": {"name": "thread 1 (python)"}},
        ]
        doc["traceEvents"] = metadata + self.events
        return doc

    def write(self, path: Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(self.document()).encode()
        if path.name.endswith(".gz"):
            data = gzip.compress(data)
        path.write_bytes(data)
        return path


def trace_name(rank: int, span: int = 1) -> str:
    """A ranktrace file name (rank{R}.<span>.pt.trace.json.gz)."""
    return f"rank{rank}.{span}.pt.trace.json.gz"


def nccl_run(folder: Path, ranks: int = 2, steps: int = 3) -> Path:
    """`ranks` GPU ranks' traces in `folder`, `steps` steps of 9 ms each: 6 ms of compute, then
    a 0.6 ms NCCL kernel."""
    for rank in range(ranks):
        trace = TraceBuilder(rank=rank, world_size=ranks)
        for step in range(steps):
            start = 1000 + step * 10_000
            trace.step(step, start, start + 9_000)
            trace.kernel("gemm", start + 200, start + 6_200)
            trace.nccl(start + 8_300, start + 8_900)
        trace.write(folder / trace_name(rank))
    return folder

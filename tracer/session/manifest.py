"""The per-rank manifest (rank{R}.manifest.jsonl), and the versions and host it records.

The manifest is flushed after every record: it is small, and it is what tells a reader how a
rank ended (no run_end line: the rank died before it could say).
"""

from __future__ import annotations

import os
import socket
import time

from tracer import schema
from tracer.parts.record_files import JsonlWriter


class Manifest:
    def __init__(self, run_dir: str, rank: int):
        self.rank = rank
        self.writer = JsonlWriter(os.path.join(run_dir, schema.MANIFEST_FILE.format(rank=rank)),
                                  part="manifest")
        self.errors = 0

    def write(self, record) -> None:
        self.writer.write(record)
        self.writer.flush()

    def error(self, part: str, message: str) -> None:
        """Record a part of the tracer that switched itself off (it has said so on stderr)."""
        self.errors += 1
        self.write(schema.TracerError(rank=self.rank, t_ns=time.time_ns(), part=part,
                                      message=message))

    def close(self) -> None:
        self.writer.close()


def host_name() -> str:
    return socket.gethostname()


def process_cpu_ids() -> list[int] | None:
    """The ids of the CPUs this process may run on (its affinity mask), None where the OS keeps
    none."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def process_cpus() -> int | None:
    """The CPUs this process may run on: its affinity mask where the OS has one, else the
    host's count (None where neither is known)."""
    ids = process_cpu_ids()
    return len(ids) if ids is not None else os.cpu_count()


def versions(local_rank: int = 0) -> dict:
    """torch, CUDA and NCCL versions, and the name of the device of `local_rank`, without
    initialising CUDA."""
    import torch

    info = {"torch_version": str(torch.__version__), "cuda_version": torch.version.cuda}
    try:
        if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
            info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # NCCL missing from this build
        pass
    if torch.cuda.is_available():
        name = _device_name(local_rank % max(torch.cuda.device_count(), 1))
        if name is not None:
            info["device_name"] = name
    return info


def _device_name(cuda_index: int) -> str | None:
    """From NVML: torch.cuda.get_device_name() would initialise CUDA before the script does,
    which a script that forks workers before touching the GPU would notice."""
    try:
        import pynvml

        from tracer.probes.device_sampler import nvml_handle_for_cuda_device

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(nvml_handle_for_cuda_device(pynvml, cuda_index))
        finally:
            pynvml.nvmlShutdown()
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no NVML: the name is a nicety
        return None

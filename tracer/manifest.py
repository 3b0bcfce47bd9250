"""The per-rank manifest (rank{R}.manifest.jsonl) and the clock offset of each rank to rank 0.

The manifest is flushed after every record: it is small, and it is what tells a reader how a
rank ended (no run_end line: the rank died before it could say).

Clock offsets are measured right after the script's `init_process_group` returns, through the
default process group's store under `ranktrace/` keys: rank 0 answers a few NTP-style pings from
every other rank. No collective is issued, so the user's groups, their numbering and their
sequence numbers are untouched.
"""

from __future__ import annotations

import functools
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Callable

from tracer import schema
from tracer.jsonl import JsonlWriter

CLOCK_ROUND_TRIPS = 8
CLOCK_TIMEOUT_S = 30.0
CLOCK_KEY_PREFIX = "ranktrace/clock"


class Manifest:
    def __init__(self, run_dir: str, rank: int):
        self.rank = rank
        self.writer = JsonlWriter(os.path.join(run_dir, schema.MANIFEST_FILE.format(rank=rank)),
                                  part="manifest")
        self.errors = 0

    def write(self, record) -> None:
        self.writer.write(record)
        self.writer.flush()

    def error(self, part: str, message: str, echo: bool = True) -> None:
        """Record a part of the tracer that switched itself off, with one line on stderr."""
        self.errors += 1
        if echo:
            print(f"ranktrace: rank{self.rank} {part}: {message}", file=sys.stderr, flush=True)
        self.write(schema.TracerError(rank=self.rank, t_ns=time.time_ns(), part=part,
                                      message=message))

    def close(self) -> None:
        self.writer.close()


def host_name() -> str:
    return socket.gethostname()


def versions() -> dict:
    """torch, CUDA and NCCL versions, and the device name, without initialising CUDA."""
    import torch

    info = {"torch_version": str(torch.__version__), "cuda_version": torch.version.cuda}
    try:
        if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
            info["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # NCCL missing from this build
        pass
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        name = _device_name(local_rank % max(torch.cuda.device_count(), 1))
        if name is not None:
            info["device_name"] = name
    return info


def _device_name(cuda_index: int) -> str | None:
    """From NVML: torch.cuda.get_device_name() would initialise CUDA before the script does,
    which a script that forks workers before touching the GPU would notice."""
    try:
        import pynvml

        from tracer.sampler import nvml_handle_for_cuda_device

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(nvml_handle_for_cuda_device(pynvml, cuda_index))
        finally:
            pynvml.nvmlShutdown()
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no NVML: the name is a nicety
        return None


def measure_clock_offset(store, rank: int, world_size: int, key_prefix: str,
                         round_trips: int = CLOCK_ROUND_TRIPS, timeout_s: float = CLOCK_TIMEOUT_S,
                         clock: Callable[[], int] = time.time_ns) -> tuple[int, int, int]:
    """(offset_ns, uncertainty_ns, round_trips) of this rank's clock minus rank 0's.

    Rank r writes a ping with nothing in it and blocks on rank 0's pong, which carries rank 0's
    clock t0 read after the ping arrived and before the pong was sent; so t0 lies between the
    ping's send time t1 and the pong's arrival t2 on rank r's clock, and
    offset = (t1 + t2) / 2 - t0 is off by at most (t2 - t1) / 2. The round trip with the smallest
    t2 - t1 wins. Rank 0 answers ranks one after another.
    """
    if world_size <= 1:
        return 0, 0, 0
    deadline = time.monotonic() + timeout_s

    def wait(key: str) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"clock sync gave up after {timeout_s:g} s waiting for {key}")
        store.wait([key], timedelta(seconds=left))
        return store.get(key)

    if rank == 0:
        for peer in range(1, world_size):
            for i in range(round_trips):
                wait(f"{key_prefix}/{peer}/ping{i}")
                store.set(f"{key_prefix}/{peer}/pong{i}", str(clock()))
        return 0, 0, 0
    best = None
    for i in range(round_trips):
        t1 = clock()
        store.set(f"{key_prefix}/{rank}/ping{i}", b"")
        t0 = int(wait(f"{key_prefix}/{rank}/pong{i}"))
        t2 = clock()
        if best is None or t2 - t1 < best[1] - best[0]:
            best = (t1, t2, t0)
    t1, t2, t0 = best
    return (t1 + t2) // 2 - t0, (t2 - t1 + 1) // 2, round_trips


def wrap_init_process_group(after: Callable[[], None]) -> list:
    """Make `torch.distributed.init_process_group` call `after()` once it has returned, in every
    torch.distributed module that imported it by name (such as `device_mesh`, which holds its own
    reference); returns the (module, original) pairs that `restore` puts back."""
    import torch.distributed as dist

    if not dist.is_available():
        return []
    from torch.distributed import distributed_c10d

    original = distributed_c10d.init_process_group

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        result = original(*args, **kwargs)
        after()
        return result

    patches = []
    for name, module in list(sys.modules.items()):
        if name == "torch.distributed" or name.startswith("torch.distributed."):
            if getattr(module, "init_process_group", None) is original:
                module.init_process_group = init_process_group
                patches.append((module, original))
    return patches


def restore(patches: list) -> None:
    for module, original in reversed(patches):
        module.init_process_group = original
    patches.clear()

"""The clock offset of each rank to rank 0, measured when the script's process group starts.

Right after the script's `init_process_group` returns, each rank measures its clock against
rank 0's through the default process group's store under `ranktrace/clock/` keys: rank 0 answers
a few NTP-style pings from every other rank. No collective is issued, so the user's groups,
their numbering and their sequence numbers are untouched (docs/tracer.md, Clock offsets).
A session that opens once the process group exists (a rank the script started itself, traced
from its init_process_group on) measures as it starts. Each time, the session is told the rank
and world size the group gave this process.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from datetime import timedelta

from tracer import schema
from tracer.parts.part import Part

CLOCK_ROUND_TRIPS = 8
CLOCK_TIMEOUT_S = 30.0
CLOCK_KEY_PREFIX = "ranktrace/clock"


def open_clock_sync(setup):
    """The registry's factory of the clock sync (a tracer.session.part_registry.PartSetup)."""
    return setup.build(ClockSync, setup.write_manifest, setup.launch.attempt,
                       setup.group_joined)


class ClockSync(Part):
    """Wraps init_process_group (start) and writes a ClockSync record after each call."""

    name = "clock"

    def __init__(self, write: Callable[[object], None], attempt: int,
                 group_joined: Callable[[int, int], None] = lambda rank, world_size: None):
        """`group_joined(rank, world_size)`: told after each init_process_group, before the
        measurement."""
        self.write = write
        self.attempt = attempt
        self.group_joined = group_joined
        self.backend: str | None = None
        self.world_size: int | None = None
        self._inits = 0
        self._patches: list = []
        self._closed = False

    def start(self) -> None:
        self._patches = wrap_init_process_group(self.after_init_process_group)
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            self.after_init_process_group()

    def on_script_end(self, clean: bool, on_main: bool) -> None:
        self.close()

    def run_end_fields(self) -> dict:
        return {"backend": self.backend, "world_size": self.world_size}

    def close(self) -> None:
        self._closed = True
        restore(self._patches)

    def after_init_process_group(self) -> None:
        if self.failed:
            return
        try:
            import torch.distributed as dist
            from torch.distributed import distributed_c10d

            rank, world_size = dist.get_rank(), dist.get_world_size()
            self.backend, self.world_size = str(dist.get_backend()), world_size
            self.group_joined(rank, world_size)
            if self._closed:
                return  # the session closed on hearing it (it reopened under the group's rank)
            key_prefix = f"{CLOCK_KEY_PREFIX}/attempt{self.attempt}/init{self._inits}"
            self._inits += 1
            store = distributed_c10d._get_default_store() if world_size > 1 else None
            offset, uncertainty, round_trips = measure_clock_offset(store, rank, world_size,
                                                                    key_prefix)
            self.write(schema.ClockSync(
                rank=rank, offset_ns=offset, uncertainty_ns=uncertainty, round_trips=round_trips,
                backend=self.backend, world_size=world_size))
        except Exception as exc:
            self.fail(f"clock offset not measured ({type(exc).__name__}: {exc}); times of this "
                      f"rank are not aligned to rank 0")


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

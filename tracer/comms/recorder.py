"""`CommsRecorder`: installs the collective hooks, switches them off on its own first fault, and
hands out what was recorded. How each way of issuing an op is caught, and how it is timed:
docs/tracer.md, Collective hooks."""

from __future__ import annotations

from collections.abc import Callable

from tracer.comms.c10d import C10dHooks
from tracer.comms.ddp import DdpHooks
from tracer.comms.functional import FunctionalHooks
from tracer.comms.patching import Patches
from tracer.comms.timing import Timing
from tracer.log import say
from tracer.part import Part


class CommsRecorder(Part):
    """The comms part: `start` installs the hooks, `close` removes them."""

    name = "comms"

    def __init__(self, writer, current_step: Callable[[], int], use_cuda: bool, *,
                 event_factory: Callable[[], object] | None = None, wait_timeout_s: float = 10.0,
                 ddp_bucket_hook: bool = False):
        """`event_factory` replaces torch.cuda.Event(enable_timing=True) and then times every
        tensor op by events, whatever its device (for tests of the bookkeeping on CPU).
        `ddp_bucket_hook`: time DDP's buckets through a comm hook (--ddp-bucket-hook)."""
        self.active = False
        self._installed = False
        self.timing = Timing(writer, current_step, use_cuda, event_factory, wait_timeout_s,
                             self.fail)
        self._patches = Patches(self.fail)
        self.c10d = C10dHooks(self)
        self.functional = FunctionalHooks(self)
        self.ddp = DdpHooks(self, bool(ddp_bucket_hook))

    @property
    def ops(self) -> int:
        return self.timing.ops

    @property
    def bytes(self) -> int:
        return self.timing.bytes

    @property
    def ddp_buckets(self) -> str:
        """How DDP's gradient buckets are recorded: "comm hook" or "profiler windows"."""
        return self.ddp.buckets_recorded_by

    def start(self) -> None:
        self.install()

    def close(self) -> None:
        self.uninstall()

    def install(self) -> None:
        if self._installed:
            return
        try:
            import torch.distributed as dist
            if not dist.is_available():
                raise RuntimeError("torch.distributed is not available in this build")
            self.c10d.install(self._patches)
            self.functional.install(self._patches)
            self.ddp.install(self._patches)
        except Exception as exc:  # a torch without one of these pieces: leave nothing half-patched
            self._patches.restore()
            self.fail("install", exc)
            return
        self._installed = True
        self.active = self.error is None

    def uninstall(self) -> None:
        self.active = False
        self._patches.restore()
        self._installed = False
        if self.functional.compiled_collectives:
            say(f"{self.functional.compiled_collectives} collectives were compiled into "
                f"torch.compile graphs; the ops compiled code issues are not in the comms records "
                f"(comm_ops counts eager ops only; the profiler's Kineto traces show them)",
                self.name)
            self.functional.compiled_collectives = 0

    def drain(self, wait: bool = False) -> None:
        try:
            self.timing.drain(wait)
        except Exception as exc:
            self.fail("drain", exc)

    def fail(self, what: str, exc: BaseException | None = None) -> bool:
        """Switch recording off and report it once: `what` failed with `exc` (the recorder's
        own faults), or `what` is the whole message (a failure the session saw)."""
        self.active = False
        if exc is None:
            return Part.fail(self, what)
        return Part.fail(self, f"{what} failed ({type(exc).__name__}: {exc}); comms recording "
                               f"is off")

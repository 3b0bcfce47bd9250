"""`CommsRecorder`: installs the collective hooks, switches them off on its own first fault, and
hands out what was recorded. How each way of issuing an op is caught, and how it is timed:
docs/tracer.md, Collective hooks."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

from tracer import schema
from tracer.comms.c10d import C10dHooks
from tracer.comms.ddp import DdpHooks
from tracer.comms.fsdp import FsdpHooks
from tracer.comms.functional import FunctionalHooks
from tracer.comms.owners import Owners
from tracer.comms.patching import Patches
from tracer.comms.timing import Timing
from tracer.hangs import stack_dumps
from tracer.parts.log import say
from tracer.parts.part import Part
from tracer.parts.record_files import CommsWriter

FLUSH_S = 1.0  # an op's completion record is on disk at most this long after it completes


class IssuesFile:
    """rank{R}.issued.jsonl next to the comms file. Written through, one write per op, not
    buffered: a rank that aborts (gloo on mismatched sizes) or is killed right after issuing
    must still show what it issued. Opened at the first op, so that a run that issues none has
    no such file; written as <name>.tmp and renamed on close, as every record file."""

    def __init__(self, comms_path: str, fail: Callable[[str, BaseException], bool],
                 budget=None):
        folder, name = os.path.split(comms_path)
        rank = name.split(".", 1)[0].removeprefix("rank")
        self.path = os.path.join(folder, schema.ISSUED_FILE.format(rank=rank))
        self.stacks_path = os.path.join(folder, schema.STACKS_FILE.format(rank=rank))
        self.rank = int(rank) if rank.isdigit() else -1
        self.bytes_written = 0
        self._budget = budget
        self._fd: int | None = None
        self._fail = fail
        self._failed = False
        self._open_lock = threading.Lock()  # the hooks and the Flight Recorder part write here

    def write(self, record) -> None:
        if self._failed:
            return
        line = schema.ENCODER.encode(record) + b"\n"
        if self._budget is not None and not self._budget.charge(len(line), record.step):
            return
        try:
            if self._fd is None:
                with self._open_lock:
                    if self._fd is None:
                        self._fd = os.open(self.path + schema.TEMP_SUFFIX,
                                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.write(self._fd, line)
        except OSError as exc:
            self._failed = True
            self._fail(f"writing {self.path}", exc)
            return
        self.bytes_written += len(line)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.close(fd)
            os.replace(self.path + schema.TEMP_SUFFIX, self.path)
        except OSError as exc:
            self._fail(f"closing {self.path}", exc)


def open_comms(setup):
    """The registry's factory of the comms file and the recorder that writes it (a
    tracer.session.part_registry.PartSetup)."""
    writer = setup.open_writer(schema.COMMS_FILE, CommsWriter)
    if writer is None:
        return None
    c = setup.config
    return setup.build(CommsRecorder, writer, setup.current_step, setup.use_cuda,
                       ddp_bucket_hook=c.ddp_bucket_hook, issue_records=not c.no_issue_records)


class CommsRecorder(Part):
    """The comms part: `start` installs the hooks, `close` removes them."""

    name = "comms"

    def __init__(self, writer, current_step: Callable[[], int], use_cuda: bool, *,
                 event_factory: Callable[[], object] | None = None, wait_timeout_s: float = 10.0,
                 ddp_bucket_hook: bool = False, issue_records: bool = True):
        """`event_factory` replaces torch.cuda.Event(enable_timing=True) and then times every
        tensor op by events, whatever its device (for tests of the bookkeeping on CPU).
        `ddp_bucket_hook`: time DDP's buckets through a comm hook (--ddp-bucket-hook).
        `issue_records`: write each op's IssueRecord as it is issued (off: --no-issue-records;
        the stack dump of a collective's exception is still written)."""
        self.active = False
        self._installed = False
        # (thread, start_ns, end_ns or None) of each hooked call, while the Flight Recorder part
        # reads them to tell the hooks' ops from torch's own (tracer.comms.flight); None: off.
        self.issue_spans = None
        self.native_ops = 0  # ops the Flight Recorder part recorded (run_end's comm_ops)
        self.flight_recorded = False  # the Flight Recorder part read every drain until the end
        self.writer = writer
        path = getattr(writer, "path", "")
        self.issues = (IssuesFile(path, self.fail, getattr(writer, "budget", None)) if path
                       else None)
        self._last_flush = time.monotonic()
        self.timing = Timing(writer, current_step, use_cuda, event_factory, wait_timeout_s,
                             self.fail, self.issues if issue_records else None)
        self._patches = Patches(self.fail)
        self.owners = Owners()  # the DDP and FSDP units built: who issued each op
        self.c10d = C10dHooks(self)
        self.functional = FunctionalHooks(self)
        self.ddp = DdpHooks(self, bool(ddp_bucket_hook), self.owners)
        self.fsdp = FsdpHooks(self, self.owners)
        self._at_last_step = (0, 0)  # (ops, bytes) at the last step end

    @property
    def ops(self) -> int:
        return self.timing.ops

    @property
    def bytes(self) -> int:
        return self.timing.bytes

    @property
    def bytes_written(self) -> int:
        return self.issues.bytes_written if self.issues is not None else 0

    @property
    def ddp_buckets(self) -> str:
        """How DDP's gradient buckets are recorded: "comm hook" or "profiler windows"."""
        return self.ddp.buckets_recorded_by

    def start(self) -> None:
        self.install()

    def step_fields(self) -> dict:
        # Ops are counted when issued, so a step gets all of its own ops even when their timing
        # (CUDA events) is only resolved at a later drain.
        ops, nbytes = self.timing.ops, self.timing.bytes
        last_ops, last_bytes = self._at_last_step
        self._at_last_step = (ops, nbytes)
        return {"comm_ops": ops - last_ops, "comm_bytes": nbytes - last_bytes}

    def on_worker_pass(self) -> None:
        self.drain(False)

    def run_start_fields(self) -> dict:
        return {"ddp_buckets": self.ddp_buckets}

    def on_script_end(self, clean: bool, on_main: bool) -> None:
        # Waiting for ops in flight could hang when a peer died; only a clean end waits.
        self.drain(clean)
        if not self.failed:
            self.close()

    def run_end_fields(self) -> dict:
        return {"comm_ops": self.ops + self.native_ops}

    def close(self) -> None:
        self.uninstall()
        if self.issues is not None:
            self.issues.close()

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
            self.fsdp.install(self._patches)
        except Exception as exc:  # a torch without one of these pieces: leave nothing half-patched
            self.fsdp.uninstall()
            self._patches.restore()
            self.fail("install", exc)
            return
        self._installed = True
        self.active = self.error is None

    def uninstall(self) -> None:
        self.active = False
        self.fsdp.uninstall()
        self._patches.restore()
        self._installed = False
        if self.functional.compiled_collectives:
            where = ("are in the comms records as native ops, from torch's Flight Recorder "
                     "(issue time only on gloo)" if self.flight_recorded else
                     "are not in the comms records (comm_ops counts eager ops only; the "
                     "profiler's Kineto traces show them)")
            say(f"{self.functional.compiled_collectives} collectives were compiled into "
                f"torch.compile graphs; the ops compiled code issues {where}", self.name)
            self.functional.compiled_collectives = 0

    def drain(self, wait: bool = False) -> None:
        try:
            self.timing.drain(wait)
        except Exception as exc:
            self.fail("drain", exc)
        if time.monotonic() - self._last_flush >= FLUSH_S:
            # The files flush themselves only when written to; a hung rank writes nothing more,
            # and what it issued last must be on disk when it is killed.
            self._last_flush = time.monotonic()
            self.flush()

    def flush(self) -> None:
        """Completion records to disk now (any thread); issue records are never held back."""
        flush = getattr(self.writer, "flush", None)
        if flush is not None:
            flush()

    def on_op_error(self, exc: BaseException) -> None:
        """A wrapped collective raised (the process group's timeout, a dead peer): write the
        stacks and the ops still pending, then let the exception go on as it was."""
        if self.issues is None:
            return
        stack_dumps.dump(self.issues.stacks_path, self.issues.rank, "exception",
                         self.timing.not_completed(), exc)
        self.flush()

    def fail(self, what: str, exc: BaseException | None = None) -> bool:
        """Switch recording off and report it once: `what` failed with `exc` (the recorder's
        own faults), or `what` is the whole message (a failure the session saw)."""
        self.active = False
        if exc is None:
            return Part.fail(self, what)
        return Part.fail(self, f"{what} failed ({type(exc).__name__}: {exc}); comms recording "
                               f"is off")

"""Memory per step (CUDA peaks, process RSS) and CUDA memory snapshots.

Nothing here initialises CUDA: figures are read only once the script has, and snapshot
recording is queued with `torch.cuda._lazy_call` so it starts when the script first touches the
GPU (on the device the script chose, not on device 0 of every rank).
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable

from tracer import schema
from tracer.parts.part import Part
from tracer.probes.procfs import StatmRss

MAX_HISTORY_ENTRIES = 100_000  # several KB each in the snapshot; bounded like torch's examples


def _torch_cuda():
    import torch

    return torch.cuda


def _attach_oom_observer(observer) -> None:
    import torch

    torch._C._cuda_attach_out_of_memory_observer(observer)


class _PsutilRss:
    def __init__(self, process):
        self._process = process

    def rss(self) -> int:
        return self._process.memory_info().rss


def _rss_reader():
    try:
        return StatmRss()
    except (OSError, ValueError):  # not Linux
        pass
    try:
        import psutil

        return _PsutilRss(psutil.Process())
    except Exception:  # psutil missing: CUDA figures only
        return None


def open_step_memory(setup):
    """The registry's factory of the per-step memory figures (a
    tracer.session.part_registry.PartSetup)."""
    return setup.build(StepMemory if setup.use_cuda else HostStepMemory)


def open_snapshots(setup):
    """The registry's factory of the memory snapshots (a tracer.session.part_registry.PartSetup)."""
    return setup.build(MemorySnapshots, setup.run_dir, setup.rank,
                       setup.config.memory_snapshot, setup.current_step)


class StepMemory(Part):
    """Peak CUDA memory over each step (peaks are reset at every step end) and process RSS.

    `take()` runs on the main thread at each step end and only reads the allocator's counters.
    `rss()` is for the step-end worker: reading /proc/self/statm costs 20 us and more while other
    threads allocate, too much for every step on the main thread. `process` (anything with
    psutil's `memory_info().rss`) replaces the default RSS reader.
    """

    name = "memory"

    def __init__(self, cuda=None, process=None):
        self.cuda = _torch_cuda() if cuda is None else cuda
        self._rss = _rss_reader() if process is None else _PsutilRss(process)
        self._total_bytes: dict[int, int] = {}

    def step_fields(self) -> dict:
        return self.take()

    def pass_fields(self) -> dict:
        return {"rss_bytes": self.rss()}

    def take(self) -> dict:
        """The CUDA fields of the step that just ended ({} before the script uses CUDA);
        starts the next step's peaks."""
        cuda = self.cuda
        if not cuda.is_initialized():
            return {}
        device = cuda.current_device()
        # max_memory_allocated() flattens and sorts every allocator statistic into a new dict
        # each call; the nested dict has the two peaks at hand.
        stats = cuda.memory_stats_as_nested_dict(device)
        total = self._total_bytes.get(device)
        if total is None:
            total = self._total_bytes[device] = int(cuda.get_device_properties(device).total_memory)
        cuda.reset_peak_memory_stats(device)
        return {"cuda_peak_allocated_bytes": int(stats["allocated_bytes"]["all"]["peak"]),
                "cuda_peak_reserved_bytes": int(stats["reserved_bytes"]["all"]["peak"]),
                "cuda_total_bytes": total}

    def rss(self) -> int | None:
        """The process's resident memory now; None where it cannot be read."""
        return self._rss.rss() if self._rss is not None else None


class HostStepMemory(StepMemory):
    """StepMemory where torch sees no CUDA device, so that no script can use one: the RSS
    alone, and nothing on the training thread at a step's end."""

    step_fields = Part.step_fields


class MemorySnapshots(Part):
    """CUDA allocator snapshots: at the end with --memory-snapshot, and always on out-of-memory.

    Files are `rank{R}.step{S}.memory_snapshot.pickle` (torch's format, for pytorch.org/memory_viz),
    written under a temporary name and renamed. Only the first out-of-memory error is dumped: a
    script that catches OOMs on purpose (batch size search) would otherwise fill the disk.
    """

    name = "memory_snapshot"

    def __init__(self, run_dir: str, rank: int, record_history: bool,
                 current_step: Callable[[], int], cuda=None,
                 attach_oom_observer: Callable | None = None):
        self.run_dir = run_dir
        self.rank = rank
        self.record_history = record_history
        self.current_step = current_step
        self.cuda = _torch_cuda() if cuda is None else cuda
        self.attach_oom_observer = attach_oom_observer or _attach_oom_observer
        self.files: list[str] = []
        self.bytes_written = 0
        self.oom_dumped = False
        self.history_started = False

    def start(self) -> None:
        """Queue history recording and the OOM observer for when the script initialises CUDA."""
        if not self.cuda.is_available():
            return
        if self.record_history:
            self.cuda._lazy_call(self._start_history)
        self.cuda._lazy_call(self._attach_observer)

    def after_last_records(self, on_main: bool) -> None:
        if on_main:  # the SIGTERM watcher leaves CUDA alone
            self.finish()

    @property
    def keeps_run(self) -> bool:
        return self.bytes_written > 0

    def _start_history(self) -> None:
        try:
            self.cuda.memory._record_memory_history(max_entries=MAX_HISTORY_ENTRIES)
            self.history_started = True
        except Exception as exc:
            self.fail(f"cannot record CUDA memory history ({type(exc).__name__}: {exc})")

    def _attach_observer(self) -> None:
        try:
            self.attach_oom_observer(self._on_oom)
        except Exception as exc:
            self.fail(f"cannot watch for CUDA out-of-memory ({type(exc).__name__}: {exc})")

    def _on_oom(self, device, alloc, device_allocated, device_free) -> None:
        self.dump_for_oom()

    def dump_for_oom(self) -> str | None:
        if self.oom_dumped:
            return None
        self.oom_dumped = True
        return self.dump()

    def on_script_exception(self, exc: BaseException) -> None:
        """An uncaught CUDA OOM gets a snapshot even if the observer could not be attached."""
        oom_type = getattr(self.cuda, "OutOfMemoryError", None)
        if oom_type is not None and isinstance(exc, oom_type):
            self.dump_for_oom()

    def finish(self) -> None:
        """The end-of-run snapshot (with --memory-snapshot), then history recording stops."""
        if not self.history_started:
            return
        self.dump()
        try:
            self.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            pass  # the process is ending; nothing is lost by leaving it on
        self.history_started = False

    def dump(self) -> str | None:
        """Write the allocator's state now; None if CUDA was never used or writing failed."""
        if self.error is not None or not self.cuda.is_available() or not self.cuda.is_initialized():
            return None
        path = os.path.join(self.run_dir, schema.MEMORY_SNAPSHOT_FILE.format(
            rank=self.rank, step=self.current_step()))
        if os.path.exists(path):  # an OOM snapshot of the same step is worth more; keep it
            return None
        temp = path + schema.TEMP_SUFFIX
        try:
            snapshot = self.cuda.memory._snapshot()
            with open(temp, "wb") as f:
                pickle.dump(snapshot, f)
            os.replace(temp, path)
        except Exception as exc:
            self.fail(f"writing memory snapshot {path} failed ({type(exc).__name__}: {exc})")
            try:
                os.remove(temp)
            except OSError:
                pass
            return None
        self.files.append(path)
        self.bytes_written += os.path.getsize(path)
        return path

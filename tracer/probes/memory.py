"""Memory per step (CUDA peaks, process RSS) and CUDA memory snapshots.

Nothing here initialises CUDA: figures are read only once the script has, and snapshot
recording is queued with `torch.cuda._lazy_call` so it starts when the script first touches the
GPU (on the device the script chose, not on device 0 of every rank).
"""

from __future__ import annotations

import bisect
import os
import pickle
import time
from collections.abc import Callable

from tracer import schema
from tracer.parts.part import Part
from tracer.probes.procfs import StatmRss
from tracer.probes.snapshot_record import snapshot_record

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
    tracer.session.part_registry.PartSetup), and, with --profile-memory, of the memory
    categories of each profiler window (tracer.probes.memory_profile)."""
    config = setup.config
    if config.profile_memory and not config.no_profiler:
        from tracer.probes.memory_profile import open_memory_profile

        open_memory_profile(setup)
    return setup.build(StepMemory if setup.use_cuda else HostStepMemory)


def open_snapshots(setup):
    """The registry's factory of the memory snapshots (a tracer.session.part_registry.PartSetup)."""
    return setup.build(MemorySnapshots, setup.run_dir, setup.rank,
                       setup.config.memory_snapshot, setup.current_step)


# Readings of RSS kept for the step records still to come: far more than the step-end worker's
# passes leave pending (each record is matched within two passes), few enough to bound the
# memory of a script that stops stepping for hours (about 4 minutes of readings at 15 a second).
MAX_RSS_READINGS = 4096
MAX_RSS = 1 << 62  # above any RSS: (t, MAX_RSS) sorts after every reading taken at t


class StepMemory(Part):
    """Memory over each step: the peak CUDA memory (peaks are reset at every step end, on the
    training thread) and the process's RSS near the step's end, stamped with its time.

    `take()` only reads the allocator's counters. RSS is never read on the training thread: a
    read of /proc/self/statm costs it 9-23 us at a step's end (benchmarks/step_memory_cost.py),
    above the 5 us that a step's end may spend on it. It is read instead on the step-end worker
    at each pass, and taken from the device sampler's psutil samples (on_sample); each step
    record gets the last reading taken by its end (`rss_t_ns` says when). A record waits for
    the next pass (steps_known_until) until the readings up to its end are all in: the pass's
    own and the samples the session hands over at the pass's end.
    `process` (anything with psutil's `memory_info().rss`) replaces the default RSS reader;
    `clock` (time.time_ns) is for tests.
    """

    name = "memory"

    def __init__(self, cuda=None, process=None, clock: Callable[[], int] = time.time_ns):
        self.cuda = _torch_cuda() if cuda is None else cuda
        self._rss = _rss_reader() if process is None else _PsutilRss(process)
        self._total_bytes: dict[int, int] = {}
        self._clock = clock
        # (t_ns, rss_bytes) sorted by time; used by the worker's passes (and the closer's last
        # one, once the worker has stopped), never by two threads at once.
        self._readings: list[tuple[int, int]] = []
        self._last_pass_ns: int | None = None
        self._complete_until = 0  # readings up to this time are all in

    def step_fields(self) -> dict:
        return self.take()

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

    # ---- RSS readings, matched to the steps by time -------------------------------------------
    def on_worker_pass(self) -> None:
        if self._rss is None:
            return
        now = self._clock()
        self.add_reading(now, self._rss.rss())
        # The samples taken before the previous pass were handed over at its end.
        if self._last_pass_ns is not None:
            self._complete_until = self._last_pass_ns
        self._last_pass_ns = now

    def on_sample(self, sample, step: int) -> None:
        if sample.rss_bytes is not None:
            self.add_reading(sample.t_ns, sample.rss_bytes)

    def add_reading(self, t_ns: int, rss_bytes: int) -> None:
        readings = self._readings
        if readings and t_ns < readings[-1][0]:
            bisect.insort(readings, (t_ns, rss_bytes))
        else:
            readings.append((t_ns, rss_bytes))
        if len(readings) > MAX_RSS_READINGS:
            del readings[:len(readings) - MAX_RSS_READINGS]

    def steps_known_until(self) -> int | None:
        return None if self._rss is None else self._complete_until

    def amend_step_record(self, record) -> None:
        """`rss_bytes` and `rss_t_ns`: the last reading taken by the step's end; for a step that
        ended before the first reading, that first reading. Never a later one while an earlier
        one exists: after a run's last step the script may already be freeing its memory."""
        readings = self._readings
        if not readings:
            return
        after = bisect.bisect_right(readings, (record.end_ns, MAX_RSS))
        at = max(after - 1, 0)
        record.rss_t_ns, record.rss_bytes = readings[at]
        del readings[:at]  # later records end later: the readings before serve none of them


class HostStepMemory(StepMemory):
    """StepMemory where torch sees no CUDA device, so that no script can use one: the RSS
    alone, and nothing on the training thread at a step's end."""

    step_fields = Part.step_fields


class MemorySnapshots(Part):
    """CUDA allocator snapshots: at the end with --memory-snapshot, and always on out-of-memory.

    Files are `rank{R}.step{S}.memory_snapshot.pickle` (torch's format, for pytorch.org/memory_viz)
    and `rank{R}.step{S}.memory_snapshot.jsonl` (the same as a MemorySnapshotRecord, which the
    analysis reads), each written under a temporary name and renamed. Only the first
    out-of-memory error is dumped: a script that catches OOMs on purpose (batch size search)
    would otherwise fill the disk.
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
        self.dump_for_oom(schema.OutOfMemory(
            device=int(device), requested_bytes=int(alloc),
            device_allocated_bytes=int(device_allocated), device_free_bytes=int(device_free)))

    def dump_for_oom(self, oom: schema.OutOfMemory | None = None) -> str | None:
        if self.oom_dumped:
            return None
        self.oom_dumped = True
        return self.dump(schema.SNAPSHOT_REASONS[0], oom)

    def on_script_exception(self, exc: BaseException) -> None:
        """An uncaught CUDA OOM gets a snapshot even if the observer could not be attached."""
        oom_type = getattr(self.cuda, "OutOfMemoryError", None)
        if oom_type is not None and isinstance(exc, oom_type):
            self.dump_for_oom()

    def finish(self) -> None:
        """The end-of-run snapshot (with --memory-snapshot), then history recording stops."""
        if not self.history_started:
            return
        self.dump(schema.SNAPSHOT_REASONS[1])
        try:
            self.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            pass  # the process is ending; nothing is lost by leaving it on
        self.history_started = False

    def dump(self, reason: str = "end", oom: schema.OutOfMemory | None = None) -> str | None:
        """Write the allocator's state now, as torch's pickle and as a MemorySnapshotRecord;
        the pickle's path, or None if CUDA was never used or writing it failed."""
        if self.error is not None or not self.cuda.is_available() or not self.cuda.is_initialized():
            return None
        step, t_ns = self.current_step(), time.time_ns()
        path = os.path.join(self.run_dir, schema.MEMORY_SNAPSHOT_FILE.format(
            rank=self.rank, step=step))
        if os.path.exists(path):  # an OOM snapshot of the same step is worth more; keep it
            return None
        try:
            snapshot = self.cuda.memory._snapshot()
            self._write(path, lambda f: pickle.dump(snapshot, f))
            record = snapshot_record(snapshot, self.rank, step, t_ns, reason, oom,
                                     self._device_total_bytes())
            self._write(os.path.join(self.run_dir, schema.MEMORY_SNAPSHOT_RECORD_FILE.format(
                rank=self.rank, step=step)), lambda f: f.write(schema.ENCODER.encode(record)
                                                                + b"\n"))
        except Exception as exc:
            self.fail(f"writing memory snapshot {path} failed ({type(exc).__name__}: {exc})")
            return None
        return path

    def _write(self, path: str, write: Callable) -> None:
        """`write(file)` into path's temporary name, then renamed to path."""
        temp = path + schema.TEMP_SUFFIX
        try:
            with open(temp, "wb") as f:
                write(f)
            os.replace(temp, path)
        except BaseException:
            try:
                os.remove(temp)
            except OSError:
                pass
            raise
        self.files.append(path)
        self.bytes_written += os.path.getsize(path)

    def _device_total_bytes(self) -> int | None:
        try:
            return int(self.cuda.get_device_properties(self.cuda.current_device()).total_memory)
        except Exception:
            return None

"""One rank's tracing session: the run folder, the parts, and the step clock."""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import importlib.machinery
import os
import sys
import threading
import time
import types
import weakref

import msgspec

import tracer
from tracer import schema
from tracer.config import TracerConfig
from tracer.jsonl import CommsWriter, JsonlWriter, RecordBudget, SamplesWriter
from tracer.manifest import (
    CLOCK_KEY_PREFIX,
    Manifest,
    host_name,
    measure_clock_offset,
    restore,
    versions,
    wrap_init_process_group,
)
from tracer.memory import MemorySnapshots, StepMemory
from tracer.profiling import ProfilerDriver
from tracer.rundir import LaunchInfo, RunDirError, remove_rank_files, resolve_run_dir
from tracer.sigterm import SIGTERM_EXIT_CODE, SigtermHandling, die_by_sigterm
from tracer.spawnwatch import SpawnWatch
from tracer.summary import ScriptOutcome, recorded_anything, summary_lines

STEP_WORKER_PERIOD_S = 0.2  # how often step records, comms records and scalars are written
# Above this many active steps a window's events held in memory until export grow RSS by
# hundreds of MB (docs/tracer.md, Record sizes and memory): said once, at start.
ACTIVE_STEPS_WARNING = 100
_FAILED = object()  # what Session._guarded returns when the call raised


def _import_part(module: str, name: str):
    """(class, None) or (None, why): a part that cannot be imported is left out, not fatal."""
    try:
        return getattr(importlib.import_module(module), name), None
    except Exception as exc:
        return None, f"{module} unavailable ({type(exc).__name__}: {exc}); this part is off"


class Session:
    """One rank's tracing of one script run: the run folder, the parts, the step clock."""

    def __init__(self, config: TracerConfig, script: str, script_args: list[str],
                 launch: LaunchInfo):
        self.config = config
        self.script = script
        self.script_args = script_args
        self.launch = launch
        self.rank = launch.rank
        self.run_dir: str | None = None
        self.manifest: Manifest | None = None
        self.steps = 0
        self.step_start_ns = time.time_ns()
        self.steps_writer: JsonlWriter | None = None
        self.comms_writer: CommsWriter | None = None
        self.samples_writer: JsonlWriter | None = None
        self.comms = None
        self.sampler = None
        self.scalars = None
        self.profiler: ProfilerDriver | None = None
        self.memory: StepMemory | None = None
        self.snapshots: MemorySnapshots | None = None
        self.backend: str | None = None
        self.pg_world_size: int | None = None
        self.opened = False
        self.closed = False
        self.sigterm_received = False
        self.summary: str | None = None
        self._close_lock = threading.Lock()
        self._pending_errors: list[tuple[str, str]] | None = []  # None once run_start is out
        self._reported: set[int] = set()
        self._manual_steps = False
        self._optimizer_ended_a_step = False
        self.record_budget: RecordBudget | None = None
        self.record_cap_step: int | None = None
        self.spawn_watch: SpawnWatch | None = None
        self.kept = True  # False once a run that recorded nothing has had its files removed
        self._step_optimizer: weakref.ref | None = None
        self._optimizer_hook = None
        self._init_patches: list[tuple[types.ModuleType, object]] = []
        self._inits = 0
        self._step_failed = False
        self._comm_ops_seen = 0
        self._comm_bytes_seen = 0
        self._step_records: collections.deque = collections.deque()
        self._step_worker: threading.Thread | None = None
        self._step_worker_stop = threading.Event()
        self.closed_event = threading.Event()
        self._sigterm = SigtermHandling(self)

    # ---- setup -----------------------------------------------------------------------------
    def open(self) -> None:
        """Create the run folder and files and start every part; the script has not run yet.

        Raises RunDirError when the run folder or the manifest cannot be created; a part that
        fails after that is switched off and noted.
        """
        c = self.config
        self.run_dir = resolve_run_dir(c.out, c.run_name, self.script, self.launch,
                                       c.rendezvous_timeout)
        import torch  # after the folder check: a bad --out fails in a fraction of a second
        try:
            self.manifest = Manifest(self.run_dir, self.rank)
        except OSError as exc:
            raise RunDirError(f"cannot write in run folder {self.run_dir!r}: "
                              f"{exc.strerror or exc}") from None
        if c.max_record_mb > 0:
            self.record_budget = RecordBudget(int(c.max_record_mb * 1e6), self._record_cap_reached)
        self.steps_writer = self._open_writer(schema.STEPS_FILE, "steps", JsonlWriter)
        use_cuda = torch.cuda.is_available()
        if not c.no_comms:
            recorder_class, why = _import_part("tracer.comms", "CommsRecorder")
            if recorder_class is None:
                self._part_failed("comms", why)
            else:
                self.comms_writer = self._open_writer(schema.COMMS_FILE, "comms", CommsWriter)
                if self.comms_writer is not None:
                    self.comms = self._construct("comms", recorder_class, self.comms_writer,
                                                 self._current_step, use_cuda,
                                                 ddp_bucket_hook=c.ddp_bucket_hook)
        if not c.no_sampler:
            sampler_class, why = _import_part("tracer.sampler", "DeviceSampler")
            if sampler_class is None:
                self._part_failed("sampler", why)
            else:
                self.samples_writer = self._open_writer(schema.SAMPLES_FILE, "sampler",
                                                        SamplesWriter, self._current_step)
                if self.samples_writer is not None:
                    device = (self.launch.local_rank % torch.cuda.device_count()) if use_cuda else None
                    self.sampler = self._construct("sampler", sampler_class,
                                                   self.samples_writer, c.sample_hz, device)
        scalars_class, why = _import_part("tracer.scalars", "ScalarsWriter")
        if scalars_class is None:
            self._part_failed("scalars", why)
        else:
            self.scalars = self._construct("scalars", scalars_class, self.run_dir, self.rank,
                                           budget=self.record_budget)
        self.memory = self._construct("memory", StepMemory)
        self.snapshots = MemorySnapshots(self.run_dir, self.rank, c.memory_snapshot,
                                         self._current_step, self._part_failed)
        if not c.no_profiler:
            self.profiler = ProfilerDriver(c, self.run_dir, self.rank, self._part_failed, use_cuda)
            if c.active > ACTIVE_STEPS_WARNING and self.rank == 0:
                self._say(f"profiler: --active {c.active} keeps every event of {c.active} steps "
                          f"in memory until each window ends; memory grows with each active step"
                          f" (docs/tracer.md, Record sizes and memory)")
        self.spawn_watch = self._construct("spawn_watch", SpawnWatch, self._untraced_processes)

        self._init_patches = wrap_init_process_group(self._after_init_process_group)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._optimizer_hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        tracer._step_callback = self.manual_step
        if self.comms is not None:
            self._guarded("comms", self.comms.install)
        if self.spawn_watch is not None and self._guarded("spawn_watch",
                                                          self.spawn_watch.install) is _FAILED:
            self.spawn_watch = None
        if self.sampler is not None:
            self._guarded("sampler", self.sampler.start)
        self._guarded("memory_snapshot", self.snapshots.install)
        self._write_run_start(use_cuda)
        self._step_worker = threading.Thread(target=self._write_steps, name="ranktrace-steps",
                                             daemon=True)
        self._step_worker.start()
        # Last, so that setting up the other parts is not in the first trace window.
        if self.profiler is not None:
            self._guarded("profiler", self.profiler.start)
        self.opened = True
        self.step_start_ns = time.time_ns()

    def _open_writer(self, pattern: str, part: str, writer_class, *args):
        path = os.path.join(self.run_dir, pattern.format(rank=self.rank))
        try:
            return writer_class(path, part, *args, budget=self.record_budget)
        except OSError as exc:
            self._part_failed(part, f"cannot create {path} ({exc.strerror or exc}); {part} is off")
            return None

    def _write_run_start(self, use_cuda: bool) -> None:
        info = versions()
        if not use_cuda:
            info.pop("device_name", None)
        self.manifest.write(schema.RunStart(
            schema_version=schema.SCHEMA_VERSION, run_name=os.path.basename(self.run_dir),
            rank=self.rank, local_rank=self.launch.local_rank, world_size=self.launch.world_size,
            host=host_name(), pid=os.getpid(), start_ns=time.time_ns(),
            argv=list(getattr(sys, "orig_argv", sys.argv)), script=self.script,
            script_args=list(self.script_args), config=dataclasses.asdict(self.config),
            attempt=self.launch.attempt,
            sampler_source=getattr(self.sampler, "source", None),
            sampler_reason=getattr(self.sampler, "reason", None), **info))
        pending, self._pending_errors = self._pending_errors, None
        for part, message in pending:
            self.manifest.error(part, message, echo=False)  # printed when it happened

    # ---- failures of parts -----------------------------------------------------------------
    def _part_failed(self, part: str, message: str, echo: bool = True) -> None:
        """Note a part that switched itself off: one stderr line, one manifest record."""
        if self._pending_errors is not None:  # run_start is not written yet
            if echo:
                print(f"ranktrace: rank{self.rank} {part}: {message}", file=sys.stderr, flush=True)
            self._pending_errors.append((part, message))
            return
        self.manifest.error(part, message, echo=echo)

    def _guarded(self, part: str, fn, *args, **kwargs):
        """fn(*args, **kwargs), or _FAILED after switching `part` off if it raised."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            self._disable(part, f"{type(exc).__name__}: {exc}")
            return _FAILED

    def _construct(self, part: str, cls, *args, **kwargs):
        made = self._guarded(part, cls, *args, **kwargs)
        return None if made is _FAILED else made

    def _disable(self, part: str, why: str) -> None:
        self._part_failed(part, f"{why}; {part} is off")
        if part == "comms" and self.comms is not None:
            comms, self.comms = self.comms, None
            try:
                comms.uninstall()
            except Exception:
                pass  # already reported; nothing more to do
        elif part == "sampler" and self.sampler is not None:
            sampler, self.sampler = self.sampler, None
            try:
                sampler.stop()
            except Exception:
                pass
        elif part in ("scalars", "memory", "profiler"):
            setattr(self, part, None)

    def _say(self, line: str) -> None:
        print(f"ranktrace: rank{self.rank} {line}", file=sys.stderr, flush=True)

    def _record_cap_reached(self, step: int) -> None:
        """The budget's callback, on whichever thread wrote the record that did not fit."""
        self.record_cap_step = step
        self._say(f"records: --max-record-mb {self.config.max_record_mb:g} reached at step "
                  f"{step}: step, comm and sample records and scalars stop there (Kineto traces "
                  f"and the manifest go on)")

    def _untraced_processes(self, nprocs: int, start_method: str) -> None:
        self._say(f"torch.multiprocessing started {nprocs} process(es) (start method "
                  f"{start_method}); they are not traced, only this process is: launch the "
                  f"ranks with torchrun -m tracer.record to trace each one")

    def _report_part_errors(self) -> None:
        """Into the manifest: writers and parts that switched themselves off (and said so)."""
        for part, source in (("steps", self.steps_writer), ("comms", self.comms_writer),
                             ("sampler", self.samples_writer), ("comms", self.comms),
                             ("sampler", self.sampler), ("scalars", self.scalars)):
            error = getattr(source, "error", None) if source is not None else None
            if error is not None and id(source) not in self._reported:
                self._reported.add(id(source))
                self._part_failed(part, error, echo=False)

    # ---- steps -----------------------------------------------------------------------------
    def _current_step(self) -> int:
        return self.steps

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self._manual_steps:
            return
        # Several optimizers (one per model part) step once each per training step: the
        # first one that ever stepped keeps time, unless it has been dropped since.
        first = self._step_optimizer() if self._step_optimizer is not None else None
        if first is None:
            self._step_optimizer = weakref.ref(optimizer)
        elif first is not optimizer:
            return
        self._optimizer_ended_a_step = True
        self.end_step()

    def manual_step(self) -> None:
        """tracer.step(): from its first call on, only it ends steps. A script that also steps
        a torch.optim optimizer calls it after optimizer.step(), whose hook has already ended
        the step: that first call then only takes over, so the step is not counted twice."""
        if not self._manual_steps:
            self._manual_steps = True
            if self._optimizer_ended_a_step:
                return
        self.end_step()

    def end_step(self) -> None:
        if self.closed or not self.opened:
            return
        try:
            self._end_step()
        except Exception as exc:  # a bug of ours must not fail the optimizer step
            if not self._step_failed:
                self._step_failed = True
                self._part_failed("steps", f"step end failed ({type(exc).__name__}: {exc})")
        finally:
            self.step_start_ns = time.time_ns()
            if self._sigterm.pending:
                self._sigterm.handle_on_main()

    def _end_step(self) -> None:
        """The main thread's share of a step end: what must be read exactly at the boundary."""
        end_ns = time.time_ns()
        step = self.steps
        profiler, comms, memory = self.profiler, self.comms, self.memory  # the worker may unset them
        in_window = profiler.recording if profiler is not None else False
        # The recorder counts ops when they are issued, so a step gets all of its own ops even
        # when their timing (CUDA events) is only resolved at a later drain.
        ops = nbytes = 0
        if comms is not None:
            total_ops, total_bytes = comms.ops, comms.bytes
            ops, nbytes = total_ops - self._comm_ops_seen, total_bytes - self._comm_bytes_seen
            self._comm_ops_seen, self._comm_bytes_seen = total_ops, total_bytes
        figures = {}
        if memory is not None:
            figures = self._guarded("memory", memory.take)
            if figures is _FAILED:
                figures = {}
        record = schema.StepRecord(step=step, start_ns=self.step_start_ns, end_ns=end_ns,
                                   in_profiler_window=in_window, comm_ops=ops, comm_bytes=nbytes,
                                   **figures)
        self.steps = step + 1
        self._step_records.append(record)  # no wake-up: the worker comes by on its own
        if profiler is not None:
            profiler.step()

    def _write_steps(self) -> None:
        """The step-end worker thread: everything that can wait a fraction of a second.

        Draining the comms recorder and writing step records and scalars costs about 175 us of
        CPU per step when done one step at a time (cold caches, a thread wake-up each); done
        every STEP_WORKER_PERIOD_S for all the steps since, about 50 us, and mostly while the
        main thread waits in C (kernels, collectives).
        """
        while not self._step_worker_stop.wait(STEP_WORKER_PERIOD_S):
            try:
                self._finish_steps()
            except Exception as exc:  # a bug of ours: keep training, stop this part
                self._part_failed("steps", f"step-end worker failed ({type(exc).__name__}: {exc});"
                                           " steps, comms and scalars recording is off")
                return
        # The closer makes the last pass, after the comms recorder's last drain.

    def _finish_steps(self, drain: bool = True) -> None:
        comms = self.comms
        if drain and comms is not None:
            self._guarded("comms", comms.drain, False)
        records = self._step_records
        rss = None
        memory = self.memory
        if records and memory is not None:
            rss = self._guarded("memory", memory.rss)
            rss = None if rss is _FAILED else rss
        while records:
            record = records.popleft()
            record.rss_bytes = rss
            algbw = (self.comms_writer.take_algbw(record.step) if self.comms_writer is not None
                     else None)
            if self.steps_writer is not None:
                self.steps_writer.write(record)
            scalars = self.scalars
            if scalars is not None:
                self._guarded("scalars", scalars.add_step, record, algbw)
        samples = self.samples_writer.pending if self.samples_writer is not None else ()
        while samples:
            sample, step = samples.popleft()
            scalars = self.scalars
            if scalars is not None:
                self._guarded("scalars", scalars.add_sample, sample, step)
        self._report_part_errors()

    def _stop_step_worker(self, timeout: float) -> None:
        worker, self._step_worker = self._step_worker, None
        if worker is None:
            return
        self._step_worker_stop.set()
        if worker is not threading.current_thread():
            worker.join(timeout)

    # ---- process group start: clock offset -------------------------------------------------
    def _after_init_process_group(self) -> None:
        if self.closed or self.manifest is None:
            return
        try:
            import torch.distributed as dist
            from torch.distributed import distributed_c10d

            rank, world_size = dist.get_rank(), dist.get_world_size()
            self.backend, self.pg_world_size = str(dist.get_backend()), world_size
            key_prefix = f"{CLOCK_KEY_PREFIX}/attempt{self.launch.attempt}/init{self._inits}"
            self._inits += 1
            store = distributed_c10d._get_default_store() if world_size > 1 else None
            offset, uncertainty, round_trips = measure_clock_offset(store, rank, world_size,
                                                                    key_prefix)
            self.manifest.write(schema.ClockSync(
                rank=rank, offset_ns=offset, uncertainty_ns=uncertainty, round_trips=round_trips,
                backend=self.backend, world_size=world_size))
        except Exception as exc:
            self._part_failed("clock", f"clock offset not measured ({type(exc).__name__}: {exc});"
                                       " times of this rank are not aligned to rank 0")

    # ---- the end ---------------------------------------------------------------------------
    def close(self, status: str, exit_code: int, exception: str | None = None,
              on_main: bool = True) -> bool:
        """Stop every part, finish the files, write run_end. False if already closed.

        `on_main` False: called from the SIGTERM watcher while the main thread is stuck; the
        profiler (not safe to stop from another thread) and CUDA are left alone.
        """
        with self._close_lock:
            if self.closed:
                return False
            self.closed = True
        try:
            self._close(status, exit_code, exception, on_main)
        finally:
            self.closed_event.set()
        return True

    def _close(self, status: str, exit_code: int, exception: str | None, on_main: bool) -> None:
        tracer._step_callback = None
        if self._optimizer_hook is not None:
            self._optimizer_hook.remove()
        restore(self._init_patches)
        self._stop_step_worker(timeout=5.0 if on_main else 1.0)
        if self.profiler is not None:
            if on_main:
                self.profiler.stop()
            elif self.profiler.recording:
                self._part_failed("profiler", "the open profiler window was lost: the main "
                                              "thread was blocked when SIGTERM came")
        if self.spawn_watch is not None:
            self._guarded("spawn_watch", self.spawn_watch.uninstall)
        if self.comms is not None:
            # Waiting for ops in flight could hang when a peer died; only a clean end waits.
            self._guarded("comms", self.comms.drain, status == "ok")
            self._guarded("comms", self.comms.uninstall)
        if self.sampler is not None:
            self._guarded("sampler", self.sampler.stop)
        # The step records, comm records and samples that came after the worker's last pass.
        try:
            self._finish_steps(drain=False)
        except Exception as exc:
            self._part_failed("steps", f"writing the last steps failed ({type(exc).__name__}: {exc})")
        if on_main and self.snapshots is not None:
            self.snapshots.finish()
        if self.scalars is not None:
            self._guarded("scalars", self.scalars.close)
        for writer in (self.steps_writer, self.comms_writer, self.samples_writer):
            if writer is not None:
                writer.close()
        self._report_part_errors()
        backend, world_size = self.backend, self.pg_world_size
        run_end = schema.RunEnd(
            rank=self.rank, end_ns=time.time_ns(), status=status, exit_code=exit_code,
            steps=self.steps, windows=self.windows, samples=self.samples, comm_ops=self.comm_ops,
            bytes_written=self.bytes_written(), errors=self.manifest.errors, backend=backend,
            world_size=world_size, exception=exception,
            samples_missed_pct=getattr(self.sampler, "missed_pct", None),
            untraced_processes=getattr(self.spawn_watch, "processes", 0),
            record_cap_step=self.record_cap_step)
        self.manifest.write(run_end)
        self.manifest.close()
        if self.manifest.writer.error is not None:
            run_end.errors += 1
        snapshots = getattr(self.snapshots, "bytes_written", 0) or 0
        if not recorded_anything(run_end, snapshots):
            self._remove_files()
        # The summary counts the run_end line too, as bytes_written in the folder.
        shown = msgspec.structs.replace(run_end, bytes_written=self.bytes_written())
        self.summary = "\n".join(summary_lines(shown, self.run_dir, self.kept))

    def _remove_files(self) -> None:
        """Remove this rank's files, and the run folder once no rank has files left in it."""
        paths = [w.path for w in self._writers()]
        scalars_path = getattr(self.scalars, "path", None)
        if scalars_path is not None and scalars_path != self.run_dir:
            paths.append(scalars_path)
        self.kept = not remove_rank_files(self.run_dir, paths)

    @property
    def windows(self) -> int:
        return self.profiler.windows if self.profiler is not None else 0

    @property
    def samples(self) -> int:
        return getattr(self.sampler, "samples", 0) if self.sampler is not None else 0

    @property
    def comm_ops(self) -> int:
        return getattr(self.comms, "ops", 0) if self.comms is not None else 0

    def bytes_written(self) -> int:
        parts = (*self._writers(), self.scalars, self.profiler, self.snapshots)
        return sum(getattr(part, "bytes_written", 0) or 0 for part in parts if part is not None)

    def finish(self, outcome: ScriptOutcome) -> None:
        """After the script: snapshot an OOM, close, let SIGTERM kill at once again."""
        if outcome.exception is not None and self.snapshots is not None:
            self.snapshots.on_script_exception(outcome.exception)
        self._sigterm.settle()
        if self._sigterm.fatal:
            # SIGTERM came while its default action was due (our handler only defers it), and
            # the script then ended before our handler ran (say a collective failed because
            # the peers died of the same SIGTERM): it dies of SIGTERM, as it would untraced.
            self.close("interrupted", SIGTERM_EXIT_CODE, outcome.exception_text)
            self.print_summary()
            die_by_sigterm()
        status = "interrupted" if self.sigterm_received else outcome.status
        self.close(status, outcome.exit_code, outcome.exception_text)
        self._sigterm.uninstall()

    def abandon(self) -> None:
        """Undo whatever open() installed, after it failed half-way; writes nothing more."""
        self.closed = True
        tracer._step_callback = None
        self._stop_step_worker(timeout=1.0)
        for undo in (getattr(self._optimizer_hook, "remove", None),
                     functools.partial(restore, self._init_patches),
                     getattr(self.comms, "uninstall", None), getattr(self.sampler, "stop", None),
                     getattr(self.spawn_watch, "uninstall", None),
                     getattr(self.profiler, "stop", None), getattr(self.scalars, "close", None),
                     self._sigterm.uninstall):
            if undo is not None:
                try:
                    undo()
                except Exception:
                    pass
        for writer in self._writers():
            writer.close()
        if self.run_dir is not None:
            self._remove_files()  # the script runs untraced: nothing here is worth keeping

    def print_summary(self) -> None:
        if self.summary is not None:
            print(self.summary, file=sys.stderr, flush=True)

    def flush_files(self) -> None:
        """Push buffered records to disk now (any thread); for SIGTERM and similar."""
        for writer in self._writers():
            writer.flush()

    def _writers(self) -> list[JsonlWriter]:
        """Every JSONL writer that was opened, the manifest's last."""
        manifest_writer = self.manifest.writer if self.manifest is not None else None
        return [w for w in (self.steps_writer, self.comms_writer, self.samples_writer,
                            manifest_writer) if w is not None]

"""One rank's tracing session: the run folder, the parts, their failures, and the run's end.

Every part (tracer.part.Part) is built here, told to report its failure to the session, and
closed at the end. A part that fails is noted in the manifest and no longer used; the others go
on. Steps are ended by tracer.stepclock, written by tracer.stepworker; clock offsets come from
tracer.clocksync; SIGTERM is handled by tracer.sigterm through `end_by_sigterm`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import threading
import time

import msgspec

import tracer
from tracer import log, schema, stacks
from tracer.buffered import BufferedFile, RecordBudget
from tracer.clocksync import ClockSync
from tracer.config import TracerConfig
from tracer.jsonl import CommsWriter, JsonlWriter, SamplesWriter
from tracer.manifest import Manifest, host_name, versions
from tracer.memory import MemorySnapshots, StepMemory
from tracer.part import Part
from tracer.profiling import ProfilerDriver
from tracer.rundir import LaunchInfo, RunDirError, remove_rank_files, resolve_run_dir
from tracer.sigterm import SIGTERM_EXIT_CODE, SigtermHandling, die_by_sigterm
from tracer.spawnwatch import SpawnWatch
from tracer.stepclock import StepClock
from tracer.stepworker import StepWorker
from tracer.summary import ScriptOutcome, recorded_anything, summary_lines

# Above this many active steps a window's events held in memory until export grow RSS by
# hundreds of MB (docs/tracer.md, Record sizes and memory): said once, at start.
ACTIVE_STEPS_WARNING = 100
_FAILED = object()  # what Session._guarded returns when the call raised
# The session's references to the parts it calls while the script runs; a failed part's is
# set to None.
_IN_USE = ("steps_writer", "comms_writer", "samples_writer", "comms", "sampler", "scalars",
           "memory", "snapshots", "profiler", "spawn_watch", "clock_sync")


def _import_part(module: str, name: str):
    """(class, None) or (None, why): a part that cannot be imported is left out, not fatal."""
    try:
        return getattr(importlib.import_module(module), name), None
    except Exception as exc:
        return None, f"{module} unavailable ({type(exc).__name__}: {exc}); this part is off"


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:
        pass  # the part has said what went wrong, or the process is ending anyway


class Session:
    """One rank's tracing of one script run."""

    def __init__(self, config: TracerConfig, script: str, script_args: list[str],
                 launch: LaunchInfo):
        self.config, self.script, self.script_args = config, script, script_args
        self.launch, self.rank = launch, launch.rank
        self.run_dir: str | None = None
        self.manifest: Manifest | None = None
        self.parts: list[Part] = []
        for name in _IN_USE:
            setattr(self, name, None)
        self.clock = StepClock(self._on_step_end)
        self.worker = StepWorker(self._write_pending, self._on_worker_error)
        self.samples_per_step = config.samples_per_step or None
        self.record_budget: RecordBudget | None = None
        self.record_cap_step: int | None = None
        self.opened = self.closed = False
        self.kept = True  # False once a run that recorded nothing has had its files removed
        self.summary: str | None = None
        self.closed_event = threading.Event()
        self._close_lock = threading.Lock()
        self._errors_lock = threading.Lock()
        self._pending_errors: list[tuple[str, str]] | None = []  # None once run_start is out
        self._comm_seen = (0, 0)  # the recorder's (ops, bytes) at the last step end
        self._step_end_failed = False
        self._sigterm = SigtermHandling(self)

    # ---- setup -----------------------------------------------------------------------------
    def watch_sigterm(self) -> None:
        """Main thread, before open(): from now on SIGTERM ends the run cleanly."""
        self._sigterm.install()

    def open(self) -> None:
        """Create the run folder and files and start every part; the script has not run yet.

        Raises RunDirError when the run folder or the manifest cannot be created; a part that
        fails after that is switched off and noted.
        """
        c = self.config
        log.set_rank(self.rank)
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
            self._open_comms(use_cuda)
        if not c.no_sampler:
            self._open_sampler(use_cuda)
        if not c.no_scalars:
            self.scalars = self._build("scalars", "tracer.scalars", "ScalarsWriter", self.run_dir,
                                       self.rank, budget=self.record_budget)
        self.memory = self._build("memory", StepMemory)
        self.snapshots = self._build("memory_snapshot", MemorySnapshots, self.run_dir, self.rank,
                                     c.memory_snapshot, self.current_step)
        if not c.no_profiler:
            self.profiler = self._build("profiler", ProfilerDriver, c, self.run_dir, self.rank,
                                        use_cuda)
            if c.active > ACTIVE_STEPS_WARNING and self.rank == 0:
                log.say(f"--active {c.active} keeps every event of {c.active} steps in memory "
                        f"until each window ends; memory grows with each active step "
                        f"(docs/tracer.md, Record sizes and memory)", "profiler")
        self.spawn_watch = self._build("spawn_watch", SpawnWatch, self._untraced_processes)
        self.clock_sync = self._build("clock", ClockSync, self.manifest.write, self.launch.attempt)
        tracer._samples_per_step_callback = self._set_samples_per_step
        self.clock.start(self.manual_step)
        for part in (self.clock_sync, self.comms, self.spawn_watch, self.sampler, self.snapshots):
            if part is not None:
                self._guarded(part, part.start)
        self._write_run_start(use_cuda)
        self.worker.start()
        # Last, so that setting up the other parts is not in the first trace window.
        if self.profiler is not None:
            self._guarded(self.profiler, self.profiler.start)
        self.opened = True
        self.clock.start_ns = time.time_ns()

    def _open_comms(self, use_cuda: bool) -> None:
        recorder_class, why = _import_part("tracer.comms", "CommsRecorder")
        if recorder_class is None:
            self._report("comms", why)
            return
        self.comms_writer = self._open_writer(schema.COMMS_FILE, "comms", CommsWriter)
        if self.comms_writer is not None:
            self.comms = self._build("comms", recorder_class, self.comms_writer,
                                     self.current_step, use_cuda,
                                     ddp_bucket_hook=self.config.ddp_bucket_hook,
                                     issue_records=not self.config.no_issue_records)

    def _open_sampler(self, use_cuda: bool) -> None:
        sampler_class, why = _import_part("tracer.sampler", "DeviceSampler")
        if sampler_class is None:
            self._report("sampler", why)
            return
        self.samples_writer = self._open_writer(schema.SAMPLES_FILE, "sampler", SamplesWriter,
                                                self.current_step)
        if self.samples_writer is not None:
            import torch

            device = (self.launch.local_rank % torch.cuda.device_count()) if use_cuda else None
            self.sampler = self._build("sampler", sampler_class, self.samples_writer,
                                       self.config.sample_hz, device)

    def _open_writer(self, pattern: str, name: str, writer_class, *args):
        path = os.path.join(self.run_dir, pattern.format(rank=self.rank))
        try:
            return self._add(writer_class(path, name, *args, budget=self.record_budget))
        except OSError as exc:
            self._report(name, f"cannot create {path} ({exc.strerror or exc}); {name} is off")
            return None

    def _build(self, name: str, cls, *args, **kwargs):
        """The part `cls(*args, **kwargs)` (a class, or module and class name to import), or
        None after reporting why it could not be built."""
        if isinstance(cls, str):
            cls, why = _import_part(cls, args[0])
            args = args[1:]
            if cls is None:
                self._report(name, why)
                return None
        try:
            part = cls(*args, **kwargs)
        except Exception as exc:
            self._report(name, f"{type(exc).__name__}: {exc}; {name} is off")
            return None
        return self._add(part)

    def _add(self, part: Part):
        self.parts.append(part)
        part.on_failure = self._on_part_failure
        if part.failed:  # it failed while being built, before it had anyone to tell
            self._record_error(part.name, part.error)
            return None
        return part

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
            sampler_reason=getattr(self.sampler, "reason", None),
            ddp_buckets=getattr(self.comms, "ddp_buckets", None), **info))
        with self._errors_lock:
            pending, self._pending_errors = self._pending_errors, None
        for name, message in pending:
            self.manifest.error(name, message)

    # ---- failures: the one path ------------------------------------------------------------
    def _on_part_failure(self, part: Part) -> None:
        """A part failed (it has said so on stderr): note it and stop using it."""
        self._record_error(part.name, part.error)
        for name in _IN_USE:
            if getattr(self, name) is part:
                setattr(self, name, None)

    def _report(self, name: str, message: str) -> None:
        """A failure with no part to report it (one that could not be built, the step end)."""
        log.say(message, name)
        self._record_error(name, message)

    def _record_error(self, name: str, message: str) -> None:
        with self._errors_lock:
            if self._pending_errors is not None:  # run_start is not written yet
                self._pending_errors.append((name, message))
                return
        self.manifest.error(name, message)

    def _guarded(self, part: Part, fn, *args):
        """fn(*args), or _FAILED after failing `part` if it raised."""
        try:
            return fn(*args)
        except Exception as exc:
            part.fail(f"{type(exc).__name__}: {exc}; {part.name} is off")
            return _FAILED

    def _record_cap_reached(self, step: int) -> None:
        """The budget's callback, on whichever thread wrote the record that did not fit."""
        self.record_cap_step = step
        log.say(f"--max-record-mb {self.config.max_record_mb:g} reached at step {step}: step, "
                f"comm and sample records and scalars stop there (Kineto traces and the manifest"
                f" go on)", "records")

    def _untraced_processes(self, nprocs: int, start_method: str) -> None:
        log.say(f"torch.multiprocessing started {nprocs} process(es) (start method "
                f"{start_method}); they are not traced, only this process is: launch the ranks "
                f"with torchrun -m tracer.record to trace each one")

    # ---- steps -----------------------------------------------------------------------------
    def current_step(self) -> int:
        return self.clock.steps

    def manual_step(self) -> None:
        """tracer.step()."""
        self.clock.manual_step()

    def _set_samples_per_step(self, samples: int) -> None:
        self.samples_per_step = samples or None

    def _on_step_end(self, step: int, start_ns: int, end_ns: int) -> None:
        if self.closed or not self.opened:
            return
        try:
            self._record_step(step, start_ns, end_ns)
        except Exception as exc:  # a bug of ours must not fail the optimizer step
            if not self._step_end_failed:
                self._step_end_failed = True
                self._report("steps", f"step end failed ({type(exc).__name__}: {exc})")
        finally:
            if self._sigterm.pending:
                self._sigterm.handle_on_main()

    def _record_step(self, step: int, start_ns: int, end_ns: int) -> None:
        """The main thread's share of a step end: what must be read exactly at the boundary."""
        profiler, comms, memory = self.profiler, self.comms, self.memory  # may be switched off
        in_window = profiler.recording if profiler is not None else False
        # The recorder counts ops when they are issued, so a step gets all of its own ops even
        # when their timing (CUDA events) is only resolved at a later drain.
        ops = nbytes = 0
        if comms is not None:
            total_ops, total_bytes = comms.ops, comms.bytes
            ops, nbytes = total_ops - self._comm_seen[0], total_bytes - self._comm_seen[1]
            self._comm_seen = (total_ops, total_bytes)
        figures = {}
        if memory is not None:
            figures = self._guarded(memory, memory.take)
            if figures is _FAILED:
                figures = {}
        self.worker.records.append(schema.StepRecord(
            step=step, start_ns=start_ns, end_ns=end_ns, in_profiler_window=in_window,
            comm_ops=ops, comm_bytes=nbytes, samples=self.samples_per_step, **figures))
        if profiler is not None:
            profiler.step()

    def _write_pending(self, drain: bool = True) -> None:
        """Step records, their scalars and the samples' scalars that piled up (the worker's
        pass every stepworker.PERIOD_S, and the closer's last one)."""
        comms = self.comms
        if drain and comms is not None:
            self._guarded(comms, comms.drain, False)
        records, memory = self.worker.records, self.memory
        rss = None
        if records and memory is not None:
            rss = self._guarded(memory, memory.rss)
            rss = None if rss is _FAILED else rss
        while records:
            record = records.popleft()
            record.rss_bytes = rss
            comms_writer, steps_writer = self.comms_writer, self.steps_writer
            algbw = comms_writer.take_algbw(record.step) if comms_writer is not None else None
            if steps_writer is not None:
                steps_writer.write(record)
            scalars = self.scalars
            if scalars is not None:
                self._guarded(scalars, scalars.add_step, record, algbw)
        samples = self.samples_writer.pending if self.samples_writer is not None else ()
        while samples:
            sample, step = samples.popleft()
            scalars = self.scalars
            if scalars is not None:
                self._guarded(scalars, scalars.add_sample, sample, step)

    def _on_worker_error(self, exc: BaseException) -> None:
        self._report("steps", f"step-end worker failed ({type(exc).__name__}: {exc}); steps, "
                              f"comms and scalars recording is off")

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
        tracer._samples_per_step_callback = None
        self.clock.close()
        self.worker.stop(timeout=5.0 if on_main else 1.0)
        profiler = self.profiler
        if profiler is not None and on_main:
            self._guarded(profiler, profiler.close)
        elif profiler is not None and profiler.recording:
            profiler.fail("the open profiler window was lost: the main thread was blocked when "
                          "SIGTERM came")
        if self.spawn_watch is not None:
            self._guarded(self.spawn_watch, self.spawn_watch.close)
        if self.comms is not None:
            # Waiting for ops in flight could hang when a peer died; only a clean end waits.
            self._guarded(self.comms, self.comms.drain, status == "ok")
        for part in (self.comms, self.sampler, self.clock_sync):
            if part is not None:
                self._guarded(part, part.close)
        try:  # the step records, comm records and samples that came after the worker's last pass
            self._write_pending(drain=False)
        except Exception as exc:
            self._report("steps", f"writing the last steps failed ({type(exc).__name__}: {exc})")
        if on_main and self.snapshots is not None:
            self.snapshots.finish()
        for part in self.parts:  # what is left: the files, and parts switched off on the way
            if on_main or not isinstance(part, ProfilerDriver):
                _quietly(part.close)
        run_end = schema.RunEnd(
            rank=self.rank, end_ns=time.time_ns(), status=status, exit_code=exit_code,
            steps=self.clock.steps, windows=self._built("windows", 0),
            samples=self._built("samples", 0), comm_ops=self._built("ops", 0),
            bytes_written=self.bytes_written(), errors=self.manifest.errors,
            backend=self._built("backend", None, ClockSync),
            world_size=self._built("world_size", None, ClockSync), exception=exception,
            samples_missed_pct=self._built("missed_pct", None),
            untraced_processes=self._built("processes", 0), record_cap_step=self.record_cap_step)
        self.manifest.write(run_end)
        self.manifest.close()
        if self.manifest.writer.error is not None:
            run_end.errors += 1
        if not recorded_anything(run_end, self._built("bytes_written", 0, MemorySnapshots)):
            self._remove_files()
        # The summary counts the run_end line too, as bytes_written in the folder.
        shown = msgspec.structs.replace(run_end, bytes_written=self.bytes_written())
        self.summary = "\n".join(summary_lines(shown, self.run_dir, self.kept))

    def _built(self, attribute: str, default, cls: type = Part):
        """`attribute` of the first part built (failed or not) that has it, of class `cls`."""
        for part in self.parts:
            if isinstance(part, cls) and hasattr(part, attribute):
                return getattr(part, attribute)
        return default

    def _remove_files(self) -> None:
        """Remove this rank's files, and the run folder once no rank has files left in it."""
        paths = [p.path for p in self._files() if p.path and p.path != self.run_dir]
        paths.append(os.path.join(self.run_dir, schema.STACKS_FILE.format(rank=self.rank)))
        self.kept = not remove_rank_files(self.run_dir, paths)

    def _files(self) -> list[BufferedFile]:
        """Every record and scalars file that was opened, the manifest's last."""
        files = [p for p in self.parts if isinstance(p, BufferedFile)]
        return files + ([self.manifest.writer] if self.manifest is not None else [])

    def bytes_written(self) -> int:
        manifest = self.manifest.writer.bytes_written if self.manifest is not None else 0
        return sum(part.bytes_written for part in self.parts) + manifest

    def finish(self, outcome: ScriptOutcome) -> None:
        """After the script: snapshot an OOM, close, let SIGTERM kill at once again."""
        if outcome.exception is not None and self.snapshots is not None:
            self.snapshots.on_script_exception(outcome.exception)
        if outcome.exception is not None and not stacks.was_dumped(outcome.exception):
            # It never passed through a collective's wrapper (DDP's reducer raises the group's
            # timeout from C++): the stop diagnosis still needs where this rank was.
            self._sigterm.dump_stacks("exception", skip_current=False, exc=outcome.exception)
        self._sigterm.settle()
        if self._sigterm.fatal:
            # SIGTERM came while its default action was due (our handler only defers it), and
            # the script then ended before our handler ran (say a collective failed because
            # the peers died of the same SIGTERM): it dies of SIGTERM, as it would untraced.
            self.close("interrupted", SIGTERM_EXIT_CODE, outcome.exception_text)
            self.print_summary()
            die_by_sigterm()
        status = "interrupted" if self._sigterm.received else outcome.status
        self.close(status, outcome.exit_code, outcome.exception_text)
        self._sigterm.uninstall()

    def end_by_sigterm(self, on_main: bool, wait_s: float) -> None:
        """Close as interrupted and print the summary; if another thread is already closing,
        wait up to `wait_s` for it instead."""
        if self.close("interrupted", SIGTERM_EXIT_CODE, on_main=on_main):
            self.print_summary()
        else:
            self.closed_event.wait(wait_s)

    def abandon(self) -> None:
        """Undo whatever open() installed, after it failed half-way; writes nothing more."""
        self.closed = True
        tracer._samples_per_step_callback = None
        self.clock.close()
        self.worker.stop(timeout=1.0)
        for part in self.parts:
            _quietly(part.close)
        _quietly(self._sigterm.uninstall)
        if self.manifest is not None:
            self.manifest.close()
        if self.run_dir is not None:
            self._remove_files()  # the script runs untraced: nothing here is worth keeping

    def print_summary(self) -> None:
        if self.summary is not None:
            print(self.summary, file=sys.stderr, flush=True)

    def flush_files(self) -> None:
        """Push buffered records to disk now (any thread); for SIGTERM and similar."""
        for file in self._files():
            file.flush()


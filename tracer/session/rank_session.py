"""One rank's tracing session: the run folder, the parts, their failures, and the run's end.

Every part (tracer.parts.part.Part) is built here from its tracer.session.part_registry entry,
told to report its failure to the session, and closed at the end; the session calls each part's
hooks and knows no part by name. A part that fails is noted in the manifest and no longer used;
the others go on. Steps are ended by tracer.steps.step_clock, written by
tracer.steps.step_worker; SIGTERM is handled by tracer.hangs.sigterm through `end_by_sigterm`.
A session whose script starts its ranks itself retires as a rank and hands the run over to its
launcher (tracer.session.launcher); the ranks' own sessions are tracer.session.launched's.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from collections.abc import Callable

import msgspec

import tracer
from tracer import schema
from tracer.hangs import stack_dumps
from tracer.hangs.sigterm import (
    SIGTERM_DEADLINE_S,
    SIGTERM_EXIT_CODE,
    SigtermHandling,
    die_by_sigterm,
)
from tracer.options.config import TracerConfig
from tracer.parts import log
from tracer.parts.buffered_file import BufferedFile, RecordBudget
from tracer.parts.part import Part
from tracer.session import part_registry
from tracer.session.manifest import Manifest, host_name, process_cpu_ids, process_cpus, versions
from tracer.session.part_registry import PartEntry, PartSetup
from tracer.session.run_folder import LaunchInfo, RunDirError, remove_rank_files, resolve_run_dir
from tracer.session.script_end import (
    ScriptOutcome,
    recorded_anything,
    say_lines,
    summary_lines,
)
from tracer.steps.step_clock import StepClock
from tracer.steps.step_worker import StepWorker

_FAILED = object()  # what Session._guarded returns when the call raised
# The Part hooks the session calls; each on the parts in use that override it.
_HOOKS = ("start", "step_fields", "on_step", "on_worker_pass", "pass_fields",
          "steps_known_until", "amend_step_record", "on_step_record",
          "pending_samples", "on_sample", "run_start_fields", "on_script_exception",
          "on_script_end", "after_last_records")


def _overrides(part: Part, hook: str) -> bool:
    return getattr(type(part), hook) is not getattr(Part, hook)


def _part_raised(part: Part, exc: Exception) -> None:
    """A hook of `part` raised `exc`: the part fails (and the session stops using it)."""
    part.fail(f"{type(exc).__name__}: {exc}; {part.name} is off")


def _quietly(fn) -> None:
    try:
        fn()
    except Exception:
        pass  # the part has said what went wrong, or the process is ending anyway


class Session:
    """One rank's tracing of one script run."""

    def __init__(self, config: TracerConfig, script: str, script_args: list[str],
                 launch: LaunchInfo, *, run_dir: str | None = None,
                 argv: list[str] | None = None, launched_by: str | None = None,
                 make_launcher: Callable[[Session], object] | None = None,
                 on_group_joined: Callable[[int, int], None] | None = None):
        """`run_dir`: the run folder, made already by the process that launched this rank
        (None: agree on one, tracer.session.run_folder); `argv`: the command line as typed
        (None: this process's); `launched_by`: how the script started this rank
        (schema.LAUNCHERS); `make_launcher(session)`: what the spawn watch hands the ranks the
        script starts (tracer.session.launcher.Launcher; None: they are not traced);
        `on_group_joined(rank, world_size)`: told when the script's init_process_group
        returns."""
        self.config, self.script, self.script_args = config, script, script_args
        self.launch, self.rank = launch, launch.rank
        self.run_dir: str | None = None
        self.run_path: str | None = None
        self._given_run_dir = run_dir
        self.argv = argv
        self.launched_by = launched_by
        self.on_group_joined = on_group_joined
        self.launcher = make_launcher(self) if make_launcher is not None else None
        self.manifest: Manifest | None = None
        self.parts: list[Part] = []  # every part built, failed or not, in the registry's order
        self._entries: dict[int, PartEntry] = {}  # id(part) -> the entry that built it
        self._named: dict[str, Part] = {}  # entry name -> the part its factory returned
        # hook -> the parts in use that override it; replaced, never changed in place, so that
        # a thread going through one while another part fails is not disturbed.
        self._hooked: dict[str, tuple[Part, ...]] = dict.fromkeys(_HOOKS, ())
        self._hooked_lock = threading.Lock()
        self.clock = StepClock(self._on_step_end)
        self.worker = StepWorker(self._write_pending, self._on_worker_error)
        self.samples_per_step = config.samples_per_step or None
        self.record_budget: RecordBudget | None = None
        self.record_cap_step: int | None = None
        self.opened = self.closed = False
        self.kept = True  # False once a run that recorded nothing has had its files removed
        self.summary: str | None = None
        self._summary_said = False
        self.closed_event = threading.Event()
        self._close_lock = threading.Lock()
        self._errors_lock = threading.Lock()
        self._pending_errors: list[tuple[str, str]] | None = []  # None once run_start is out
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
        self.run_dir = self._given_run_dir or resolve_run_dir(
            c.out, c.run_name, self.script, self.launch, c.rendezvous_timeout)
        self.run_path = os.path.abspath(self.run_dir)  # still right if the script changes cwd
        import torch  # after the folder check: a bad --out fails in a fraction of a second
        try:
            self.manifest = Manifest(self.run_dir, self.rank)
        except OSError as exc:
            raise RunDirError(f"cannot write in run folder {self.run_dir!r}: "
                              f"{exc.strerror or exc}") from None
        if c.max_record_mb > 0:
            self.record_budget = RecordBudget(int(c.max_record_mb * 1e6), self._record_cap_reached)
        use_cuda = torch.cuda.is_available()
        for entry in list(part_registry.REGISTRY):
            if entry.is_on(c):
                self._build(entry, use_cuda)
        self._refresh_hooks()
        tracer._samples_per_step_callback = self._set_samples_per_step
        self.clock.start(self.manual_step)
        starting = self._in_order(self._hooked["start"], "start_order")
        for part in [p for p in starting if not self._entries[id(p)].starts_last]:
            self._guarded(part, part.start)
        self._write_run_start(use_cuda)
        self.worker.start()
        for part in [p for p in starting if self._entries[id(p)].starts_last]:
            if not part.failed:
                self._guarded(part, part.start)
        self.opened = True
        self.clock.start_ns = time.time_ns()

    def _build(self, entry: PartEntry, use_cuda: bool) -> None:
        build, why = part_registry.factory(entry)
        if build is None:
            self._report(entry.name, why)
            return
        setup = PartSetup(entry, self.config, self.launch, self.run_dir, use_cuda,
                          self.record_budget, self.current_step, self.clock.track_ends,
                          self.manifest.write, add=lambda part: self._add(part, entry),
                          report=self._report, built=self.in_use, launcher=self.launcher,
                          group_joined=self._group_joined)
        part = build(setup)
        if part is not None:
            self._named[entry.name] = part

    def _add(self, part: Part, entry: PartEntry):
        self.parts.append(part)
        self._entries[id(part)] = entry
        part.on_failure = self._on_part_failure
        if part.failed:  # it failed while being built, before it had anyone to tell
            self._record_error(part.name, part.error)
            return None
        return part

    def _refresh_hooks(self) -> None:
        with self._hooked_lock:
            using = [p for p in self.parts if not p.failed]
            self._hooked = {hook: tuple(p for p in using if _overrides(p, hook))
                            for hook in _HOOKS}

    def _in_order(self, parts, order: str) -> list[Part]:
        """`parts` by their entries' `order`; those without one after, in the registry's."""
        def key(part):
            rank = getattr(self._entries[id(part)], order)
            return (rank is None, rank or 0)
        return sorted(parts, key=key)

    def in_use(self, name: str) -> Part | None:
        """The part built by the registry entry `name`, while it is in use."""
        part = self._named.get(name)
        return part if part is not None and not part.failed else None

    def _write_run_start(self, use_cuda: bool) -> None:
        info = versions(self.launch.local_rank)
        if not use_cuda:
            info.pop("device_name", None)
        fields = self._gathered("run_start_fields", self._hooked["run_start_fields"])
        self.manifest.write(schema.RunStart(**{
            **fields, **info, "schema_version": schema.SCHEMA_VERSION,
            "run_name": os.path.basename(self.run_dir), "rank": self.rank,
            "local_rank": self.launch.local_rank, "world_size": self.launch.world_size,
            "host": host_name(), "pid": os.getpid(), "start_ns": time.time_ns(),
            "argv": list(self.argv or getattr(sys, "orig_argv", sys.argv)),
            "script": self.script, "script_args": list(self.script_args),
            "config": dataclasses.asdict(self.config), "attempt": self.launch.attempt,
            "launched_by": self.launched_by, "cpus": process_cpus(),
            "cpu_ids": process_cpu_ids(), "device_type": "cuda" if use_cuda else "cpu"}))
        with self._errors_lock:
            pending, self._pending_errors = self._pending_errors, None
        for name, message in pending:
            self.manifest.error(name, message)

    def _gathered(self, hook: str, parts) -> dict:
        """The fields `hook` of each of `parts` gives; the first part to give one wins."""
        fields: dict = {}
        for part in parts:
            given = self._guarded(part, getattr(part, hook))
            if given is not _FAILED:
                for key, value in given.items():
                    fields.setdefault(key, value)
        return fields

    # ---- failures: the one path ------------------------------------------------------------
    def _on_part_failure(self, part: Part) -> None:
        """A part failed (it has said so on stderr): note it and stop using it."""
        self._record_error(part.name, part.error)
        self._refresh_hooks()

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
            _part_raised(part, exc)
            return _FAILED

    def _record_cap_reached(self, step: int) -> None:
        """The budget's callback, on whichever thread wrote the record that did not fit."""
        self.record_cap_step = step
        log.say(f"--max-record-mb {self.config.max_record_mb:g} reached at step {step}: step, "
                f"comm and sample records and scalars stop there (Kineto traces and the manifest"
                f" go on)", "records")

    def _group_joined(self, rank: int, world_size: int) -> None:
        """The clock sync's word that the script's init_process_group returned."""
        if self.on_group_joined is not None:
            self.on_group_joined(rank, world_size)

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
        """The main thread's share of a step end: what must be read exactly at the boundary.

        The hooks are called as `_guarded` would, written out: this runs at every step, after
        the training has pushed the tracer's code out of the caches, where each call costs."""
        fields = {}
        hooked = self._hooked
        for part in hooked["step_fields"]:
            try:
                fields.update(part.step_fields())
            except Exception as exc:
                _part_raised(part, exc)
        self.worker.records.append(schema.StepRecord(
            step=step, start_ns=start_ns, end_ns=end_ns, samples=self.samples_per_step,
            cpu_ns=time.process_time_ns() - self.clock.start_cpu_ns, **fields))
        for part in hooked["on_step"]:
            try:
                part.on_step()
            except Exception as exc:
                _part_raised(part, exc)

    def _write_pending(self, drain: bool = True) -> None:
        """Step records, their scalars and the samples' scalars that piled up (the worker's
        pass every step_worker.PERIOD_S, and the closer's last one)."""
        if drain:
            for part in self._hooked["on_worker_pass"]:
                self._guarded(part, part.on_worker_pass)
        records = self.worker.records
        fields = self._gathered("pass_fields", self._hooked["pass_fields"]) if records else {}
        until = self._steps_known_until() if drain and records else None
        while records:
            if until is not None and records[0].end_ns > until:
                break  # a part has not yet drained what this step issued
            record = records.popleft()
            for key, value in fields.items():
                setattr(record, key, value)
            for part in self._hooked["amend_step_record"]:
                self._guarded(part, part.amend_step_record, record)
            notes: dict = {}
            for part in self._hooked["on_step_record"]:
                self._guarded(part, part.on_step_record, record, notes)
        for source in self._hooked["pending_samples"]:
            samples = self._guarded(source, source.pending_samples)
            if samples is _FAILED:
                continue
            while samples:
                sample, step = samples.popleft()
                for part in self._hooked["on_sample"]:
                    self._guarded(part, part.on_sample, sample, step)

    def _steps_known_until(self) -> int | None:
        known = [self._guarded(p, p.steps_known_until) for p in self._hooked["steps_known_until"]]
        known = [t for t in known if t is not _FAILED and t is not None]
        return min(known) if known else None

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

    def close_or_wait(self, status: str, exit_code: int, exception: str | None = None,
                      on_main: bool = True, wait_s: float = SIGTERM_DEADLINE_S) -> bool:
        """close(); where another thread is already closing (the SIGTERM watcher, past its
        grace, while the script's end reached the main thread), wait up to `wait_s` for it to
        write run_end instead, since the process ends right after this returns. False if
        another thread closed."""
        if self.close(status, exit_code, exception, on_main=on_main):
            return True
        self.closed_event.wait(wait_s)
        return False

    def _close(self, status: str, exit_code: int, exception: str | None, on_main: bool) -> None:
        tracer._samples_per_step_callback = None
        self.clock.close()
        self.worker.stop(timeout=5.0 if on_main else 1.0)
        for part in self._in_order(self._hooked["on_script_end"], "close_order"):
            if not part.failed:
                self._guarded(part, part.on_script_end, status == "ok", on_main)
        try:  # the step records, comm records and samples that came after the worker's last pass
            self._write_pending(drain=False)
        except Exception as exc:
            self._report("steps", f"writing the last steps failed ({type(exc).__name__}: {exc})")
        for part in self._hooked["after_last_records"]:
            self._guarded(part, part.after_last_records, on_main)
        for part in self.parts:  # what is left: the files, and parts switched off on the way
            if on_main or not part.main_thread_only:
                _quietly(part.close)
        run_end = schema.RunEnd(**{
            **self._run_end_fields(), "rank": self.rank, "end_ns": time.time_ns(),
            "status": status, "exit_code": exit_code, "steps": self.clock.steps,
            "bytes_written": self.bytes_written(), "errors": self.manifest.errors,
            "exception": exception, "record_cap_step": self.record_cap_step})
        self.manifest.write(run_end)
        self.manifest.close()
        if self.manifest.writer.error is not None:
            run_end.errors += 1
        if not recorded_anything(run_end, any(part.keeps_run for part in self.parts)):
            self._remove_files()
        # The summary counts the run_end line too, as bytes_written in the folder.
        shown = msgspec.structs.replace(run_end, bytes_written=self.bytes_written())
        self.summary = "\n".join(summary_lines(shown, self.run_dir, self.kept))

    def recorded_so_far(self) -> bool:
        """Whether this rank has recorded anything worth keeping yet (a step, a comm op, a
        Kineto trace, a memory snapshot)."""
        counts = schema.RunEnd(**{
            **self._run_end_fields(), "rank": self.rank, "end_ns": 0, "status": "ok",
            "exit_code": 0, "steps": self.clock.steps, "bytes_written": 0, "errors": 0})
        counts.untraced_processes = 0  # a note about processes, not a record of this rank's
        return recorded_anything(counts, any(part.keeps_run for part in self.parts))

    def retire(self) -> None:
        """This process stops being a rank: the script starts the ranks itself, and the
        launcher (tracer.session.launcher) takes over. Every part stops and this rank's files,
        which hold nothing worth keeping (recorded_so_far), are removed; the run folder stays,
        for the ranks. No stack dump is written for this process from now on."""
        self.close("ok", 0, on_main=threading.current_thread() is threading.main_thread())
        if self.kept:
            self._remove_files()
        self.summary = None
        self.run_dir = None

    def _run_end_fields(self) -> dict:
        """What every part built gives, failed or not (what it did until then counts); 0 for
        the counts of the parts that were never built."""
        return {**schema.RUN_END_COUNTS, **self._gathered("run_end_fields", self.parts)}

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
        if self.launcher is not None and self.launcher.active:
            self._finish_launcher(outcome)
            return
        if outcome.exception is not None:
            for part in self._hooked["on_script_exception"]:
                self._guarded(part, part.on_script_exception, outcome.exception)
        if outcome.exception is not None and not stack_dumps.was_dumped(outcome.exception):
            # It never passed through a collective's wrapper (DDP's reducer raises the group's
            # timeout from C++): the stop diagnosis still needs where this rank was.
            self._sigterm.dump_stacks("exception", skip_current=False, exc=outcome.exception)
        self._sigterm.settle()
        if self._sigterm.fatal:
            # SIGTERM came while its default action was due (our handler only defers it), and
            # the script then ended before our handler ran (say a collective failed because
            # the peers died of the same SIGTERM): it dies of SIGTERM, as it would untraced.
            self.close_or_wait("interrupted", SIGTERM_EXIT_CODE, outcome.exception_text)
            self.print_summary()
            die_by_sigterm()
        status = "interrupted" if self._sigterm.received else outcome.status
        self.close_or_wait(status, outcome.exit_code, outcome.exception_text)
        self._sigterm.uninstall()

    def _finish_launcher(self, outcome: ScriptOutcome) -> None:
        """finish() of a session that retired for its launcher."""
        self._sigterm.settle()
        if self._sigterm.fatal:  # as in finish(): the script ended before our handler ran
            self.end_by_sigterm(True, SIGTERM_DEADLINE_S)
            die_by_sigterm()
        self.launcher.finish(outcome, "interrupted" if self._sigterm.received else None)
        self.summary = self.launcher.summary
        self._sigterm.uninstall()

    def end_by_sigterm(self, on_main: bool, wait_s: float) -> None:
        """Close as interrupted and print the summary; if another thread is already closing,
        wait up to `wait_s` for it instead. A launcher first passes SIGTERM on to its ranks and
        waits for them, as torchrun's agent does."""
        if self.launcher is not None and self.launcher.active:
            self.launcher.end_by_sigterm(wait_s)
            return
        self.close_or_wait("interrupted", SIGTERM_EXIT_CODE, on_main=on_main, wait_s=wait_s)
        self.print_summary()

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

    def dump_sigterm_stacks(self) -> None:
        """A stack dump for SIGTERM of a session whose process's SIGTERM handling is another's
        (the launcher's own rank): from the thread that handles it."""
        if self.opened and not self.closed:
            self._sigterm.dump_stacks("sigterm", skip_current=True)

    def print_summary(self) -> None:
        """The run's summary, once: the script's end and the SIGTERM watcher may both get
        here when they end the run at the same time."""
        with self._close_lock:
            if self.summary is None or self._summary_said:
                return
            self._summary_said = True
        say_lines(self.summary)

    def flush_files(self) -> None:
        """Push buffered records to disk now (any thread); for SIGTERM and similar."""
        for file in self._files():
            file.flush()


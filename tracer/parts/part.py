"""The interface every part of the tracer has, and its one failure path.

A part (the profiler driver, the device sampler, the memory readers, the TensorBoard writer,
the record writers, the comms recorder) starts, closes, says how many bytes it wrote, and fails at
most once: `fail(message)` keeps the message in `error`, prints one `ranktrace:` line and tells
its listener (the session, which notes it in the manifest and stops using the part). A failed
part does nothing more; training goes on.

What a part adds to the run goes through the hooks below, which the session calls on every part
in use, in the order of tracer.session.part_registry; a hook that raises fails its part.
Overriding a hook is all it takes to take part: the session calls a hook only on the parts that
override it, so the training's step end pays only for the parts that have something to do there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from tracer.parts.log import say

_fail_lock = threading.Lock()  # two threads failing one part at once still report it once


class Part:
    name = "part"  # what its stderr line and manifest error are labelled with
    error: str | None = None
    bytes_written: int = 0
    rank: int | None = None  # named in its line; None: the rank the log names
    on_failure: Callable[[Part], None] | None = None  # set by the session
    # close() must not run on another thread (torch.profiler): when the SIGTERM watcher ends the
    # run for a main thread stuck in C, it is left open.
    main_thread_only = False

    @property
    def failed(self) -> bool:
        return self.error is not None

    def start(self) -> None:
        """Begin recording (most parts are running once built)."""

    def close(self) -> None:
        """Stop and finish this part's files; calling it again does nothing."""

    def fail(self, message: str) -> bool:
        """Report this part's first failure; False (and nothing said) if it had already failed."""
        with _fail_lock:
            if self.error is not None:
                return False
            self.error = message
        say(message, self.name, self.rank)
        listener = self.on_failure
        if listener is not None:
            listener(self)
        return True

    # ---- a step's end, on the training thread: what must be read exactly at the boundary -----
    def step_fields(self) -> dict:
        """This part's fields of the StepRecord of the step that just ended."""
        return {}

    def on_step(self) -> None:
        """The step's record is queued (the profiler steps here: a window it closes, exported
        then, must not hold back the record, which SIGTERM's wrap-up may need to write)."""

    # ---- the step-end worker's pass (tracer.steps.step_worker): what can wait a moment -----------
    def on_worker_pass(self) -> None:
        """A pass begins: gather what completed since the last one (not in the closer's last
        pass, which comes after `on_script_end`)."""

    def pass_fields(self) -> dict:
        """Fields that every step record of this pass gets, read once per pass: too costly for
        every step on the training thread."""
        return {}

    def steps_known_until(self) -> int | None:
        """Step records that end after this host time (ns) wait for a later pass: this part
        adds to them what it learns only at its drains (tracer.comms.flight); None: no wait.
        The closer's last pass writes every record."""
        return None

    def amend_step_record(self, record) -> None:
        """Add this part's share to a finished StepRecord before any part writes it."""

    def on_step_record(self, record, notes: dict) -> None:
        """A finished StepRecord, in step order. `notes` holds what the parts before this one
        learnt about the step that is no field of it (the comms writer's comm_algbw_gbps)."""

    def pending_samples(self):
        """A deque of (DeviceSample, training step) written since the last pass, which the
        session empties into every part's `on_sample`; () when this part takes no samples."""
        return ()

    def on_sample(self, sample, step: int) -> None:
        """One device sample, and the training step it fell in."""

    # ---- the run ------------------------------------------------------------------------------
    def run_start_fields(self) -> dict:
        """This part's fields of the run_start record, written once every part has started."""
        return {}

    def on_script_exception(self, exc: BaseException) -> None:
        """The script ended with `exc`, before the run is closed."""

    def on_script_end(self, clean: bool, on_main: bool) -> None:
        """Stop observing the script, before the session writes the last records. `clean`: the
        run ended ok (worth waiting for ops in flight); `on_main` False: the SIGTERM watcher
        ends the run while the main thread is stuck, and CUDA is to be left alone."""

    def after_last_records(self, on_main: bool) -> None:
        """The last records are written; the files close next."""

    def run_end_fields(self) -> dict:
        """This part's fields of the run_end record (asked even when it has failed: what it
        did until then counts)."""
        return {}

    @property
    def keeps_run(self) -> bool:
        """Whether what this part wrote alone makes the run worth keeping (a run that recorded
        nothing has its files removed)."""
        return False

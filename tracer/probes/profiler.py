"""torch.profiler driven by training steps, writing one gzipped Kineto trace per window.

A torch.profiler.profile object exists only from the step before a window to the end of it:
between windows nothing of the profiler runs at a step end (torch's own `step()` costs about
10 us even when idle, a tenth of a percent of a 10 ms step).

Each trace is exported under a temporary name, gzipped to another, and renamed to
`rank{R}.<ns>.pt.trace.json.gz` only when complete, so torch-tb-profiler and HTA never see a
half-written file. An export failure (disk full) switches the profiler off with one line;
training goes on.
"""

from __future__ import annotations

import gzip
import os
import shutil
import threading
import time
import warnings

from tracer import schema
from tracer.options.config import TracerConfig
from tracer.parts import log
from tracer.parts.part import Part

GZIP_LEVEL = 6  # torch's own default (9) takes about twice as long for a few percent less
# Above this many active steps a window's events held in memory until export grow RSS by
# hundreds of MB (docs/tracer.md, Record sizes and memory): said once, at start.
ACTIVE_STEPS_WARNING = 100


def open_profiler(setup):
    """The registry's factory of the profiler driver (a tracer.session.part_registry.PartSetup)."""
    c = setup.config
    driver = setup.build(ProfilerDriver, c, setup.run_dir, setup.rank, setup.use_cuda)
    if c.active > ACTIVE_STEPS_WARNING and setup.rank == 0:
        log.say(f"--active {c.active} keeps every event of {c.active} steps in memory "
                f"until each window ends; memory grows with each active step "
                f"(docs/tracer.md, Record sizes and memory)", "profiler")
    if driver is not None:  # windows on demand and, with --capture-slow-steps, on slow steps
        from tracer.capture.capture_watch import open_capture

        open_capture(setup, driver)
    return driver


class ProfilerDriver(Part):
    name = "profiler"
    main_thread_only = True  # torch.profiler is not safe to stop from another thread

    def __init__(self, config: TracerConfig, run_dir: str, rank: int, use_cuda: bool):
        self.config = config
        self.run_dir = run_dir
        self.rank = rank
        self.use_cuda = use_cuda
        self.windows = 0
        self.bytes_written = 0
        self.trace_files: list[str] = []
        self._profile = None
        self._schedule = None
        self._idle = None  # ProfilerAction.NONE, once torch.profiler is imported
        self._step = 0  # the step now running, as the tracer numbers them
        self._due: int | None = None  # the next step that needs a profiler; None: never again
        # Windows off the fixed schedule (tracer.capture.capture_watch), planned by another thread:
        # (open step, first traced step, last traced step), in step order. `_capture_due` is the
        # first one's open step, the one thing the training thread reads between windows.
        self._captures: tuple[tuple[int, int, int], ...] = ()
        self._capture_due: int | None = None
        self._capture_open: tuple[int, int, int] | None = None  # the one being recorded
        self._capture_lock = threading.Lock()
        self.captures_missed: list[int] = []  # first steps passed before they were planned
        # Called with the torch.profiler.profile object once a window's trace is written, on
        # the training thread (tracer.probes.memory_profile's memory categories)
        self.window_listeners: list = []

    def start(self) -> None:
        """Before the script's first step."""
        from torch.profiler import ProfilerAction, schedule

        c = self.config
        self._schedule = schedule(skip_first=c.skip_first, wait=c.wait, warmup=c.warmup,
                                  active=c.active, repeat=c.windows)
        self._idle = ProfilerAction.NONE
        self._step = 0
        self._due = self._next_due(0)
        self._open_if_due()

    def _next_due(self, step: int) -> int | None:
        # Idle stretches are at most skip_first + wait steps long; longer means no more windows.
        c = self.config
        for k in range(step, step + c.skip_first + c.wait + 1):
            if self._schedule(k) != self._idle:
                return k
        return None

    def plan_window(self, first: int, steps: int) -> bool:
        """Any thread: profile steps first..first+steps-1 (after the configured warm-up steps),
        as well as the fixed schedule's windows. False when this rank is already past the
        window's first warm-up step, or the window overlaps another (nothing is planned)."""
        open_at, last = first - self.config.warmup, first + steps - 1
        with self._capture_lock:
            if self._schedule is None or open_at <= self._step:
                return False
            if any(self._schedule(k) != self._idle for k in range(open_at - 1, last + 2)):
                return False
            if any(o <= last + 1 and open_at <= e + 1 for o, _, e in self._captures):
                return False
            self._captures = tuple(sorted((*self._captures, (open_at, first, last))))
            self._capture_due = self._captures[0][0]
        return True

    @property
    def stopped(self) -> bool:
        """Any thread: profiling has stopped (the run is ending); no window opens any more."""
        return self._schedule is None

    def fixed_action(self, k: int):
        """Any thread: the fixed schedule's action at step k (idle once stopped)."""
        schedule = self._schedule
        return self._idle if schedule is None else schedule(k)

    def take_missed(self) -> list[int]:
        """Any thread: the first steps of the planned windows passed before they could open."""
        with self._capture_lock:
            missed, self.captures_missed = self.captures_missed, []
        return missed

    def _action(self, k: int):
        """The profiler's action at step k: the fixed schedule's, or the capture window's."""
        action = self._schedule(k)
        window = self._capture_open
        if action != self._idle or window is None or not window[0] <= k <= window[2]:
            return action
        from torch.profiler import ProfilerAction

        if k < window[1]:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD_AND_SAVE if k == window[2] else ProfilerAction.RECORD

    def _take_capture(self) -> None:
        """The training thread has reached the first planned capture's open step (or passed it:
        planned too late, it is dropped and noted)."""
        with self._capture_lock:
            while self._captures and self._captures[0][0] <= self._step:
                window, self._captures = self._captures[0], self._captures[1:]
                if window[0] == self._step:
                    self._capture_open = window
                else:
                    self.captures_missed.append(window[1])
            self._capture_due = self._captures[0][0] if self._captures else None

    def _open_if_due(self) -> None:
        capture = self._capture_due
        if capture is not None and self._step >= capture and self.error is None:
            self._take_capture()
        elif self.error is not None or self._due is None or self._step < self._due:
            return
        if self._action(self._step) == self._idle:
            if self._due is not None and self._step >= self._due:
                self._due = self._next_due(self._step)
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.use_cuda:
            activities.append(ProfilerActivity.CUDA)
        c = self.config
        # No with_flops: torch 2.13 writes no `flops` argument into the exported trace, and it
        # costs as much again as the shapes (docs/benchmarks.md); analysis.rank.flops counts
        # FLOPs from the shapes (docs/mfu.md). --profile-memory takes the Python stacks too:
        # torch's memory profiler needs them to tell parameters and optimizer state
        # (docs/memory.md).
        prof = profile(activities=activities, schedule=self._action,
                       on_trace_ready=self._export, record_shapes=c.record_shapes,
                       profile_memory=c.profile_memory,
                       with_stack=c.with_stack or c.profile_memory)
        # Start at the tracer's step number, so the trace's ProfilerStep#N is step N.
        prof.step_num = self._step
        prof.current_action = self._action(self._step)
        if hasattr(prof, "_prev_schedule_action"):
            prof._prev_schedule_action = prof.current_action
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof.start()
        self._profile = prof

    @property
    def recording(self) -> bool:
        """Whether the profiler is collecting events in the current step (warm-up or active)."""
        return self._profile is not None and self._profile.current_action != self._idle

    def step(self) -> None:
        """Tell the profiler a step ended; may export a trace (that is when a window closes)."""
        if self._schedule is None:
            return
        self._step += 1
        try:
            if self._profile is None:
                # Between windows nothing is due at almost every step: said here, without a
                # call, as this runs at every step end on the training thread.
                due = self._due
                if self._capture_due is not None or (due is not None and self._step >= due):
                    self._open_if_due()
                return
            if self.error is not None:
                self._shut_down()
                return
            # torch warns once per cycle that events are cleared between cycles: expected here.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._profile.step()
            if self._profile.current_action == self._idle:
                self._shut_down()  # the window is written; nothing runs until the next one
                self._capture_open = None
                if self._due is not None:
                    self._due = self._next_due(self._step)
        except Exception as exc:
            self.fail(f"profiler step failed ({type(exc).__name__}: {exc}); profiler is off")
            self._shut_down()

    def step_fields(self) -> dict:
        profile = self._profile  # self.recording, written out (every step end)
        return {"in_profiler_window": profile is not None
                and profile.current_action != self._idle}

    on_step = step

    def on_script_end(self, clean: bool, on_main: bool) -> None:
        if on_main:
            self.close()
        elif self.recording:
            self.fail("the open profiler window was lost: the main thread was blocked when "
                      "SIGTERM came")

    def run_end_fields(self) -> dict:
        return {"windows": self.windows}

    def close(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop profiling; a window still open is exported as it stands."""
        self._schedule = None
        if self._profile is None:
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._profile.stop()
        except Exception as exc:
            self.fail(f"profiler stop failed ({type(exc).__name__}: {exc})")
        self._profile = None

    def _shut_down(self) -> None:
        profile, self._profile = self._profile, None
        if profile is None:
            return
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                profile.stop()
        except Exception:
            pass  # reported already, or nothing was open

    def _export(self, profile) -> None:
        if self.error is not None:
            return
        final = os.path.join(self.run_dir, schema.kineto_trace_file(self.rank, time.time_ns()))
        raw = final + ".raw" + schema.TEMP_SUFFIX
        packed = final + schema.TEMP_SUFFIX
        try:
            profile.export_chrome_trace(raw)
            if not os.path.exists(raw):  # Kineto reports its write errors on stderr, not to us
                raise OSError(f"torch's export to {raw} wrote nothing (disk full?)")
            with open(raw, "rb") as src, gzip.open(packed, "wb", compresslevel=GZIP_LEVEL) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(packed, final)
            self.windows += 1
            self.bytes_written += os.path.getsize(final)
            self.trace_files.append(final)
        except Exception as exc:
            self.fail(
                f"writing trace {final} failed ({type(exc).__name__}: {exc}); profiler is off"
            )
            _remove_quietly(packed)
        finally:
            _remove_quietly(raw)
            _remove_quietly(raw + schema.TEMP_SUFFIX)  # Kineto's own temporary name
        if self.error is None:
            for listener in self.window_listeners:  # each reports its own failure
                listener(profile)


def _remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass

"""torch.profiler driven by training steps, writing one gzipped Kineto trace per window.

A torch.profiler.profile object exists only from the step before a window to the end of it:
between windows nothing of the profiler runs at a step end (torch's own `step()` costs about
10 us even when idle, a tenth of a percent of a 10 ms step).

Each trace is exported under a temporary name, gzipped to another, and renamed to
`rank{R}.<ns>.pt.trace.json.gz` only when complete, so torch-tb-profiler and HTA never see a
half-written file. An export failure (disk full) switches the profiler off with one line;
training goes on.

Every window, fixed or captured, is bounded (docs/tracer.md, Window bounds): a window still
open --max-window-s after it opened, or in which the process's resident memory grew by
--max-window-mb, is closed at the next step end and written as it stands, its trace's metadata
saying why (schema.WINDOW_CUT_METADATA), with one line and a manifest `problem`. Those checks
run only while a window is open.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import threading
import time
import warnings

from tracer import schema
from tracer.options.config import TracerConfig
from tracer.parts import log
from tracer.parts.part import Part
from tracer.probes.procfs import StatmRss

GZIP_LEVEL = 6  # torch's own default (9) takes about twice as long for a few percent less
# Above this many active steps a window's events held in memory until export grow RSS by
# hundreds of MB (docs/tracer.md, Record sizes and memory): said once, at start.
ACTIVE_STEPS_WARNING = 100


def open_profiler(setup):
    """The registry's factory of the profiler driver (a tracer.session.part_registry.PartSetup)."""
    c = setup.config
    driver = setup.build(ProfilerDriver, c, setup.run_dir, setup.rank, setup.use_cuda,
                         setup.write_manifest)
    if c.active > ACTIVE_STEPS_WARNING and setup.rank == 0:
        log.say(f"--active {c.active} keeps every event of {c.active} steps in memory "
                f"until each window ends; memory grows with each active step "
                f"(docs/tracer.md, Record sizes and memory)", "profiler")
    if driver is not None:  # windows on slow steps and on demand, unless --no-capture
        from tracer.capture.capture_watch import open_capture

        open_capture(setup, driver)
    return driver


class ProfilerDriver(Part):
    name = "profiler"
    main_thread_only = True  # torch.profiler is not safe to stop from another thread

    def __init__(self, config: TracerConfig, run_dir: str, rank: int, use_cuda: bool,
                 write_manifest=None):
        self.config = config
        self.write_manifest = write_manifest
        self.run_dir = run_dir
        self.rank = rank
        self.use_cuda = use_cuda
        self.windows = 0
        self.bytes_written = 0
        self.trace_files: list[str] = []
        self._profile = None
        self._schedule = None
        self._idle = None  # ProfilerAction.NONE, once torch.profiler is imported
        self._unsaved = ()  # the actions of a window's steps before its last
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
        # The bounds of the open window: when it opened (monotonic s), the RSS then (None: not
        # measured); `_cut`: (from, to) steps forced idle, the rest of a window closed early.
        self._opened_s = 0.0
        self._opened_rss: int | None = None
        self._rss_reader: StatmRss | None | bool = None  # False: not available here
        self._cut: tuple[int, int] | None = None
        self.cuts: dict[int, tuple[str, int]] = {}  # first traced step -> (why, cut step)
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
        self._unsaved = (ProfilerAction.WARMUP, ProfilerAction.RECORD)
        self._step = 0
        self._due = self._next_due(0)
        self._open_if_due()

    def _next_due(self, step: int) -> int | None:
        # Idle stretches are at most skip_first + wait steps long; longer means no more windows.
        c = self.config
        for k in range(step, step + c.skip_first + c.wait + 1):
            if self._fixed(k) != self._idle:
                return k
        return None

    def _fixed(self, k: int):
        """The fixed schedule's action at step k, idle in the rest of a window cut short."""
        cut = self._cut
        if cut is not None and cut[0] <= k <= cut[1]:
            return self._idle
        return self._schedule(k)

    def plan_window(self, first: int, steps: int) -> bool:
        """Any thread: profile steps first..first+steps-1 (after the configured warm-up steps),
        as well as the fixed schedule's windows. False when this rank is already past the
        window's first warm-up step, or the window overlaps another (nothing is planned)."""
        open_at, last = first - self.config.warmup, first + steps - 1
        if not 1 <= steps <= self.config.max_window_steps:
            return False
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
        action = self._fixed(k)
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
        self._opened_s = time.monotonic()
        self._opened_rss = self._rss() if c.max_window_mb > 0 else None

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
            # Only a window with steps still to come is cut: one at its last step ends now.
            why = self._past_bounds() if self._profile.current_action in self._unsaved else None
            if why is not None:
                self._cut_window(why)
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

    def _rss(self) -> int | None:
        reader = self._rss_reader
        if reader is None:
            try:
                reader = self._rss_reader = StatmRss()
            except (OSError, ValueError):
                reader = self._rss_reader = False  # not Linux: no memory bound
        return reader.rss() if reader else None

    def _past_bounds(self) -> tuple[str, str] | None:
        """(CAPTURE_CUTS reason, what was seen) when the open window has run past a bound."""
        c = self.config
        elapsed = time.monotonic() - self._opened_s
        if c.max_window_s > 0 and elapsed > c.max_window_s:
            return "time", f"open for {elapsed:.1f} s, past --max-window-s {c.max_window_s:g}"
        if self._opened_rss is not None:
            grown = (self._rss() - self._opened_rss) / 1e6
            if grown > c.max_window_mb:
                return "memory", (f"the process's resident memory grew by {grown:.0f} MB, past "
                                  f"--max-window-mb {c.max_window_mb:g}")
        return None

    def _cut_window(self, why: tuple[str, str]) -> None:
        """Close the open window at this step end: written as it stands if it has traced a
        step, its remaining steps idle; said once, and noted in the trace and the manifest."""
        from torch.profiler import ProfilerAction

        prof, step = self._profile, self._step  # the step about to begin
        window = self._capture_open
        if window is not None and window[0] <= step <= window[2]:
            first, last = window[1], window[2]
            self._capture_open = (window[0], window[1], step - 1)
        else:
            first, last = self._fixed_window_around(step)
        self._cut = (step, last)
        reason, seen = why
        with self._capture_lock:
            self.cuts[first] = (reason, step)
        traced = ("no trace is written (it was warming up)" if step <= first
                  else f"its trace holds steps {first}-{step - 1}")
        message = f"the window of steps {first}-{last} was closed at step {step}: {seen}; {traced}"
        if prof.current_action == ProfilerAction.RECORD:
            prof.current_action = ProfilerAction.RECORD_AND_SAVE  # written at this step()
        if step > first:
            prof.add_metadata_json(schema.WINDOW_CUT_METADATA, json.dumps(
                {"reason": reason, "cut_step": step, "first_step": first, "last_step": last,
                 "message": message}))
        log.say(message, self.name, self.rank)
        if self.write_manifest is not None:
            self.write_manifest(schema.TracerProblem(rank=self.rank, t_ns=time.time_ns(),
                                                     part=self.name, message=message))

    def _fixed_window_around(self, step: int) -> tuple[int, int]:
        """(first traced step, last step) of the fixed schedule's window holding `step` (a
        warm-up or traced step)."""
        from torch.profiler import ProfilerAction

        span = self.config.warmup + self.config.active
        recording = (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE)
        first = next((k for k in range(step, step + span) if self._schedule(k) in recording),
                     step)
        while first > 0 and first > step - span and self._schedule(first - 1) in recording:
            first -= 1
        last = next((k for k in range(first, first + span)
                     if self._schedule(k) == ProfilerAction.RECORD_AND_SAVE), first + span)
        return first, last

    def take_cuts(self) -> dict[int, tuple[str, int]]:
        """Any thread: the windows cut since the last call, by first traced step."""
        with self._capture_lock:
            cuts, self.cuts = self.cuts, {}
        return cuts

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

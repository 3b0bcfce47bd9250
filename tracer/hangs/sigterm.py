"""SIGTERM under the tracer: dump the stacks, flush, record the run as interrupted, and die by
SIGTERM as usual. SIGUSR1: dump the stacks, and training goes on."""

from __future__ import annotations

import _thread
import os
import select
import signal
import socket
import sys
import threading
import time

import tracer
from tracer import schema
from tracer.hangs import stack_dumps

# After SIGTERM the main thread gets this long to wrap up (it normally does so within
# milliseconds); if it is stuck in a C call, the watcher thread wraps up without it.
SIGTERM_GRACE_S = 1.0
# ... and whatever is still running then, the process is gone this long after SIGTERM.
SIGTERM_DEADLINE_S = 4.5
SIGTERM_EXIT_CODE = -signal.SIGTERM  # as subprocess and torchrun report a death by SIGTERM
_TRACER_DIR = os.path.dirname(os.path.abspath(tracer.__file__)) + os.sep


class SigtermHandling:
    """SIGTERM: flush, write run_end with status "interrupted", then die by SIGTERM as usual.

    A Python signal handler only runs on the main thread between bytecodes, so a script stuck
    in a C call (a collective waiting for a dead peer) would never see it. `signal.set_wakeup_fd`
    makes the interpreter's C-level handler also write the signal number to a socket, which a
    watcher thread reads at once. Blocking SIGTERM with pthread_sigmask and `sigwait` would do
    the same, but the mask is inherited by every child (DataLoader workers, subprocesses) across
    fork and exec, making them immune to SIGTERM.

    The main thread's handler wraps up if it gets to run; if not within SIGTERM_GRACE_S, the
    watcher wraps up without the profiler. Either way the process is gone by
    SIGTERM_DEADLINE_S. A handler the script installs replaces ours and is left to decide what
    happens; the watcher then only flushes files.
    """

    def __init__(self, session):
        """`session`: what SIGTERM ends, through `opened`, `flush_files()` and
        `end_by_sigterm(on_main)`, and whose stacks it dumps (`run_dir`, `rank`, and the ops
        of `in_use("comms")`)."""
        self.session = session
        self.received = False  # SIGTERM came, whoever handled it
        self.pending = False
        self.fatal = False  # SIGTERM arrived while our handler (its default action) was in place
        self.installed = False
        self._pid = os.getpid()
        self._done = threading.Event()
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        self._previous_wakeup_fd = -1
        self._read_lock = threading.Lock()
        self._dump_lock = threading.Lock()
        self._sigterm_dumped = False
        self._usr1_installed = False

    def install(self) -> None:
        """Main thread, before the script runs."""
        if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
            return  # inherited "ignore": the untraced script would ignore SIGTERM too
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._reader.setblocking(False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._writer.fileno(),
                                                        warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_main)
        if signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL:
            # Only a handler keeps SIGUSR1 from killing; the watcher does the dump, since the
            # main thread may be stuck in C where no Python handler runs. A script that installs
            # its own SIGUSR1 handler replaces this one and gets no dump.
            signal.signal(signal.SIGUSR1, _on_sigusr1)
            self._usr1_installed = True
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        threading.Thread(target=self._watch, name="ranktrace-sigterm", daemon=True).start()
        self.installed = True

    def uninstall(self) -> None:
        """Main thread, after the script ended: SIGTERM kills at once again."""
        if not self.installed:
            return
        self.installed = False
        try:
            if signal.getsignal(signal.SIGTERM) == self._on_main:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if self._usr1_installed and signal.getsignal(signal.SIGUSR1) is _on_sigusr1:
                signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            if signal.set_wakeup_fd(self._previous_wakeup_fd) != self._writer.fileno():
                signal.set_wakeup_fd(-1)  # the script changed it; leave the script's in place
        except (ValueError, OSError):
            pass
        self._reader.shutdown(socket.SHUT_RDWR)  # ends the watcher's recv

    def _after_fork_in_child(self) -> None:
        # A forked child (DataLoader worker) must die on SIGTERM as it would untraced, and must
        # not wake the parent's watcher through the inherited socket.
        if os.getpid() == self._pid or not self.installed:
            return
        try:
            if signal.getsignal(signal.SIGTERM) == self._on_main:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            if signal.getsignal(signal.SIGUSR1) is _on_sigusr1:
                signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
        except (ValueError, OSError):
            pass

    def _on_main(self, signum, frame) -> None:
        if os.getpid() != self._pid:
            die_by_sigterm()
        self.received = True
        self.fatal = True
        if not self.session.opened:
            die_by_sigterm()
        if _inside_tracer(frame):
            # We interrupted our own code, which may hold a writer's lock: wrapping up now could
            # deadlock. The next step end does it, or the watcher after SIGTERM_GRACE_S.
            self.pending = True
            return
        self.handle_on_main()

    def handle_on_main(self) -> None:
        self.pending = False
        self._dump_for_sigterm(on_main=True)
        self._wrap_up(on_main=True)

    def _watch(self) -> None:
        while True:
            try:
                select.select([self._reader], [], [])
            except (OSError, ValueError):
                return
            with self._read_lock:
                try:
                    data = self._reader.recv(64)
                except BlockingIOError:
                    continue  # settle() took it
                except OSError:
                    return
                if not data:
                    return
                got_sigterm = signal.SIGTERM in data
                if got_sigterm:
                    self.received = True
            if signal.SIGUSR1 in data and self._usr1_installed:
                self.dump_stacks("sigusr1", skip_current=True)
            if got_sigterm:
                self._on_watcher()

    def settle(self) -> None:
        """Main thread, before the status is decided: a SIGTERM whose Python handler (the
        script's) has already run on the main thread must not be missed because the watcher
        has not read its byte yet."""
        if not self.installed:
            return
        with self._read_lock:  # the watcher notes what it read under this lock
            try:
                data = self._reader.recv(64)
            except OSError:  # BlockingIOError: nothing unread
                return
            if signal.SIGTERM in data:
                self.received = True
                self.fatal = signal.getsignal(signal.SIGTERM) == self._on_main

    def _on_watcher(self) -> None:
        session = self.session
        self.received = True
        handler = signal.getsignal(signal.SIGTERM)
        if handler != self._on_main:
            # The script's own handler (or SIG_IGN) decides; keep what was recorded safe.
            try:
                session.flush_files()
            except Exception:
                pass
            return
        self.fatal = True
        if not session.opened:
            die_by_sigterm()
        self._dump_for_sigterm(on_main=False)
        deadline = threading.Timer(SIGTERM_DEADLINE_S, die_by_sigterm)
        deadline.daemon = True
        deadline.start()
        try:
            session.flush_files()
        except Exception:
            pass
        grace_ends = time.monotonic() + SIGTERM_GRACE_S
        while time.monotonic() < grace_ends:
            if self._done.wait(0.05):
                return
            if self.pending:
                # Our handler ran inside tracer code and put it off; run it again, it may
                # now land outside (no effect while the main thread is in a C call).
                _thread.interrupt_main(signal.SIGTERM)
        self._wrap_up(on_main=False)

    def _dump_for_sigterm(self, on_main: bool) -> None:
        """Once per run, by whichever thread sees SIGTERM first."""
        with self._dump_lock:
            if self._sigterm_dumped:
                return
            self._sigterm_dumped = True
        self.dump_stacks("sigterm", skip_current=not on_main)

    def dump_stacks(self, reason: str, skip_current: bool,
                    exc: BaseException | None = None) -> None:
        """rank{R}.stacks.jsonl gets every thread's stack and the ops pending; then the issue
        and completion records are flushed, so the files agree with the dump."""
        session = self.session
        run_dir = getattr(session, "run_dir", None)
        if not session.opened or run_dir is None:
            return
        comms = session.in_use("comms")
        try:
            pending = comms.timing.not_completed() if comms is not None else []
        except Exception:
            pending = []
        path = os.path.join(run_dir, schema.STACKS_FILE.format(rank=session.rank))
        stack_dumps.dump(path, session.rank, reason, pending, exc, skip_current=skip_current,
                         where_raised=exc is not None)
        if comms is not None:
            try:
                comms.flush()
            except Exception:
                pass

    def _wrap_up(self, on_main: bool) -> None:
        try:
            self.session.end_by_sigterm(on_main, SIGTERM_DEADLINE_S)
        finally:
            self._done.set()
            die_by_sigterm()


def _on_sigusr1(signum, frame) -> None:
    """Keeps SIGUSR1 from killing the process; the watcher thread writes the dump."""


def _inside_tracer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith(_TRACER_DIR):
            return True
        frame = frame.f_back
    return False


def die_by_sigterm() -> None:
    """End the process the way SIGTERM's default action does (from any thread)."""
    try:
        sys.stderr.flush()
    except Exception:
        pass
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    else:
        try:
            import ctypes

            # signal.signal() refuses other threads; libc's does not.
            ctypes.CDLL(None).signal(signal.SIGTERM, ctypes.c_void_p(0))  # SIG_DFL
        except Exception:
            os._exit(128 + signal.SIGTERM)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)
    os._exit(128 + signal.SIGTERM)

"""SIGTERM and SIGUSR1 under the tracer (tracer.hangs.sigterm), with a stand-in session: SIGUSR1
dumps every thread's stack and training goes on; SIGTERM dumps, closes the session and dies by
SIGTERM, also when the main thread is stuck in C; a handler the script installs decides for
itself; a forked child dies by SIGTERM as it would untraced. SIGTERM itself is only sent to
child processes (tests/scripts/sigterm_handling.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from helpers.launch import REPO
from helpers.tracer_files import read_jsonl
from tracer.comms.patching import recording_wrapper
from tracer.hangs import sigterm
from tracer.hangs.sigterm import SigtermHandling

SCRIPT = REPO / "tests" / "scripts" / "sigterm_handling.py"


class Session:
    """What SigtermHandling uses of the session, noting what it is asked to do."""

    def __init__(self, run_dir, opened=True):
        self.run_dir, self.rank, self.opened = str(run_dir), 0, opened
        self.flushed = 0
        self.ended = []

    def in_use(self, name):
        return None

    def flush_files(self):
        self.flushed += 1

    def end_by_sigterm(self, on_main, wait_s):
        self.ended.append(on_main)


@pytest.fixture
def signals():
    """SIGTERM's and SIGUSR1's handlers and the wakeup fd put back as they were."""
    term, usr1 = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    wakeup = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(wakeup)
    yield
    signal.signal(signal.SIGTERM, term)
    signal.signal(signal.SIGUSR1, usr1)
    signal.set_wakeup_fd(wakeup)


def wait_for(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within the timeout"
        time.sleep(0.01)


def test_the_handlers_are_ours_while_installed_and_the_defaults_after(tmp_path, signals):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    handling = SigtermHandling(Session(tmp_path))
    handling.install()
    try:
        assert signal.getsignal(signal.SIGTERM) == handling._on_main
        assert signal.getsignal(signal.SIGUSR1) is sigterm._on_sigusr1
    finally:
        handling.uninstall()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    assert not handling.installed


def test_an_inherited_ignore_of_sigterm_is_kept(tmp_path, signals):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    handling = SigtermHandling(Session(tmp_path))
    handling.install()
    assert not handling.installed and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN


def test_sigusr1_dumps_every_threads_stack_and_training_goes_on(tmp_path, signals):
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    handling = SigtermHandling(Session(tmp_path))
    handling.install()
    path = tmp_path / "rank0.stacks.jsonl"
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_for(path.exists)
    finally:
        handling.uninstall()
    [dump] = read_jsonl(path)
    assert dump["reason"] == "sigusr1" and dump["rank"] == 0 and dump["pending"] == []
    main = dump["threads"][0]
    functions = [f["function"] for f in main["frames"]]
    assert main["main"] and "test_sigusr1_dumps_every_threads_stack_and_training_goes_on" in (
        functions) and "wait_for" in functions  # where the main thread was
    assert "ranktrace-sigterm" not in [t["name"] for t in dump["threads"]]  # the dumper's own
    assert not handling.received


def test_a_sigusr1_handler_of_the_script_is_left_alone(tmp_path, signals):
    def scripts_handler(signum, frame):
        pass

    signal.signal(signal.SIGUSR1, scripts_handler)
    handling = SigtermHandling(Session(tmp_path))
    handling.install()
    try:
        assert signal.getsignal(signal.SIGUSR1) is scripts_handler
    finally:
        handling.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is scripts_handler


def test_a_sigterm_the_scripts_handler_takes_only_flushes_the_files(tmp_path, signals):
    session = Session(tmp_path)
    handling = SigtermHandling(session)
    handling.install()
    handled = []
    signal.signal(signal.SIGTERM, lambda signum, frame: handled.append(signum))
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: session.flushed == 1 and handled)
    finally:
        handling.uninstall()
    assert handled == [signal.SIGTERM] and handling.received and not handling.fatal
    assert session.ended == [] and not (tmp_path / "rank0.stacks.jsonl").exists()


def test_a_sigterm_that_lands_in_the_tracers_own_code_is_put_off(tmp_path):
    frames = []

    class Recorder:
        active, issue_spans = True, None

    def describe(args, kwargs):
        frames.append(sys._getframe(1))  # the wrapper's frame, in tracer/comms/patching.py

    recording_wrapper(Recorder(), "op", lambda: None, describe, lambda d, r: None)()
    session = Session(tmp_path)
    handling = SigtermHandling(session)
    handling._on_main(signal.SIGTERM, frames[0])
    assert handling.pending and handling.received and handling.fatal
    assert session.ended == []  # the next step end, or the watcher, wraps up
    assert not sigterm._inside_tracer(sys._getframe())


def run_script(tmp_path, *args):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    noted = tmp_path / "noted.json"
    return done, (json.loads(noted.read_text()) if noted.exists() else None)


def test_sigterm_dumps_closes_the_session_on_the_main_thread_and_dies_by_sigterm(tmp_path):
    done, noted = run_script(tmp_path, "python")
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert noted == {"ended_on_main": True}
    [dump] = read_jsonl(tmp_path / "rank0.stacks.jsonl")
    assert dump["reason"] == "sigterm" and dump["threads"][0]["main"]
    assert "in_python" in [f["function"] for f in dump["threads"][0]["frames"]]


@pytest.mark.slow  # imports torch in the child, and waits out the grace
def test_a_main_thread_stuck_in_c_is_wrapped_up_by_the_watcher_after_the_grace(tmp_path):
    started = time.monotonic()
    done, noted = run_script(tmp_path, "stuck_in_c")
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert noted == {"ended_on_main": False}
    assert time.monotonic() - started < sigterm.SIGTERM_DEADLINE_S + 5
    [dump] = read_jsonl(tmp_path / "rank0.stacks.jsonl")
    assert dump["reason"] == "sigterm"


def test_a_forked_child_dies_by_sigterm_as_untraced(tmp_path):
    done, noted = run_script(tmp_path, "fork")
    assert done.returncode == 0, done.stderr
    assert noted == {"child_exit_signal": signal.SIGTERM, "child_sigterm_default": True}


def test_dying_by_sigterm_works_from_any_thread():
    for thread in ("main", "other"):
        code = ("import threading\nfrom tracer.hangs.sigterm import die_by_sigterm\n"
                + ("die_by_sigterm()\n" if thread == "main" else
                   "t = threading.Thread(target=die_by_sigterm)\nt.start()\nt.join()\n")
                + "print('still alive')\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=REPO, timeout=30)
        assert (done.returncode, done.stdout) == (-signal.SIGTERM, ""), thread

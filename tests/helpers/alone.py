"""Runs whose timings the tests assert (a delayed rank named and none named without a delay, a
diff's verdict on step times, a sweep's lost efficiency, the tracer's overhead) are recorded with
nothing else of the test session running, also when pytest-xdist runs tests on two workers.

Under xdist every test holds a shared lock for as long as it runs (tests/conftest.py), and
`alone()` trades it for the exclusive one: it waits until the other worker's test has ended, and
holds that worker's next test back until the timed run is over. A turnstile lock keeps the other
worker from starting a test while one waits. Without xdist (one process) these do nothing."""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager

_files: tuple[int, int] | None = None  # (main lock, turnstile), open under xdist only


def start(session_id: str) -> None:
    """Called once per xdist worker: every worker of one session opens the same two files."""
    global _files
    base = os.path.join(tempfile.gettempdir(), f"ranktrace-tests-{session_id}")
    _files = tuple(os.open(base + suffix, os.O_RDWR | os.O_CREAT, 0o600)
                   for suffix in (".lock", ".turnstile"))


def share() -> None:
    """Hold the shared lock (a test starts): waits while a timed run holds or waits for it."""
    if _files is not None:
        main, turnstile = _files
        fcntl.flock(turnstile, fcntl.LOCK_SH)
        fcntl.flock(main, fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)


def unshare() -> None:
    if _files is not None:
        fcntl.flock(_files[0], fcntl.LOCK_UN)


def alone_is_active() -> bool:
    """Whether this process is an xdist worker, where `alone()` waits for the other worker."""
    return _files is not None


_depth = 0  # alone() blocks entered and not yet left in this process


@contextmanager
def alone():
    """Nothing else of the session runs on any worker until the block ends (blocks nest)."""
    global _depth
    if _files is None or _depth:
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
        return
    main, turnstile = _files
    fcntl.flock(main, fcntl.LOCK_UN)  # so that two workers both waiting here cannot deadlock
    fcntl.flock(turnstile, fcntl.LOCK_EX)
    fcntl.flock(main, fcntl.LOCK_EX)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        fcntl.flock(main, fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)

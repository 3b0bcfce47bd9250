"""A value computed in a forked child process while the caller goes on with its own work, on a
machine's second core: the command's one-rank critical path beside the rest of the analysis
(analysis.rank.summary). The child shares the caller's memory as it was at the fork (nothing is
copied to it), computes, and hands back its result, pickled by itself, through a pipe; nothing
read from a file is ever unpickled. A child that cannot be started, or dies before it answers,
just leaves the value to be computed in the caller when it is taken.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from collections.abc import Callable
from typing import Any


def can_fork() -> bool:
    """Whether a value can be computed beside the caller: a Linux machine with a second core."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork")
            and (os.cpu_count() or 1) >= 2)


class ComputedElsewhereFailed(Exception):
    """The computation failed in the child: `why` is its "ExceptionType: message"."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class ForkedResult:
    """compute() running in a forked child from creation; `result()` waits for it. Pickled, it
    is its result (waited for), so that it travels as the value would."""

    def __init__(self, compute: Callable[[], Any]):
        self._compute = compute
        self._outcome: tuple | None = None
        self._pid: int | None = None
        try:
            read_fd, write_fd = os.pipe()
        except OSError:
            return  # no pipe to spare: computed here when taken
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            return
        if pid == 0:
            os.close(read_fd)
            _compute_in_child(compute, write_fd)  # never returns
        os.close(write_fd)
        self._pid, self._read_fd = pid, read_fd

    def result(self) -> Any:
        """The value; raises ComputedElsewhereFailed where the child's computation raised."""
        if self._outcome is None:
            self._outcome = self._take() or _outcome_of(self._compute)
            self._compute = None  # what it holds (a rank's events) is not needed any more
        kind, value = self._outcome
        if kind == "failed":
            raise ComputedElsewhereFailed(value)
        return value

    def close(self) -> None:
        """Stop the child if nobody took its result (the caller failed before it)."""
        if self._pid is None:
            return
        os.close(self._read_fd)
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._pid = _reaped(self._pid)

    def __reduce__(self):
        return _value, (self.result(),)

    def _take(self) -> tuple | None:
        """The child's outcome; None where there is no child or it died before answering."""
        if self._pid is None:
            return None
        try:
            with os.fdopen(self._read_fd, "rb") as pipe:
                data = pipe.read()
        finally:
            self._pid = _reaped(self._pid)
        return pickle.loads(data) if data else None


def _value(value):
    return value


def _outcome_of(compute: Callable[[], Any]) -> tuple:
    try:
        return ("done", compute())
    except Exception as exc:  # noqa: BLE001  (raised as ComputedElsewhereFailed when taken)
        return ("failed", f"{type(exc).__name__}: {exc}")


def _reaped(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _compute_in_child(compute: Callable[[], Any], write_fd: int) -> None:
    """The child's whole life: compute, answer, and leave without running any of the parent's
    exit handlers or flushing its buffers (the parent's output is the parent's to write)."""
    try:
        data = pickle.dumps(_outcome_of(compute), protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
    except BaseException:  # noqa: BLE001, S110  (an interrupted or orphaned child just ends)
        pass
    finally:
        os._exit(0)

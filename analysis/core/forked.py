"""Work done in a forked child process while the caller goes on with its own, on a machine's
second core: the command's decoding of its one trace while it imports pandas
(analysis.ingest.parse_ahead), and a run's one-rank critical path beside the rest of the
analysis (analysis.rank.reduction).

The child shares the caller's memory as it was at the fork (nothing is copied to it), computes,
and hands back its answer, pickled by itself: one answer is written into memory it shares with
the caller (the pipe then carries only its size), answers one by one go through the pipe;
nothing read from a file is ever unpickled. It leaves without running any of the caller's exit
handlers or flushing its buffers (the caller's output is the caller's to write). A child that
cannot be started, or dies before it answers, answers nothing: its caller does the work itself.
"""

from __future__ import annotations

import fcntl
import gc
import mmap
import os
import pickle
import select
import signal
import sys
from collections.abc import Callable
from typing import Any


def can_fork() -> bool:
    """Whether work can be done beside the caller: a Linux machine with a second core."""
    return (sys.platform.startswith("linux") and hasattr(os, "fork")
            and (os.cpu_count() or 1) >= 2)


class ForkedChild:
    """compute() running in a forked child from creation; `answer()` waits for what it
    returned. Raises OSError where no process or pipe can be had."""

    def __init__(self, compute: Callable[[], Any], in_child: Callable | None = None):
        """`in_child(compute, write_fd)`: what the child does (never returning); by default it
        answers compute()'s value once (`answer`)."""
        self._pid: int | None = None
        self._pipe = None  # the read end, as a file, once answers are read one by one
        # Where the default child writes its answer (None: through the pipe).
        self._shared = _shared_memory() if in_child is None else None
        _reap_ended()
        read_fd, write_fd = os.pipe()
        _widen(write_fd)
        try:
            pid = os.fork()
        except OSError:
            os.close(read_fd)
            os.close(write_fd)
            self._release_shared()
            raise
        if pid == 0:
            # The child ends once it answers: a collection of what the caller made would only
            # rescan it (40 ms after decoding a 50 MB trace, before its answer is sent).
            gc.disable()
            os.close(read_fd)
            if in_child is None:
                _answer_in_child(compute, write_fd, self._shared)  # never returns
            in_child(compute, write_fd)  # never returns
        os.close(write_fd)
        self._pid, self._read_fd = pid, read_fd

    @property
    def waiting(self) -> bool:
        """Whether its answer is still to be taken."""
        return self._pid is not None

    def answered(self) -> bool:
        """Whether answer() would return at once: the child has answered, or ended."""
        if self._pid is None:
            return True
        readable, _, _ = select.select([self._read_fd], [], [], 0)
        return bool(readable)

    def answer(self) -> Any | None:
        """What compute() returned (once); None where the child died before answering, or
        the answer was taken already."""
        if self._pid is None:
            return None
        try:
            with os.fdopen(self._read_fd, "rb") as pipe:
                data = pipe.read()
        finally:
            self._pid = _reap_when_ended(self._pid)
        try:
            value = pickle.loads(data) if data else None
            if isinstance(value, _InSharedMemory):  # sent only by a child given the mapping
                with memoryview(self._shared) as shared:
                    value = pickle.loads(shared[:value.size])
            return value
        finally:
            self._release_shared()

    def _release_shared(self) -> None:
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def next_answer(self) -> Any | None:
        """The next of the answers that a child of _answers_in_child sends, each once it is
        computed; None once there is none left (the child ended, or died before it sent
        it)."""
        if self._pid is None:
            return None
        if self._pipe is None:
            self._pipe = os.fdopen(self._read_fd, "rb")
        head = self._pipe.read(_LENGTH_BYTES)
        size = int.from_bytes(head, "little")
        data = self._pipe.read(size) if len(head) == _LENGTH_BYTES else b""
        if len(head) == _LENGTH_BYTES and len(data) == size:
            return pickle.loads(data)
        self._pipe.close()
        self._pid = _reap_when_ended(self._pid)
        return None

    def close(self) -> None:
        """Stop the child if nobody took its answer (the caller failed before it, or never
        needed it)."""
        self._release_shared()
        if self._pid is None:
            return
        if self._pipe is not None:
            self._pipe.close()
        else:
            os.close(self._read_fd)
        try:
            os.kill(self._pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._pid = _reaped(self._pid)

    def __del__(self):
        self.close()


class ComputedElsewhereFailed(Exception):
    """The computation failed in the child: `why` is its "ExceptionType: message"."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class ForkedResult:
    """A value being computed by compute() in a ForkedChild; `result()` waits for it, and
    computes it here where the child could not be started or died. Pickled, it is its result
    (waited for), so that it travels as the value would."""

    def __init__(self, compute: Callable[[], Any]):
        self._compute = compute
        self._outcome: tuple | None = None
        try:
            self._child: ForkedChild | None = ForkedChild(lambda: _outcome_of(compute))
        except OSError:
            self._child = None  # no process or pipe to spare: computed here when taken

    def result(self) -> Any:
        """The value; raises ComputedElsewhereFailed where the computation raised."""
        if self._outcome is None:
            answer = self._child.answer() if self._child is not None else None
            self._outcome = answer or _outcome_of(self._compute)
            self._compute = None  # what it holds (a rank's events) is not needed any more
        kind, value = self._outcome
        if kind == "failed":
            raise ComputedElsewhereFailed(value)
        return value

    def close(self) -> None:
        """Stop the child if nobody took the result."""
        if self._child is not None:
            self._child.close()

    def __reduce__(self):
        return _value, (self.result(),)


def _value(value):
    return value


def forked_results(computes: dict[str, Callable[[], Any]]) -> dict[str, ForkedResult]:
    """{name: a ForkedResult of computes[name]()}, all computed in one ForkedChild (one fork),
    one after the other in the order given, each sent as soon as it is computed: the first can
    be taken while the child computes the next. Each fails alone, as a ForkedResult of its own
    would; those the child did not send (it could not be started, or died) are computed here
    when taken."""
    outcomes = _ForkedOutcomes(computes)
    return {name: _ForkedPart(outcomes, name) for name in computes}


class _ForkedOutcomes:
    """The outcomes of forked_results' computes, as the child sends them."""

    def __init__(self, computes: dict[str, Callable[[], Any]]):
        self._computes = dict(computes)
        self._count = len(computes)
        self._received: dict[str, tuple] = {}
        try:
            self._child: ForkedChild | None = ForkedChild(self._computes, _answers_in_child)
        except OSError:
            self._child = None  # no process or pipe to spare: each computed here when taken

    def outcome(self, name: str) -> tuple:
        """("done", value) or ("failed", why) of computes[name]()."""
        while name not in self._received and self._child is not None:
            answer = self._child.next_answer()
            if answer is None:
                self._child = None
                break
            self._received[answer[0]] = answer[1]
        if self._child is not None and len(self._received) == self._count:
            self._child.next_answer()  # none left: the child is reaped as it ends
            self._child = None
        if name not in self._received:
            self._received[name] = _outcome_of(self._computes[name])
        self._computes.pop(name, None)  # what it holds (a rank's events) is not needed any more
        return self._received[name]

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
            self._child = None


class _ForkedPart(ForkedResult):
    """One value of forked_results: its child is the one of all of them."""

    def __init__(self, outcomes: _ForkedOutcomes, name: str):  # no child of its own
        self._outcomes, self._name = outcomes, name

    def result(self) -> Any:
        kind, value = self._outcomes.outcome(self._name)
        if kind == "failed":
            raise ComputedElsewhereFailed(value)
        return value

    def close(self) -> None:
        """Stop the child of all of them (those not taken yet are then computed here)."""
        self._outcomes.close()


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


# Children that answered and closed their pipe but had not ended when their caller went on: a
# child's exit frees the caller's memory as it was at the fork (5 ms of the breakdown of a 50 MB
# trace), which nobody needs to wait for. Each is reaped once it has ended, when a child is next
# forked (_reap_ended) or the command ends (reap_children).
_ENDING: list[int] = []


def _reap_when_ended(pid: int) -> None:
    """Reap `pid` if it has ended, else leave it to _ENDING."""
    try:
        ended, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return
    if not ended:
        _ENDING.append(pid)


def _reap_ended() -> None:
    for pid in list(_ENDING):
        _ENDING.remove(pid)
        _reap_when_ended(pid)


def reap_children() -> None:
    """Wait for every child that answered and has not been reaped yet (a command's last act)."""
    while _ENDING:
        _reaped(_ENDING.pop())


_LENGTH_BYTES = 8  # each of _answers_in_child's answers: its length, then its pickle


def _answers_in_child(computes: dict[str, Callable[[], Any]], write_fd: int) -> None:
    """The whole life of forked_results' child: each (name, outcome) sent once computed, in
    order, and leave."""
    try:
        with os.fdopen(write_fd, "wb") as pipe:
            for name, compute in computes.items():
                data = pickle.dumps((name, _outcome_of(compute)),
                                    protocol=pickle.HIGHEST_PROTOCOL)
                pipe.write(len(data).to_bytes(_LENGTH_BYTES, "little"))
                pipe.write(data)
                pipe.flush()
    except BaseException:  # noqa: BLE001, S110  (a failed, interrupted or orphaned child ends)
        pass
    finally:
        os._exit(0)


# A child's one answer is written into memory it shares with its caller, where it fits: a pipe
# moves the 6 MB of a 50 MB trace's columns in 64 KB turns, 10 ms on two cores, where the
# shared pages take 3. The mapping is address space only until written (MAP_NORESERVE); a
# larger answer, or one where no mapping can be had, goes through the pipe.
SHARED_ANSWER_BYTES = 512 << 20


class _InSharedMemory:
    """What the pipe carries when the answer, `size` bytes of pickle, is in shared memory."""

    def __init__(self, size: int):
        self.size = size


# A pipe's buffer, where the system lets it be this large (Linux's default limit): a child that
# sends its answers one by one goes on computing the next while the caller has not read the
# last, rather than wait for it (a run's comm events are 140 KB for a 50 MB trace, against the
# usual 64 KB).
PIPE_BYTES = 1 << 20


def _widen(fd: int) -> None:
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (AttributeError, OSError):
        pass  # not Linux, or a lower limit: the pipe's own size


def _shared_memory() -> mmap.mmap | None:
    try:
        return mmap.mmap(-1, SHARED_ANSWER_BYTES, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS
                         | getattr(mmap, "MAP_NORESERVE", 0))
    except (OSError, ValueError):
        return None


def _answer_in_child(compute: Callable[[], Any], write_fd: int,
                     shared: mmap.mmap | None = None) -> None:
    """The child's whole life: compute, answer (in `shared` where it fits), and leave."""
    try:
        value = compute()
        if shared is not None:
            try:
                pickle.dump(value, shared, protocol=pickle.HIGHEST_PROTOCOL)
                value = _InSharedMemory(shared.tell())
            except ValueError:  # larger than the mapping: through the pipe
                pass
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        with os.fdopen(write_fd, "wb") as pipe:
            pipe.write(data)
    except BaseException:  # noqa: BLE001, S110  (a failed, interrupted or orphaned child ends)
        pass
    finally:
        os._exit(0)

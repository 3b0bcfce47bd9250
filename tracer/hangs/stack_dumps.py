"""Stack dumps: the Python stack of every thread and the ops still pending, one StackDump line
in rank{R}.stacks.jsonl, on SIGUSR1, SIGTERM, or when a collective raises (docs/tracer.md,
Hangs and stack dumps). The session also writes an `exception` dump when the script's exception
never passed through a collective's wrapper (DDP's C++ reducer raises the group's timeout in
backward): its main thread's frames are then those the exception was raised through.

Written straight to the file (no buffer): a dump is rare and must be on disk before the
process dies. Never raises.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import tracer
from tracer import schema

# A script that catches the errors of its collectives in a loop must not fill the disk.
MAX_DUMPS = 20
_TRACER_DIR = os.path.dirname(os.path.abspath(tracer.__file__)) + os.sep
_lock = threading.Lock()
_dumps = 0
# The exceptions dumped, held (at most MAX_DUMPS) so that no other object takes their id.
_dumped: list[BaseException] = []


def _frames(frame) -> list[schema.StackFrame]:
    """Outermost first; the tracer's own frames are left out (they wrap the script's)."""
    frames = []
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_TRACER_DIR):
            frames.append(schema.StackFrame(file=code.co_filename, line=frame.f_lineno or 0,
                                            function=code.co_name))
        frame = frame.f_back
    frames.reverse()
    return frames


def thread_stacks(skip_current: bool = True) -> list[schema.ThreadStack]:
    """Every thread's stack; the calling thread's only when `skip_current` is False."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main_id = threading.main_thread().ident
    current = threading.get_ident()
    stacks = []
    for ident, frame in sys._current_frames().items():
        if skip_current and ident == current:
            continue
        stacks.append(schema.ThreadStack(name=names.get(ident, "?"), thread_id=ident,
                                         main=ident == main_id, frames=_frames(frame)))
    stacks.sort(key=lambda s: not s.main)
    return stacks


def raised_frames(exc: BaseException) -> list[schema.StackFrame] | None:
    """Outermost first: the frames `exc` was raised through, with the frames outside the one
    that caught it; None when it carries no traceback."""
    tb = exc.__traceback__
    if tb is None:
        return None
    frames = _frames(tb.tb_frame.f_back)
    while tb is not None:
        code = tb.tb_frame.f_code
        if not code.co_filename.startswith(_TRACER_DIR):
            # tb_lineno, not f_lineno: the line it was raised at, not where the frame is now.
            frames.append(schema.StackFrame(file=code.co_filename, line=tb.tb_lineno or 0,
                                            function=code.co_name))
        tb = tb.tb_next
    return frames


def was_dumped(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from or while handling, had a dump."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if any(dumped is exc for dumped in _dumped):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def describe_exception(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def dump(path: str, rank: int, reason: str, pending: list[schema.IssueRecord],
         exc: BaseException | None = None, skip_current: bool = False,
         where_raised: bool = False) -> bool:
    """Append one StackDump to `path`; False when it was not written (cap reached, I/O error).
    `where_raised`: the main thread's frames are those `exc` was raised through (the dump is
    taken after it unwound)."""
    global _dumps
    try:
        with _lock:
            if _dumps >= MAX_DUMPS:
                return False
            _dumps += 1
            if exc is not None:
                _dumped.append(exc)
        threads = thread_stacks(skip_current)
        raised = raised_frames(exc) if where_raised and exc is not None else None
        if raised is not None:
            for thread in threads:
                if thread.main:
                    thread.frames = raised
        record = schema.StackDump(
            rank=rank, t_ns=time.time_ns(), reason=reason,
            threads=threads, pending=list(pending),
            exception=describe_exception(exc) if exc is not None else None)
        line = schema.ENCODER.encode(record) + b"\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        return True
    except Exception:
        return False

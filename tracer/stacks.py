"""Stack dumps: the Python stack of every thread and the ops still pending, one StackDump line
in rank{R}.stacks.jsonl, on SIGUSR1, SIGTERM, or when a collective raises (docs/tracer.md,
Hangs and stack dumps).

Written straight to the file (no buffer): a dump is rare and must be on disk before the
process dies. Never raises.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from tracer import schema

# A script that catches the errors of its collectives in a loop must not fill the disk.
MAX_DUMPS = 20
_TRACER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_lock = threading.Lock()
_dumps = 0


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


def describe_exception(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def dump(path: str, rank: int, reason: str, pending: list[schema.IssueRecord],
         exc: BaseException | None = None, skip_current: bool = False) -> bool:
    """Append one StackDump to `path`; False when it was not written (cap reached, I/O error)."""
    global _dumps
    try:
        with _lock:
            if _dumps >= MAX_DUMPS:
                return False
            _dumps += 1
        record = schema.StackDump(
            rank=rank, t_ns=time.time_ns(), reason=reason,
            threads=thread_stacks(skip_current), pending=list(pending),
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

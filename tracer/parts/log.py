"""The `ranktrace` logger: every "ranktrace: rank{R} part: message" line the tracer prints.

One line per event on the process's current stderr (tests and scripts may replace sys.stderr),
flushed at once. The logger does not propagate: a script's own logging set-up neither doubles
nor hides the tracer's lines.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("ranktrace")
_rank: int | None = None  # set by the session; else RANK from the environment, if any


class _CurrentStderr(logging.StreamHandler):
    """A StreamHandler on whatever sys.stderr is at the time of each line."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass  # always the current sys.stderr


class _RankFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        rank = getattr(record, "rank", None)
        if rank is None:
            rank = _rank if _rank is not None else os.environ.get("RANK")
        where = "" if rank is None else f"rank{rank} "
        part = getattr(record, "part", None)
        return f"ranktrace: {where}{'' if part is None else part + ': '}{record.getMessage()}"


def _configure() -> None:
    if logger.handlers:
        return
    handler = _CurrentStderr()
    handler.setFormatter(_RankFormatter())
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def set_rank(rank: int | None) -> None:
    """The rank every line names from now on (None: RANK from the environment)."""
    global _rank
    _rank = rank


def say(message: str, part: str | None = None, rank: int | None = None) -> None:
    """One line on stderr: "ranktrace: rank{R} {part}: {message}"."""
    logger.warning(message, extra={"part": part, "rank": rank})


_configure()

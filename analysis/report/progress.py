"""A progress bar on stderr over ranks and phases, for the command-line tools.

It appears only when stderr is a terminal, and only once a task has run for DELAY_S (tqdm's own
`delay`): quick runs and piped output stay silent, and nothing ever goes to stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import TextIO

DELAY_S = 2.0


class Progress:
    """`progress(done, total)` is the load callback (files parsed); `progress.over(items,
    phase)` wraps an iterable (ranks) of one phase. Close it, or use it as a context manager."""

    def __init__(self, stream: TextIO | None = None, delay: float = DELAY_S):
        self.stream = stream if stream is not None else sys.stderr
        self.delay = delay
        self._files = None
        self._tqdm = None
        if _is_terminal(self.stream):  # imported only where a bar can show: a terminal
            try:
                from tqdm import tqdm
            except ImportError:  # the bar is a nicety: without tqdm there is none
                tqdm = None
            self._tqdm = tqdm
        self.enabled = self._tqdm is not None

    def _bar(self, total: int | None, phase: str, unit: str):
        return self._tqdm(total=total, desc=f"ranktrace: {phase}", unit=unit, file=self.stream,
                    delay=self.delay, leave=False, dynamic_ncols=True)

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._files is None:
            self._files = self._bar(total, "parsing traces", "file")
        self._files.update(done - self._files.n)
        if done >= total:
            self._files.close()
            self._files = None

    def over(self, items: Iterable, phase: str, unit: str = "rank") -> Iterable:
        if not self.enabled:
            return items
        items = list(items)
        bar = self._bar(len(items), phase, unit)

        def advance():
            try:
                for item in items:
                    yield item
                    bar.update(1)
            finally:
                bar.close()

        return advance()

    def close(self) -> None:
        if self._files is not None:
            self._files.close()
            self._files = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False

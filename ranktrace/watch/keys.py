"""Key presses on a terminal, without echo and without waiting for Enter (the terminal's
cbreak mode, through termios: nothing is written to the terminal). Ctrl-C still interrupts."""

from __future__ import annotations

import os
import select
import sys
import time


class Keys:
    """`with Keys() as keys: keys.wait(1.0)`: the key pressed within a second, or None."""

    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stdin
        self.fd: int | None = None
        self.saved = None

    def __enter__(self) -> Keys:
        try:
            import termios
            import tty

            if self.stream is not None and self.stream.isatty():
                self.fd = self.stream.fileno()
                self.saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except (ImportError, OSError, ValueError):
            self.fd = None  # no terminal to read keys from: the watch runs without them
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None and self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def wait(self, timeout: float) -> str | None:
        """The first key pressed within `timeout` seconds; None when none was."""
        if self.fd is None:
            time.sleep(max(timeout, 0.0))
            return None
        ready, _, _ = select.select([self.fd], [], [], max(timeout, 0.0))
        if not ready:
            return None
        data = os.read(self.fd, 64)
        if not data:  # the terminal closed: no more keys
            self.fd = None
            return None
        return data[:1].decode("latin-1")

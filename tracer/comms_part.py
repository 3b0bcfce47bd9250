"""The comms recorder (tracer.comms) as a tracer part: start installs the hooks, close removes
them, and the recorder's own first fault goes down the parts' one failure path."""

from __future__ import annotations

from tracer.comms import CommsRecorder
from tracer.part import Part


class CommsPart(CommsRecorder, Part):
    name = "comms"

    def start(self) -> None:
        self.install()

    def close(self) -> None:
        self.uninstall()

    def fail(self, what, exc: BaseException | None = None) -> bool:
        """The recorder's fault (what failed, its exception; the recorder says it), or a
        failure the session saw (a message)."""
        if exc is None:
            self.active = False
            return Part.fail(self, what)
        first = self.error is None
        CommsRecorder.fail(self, what, exc)
        listener = self.on_failure
        if first and listener is not None:
            listener(self)
        return first

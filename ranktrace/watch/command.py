"""`ranktrace watch [RUN | DIR ...]`: a traced job, live (docs/viewing.md, "Watching a job
live").

Every `interval` seconds: read what the ranks appended (ranktrace.watch.tail), update the model
(ranktrace.watch.model), and draw it, with rich's Live display on a terminal, or as one line of
plain text when stdout is not one (or with --plain). Ends by itself, status 0 and a one-line
summary, once every rank has ended; `q` leaves (status 0), Ctrl-C leaves at once (130); `c`
asks every rank for a capture, as `python -m tracer.capture RUN` does.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from analysis.core.terminal import terminal_safe
from ranktrace.watch import render
from ranktrace.watch.folders import RunLocator
from ranktrace.watch.keys import Keys
from ranktrace.watch.liveness import Liveness
from ranktrace.watch.model import RunModel
from ranktrace.watch.options import PROG, WatchOptions, parse_options
from ranktrace.watch.tail import RunTail
from tracer.capture import capture_command

INTERRUPTED = 130


class Watcher:
    """The watch's state between refreshes: the folders followed, the model, what it said."""

    def __init__(self, options: WatchOptions):
        self.options = options
        self.locator = RunLocator(list(options.paths), options.run)
        self.tail: RunTail | None = None
        self.model = RunModel(options.recent, options.window_s)
        self.liveness = Liveness(options.silent_s)
        self.waiting_for = ""
        self.status = ""
        self.asking: threading.Thread | None = None

    @property
    def where(self) -> str:
        folders = self.tail.folders if self.tail else []
        return ", ".join(f.folder for f in folders) or ", ".join(self.options.paths)

    def tick(self, now: float) -> list:
        """One refresh's reading; the events it brought (model.drain_events)."""
        found = self.locator.find(now)
        self.waiting_for = found.waiting_for
        if not found.folders:
            return []
        if self.tail is None:
            self.tail = RunTail(found.folders)
        for folder in found.folders:
            self.tail.add(folder)
        batch = self.tail.poll()
        self.model.take(batch)
        self.liveness.update(self.model, batch.grown, now)
        return self.model.drain_events()

    @property
    def following(self) -> bool:
        return self.tail is not None

    def capture_folder(self) -> str | None:
        """The folder an ask goes to: rank 0's (the rank that answers where asks are files)."""
        if self.tail is None or not self.tail.folders:
            return None
        return self.tail.owner.get(0, self.tail.folders[0].folder)

    def ask_capture(self) -> None:
        """Ask every rank for a window, off the refresh loop (an answer takes up to 10 s)."""
        folder = self.capture_folder()
        if folder is None:
            self.status = "capture: no run followed yet"
            return
        if self.asking is not None and self.asking.is_alive():
            return
        self.status = "capture: asked, waiting for a rank to answer"
        self.asking = threading.Thread(target=self._ask, args=(folder,), daemon=True,
                                       name="ranktrace-watch-capture")
        self.asking.start()

    def _ask(self, folder: str) -> None:
        try:
            number, request = capture_command.ask(Path(folder), None)
        except (capture_command.CaptureError, OSError) as exc:
            self.status = f"capture: {exc}"
            return
        last = request.first_step + request.steps - 1
        self.status = (f"capture: every rank profiles steps {request.first_step}-{last} "
                       f"(ask {number})")


def _clock() -> str:
    return time.strftime("%H:%M:%S")


def _run_plain(watcher: Watcher, out) -> tuple[int, bool]:
    """The loop of plain-text mode; (status, left by the user)."""
    said_waiting = ""
    while True:
        began = time.monotonic()
        events = watcher.tick(began)
        if not watcher.following:
            if watcher.waiting_for != said_waiting:
                said_waiting = watcher.waiting_for
                print(terminal_safe(f"{_clock()} {said_waiting}"), file=out, flush=True)
        else:
            view = watcher.model.view()
            for event in events:
                print(render.event_line(event, _clock()), file=out)
            print(render.plain_line(view, _clock()), file=out, flush=True)
            if view.ended:
                return 0, False
        time.sleep(max(0.0, watcher.options.interval - (time.monotonic() - began)))


def _run_live(watcher: Watcher, console) -> tuple[int, bool]:
    """The loop on a terminal, with rich's Live display and the keys; (status, left)."""
    from rich.live import Live
    from rich.text import Text

    with Keys() as keys, Live(console=console, auto_refresh=False, transient=False,
                              vertical_overflow="crop") as live:
        while True:
            began = time.monotonic()
            watcher.tick(began)
            if not watcher.following:
                live.update(Text(terminal_safe(f"ranktrace watch: {watcher.waiting_for}   "
                                               f"(q: quit)")), refresh=True)
                view = None
            else:
                view = watcher.model.view()
                size = console.size
                live.update(render.frame(view, size.width, size.height, watcher.where,
                                         watcher.status), refresh=True)
                if view.ended:
                    return 0, False
            deadline = began + watcher.options.interval
            while (left := deadline - time.monotonic()) > 0:
                key = keys.wait(left)
                if key in ("q", "Q"):
                    return 0, True
                if key in ("c", "C") and view is not None:
                    watcher.ask_capture()
                    break  # redraw now, with the status


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """`ranktrace watch`'s command line; its exit status."""
    options = parse_options(argv, prog)
    watcher = Watcher(options)
    plain = options.plain or not sys.stdout.isatty()
    try:
        if plain:
            status, left = _run_plain(watcher, sys.stdout)
        else:
            from rich.console import Console

            status, left = _run_live(watcher, Console())
    except KeyboardInterrupt:
        print(terminal_safe(f"ranktrace watch: interrupted ({watcher.where})"),
              file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # `ranktrace watch | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if watcher.following:
        print(render.summary_line(watcher.model.view(), left=left), flush=True)
    return status

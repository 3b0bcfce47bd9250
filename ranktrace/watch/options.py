"""The watch's options: one dataclass, parsed by argparse from the command line."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from dataclasses import dataclass

from tracer.options import help_format

PROG = "ranktrace watch"


@dataclass(frozen=True)
class WatchOptions:
    """What `ranktrace watch` is asked to do, one line each (the --help text):

    paths: run folders, or folders of runs (default: traces, the tracer's --out); several
        paths: one run's folders written apart (one per node), read together
    run: the run's folder name inside each PATH (default: the newest run being written)
    interval: seconds between refreshes
    plain: one line of plain text a second, no colour, even on a terminal (the default when
        stdout is not a terminal)
    window_s: the medians of the rows and of who waits for whom are taken over the steps of
        the last this many seconds
    recent: ... and over at least this many steps
    silent_s: seconds without a new byte after which a rank without run_end whose process
        cannot be checked from here (another host) counts as gone
    """

    paths: tuple[str, ...] = ("traces",)
    run: str | None = None
    interval: float = 1.0
    plain: bool = False
    window_s: float = 2.0
    recent: int = 20
    silent_s: float = 60.0


_ENTRY = re.compile(r"^(?P<name>[a-z_]+): (?P<text>.+(?:\n[ \t]+.+)*)", re.M)


def _help() -> dict[str, str]:
    """Each field's line in WatchOptions's docstring."""
    found = _ENTRY.finditer(inspect.cleandoc(WatchOptions.__doc__ or ""))
    return {m["name"]: " ".join(m["text"].split()) for m in found}


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a number above 0, got {text!r}")
        return value
    return parse


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    text = _help()
    defaults = WatchOptions()
    parser = help_format.parser(
        prog, "Watch a traced job live: every rank's step, who waits for whom, each phase and "
              "captured window as they happen (docs/viewing.md). Keys: c asks every rank for a "
              "capture (as ranktrace capture does), q quits.")
    parser.add_argument("paths", nargs="*", metavar="RUN | DIR", help=text["paths"])
    parser.add_argument("--run", metavar="NAME", help=text["run"])
    view = parser.add_argument_group("the view")
    view.add_argument("--interval", type=_positive(float), default=defaults.interval,
                      metavar="S", help=text["interval"])
    view.add_argument("--plain", action="store_true", help=text["plain"])
    view.add_argument("--window-s", type=_positive(float), default=defaults.window_s,
                      metavar="S", help=text["window_s"])
    view.add_argument("--recent", type=_positive(int), default=defaults.recent, metavar="N",
                      help=text["recent"])
    view.add_argument("--silent-s", type=_positive(float), default=defaults.silent_s,
                      metavar="S", help=text["silent_s"])
    return parser


def parse_options(argv: list[str] | None, prog: str = PROG) -> WatchOptions:
    """The options of `argv`; argparse exits with status 2 on an unknown or bad option."""
    args = build_parser(prog).parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(WatchOptions)}
    values["paths"] = tuple(args.paths) or WatchOptions.paths
    return WatchOptions(**values)

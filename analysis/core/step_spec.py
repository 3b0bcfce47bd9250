"""Step numbers as text: the --steps argument (`3-5,7`) and ranges in messages (`0-2, 5`); the
analysis commands' other argument types.
Without pandas: the command reads --steps before it imports it (analysis.ingest.parse_ahead)."""

from __future__ import annotations

import re
from argparse import ArgumentTypeError
from dataclasses import dataclass


def parse_step_spec(spec: str) -> list[int]:
    """'3-5,7' -> [3, 4, 5, 7]. Raises ValueError with the offending part."""
    chosen: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
        if not match:
            raise ValueError(f"--steps: {part!r} is not a step number or range like 3-5")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        if last < first:
            raise ValueError(f"--steps: range {part!r} ends before it starts")
        chosen.update(range(first, last + 1))
    if not chosen:
        raise ValueError(f"--steps: {spec!r} selects no step")
    return sorted(chosen)


def format_ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    parts = []
    for number in numbers:
        if parts and number == parts[-1][1] + 1:
            parts[-1][1] = number
        else:
            parts.append([number, number])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


def steps_argument(text: str) -> str:
    """The --steps text, once parse_step_spec accepts it."""
    try:
        parse_step_spec(text)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc).removeprefix("--steps: ")) from None
    return text


def at_least_one(text: str) -> int:
    """A whole-number argument of at least 1 (--jobs, --top)."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return number


def positive_number(text: str) -> float:
    """argparse type: a finite number above 0 (--peak-tflops)."""
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def regex_argument(text: str) -> re.Pattern:
    """A regular expression argument (--comm-kernel), compiled."""
    try:
        return re.compile(text)
    except re.error as exc:
        raise ArgumentTypeError(f"not a regular expression: {text!r} ({exc})") from None


@dataclass(frozen=True)
class PathWindow:
    """The unit of the one-rank critical path (--window, --instance; docs/critical-path.md,
    "Windows"): the occurrences of a user annotation instead of the ProfilerSteps."""

    name: str  # the host annotations whose name contains it are the windows, as HTA matches
    instance: int | None = None  # the one occurrence analysed, 0-based in time order; None: all

    def __post_init__(self):
        if not self.name:
            raise ValueError("--window: give the name (or part of it) of a user annotation")
        if self.instance is not None and self.instance < 0:
            raise ValueError(f"--instance: {self.instance} is not a 0-based occurrence")


def window_options(parser) -> None:
    """--window and --instance on an argparse parser (the commands that report a critical
    path)."""
    parser.add_argument("--window", metavar="NAME",
                        help="the one-rank critical path per occurrence of the host annotation "
                             "whose name contains NAME (e.g. a record_function; default: per "
                             "ProfilerStep; docs/critical-path.md, \"Windows\")")
    parser.add_argument("--instance", type=int, metavar="N",
                        help="with --window: only its occurrence N (0-based, in time order; "
                             "default: every one)")


def path_window(parser, args) -> PathWindow | None:
    """The PathWindow of the parsed --window and --instance; a usage error (parser.error) for
    --instance without --window or a bad value."""
    if args.window is None:
        if args.instance is not None:
            parser.error("--instance needs --window")
        return None
    try:
        return PathWindow(args.window, args.instance)
    except ValueError as exc:
        parser.error(str(exc))

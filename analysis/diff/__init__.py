"""`python -m analysis.diff A B`: what got faster or slower between two runs, where, and whether
it is bigger than the noise (docs/diff.md). Arguments and printing only; the comparison is
analysis.diff.compare's, its parts analysis.diff.side, diff_stats, diff_ops and diff_output."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from analysis.core.command_options import add_parse_options
from analysis.core.frames import with_text_in_python
from analysis.core.step_spec import (
    at_least_one,
    parse_step_spec,
    path_window,
    steps_argument,
    window_options,
)
from analysis.core.terminal import show, terminal_safe
from analysis.diff import compare as diff_compare
from analysis.diff import stats as diff_stats
from analysis.diff import writers as diff_output
from analysis.diff.capture_window import capture_sides
from analysis.diff.side import load_side
from analysis.ingest.capture_records import read_captures
from analysis.ingest.runs import NothingToAnalyse, resolve_runs
from tracer.options import help_format


def _not_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value


PROG = "python -m analysis.diff"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = help_format.parser(
        prog, "Compare two runs: the step-time verdict with a bootstrap interval, then "
              "per-rank categories, operators and kernels, collectives, memory and findings "
              "(docs/diff.md).")
    parser.add_argument("a", metavar="A", type=Path,
                        help="the baseline: a run folder, or a folder of repeated runs")
    parser.add_argument("b", metavar="B", type=Path, nargs="?",
                        help="the run compared with A, likewise (omitted with --capture)")
    which = parser.add_argument_group("what to compare")
    which.add_argument("--capture", type=at_least_one, metavar="N",
                       help="compare capture window N of run A (1: the first, in the order the "
                            "verdict lists them) with A's first fixed window, or with the steps "
                            "of --steps (docs/diff.md, Capture windows; default: compare A "
                            "with B)")
    which.add_argument("--steps", metavar="SPEC", type=steps_argument,
                       help="step numbers compared in both runs, e.g. 3-5,7 (default: all)")
    window_options(which)
    stats = parser.add_argument_group("the statistics")
    stats.add_argument("--seed", type=int, default=diff_stats.DEFAULT_SEED,
                       help="seed of the bootstrap")
    stats.add_argument("--resamples", type=at_least_one, default=diff_stats.DEFAULT_RESAMPLES,
                       help="bootstrap resamples")
    stats.add_argument("--noise-floor-pct", type=_not_negative, metavar="P",
                       default=diff_stats.DEFAULT_NOISE_FLOOR_PCT,
                       help="the least run-to-run noise, in %%, assumed for a side of one run: "
                            "a change within the floor is no significant change "
                            "(docs/diff.md#the-run-to-run-noise-floor)")
    output = parser.add_argument_group("output")
    output.add_argument("--format", choices=("text", "json", "csv"), default="text",
                        help="standard output: tables, one JSON document, or one long CSV")
    output.add_argument("--html", metavar="FILE", type=Path,
                        help="also write the comparison as a self-contained HTML page "
                             "(default: none written)")
    output.add_argument("--top", type=at_least_one, default=diff_compare.TOP_OPS,
                        help="operators and kernels shown, each")
    output.add_argument("--no-pager", action="store_true",
                        help="never page the text report (it is paged only on a terminal, "
                             "with $PAGER or less, where it does not fit the screen)")
    add_parse_options(parser)
    return parser


@with_text_in_python
def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if (args.b is None) == (args.capture is None):
        parser.error("give B, or --capture N to compare a capture window of A with its first "
                     "fixed window")
    steps = parse_step_spec(args.steps) if args.steps else None
    window = path_window(parser, args)
    if args.capture is not None:
        try:
            a, b = _capture_sides(args.a, args.capture, steps, not args.no_cache, args.jobs,
                                  tuple(args.comm_kernel))
        except (NothingToAnalyse, ValueError) as exc:
            print(terminal_safe(f"ranktrace: nothing compared: {exc}"), file=sys.stderr)
            return 1
        steps = None  # each side holds its own steps; --steps chose A's
    else:
        sides = []
        for label, path in (("A", args.a), ("B", args.b)):
            try:
                sides.append(load_side(path, steps, use_cache=not args.no_cache, jobs=args.jobs,
                                       comm_kernels=tuple(args.comm_kernel), window=window))
            except NothingToAnalyse as exc:
                print(terminal_safe(f"ranktrace: nothing compared: {label}: {exc}"),
                      file=sys.stderr)
                return 1
        a, b = sides
    for note in dict.fromkeys([*a.notes, *b.notes]):  # --capture: one folder, both sides
        print(terminal_safe(f"ranktrace: note: {note}"), file=sys.stderr)
    result = diff_compare.compare(a, b, seed=args.seed, resamples=args.resamples, top=args.top,
                                  noise_floor_pct=args.noise_floor_pct)
    for problem in result["problems"]:
        print(terminal_safe(f"ranktrace: warning: {problem}"), file=sys.stderr)
    if args.format == "json":
        print(terminal_safe(json.dumps(diff_output.document(result, a, b, args.steps, window),
                                       indent=1, ensure_ascii=False)))
    elif args.format == "csv":
        print(terminal_safe(diff_output.csv_text(result)), end="")
    else:
        show(terminal_safe(diff_output.text_report(result, a, b)), use_pager=not args.no_pager)
    if args.html is not None:
        try:
            args.html.write_text(diff_output.html_page(result, a, b), encoding="utf-8")
        except OSError as exc:
            print(terminal_safe(f"ranktrace: error: --html {args.html}: cannot write "
                  f"({exc.strerror or exc})"), file=sys.stderr)
            return 1
    if result["change"]["median_a_ms"] is None or result["change"]["median_b_ms"] is None:
        print(terminal_safe(f"ranktrace: nothing compared: {result['verdict']}"), file=sys.stderr)
        return 1
    return 0


def _capture_sides(path: Path, number: int, baseline: list[int] | None, use_cache: bool,
                   jobs: int | None, comm_kernels: tuple = ()):
    """(A, B) of --capture: the run `path` names, its default window (or `baseline`) and its
    capture window `number`. ValueError where the run has no such window."""
    runs = resolve_runs([path])
    run_dir = runs[0][0] if runs else None
    if run_dir is None:
        raise ValueError(f"{path}: --capture needs a run folder written by the tracer")
    windows, _ = read_captures(Path(run_dir))
    if not windows:
        raise ValueError(f"{run_dir}: the run has no capture window (the tracer opens them "
                         f"with --capture-slow-steps, or python -m tracer.capture)")
    if number > len(windows):
        raise ValueError(f"{run_dir}: --capture {number}, but the run has {len(windows)} "
                         f"capture window{'s' if len(windows) > 1 else ''}")
    return capture_sides(Path(run_dir), windows[number - 1], baseline, use_cache=use_cache,
                         jobs=jobs, comm_kernels=comm_kernels)

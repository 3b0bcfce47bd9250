"""`python -m analysis.breakdown`: the command line (docs/analysis.md). Arguments and printing only;
the analysis is analysis.run's.

Until a run's trace file is being decoded (analysis.ingest.parse_ahead), nothing here imports
pandas.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# The command's first imports (numpy, msgspec and the decoder: what runs before it forks the
# decoder ahead, analysis.ingest.parse_ahead, while nothing runs beside it) are made with the
# cyclic collector paused, and then frozen out of its collections, as _analyse's are: it would
# scan their objects again and again while they are made (about 40 collections, 12 ms), and
# they live as long as the process.
_COLLECTING = gc.isenabled()
gc.disable()
try:
    from analysis.core.command_options import add_parse_options
    from analysis.core.forked import reap_children
    from analysis.core.lean_import import import_pandas_without_arrow
    from analysis.core.limits import max_trace_bytes
    from analysis.core.step_spec import (
        PathWindow,
        parse_step_spec,
        path_window,
        positive_number,
        steps_argument,
        window_options,
    )
    from analysis.core.terminal import show, terminal_safe
    from analysis.ingest import parse_ahead
    from analysis.ingest.kineto import gc_paused
    from analysis.ingest.parallel import SchedulerUnavailable
    from analysis.ingest.runs import NothingToAnalyse, resolve
    from analysis.report.progress import Progress
    from tracer.options import help_format
finally:
    gc.freeze()
    if _COLLECTING:
        gc.enable()

if TYPE_CHECKING:
    from analysis.core.contracts import RunReport


PROG = "python -m analysis.breakdown"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = help_format.parser(
        prog, "Time breakdown, collectives and bottlenecks of a traced training run "
              "(docs/analysis.md). The text report fits one screen: the verdict, a row per "
              "rank and the top findings; --full prints every table.")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="a run folder, a folder of runs (the newest is analysed), or "
                             "Kineto trace files")
    which = parser.add_argument_group("what to analyse")
    which.add_argument("--run", metavar="NAME",
                       help="the run to analyse in a folder of runs (default: the newest)")
    which.add_argument("--all", action="store_true", help="analyse every run in a folder of runs")
    which.add_argument("--steps", metavar="SPEC", type=steps_argument,
                       help="ProfilerStep numbers to analyse, e.g. 3-5,7 (default: all)")
    window_options(which)
    which.add_argument("--hta-compatible", action="store_true",
                       help="select steps as HTA does: drop the last ProfilerStep")
    which.add_argument("--peak-tflops", type=positive_number, metavar="TFLOPS",
                       help="the peak TFLOP/s that MFU and the roofline take for every rank "
                            "(default: the one the tracer recorded, else the datasheet's for "
                            "the device and the steps' dtype; docs/mfu.md)")
    output = parser.add_argument_group("output")
    output.add_argument("--format", choices=("text", "json", "csv"), default="text",
                        help="standard output: the report, one JSON document, or the per-step "
                             "CSV")
    output.add_argument("--full", action="store_true",
                        help="the text report with every table (default: one screen)")
    output.add_argument("--no-pager", action="store_true",
                        help="never page the text report (it is paged only on a terminal, "
                             "with $PAGER or less, where it does not fit the screen)")
    output.add_argument("--out", metavar="DIR", type=Path,
                        help="also write every table as CSV into DIR (default: none written)")
    output.add_argument("--html", metavar="FILE", type=Path,
                        help="also write the standalone HTML report to FILE (<run>-FILE per run "
                             "with several runs; default: none written)")
    output.add_argument("--strict", action="store_true",
                        help="exit non-zero on any problem, not only when nothing was analysed")
    work = add_parse_options(parser)
    work.add_argument("--scheduler", metavar="ADDRESS",
                      help="parse the trace files on the Dask cluster of this scheduler "
                           "(tcp://host:8786), whose workers see them at the same paths "
                           "(default: on this machine)")
    return parser


def main(argv: list[str] | None = None, prog: str = PROG, own_process: bool = False) -> int:
    """The command; `own_process`: this process is the command's alone and ends with it
    (`python -m`, the ranktrace command), so that it may set glibc's allocator for its own
    speed while it waits for its decoder (analysis.core.heap), which would stay set in a
    caller's process."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        max_bytes = max_trace_bytes()
    except ValueError as exc:
        parser.error(str(exc))
    steps = parse_step_spec(args.steps) if args.steps else None
    window = path_window(parser, args)
    try:
        resolved = resolve([Path(p) for p in args.paths], run=args.run, all_runs=args.all)
    except NothingToAnalyse as exc:
        print(terminal_safe(f"ranktrace: nothing analysed: {exc}"), file=sys.stderr)
        return 1
    for note in resolved.notes:
        print(terminal_safe(f"ranktrace: note: {note}"), file=sys.stderr)
    runs = resolved.runs
    ahead = parse_ahead.start([f for _, files in runs for f in files], max_bytes,
                              use_cache=not args.no_cache, jobs=args.jobs,
                              scheduler=args.scheduler, ready_memory=own_process)
    try:
        return _analyse(args, runs, steps, ahead, window)
    except SchedulerUnavailable as exc:
        print(terminal_safe(f"ranktrace: error: {exc}"), file=sys.stderr)
        return 1
    finally:
        if ahead is not None:
            ahead.close()


def _analyse(args: argparse.Namespace, runs: list, steps: list[int] | None,
             ahead: parse_ahead.DecodeAhead | None, window: PathWindow | None = None) -> int:
    # Imported here, while the trace is decoded beside them (analysis.ingest.parse_ahead), with
    # the cyclic collector paused, and then frozen out of its collections (before it resumes,
    # or its first collection scans them all): it would scan the modules' objects again and
    # again while they are made (a tenth of the imports' time), and they live as long as the
    # process.
    with gc_paused():
        if ahead is not None:  # one file, analysed here and in children forked from here
            pd = import_pandas_without_arrow()
        else:  # workers (a pool's, a Dask cluster's) may send frames of pyarrow's strings
            import pandas as pd

        from analysis.core.frames import text_in_python
        from analysis.ingest.load import LoadOptions
        from analysis.report.csv_files import write_csvs
        from analysis.report.json_document import dumps, json_document
        from analysis.report.one_screen import one_screen_report
        from analysis.report.text_report import text_report
        from analysis.run.analysed_run import analyse_run
        from analysis.run.loading import load_run
        gc.freeze()

    with text_in_python():
        reports = []
        for run_dir, files in runs:
            with Progress() as progress:
                # What is loaded lives until this one-shot process ends: loaded with the cyclic
                # collector paused, and then frozen out of its collections, it would only rescan it
                # (millions of objects at a thousand ranks; 40 ms at the first collection after
                # loading one 50 MB trace). Worker processes collect as usual (run_jobs).
                with gc_paused():
                    options = LoadOptions(
                        steps=steps, hta_compatible=args.hta_compatible,
                        use_cache=not args.no_cache, jobs=args.jobs,
                        comm_kernels=tuple(args.comm_kernel), scheduler=args.scheduler,
                        # Only the HTML report draws from the events once reduced.
                        keep_events=args.html is not None, path_window=window)
                    # A run of one file: its critical path on the second core.
                    loaded = load_run(files, run_dir, options, progress=progress,
                                      decoded_ahead=ahead,
                                      path_beside=not args.scheduler and (args.jobs or 2) > 1)
                    gc.freeze()
                where = run_dir if run_dir is not None else Path(args.paths[0])
                report = analyse_run(loaded, name=where.name or str(where), path=str(where),
                                     steps_spec=args.steps, hta_compatible=args.hta_compatible,
                                     progress=progress, peak_tflops=args.peak_tflops)
            for problem in report.problems:
                print(terminal_safe(f"ranktrace: warning: {problem}"), file=sys.stderr)
            several = len(runs) > 1
            if args.out is not None:
                out_dir = args.out / report.name if several else args.out
                report, _ = _write(report, "--out", out_dir, write_csvs)
            if args.html is not None:
                target = (args.html.with_name(f"{report.name}-{args.html.name}") if several
                          else args.html)
                report, written = _write(report, "--html", target, _write_html)
                if written:
                    print(terminal_safe(f"ranktrace: HTML report written to {target}"),
                          file=sys.stderr)
            reports.append(report)

        if args.format == "json":
            print(terminal_safe(dumps(json_document(reports))))
        elif args.format == "csv":
            tables = [r.step_table().assign(run=r.name) for r in reports]
            pd.concat(tables, ignore_index=True).to_csv(sys.stdout, index=False)
        else:
            write = text_report if args.full else one_screen_report
            show(terminal_safe("\n".join(write(r) for r in reports)), use_pager=not args.no_pager)

        analysed = any(not r.nothing_analysed() for r in reports)
        if not analysed:
            reasons = "; ".join(p for r in reports for p in r.problems) or "no step to analyse"
            print(terminal_safe(f"ranktrace: nothing analysed: {reasons}"), file=sys.stderr)
            return 1
        if args.strict and any(r.problems for r in reports):
            count = sum(len(r.problems) for r in reports)
            print(terminal_safe(f"ranktrace: --strict: {count} problem(s), see the warnings above"),
                  file=sys.stderr)
            return 1
        return 0


def _write_html(report: RunReport, target: Path) -> None:
    # Imported here: only --html needs the HTML report's modules.
    from analysis.report.html import write_html_report

    write_html_report(report, target)


def _write(report: RunReport, option: str, target: Path, write) -> tuple[RunReport, bool]:
    """write(report, target), and whether it was written; an OSError becomes a problem of the
    run (the report returned has it) and an error line naming `target`."""
    try:
        write(report, target)
    except OSError as exc:
        message = f"{option} {target}: cannot write ({exc.strerror or exc})"
        print(terminal_safe(f"ranktrace: error: {message}"), file=sys.stderr)
        return dataclasses.replace(report, problems=[*report.problems, message]), False
    return report, True


def exit_now(code: int) -> None:
    """End the command with `code` once its output is flushed, without the interpreter's
    finalization: it would free what the analysis built (the events, the tables, every
    module) object by object, about 45 ms for a 50 MB trace, where the system frees the
    process's memory at once. Every file the command writes is closed and every process it
    started is reaped by then; output that cannot be flushed (a closed pipe) ends the usual
    way, with its usual message."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        raise SystemExit(code) from None
    reap_children()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main(own_process=True))

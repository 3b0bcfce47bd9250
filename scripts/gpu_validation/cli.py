"""The command line: run every check in order and write the results, or install fixtures."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .analysis_checks import check_hta_columns, check_hta_match, run_analysis
from .config import BUDGET_OVERRUN_S, DEFAULT_BUDGET_S, FIXTURES_DEST, WORKLOADS, settings
from .install_fixtures import install_fixtures
from .outdir import check_layout, provenance_of, write_fixtures, write_logs
from .overhead import overhead
from .preflight import preflight
from .results import Results, planned_checks, write_atomic
from .run_checks import (
    check_memory,
    check_run_files,
    check_trace,
    check_utilisation,
    trace_command,
)
from .run_folder import read_run
from .runner import Budget, BudgetExhausted, Interrupted, Runner, base_env


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python scripts/gpu_validation",
        description="Validate ranktrace's GPU paths on a real GPU (docs/gpu-validation.md).")
    parser.add_argument("outdir", nargs="?", type=Path,
                        help="where results.json, results.md, fixtures.tar and logs.tar.gz go")
    parser.add_argument("--quick", action="store_true",
                        help="fewer steps and overhead repetitions (the recommended run)")
    parser.add_argument("--cpu", action="store_true",
                        help="run the flow without a GPU (gloo, psutil); GPU checks are skipped")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, metavar="S",
                        help="seconds the whole run may take; subprocess timeouts are cut to it")
    parser.add_argument("--wheels", type=Path, metavar="DIR",
                        help="a folder of wheels to pip-install missing modules from (no network)")
    parser.add_argument("--max-overhead", type=float, metavar="RATIO",
                        help="fail overhead.outside_windows above this ratio "
                             "(default: report only)")
    parser.add_argument("--work", type=Path, metavar="DIR",
                        help="where the runs are traced (default: a temporary folder)")
    parser.add_argument("--keep-work", action="store_true", help="do not delete the work folder")
    parser.add_argument("--install-fixtures", type=Path, metavar="TAR",
                        help="unpack a fixtures.tar into tests/data/gpu/ and exit")
    parser.add_argument("--dest", type=Path, default=FIXTURES_DEST,
                        help="with --install-fixtures: the folder to fill")
    parser.add_argument("--allow-cpu", action="store_true",
                        help="with --install-fixtures: accept a tar made with --cpu")
    parser.add_argument("--list-checks", action="store_true",
                        help="print the checks as JSON and exit")
    return parser


class guarded:
    """A bug in a check (data this script did not expect) fails the checks whose names start with
    `prefix`, with the exception, and lets the run go on to the next workload."""

    def __init__(self, results: Results, prefix: str):
        self.results, self.prefix = results, prefix

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None or not issubclass(kind, Exception) or issubclass(
                kind, (BudgetExhausted, Interrupted)):
            return False
        traceback.print_exception(kind, exc, tb)
        where = traceback.extract_tb(tb)[-1]
        self.results.not_run([n for n in self.results.checks if n.startswith(self.prefix)],
                             f"the check code crashed: {kind.__name__}: {exc} (line "
                             f"{where.lineno}, {where.name}); see the log")
        return True


def _on_sigterm(signum, frame):
    raise Interrupted(f"signal {signum}")


@dataclass
class _Session:
    """What one validation run carries from step to step."""

    args: argparse.Namespace
    gpu: bool
    budget: Budget
    command: list[str]
    results: Results
    cfg: dict
    work: Path
    runner: Runner
    runs: dict[str, dict] = field(default_factory=dict)
    hta_numbers: dict[str, dict] = field(default_factory=dict)
    analysis_figures: dict[str, dict] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list_checks:
        print(json.dumps([{"name": n, "scope": s, "description": d}
                          for n, s, d in planned_checks()], indent=2))
        return 0
    if args.install_fixtures is not None:
        return install_fixtures(args.install_fixtures, args.dest, args.allow_cpu)
    if args.outdir is None:
        parser.error("OUTDIR is required")
    session = _start(args, argv)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    stop_reason = None
    try:
        stop_reason = _validate(session)
    except BudgetExhausted as exc:
        stop_reason = str(exc)
        print(f"!! {stop_reason}", flush=True)
    except (Interrupted, KeyboardInterrupt) as exc:
        session.runner.kill_all()
        stop_reason = f"interrupted ({exc or 'Ctrl-C'})"
        print(f"!! {stop_reason}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
        _finish(session, stop_reason)
    return _verdict(session)


def _start(args: argparse.Namespace, argv: list[str]) -> _Session:
    """The results file, the settings, the work folder and the runner of a validation run."""
    outdir = args.outdir.resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    gpu = not args.cpu
    budget = Budget(args.budget)
    command = ["python", "scripts/gpu_validation", *argv]
    results = Results(outdir, "gpu" if gpu else "cpu", args.quick, budget, command)
    results.save()
    if args.work:  # a fresh folder inside it: run names must not collide with earlier runs
        args.work.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix="run-", dir=args.work.resolve()))
    else:
        work = Path(tempfile.mkdtemp(prefix="ranktrace-gpu-validation-"))
    session = _Session(args=args, gpu=gpu, budget=budget, command=command, results=results,
                       cfg=settings(gpu, args.quick), work=work,
                       runner=Runner(budget, base_env(gpu, [])))
    print(f"ranktrace GPU validation: mode {'gpu' if gpu else 'cpu'}"
          f"{' --quick' if args.quick else ''}, budget {budget.total:g} s, work folder {work}, "
          f"results in {outdir}", flush=True)
    return session


def _validate(s: _Session) -> str | None:
    """Every check in order; why the run stopped early, or None."""
    results, runner, cfg, work, gpu = s.results, s.runner, s.cfg, s.work, s.gpu
    print(f"== preflight ({s.budget.elapsed():.0f} s)", flush=True)
    if not preflight(results, runner, gpu, s.args.wheels, work):
        return "preflight failed (see the preflight checks)"
    print(f"== tracing {', '.join(WORKLOADS)} ({s.budget.elapsed():.0f} s)", flush=True)
    traced = runner.run_many([(f"trace-{wl}", trace_command(wl, work, cfg),
                               cfg["trace_timeout"]) for wl in WORKLOADS], cfg["parallel"])
    for wl in WORKLOADS:
        done = traced[f"trace-{wl}"]
        if isinstance(done, BudgetExhausted):
            raise done
        print(f"== checking {wl} ({s.budget.elapsed():.0f} s)", flush=True)
        with guarded(results, f"{wl}."):
            _check_workload(s, wl, done)
    if gpu:
        with guarded(results, "nvml."):
            check_utilisation(results, s.runs)
    provenance = provenance_of(
        results, s.command, s.runs,
        settings={k: v for k, v in cfg.items() if not k.endswith("timeout")},
        hta_compatible=s.analysis_figures, hta=s.hta_numbers)
    with guarded(results, "fixtures."):
        write_fixtures(results, results.outdir, s.runs, provenance)
    print(f"== overhead ({s.budget.elapsed():.0f} s)", flush=True)
    with guarded(results, "overhead."):
        overhead(results, runner, work, cfg, gpu, s.args.max_overhead)
    return None


def _check_workload(s: _Session, wl: str, done) -> None:
    """The checks of one traced workload: its trace, its files, the analysis, and on a GPU its
    memory and HTA's columns."""
    results = s.results
    run = s.runs[wl] = read_run(s.work / wl)
    if not check_trace(results, wl, done, run, s.cfg) and not run.get("traces"):
        results.not_run([n for n in results.checks if n.startswith(wl + ".")],
                        f"the traced {wl} run produced no trace")
        return
    check_run_files(results, wl, run, s.gpu)
    doc = run_analysis(results, s.runner, wl, s.work / wl, s.cfg, s.gpu)
    if not s.gpu:
        return
    check_memory(results, wl, run, doc)
    ours = check_hta_columns(results, wl, doc)
    if ours is not None:
        s.analysis_figures[wl] = ours
    theirs = check_hta_match(results, s.runner, wl, run, ours, s.work, s.cfg)
    if theirs is not None:
        s.hta_numbers[wl] = theirs


def _finish(s: _Session, stop_reason: str | None) -> None:
    """The logs, the fixtures of whatever was traced, the layout and time checks, and the
    results files, however the run ended."""
    results, outdir = s.results, s.results.outdir
    try:
        write_logs(outdir, s.runner.logs)
    except OSError as exc:
        results.notes.append(f"logs.tar.gz not written: {exc}")
    if results.pending("fixtures.tar"):
        found = {wl: s.runs.get(wl) or read_run(s.work / wl) for wl in WORKLOADS}
        found = {wl: run for wl, run in found.items() if run.get("exists")}
        if found:
            write_fixtures(results, outdir, found,
                           provenance_of(results, s.command, found, partial=True))
    if stop_reason:
        results.notes.append(f"stopped early: {stop_reason}")
    check_layout(results, outdir)
    elapsed = s.budget.elapsed()
    limit = s.budget.total + BUDGET_OVERRUN_S
    results.record("time_budget", elapsed < limit, f"{elapsed:.1f} s",
                   f"{elapsed:.1f} s in all (limit {limit:.0f} s, budget "
                   f"{s.budget.total:g} s)")
    results.finish(stop_reason or "an earlier step failed")
    results.save()
    write_atomic(outdir / "results.md", results.markdown())
    if not s.args.keep_work and not s.args.work:
        shutil.rmtree(s.work, ignore_errors=True)
    else:
        print(f"work folder kept: {s.work}", flush=True)


def _verdict(s: _Session) -> int:
    """The summary lines and the exit status: 1 where a check failed."""
    results = s.results
    counts = results.counts()
    print(f"== done in {s.budget.elapsed():.1f} s: {counts.get('passed', 0)} passed, "
          f"{counts.get('failed', 0)} failed, {counts.get('skipped', 0)} skipped", flush=True)
    if results.failed:
        print("FAILED CHECKS:", flush=True)
        not_run: dict[str, list[str]] = {}
        for check in results.failed:
            if check["detail"].startswith("not run: "):
                not_run.setdefault(check["detail"], []).append(check["name"])
            else:
                print(f"  {check['name']}: {check['detail']}", flush=True)
        for detail, names in not_run.items():
            print(f"  {len(names)} checks {detail}: {', '.join(names)}", flush=True)
        print(f"VERDICT: FAILED (results in {results.outdir})", flush=True)
        return 1
    print(f"VERDICT: PASSED{' (GPU checks skipped: --cpu)' if not s.gpu else ''} "
          f"(results in {results.outdir})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

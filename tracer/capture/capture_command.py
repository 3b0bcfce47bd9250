"""Ask every rank of a running job to profile the next steps, at the same step numbers.

    ranktrace capture RUN [--active N]      (or python -m tracer.capture)

RUN is the run folder (traces/<run>). The ask is a file in it (tracer.capture.capture_requests);
one live rank answers it on its next step-end worker pass with the window's steps, from its own
step plus a margin, and every rank opens that window (docs/tracer.md, Capturing slow steps). Exit
codes: 0 asked and answered, 1 the run cannot be asked (ended, no live rank, not a run folder,
--no-profiler or --no-capture, no answer), 2 usage (--active below 1 or above the run's
--max-window-steps).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from pathlib import Path

from tracer import schema
from tracer.capture.capture_requests import FileLog, shown
from tracer.options import help_format
from tracer.options.config import TracerConfig

ANSWER_TIMEOUT_S = 10.0  # a live rank answers on its next step-end worker pass (0.2 s)


class CaptureError(RuntimeError):
    """The run cannot be asked; the message says why."""


def _manifest(path: Path) -> list:
    decoder = schema.decoder(schema.ManifestRecord)
    records = []
    for line in path.read_bytes().splitlines():
        try:
            records.append(decoder.decode(line))
        except Exception:
            continue  # a line cut short, or a kind this version does not know
    return records


def _manifests(run: Path) -> dict[int, Path]:
    found = {}
    for path in sorted(run.iterdir()):
        rank, _, rest = path.name.partition(".")
        worker = schema.RANK_WORKER_RE.match(rank)
        if worker and rest in ("manifest.jsonl", "manifest.jsonl" + schema.TEMP_SUFFIX):
            found.setdefault(int(worker["rank"]), path)
    return found


def _alive(start: schema.RunStart) -> bool:
    if start.host != socket.gethostname():
        return True  # another machine's process: cannot be told from here
    try:
        os.kill(start.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def check_run(run: Path) -> schema.RunStart:
    """The run_start of a live rank of the run in `run`; CaptureError unless some rank is live
    and profiling with capture on."""
    if not run.is_dir():
        raise CaptureError(f"no run folder {str(run)!r}")
    manifests = _manifests(run)
    if not manifests:
        raise CaptureError(f"{str(run)!r} holds no rank manifest: not a run folder")
    records = {rank: _manifest(path) for rank, path in manifests.items()}
    live = [rank for rank, recs in records.items()
            if not any(isinstance(r, schema.RunEnd) for r in recs)]
    if not live:
        raise CaptureError(f"the run in {str(run)!r} has ended (every rank wrote run_end)")
    starts = [next((r for r in records[rank] if isinstance(r, schema.RunStart)), None)
              for rank in live]
    starts = [s for s in starts if s is not None and _alive(s)]
    if not starts:
        raise CaptureError(f"no live rank in {str(run)!r}: each rank without a run_end has no "
                           f"running process (it crashed or was killed)")
    if starts[0].config.get("no_profiler"):
        raise CaptureError(f"the run in {str(run)!r} runs with --no-profiler")
    if starts[0].config.get("no_capture"):
        raise CaptureError(f"the run in {str(run)!r} runs with --no-capture")
    return starts[0]


def max_window_steps(start: schema.RunStart) -> int:
    """The run's --max-window-steps (the default for a run recorded before it existed)."""
    value = start.config.get("max_window_steps")
    return value if isinstance(value, int) and value > 0 else TracerConfig.max_window_steps


class StepsError(CaptureError):
    """--active is above the run's bound: a usage error."""


def ask(run: Path, steps: int | None, timeout_s: float = ANSWER_TIMEOUT_S
        ) -> tuple[int, schema.CaptureRequest]:
    """Ask the ranks of `run` for a window; (ask number, the request that answers it)."""
    start = check_run(run)
    bound = max_window_steps(start)
    if steps is not None and steps > bound:
        raise StepsError(f"--active {steps} is above the run's --max-window-steps {bound}: a "
                         f"window keeps every event of its steps in memory until it ends")
    number = FileLog(str(run), schema.CAPTURE_ASK_FILE, schema.CaptureAsk).append(
        schema.CaptureAsk(steps=steps or 0, t_ns=time.time_ns(), run=start.run_name))
    answers = FileLog(str(run))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for _, request in answers.read_new():
            if request is not None and request.ask == number:
                return number, request
        time.sleep(0.05)
    raise CaptureError(f"no rank of the run in {str(run)!r} answered within {timeout_s:g} s "
                       f"(ask {number} stays in the folder; is the run still going?)")


PROG = "python -m tracer.capture"
RENAMED = {"--steps": "--active"}  # old spelling -> new: still taken, with a warning


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = help_format.parser(prog, __doc__.split("\n\n")[0])
    parser.add_argument("run", metavar="RUN", help="the run folder of the running job")
    parser.add_argument("--active", type=int, metavar="N",
                        help="steps to trace, as the tracer's --active (default: the run's "
                             "--active; --steps, the old name, is still taken)")
    return parser


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    parser = build_parser(prog)
    args = parser.parse_args(help_format.renamed(sys.argv[1:] if argv is None else argv,
                                                 RENAMED, prog))
    if args.active is not None and args.active < 1:
        parser.error(f"--active must be >= 1, got {args.active}")
    run = Path(args.run)
    try:
        number, request = ask(run, args.active)
    except (CaptureError, OSError) as exc:
        why = str(exc) if isinstance(exc, CaptureError) else f"cannot write in {str(run)!r} ({exc})"
        print(shown(f"ranktrace: capture: {why}"), file=sys.stderr)
        return 2 if isinstance(exc, StepsError) else 1
    last = request.first_step + request.steps - 1
    print(shown(f"every rank of {run} will profile steps {request.first_step}-{last} (ask "
                 f"{number}); traces land in {run} as rank<R>.<ns>.pt.trace.json.gz; a rank "
                 f"already past step {request.first_step - 1} says so on its stderr"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

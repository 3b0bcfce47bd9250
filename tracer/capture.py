"""Ask every rank of a running job to profile the next steps, at the same step numbers.

    python -m tracer.capture RUN [--steps N]

RUN is the run folder (traces/<run>). The request is a file in it (tracer.capture_log) that
every rank reads on its next step-end worker pass; its first step is the newest step any rank
has recorded, moved on by the time since, plus a margin (docs/tracer.md, Capturing slow steps).
Exit codes: 0 asked, 1 the run cannot be asked (ended, no live rank, not a run folder), 2 usage.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import sys
import time
from pathlib import Path

from tracer import schema
from tracer.capture_log import FileLog
from tracer.slow_steps import margin_steps, place_window

# The steps file is flushed at least every second and read by the ranks every 0.2 s: a request
# is ahead of every rank by this long, and the newest step on disk is at most this old.
MARGIN_S = 2.0
FLUSH_LAG_S = 1.5
TAIL_BYTES = 1 << 16
RECENT_STEPS = 20


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


def _rank_files(run: Path, pattern: str) -> dict[int, Path]:
    found = {}
    for rank_path in sorted(run.iterdir()):
        for suffix in ("", schema.TEMP_SUFFIX):
            for_rank = schema.RANK_WORKER_RE.match(rank_path.name.split(".", 1)[0])
            if for_rank and rank_path.name == pattern.format(rank=for_rank["rank"]) + suffix:
                found.setdefault(int(for_rank["rank"]), rank_path)
    return found


def _alive(start: schema.RunStart) -> bool:
    if start.host != socket.gethostname():
        return True  # another machine's process: cannot be told from here
    try:
        os.kill(start.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _last_steps(path: Path) -> list[schema.StepRecord]:
    decoder = schema.decoder(schema.StepRecord)
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - TAIL_BYTES))
        lines = f.read().splitlines()
    steps = []
    for line in lines[1:] if len(lines) > 1 else lines:
        try:
            steps.append(decoder.decode(line))
        except Exception:
            continue
    return steps[-RECENT_STEPS:]


def plan_request(run: Path, steps: int | None, now_ns: int | None = None
                 ) -> schema.CaptureRequest:
    """The request for `run`, or CaptureError."""
    if not run.is_dir():
        raise CaptureError(f"no run folder {str(run)!r}")
    manifests = _rank_files(run, schema.MANIFEST_FILE)
    if not manifests:
        raise CaptureError(f"{str(run)!r} holds no rank manifest: not a run folder")
    records = {rank: _manifest(path) for rank, path in manifests.items()}
    live = [rank for rank, recs in records.items()
            if not any(isinstance(r, schema.RunEnd) for r in recs)]
    if not live:
        raise CaptureError(f"the run in {str(run)!r} has ended (every rank wrote run_end)")
    starts = {rank: next((r for r in records[rank] if isinstance(r, schema.RunStart)), None)
              for rank in live}
    live = [rank for rank in live if starts[rank] is not None and _alive(starts[rank])]
    if not live:
        raise CaptureError(f"no live rank in {str(run)!r}: every rank without a run_end has no "
                           f"running process (crashed?)")
    config = starts[live[0]].config
    if config.get("no_profiler"):
        raise CaptureError(f"the run in {str(run)!r} was started with --no-profiler")
    steps = steps or int(config.get("active", 3))
    warmup = int(config.get("warmup", 1))
    newest, durations = -1, []
    now_ns = time.time_ns() if now_ns is None else now_ns
    newest_end = None
    for path in _rank_files(run, schema.STEPS_FILE).values():
        recent = _last_steps(path)
        durations += [s.end_ns - s.start_ns for s in recent if not s.in_profiler_window]
        if recent and recent[-1].step > newest:
            newest, newest_end = recent[-1].step, recent[-1].end_ns
    median = statistics.median(durations) if durations else None
    ahead = 0
    if median and newest_end is not None:  # steps run since, as far as the flush lag goes
        ahead = math.ceil(min(max(now_ns - newest_end, 0), FLUSH_LAG_S * 1e9) / median)
    first = newest + 1 + ahead + margin_steps(median, MARGIN_S) + warmup
    first = _clear_of_fixed_windows(first, steps, warmup, config)
    return schema.CaptureRequest(trigger="on_demand", trigger_step=max(newest, 0),
                                 first_step=first, steps=steps, t_ns=now_ns)


def _clear_of_fixed_windows(first: int, steps: int, warmup: int, config: dict) -> int:
    from torch.profiler import ProfilerAction, schedule

    fixed = schedule(skip_first=int(config.get("skip_first", 5)), wait=int(config.get("wait", 1)),
                     warmup=warmup, active=int(config.get("active", 3)),
                     repeat=int(config.get("repeat", 1)))
    placed = place_window(first, steps, warmup, fixed, ProfilerAction.NONE)
    if placed is None:
        raise CaptureError("the profiler's own windows leave no room for another (--repeat 0 "
                           "with no --wait steps?)")
    return placed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tracer.capture", description=__doc__
                                     .split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("run", metavar="RUN", help="the run folder of the running job")
    parser.add_argument("--steps", type=int, help="steps to trace (default: the run's --active)")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1, got {args.steps}")
    run = Path(args.run)
    try:
        request = plan_request(run, args.steps)
        number = FileLog(str(run)).append(request)
    except (CaptureError, OSError) as exc:
        why = str(exc) if isinstance(exc, CaptureError) else f"cannot write in {str(run)!r} ({exc})"
        print(f"ranktrace: capture: {why}".encode("unicode_escape").decode("ascii"),
              file=sys.stderr)
        return 1
    last = request.first_step + request.steps - 1
    print(f"every rank of {run} will profile steps {request.first_step}-{last} (request "
          f"{number}); traces land in {run} as rank<R>.<ns>.pt.trace.json.gz")
    return 0


if __name__ == "__main__":
    sys.exit(main())

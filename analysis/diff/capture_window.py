"""A capture window (analysis.ingest.capture_records) against the run's default window: the two
sides of `python -m analysis.diff RUN --capture N`, which compares what the slow steps spent
their time on with what the healthy start did (A: the fixed schedule's first window, B: the
captured one, both of the same run; docs/diff.md, Capture windows).
"""

from __future__ import annotations

from pathlib import Path

from analysis.core.step_spec import format_ranges
from analysis.diff.side import Side, load_side
from analysis.ingest.records import read_records, record_ranks
from tracer import schema


def fixed_window_steps(config: dict) -> list[int]:
    """The steps traced by the first window of the fixed schedule a run_start's config gives
    (torch.profiler.schedule: skip_first, then wait, warmup and active steps)."""
    start = (int(config.get("skip_first", 5)) + int(config.get("wait", 1))
             + int(config.get("warmup", 1)))
    return list(range(start, start + int(config.get("active", 3))))


def _config(run_dir: Path) -> dict:
    for rank in sorted(record_ranks(run_dir)):
        records, _ = read_records(run_dir, rank)
        for record in records.manifest if records is not None else ():
            if isinstance(record, schema.RunStart):
                return record.config
    return {}


def capture_sides(run_dir: Path, capture: dict, baseline_steps: list[int] | None = None,
                  use_cache: bool = True, jobs: int | None = None,
                  comm_kernels: tuple = ()) -> tuple[Side, Side]:
    """(A, B): the run's `baseline_steps` (default: the fixed schedule's first window) and the
    steps of `capture` (one entry of analysis.ingest.capture_records.group_captures), each
    side's path saying which steps it holds."""
    baseline = baseline_steps or fixed_window_steps(_config(run_dir))
    a = load_side(run_dir, baseline, use_cache=use_cache, jobs=jobs,
                  comm_kernels=comm_kernels)
    b = load_side(run_dir, list(capture["steps"]), use_cache=use_cache, jobs=jobs,
                  comm_kernels=comm_kernels)
    a.path = f"{run_dir}, steps {format_ranges(baseline)}" + (
        "" if baseline_steps else " (the profiler's first fixed window)")
    b.path = f"{run_dir}, steps {format_ranges(capture['steps'])} ({capture_label(capture)})"
    return a, b


def capture_label(capture: dict) -> str:
    """What opened the window, in words."""
    if capture.get("trigger") == "slow_step":
        ratio = capture.get("ratio")
        return (f"captured on a slow step: rank {capture.get('rank')}'s step "
                f"{capture.get('step')}" + ("" if ratio is None else f", {ratio:.2f}x its median"))
    return "captured on demand"

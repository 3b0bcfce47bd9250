"""A capture window (analysis.ingest.captures) against the run's default window: what the slow
steps spent their time on that the healthy start did not, with analysis.diff's comparison (A:
the fixed schedule's first window, B: the captured one, both of the same run; docs/diff.md for
every table).
"""

from __future__ import annotations

from pathlib import Path

from analysis.diff import compare as diff_compare
from analysis.diff.side import load_side
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


def compare_capture(run_dir: Path, capture: dict, baseline_steps: list[int] | None = None,
                    use_cache: bool = True, **options) -> dict:
    """analysis.diff.compare's tables of the steps of `capture` (one entry of
    analysis.ingest.captures.group_captures) against `baseline_steps` (default: the fixed
    schedule's first window), with "a_steps" and "b_steps" added; `options` go to compare."""
    baseline = baseline_steps or fixed_window_steps(_config(run_dir))
    a = load_side(run_dir, baseline, use_cache=use_cache)
    b = load_side(run_dir, list(capture["steps"]), use_cache=use_cache)
    result = diff_compare.compare(a, b, **options)
    result["a_steps"], result["b_steps"] = baseline, list(capture["steps"])
    return result

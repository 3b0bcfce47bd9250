"""The one load of a run: its trace files parsed (analysis.ingest.load) with the per-rank
reduction (analysis.rank.reduction.rank_tables), so that every rank holds its RankTables, the only
source of its tables (docs/analysis.md, "Large runs and Dask"). Every command and `open_run`
load through it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from analysis.core.model import LoadResult
from analysis.ingest.load import LoadOptions, load_files, load_path
from analysis.ingest.parse_ahead import DecodeAhead
from analysis.rank.reduction import rank_tables


def load_run(files: list[Path], run_dir: Path | None, options: LoadOptions | None = None, *,
             progress=None, decoded_ahead: DecodeAhead | None = None,
             path_beside: bool = False) -> LoadResult:
    """load_files with the per-rank reduction (`options`: LoadOptions' defaults where None).
    `path_beside`: a run of one trace file computes
    its one-rank critical path in a forked child on a second core (rank_tables)."""
    window = options.path_window if options is not None else None
    reduce_rank = partial(rank_tables, path_beside=path_beside, path_window=window)
    return load_files(files, run_dir, options, progress=progress, reduce_rank=reduce_rank,
                      decoded_ahead=decoded_ahead)


def load_run_path(path, steps=None, *, run: str | None = None, progress=None,
                  **options) -> LoadResult:
    """load_path with the per-rank reduction: the run that `path` names (a run folder, a
    folder of runs: the newest, trace files), `steps` as --steps, the other `options`
    LoadOptions' fields. Raises NothingToAnalyse when `path` holds no trace."""
    reduce_rank = partial(rank_tables, path_window=options.get("path_window"))
    return load_path(path, steps, run=run, progress=progress, reduce_rank=reduce_rank,
                     **options)

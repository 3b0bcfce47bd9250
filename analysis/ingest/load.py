"""Loading a run: its trace files parsed, grouped into one RankTrace per rank, with the tracer's
records and the selected steps.

The pieces live in modules of their own: the data model (analysis.core.model), the frame contract
(analysis.core.frames), Kineto decoding (analysis.ingest.kineto), the
Parquet cache (analysis.ingest.cache), which files a PATH names (analysis.ingest.runs), the tracer's
records (analysis.ingest.records), a rank's profiler windows (analysis.ingest.windows) and step
selection (analysis.core.steps). A file that cannot be read, whatever the reason, becomes a
problem naming the file (and rank, where known) and the rest is still loaded; a trace the tracer
never renamed is read as found, and named; the run's world size is checked against the ranks'
own claims (docs/reliability.md, "Damaged and hostile input").
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.core.contracts import RankTables
from analysis.core.events import mark_comm_kernels
from analysis.core.frames import empty_events, steps_frame
from analysis.core.limits import MAX_WORLD_SIZE, max_trace_bytes, shown
from analysis.core.model import UNKNOWN_RANK, LoadResult, RankTrace
from analysis.core.step_spec import PathWindow, format_ranges, parse_step_spec
from analysis.core.steps import select_steps
from analysis.ingest.cache import read_trace
from analysis.ingest.kineto import TraceReadError
from analysis.ingest.parallel import run_jobs
from analysis.ingest.parsed_trace import ParsedTrace
from analysis.ingest.records import (
    RECORD_FILES,
    read_records,
    record_ranks,
    records_path,
    run_status,
    steps_ended,
)
from analysis.ingest.runs import (
    file_rank,
    is_unrenamed,
    kineto_worker,
    named_rank,
    resolve_runs,
)
from analysis.ingest.windows import merge_windows
from tracer import schema

if TYPE_CHECKING:
    from analysis.ingest.parse_ahead import DecodeAhead

# progress(files parsed, files in all): told after each file.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class EventsReader:
    """A RankTrace's read_events: its file(s) read again as they were loaded (through the
    Parquet cache or not, under the same size limit), with the same communication kernels
    marked."""

    use_cache: bool
    comm_kernels: tuple
    max_bytes: int | None

    def __call__(self, trace: RankTrace) -> pd.DataFrame:
        parts = [read_trace(path, self.use_cache, self.max_bytes)
                 for path in [trace.path, *trace.extra_paths]]
        merged = merge_windows(parts) if len(parts) > 1 else parts[0]
        return mark_comm_kernels(merged.events, self.comm_kernels)


@dataclass(frozen=True)
class LoadOptions:
    """How a run's trace files are loaded: the command's options that the load takes."""

    steps: list[int] | None = None  # --steps: the ProfilerStep numbers analysed (None: all)
    hta_compatible: bool = False  # --hta-compatible: the last ProfilerStep dropped, as HTA does
    use_cache: bool = True  # read and write the .ranktrace-cache Parquet files
    jobs: int | None = None  # processes parsing the files (None: one per core)
    # Regular expressions (str or compiled) naming more device kernels that count as
    # communication, besides COMM_KERNEL_PATTERNS.
    comm_kernels: tuple = ()
    # The address of a Dask scheduler whose workers parse the files instead
    # (analysis.ingest.parallel); they must see the files at the same paths.
    scheduler: str | None = None
    # Keep each rank's events frame once it is reduced (notebooks, the HTML report and the
    # timeline draw from it); without it `RankTrace.events` is None (`with_events()` reads them
    # again), so that memory holds O(ranks x steps + collectives), not every event of every rank.
    keep_events: bool = True
    # --window, --instance: the one-rank critical path's windows (analysis.rank.path_windows);
    # None: the ProfilerSteps, or the whole trace in a trace without them.
    path_window: PathWindow | None = None


@dataclass(frozen=True)
class RankReduction:
    """What a worker needs to build its file's RankTrace as load_files would, and compute the
    per-rank tables and summaries there (`tables`, given by the caller: the rank floor's
    rank_tables) while the events are at hand."""

    tables: Callable[..., RankTables]  # tables(trace, only_trace=..., run_folder=...)
    steps: list[int] | None
    hta_compatible: bool
    comm_kernels: tuple
    with_records: bool  # a run folder was given: the records beside the trace are read
    # Drop the events once reduced: the command's text and JSON reports need only the
    # reductions; notebooks, the HTML report and the timeline keep them.
    drop_events: bool = False
    # The command's RANKTRACE_MAX_TRACE_MB, in bytes: a worker's environment may differ.
    max_bytes: int | None = None
    # The run has one trace file: its rank may be the run's only traced one, whatever world
    # size the trace names, and gets what only such a rank needs (its own critical path).
    only_trace: bool = False


def _read_trace_job(args: tuple[str, bool, int, RankReduction | None, DecodeAhead | None]):
    """Process-pool job: a ParsedTrace, or the error message (exceptions cross processes badly).
    A DecodeAhead (analysis.ingest.parse_ahead) comes only with a job run in this process."""
    path, use_cache, max_bytes, reduction, decoded_ahead = args
    try:
        parsed = read_trace(Path(path), use_cache, max_bytes, decoded_ahead)
        if reduction is not None:
            parsed.reduced = _reduce(parsed, reduction)
            if reduction.drop_events and parsed.reduced is not None:
                parsed.events = None
    except TraceReadError as exc:
        rank = file_rank(exc.path)
        return f"{exc.path}: rank {rank}: {exc.reason}" if rank is not None else str(exc)
    except Exception as exc:  # noqa: BLE001  (whatever else a file does costs that file only)
        rank = file_rank(Path(path))
        where = f"{path}: rank {rank}" if rank is not None else path
        return f"{where}: cannot be analysed ({type(exc).__name__}: {exc})"
    return parsed


def _reduce(parsed: ParsedTrace, how: RankReduction) -> tuple[int, int, RankTrace] | None:
    """(rank, problems of the parsed file, its RankTrace without events, reduced) as load_files
    will give the rank, when the file names one: the command takes it when the file turns out to
    be its rank's only one, without reading the records or selecting the steps again."""
    rank = parsed.rank if parsed.rank is not None else file_rank(parsed.path)
    if rank is None:
        return None  # unranked: only the whole run tells which rank it is analysed as
    trace = _rank_trace(parsed, rank, [], parsed.path.parent if how.with_records else None,
                        how.steps, how.hta_compatible, how.comm_kernels, how.max_bytes)
    trace.tables = how.tables(trace, only_trace=how.only_trace, run_folder=how.with_records)
    trace.events = None  # the parsed file's own travel back, when they are kept
    return rank, len(parsed.problems), trace


def _parse_all(files: list[Path], options: LoadOptions, progress: Progress | None,
               reduction: RankReduction | None = None,
               decoded_ahead: DecodeAhead | None = None) -> list:
    # Read here, not in the workers: a cluster's workers do not share this process's environment.
    max_bytes = max_trace_bytes()
    # A file of a rank's several profiler windows is reduced once merged, in this process: its
    # worker keeps its events, which would otherwise be read again here.
    reductions = _reductions(files, reduction)
    if not options.scheduler:
        return run_jobs(_read_trace_job,
                        [(str(f), options.use_cache, max_bytes, how,
                          decoded_ahead if len(files) == 1 else None)
                         for f, how in zip(files, reductions)],
                        jobs=options.jobs, progress=progress)
    # Cluster workers have their own working folder: they get absolute paths, and the results
    # name each file as it was given here, as a local run does.
    given = {str(f.absolute()): str(f) for f in files}
    how_of = {str(f.absolute()): how for f, how in zip(files, reductions)}
    results = run_jobs(_read_trace_job, [(path, options.use_cache, max_bytes, how_of[path], None)
                                          for path in given],
                       scheduler=options.scheduler, progress=progress)
    return [_named_as_given(result, absolute, shown)
            for result, (absolute, shown) in zip(results, given.items())]


def _reductions(files: list[Path], reduction: RankReduction | None
                ) -> list[RankReduction | None]:
    """Each file's reduction: None for a file whose name shares its Kineto worker (rank and
    process) with another's, one of a rank's several profiler windows, which load_files
    merges and then reduces; `reduction` with `only_trace` for the run's one file."""
    if reduction is None:
        return [None] * len(files)
    if len(files) == 1:
        return [dataclasses.replace(reduction, only_trace=True)]
    workers = Counter(kineto_worker(f) for f in files)
    return [None if (worker := kineto_worker(f)) is not None and workers[worker] > 1
            else reduction for f in files]


def _named_as_given(result, absolute: str, shown: str):
    if absolute == shown:
        return result
    if isinstance(result, str):
        return result.replace(absolute, shown)
    named = [result] + ([result.reduced[2]] if result.reduced is not None else [])
    for found in named:
        found.path = Path(shown)
        found.problems = [problem.replace(absolute, shown) for problem in found.problems]
    return result


def load_files(files: list[Path], run_dir: Path | None = None,
               options: LoadOptions | None = None, *, progress: Progress | None = None,
               reduce_rank: Callable[..., RankTables] | None = None,
               decoded_ahead: DecodeAhead | None = None) -> LoadResult:
    """Parse trace files (in parallel processes when several) into one RankTrace per rank.

    `reduce_rank(trace, only_trace=..., run_folder=...)`: the per-rank tables and summaries of
    a RankTrace (the rank floor's rank_tables, which analysis.run.loading gives), computed
    where each file is parsed while its events are at hand (a rank of several files once they
    are merged, and a rank known from its records alone, here): every rank gets its
    `RankTrace.tables`. `only_trace` says that the rank may be the run's only traced one (the
    run has one trace file, or one rank), `run_folder` that a run folder was given. Without it
    the ranks have no tables (`options.keep_events` must then be True).

    `options.scheduler`: raises SchedulerUnavailable when the scheduler cannot be used.
    `progress`, where given, is called after each file is parsed.
    `decoded_ahead`: the one file of `files` being decoded already (analysis.ingest.parse_ahead).
    `options`: LoadOptions' defaults where None.
    """
    options = options if options is not None else LoadOptions()
    where = run_dir if run_dir is not None else (files[0].parent if files else Path("."))
    if not files and run_dir is None:
        return LoadResult([], [f"{where}: no Kineto trace files"], run_dir)
    if not options.keep_events and reduce_rank is None:
        raise ValueError("keep_events=False needs reduce_rank: what to keep of each rank")
    reduction = None if reduce_rank is None else RankReduction(
        reduce_rank, options.steps, options.hta_compatible, tuple(options.comm_kernels),
        run_dir is not None, drop_events=not options.keep_events, max_bytes=max_trace_bytes())
    problems = _file_name_problems(files)
    parsed: list[ParsedTrace] = []
    for result in _parse_all(files, options, progress, reduction, decoded_ahead):
        if isinstance(result, str):
            problems.append(result)
        else:
            parsed.append(result)
    ranks = _ranks_of(_by_rank(parsed), run_dir, options, reduce_rank, problems)
    if run_dir is not None:
        ranks += _records_only_ranks(run_dir, files, ranks, reduce_rank, problems)
        ranks.sort(key=lambda r: (r.rank == UNKNOWN_RANK, r.rank, str(r.path)))
        problems += _unmarked_steps(run_dir, ranks)
    world_size, disagreeing = _world_size(ranks, where)
    problems += disagreeing
    if world_size:
        problems += _missing_ranks(where, ranks, world_size)
    for r in ranks:
        problems += r.problems
    if not ranks and not problems:
        problems.append(f"{where}: no Kineto trace files")
    return LoadResult(ranks=ranks, problems=problems, run_dir=run_dir, world_size=world_size,
                      files=list(files), path_window=options.path_window)


def _file_name_problems(files: list[Path]) -> list[str]:
    """What the files' names tell before they are read: a rank out of range, a trace the
    tracer never renamed."""
    problems = []
    for file in files:
        if (said := named_rank(file)) is not None and file_rank(file) is None:
            problems.append(f"{file}: its name's rank {shown(said)} is out of range "
                            f"(0..{MAX_WORLD_SIZE - 1}); set aside")
        if is_unrenamed(file):
            rank = file_rank(file)
            problems.append(f"{file}{f': rank {rank}' if rank is not None else ''}: a trace "
                            f"file never renamed (the rank was killed while the tracer wrote "
                            f"it); read as it is")
    return problems


def _by_rank(parsed: list[ParsedTrace]) -> dict:
    """The parsed files grouped by rank: distributedInfo first, else a ranktrace file name
    (rank{R}.<span>...); a lone file without either is rank 0, several are each unranked."""
    by_rank: dict = {}
    unranked: list[ParsedTrace] = []
    for trace in parsed:
        named = file_rank(trace.path)
        if trace.rank is None and named is not None:
            trace.rank = named
        elif trace.rank is not None and named is not None and named != trace.rank:
            trace.problems.append(f"{trace.path}: distributedInfo says rank {trace.rank} but the "
                                  f"file name says rank {named}; using {trace.rank}")
        if trace.rank is None:
            unranked.append(trace)
        else:
            by_rank.setdefault(trace.rank, []).append(trace)
    for trace in unranked:
        if len(parsed) == 1:
            # Alone, it is rank 0 whatever it was (HTA assumes the same).
            trace.problems.append(f"{trace.path}: no rank in distributedInfo; analysed as "
                                  f"rank 0, the only trace")
            trace.rank = 0
            by_rank.setdefault(0, []).append(trace)
        else:
            trace.problems.append(f"{trace.path}: no rank in distributedInfo; analysed as an "
                                  f"unranked trace (shown as rank ?)")
            by_rank.setdefault(("unranked", str(trace.path)), []).append(trace)
    return by_rank


def _ranks_of(by_rank: dict, run_dir: Path | None, options: LoadOptions,
              reduce_rank: Callable[..., RankTables] | None, problems: list[str]
              ) -> list[RankTrace]:
    """One RankTrace per rank of `by_rank`, in rank order: the one its worker reduced where its
    file is its rank's only one, else built and reduced here."""
    reader = EventsReader(options.use_cache, tuple(options.comm_kernels), max_trace_bytes())
    ranks: list[RankTrace] = []
    for key, group in by_rank.items():
        group = sorted(group, key=lambda t: t.path.name)
        kept = [group[0]]
        worker = kineto_worker(group[0].path)
        for other in group[1:]:
            if worker is not None and worker == kineto_worker(other.path):
                kept.append(other)  # another profiler window of the same process
            else:
                problems.append(f"duplicate rank {key}: {group[0].path} and {other.path} both "
                                f"say rank {key}; analysing {group[0].path} only")
        rank = key if isinstance(key, int) else UNKNOWN_RANK
        first = kept[0]
        if len(kept) == 1 and first.reduced is not None and first.reduced[0] == rank:
            _, known, reduced = first.reduced
            # Problems told of the file here (e.g. a rank that its name contradicts) join those
            # the worker found.
            reduced.problems = first.problems + reduced.problems[known:]
            if options.keep_events:
                reduced.events = mark_comm_kernels(first.events, options.comm_kernels)
            reduced.read_events = reader
            ranks.append(reduced)
            continue
        # No worker reduced the rank as a whole (one of its several profiler windows, or a file
        # without a rank of its own): its windows are merged, and it is reduced here.
        kept = [_with_events(k, reader) for k in kept]
        trace = merge_windows(kept) if len(kept) > 1 else kept[0]
        # Records lie beside the trace: several run folders (one per node) form one run.
        records_dir = trace.path.parent if run_dir is not None else None
        built = _rank_trace(trace, rank, [k.path for k in kept[1:]], records_dir, options.steps,
                            options.hta_compatible, options.comm_kernels)
        built.read_events = reader
        _reduced_here(built, reduce_rank, len(by_rank) == 1, run_dir is not None,
                      options.keep_events)
        ranks.append(built)
    ranks.sort(key=lambda r: (r.rank == UNKNOWN_RANK, r.rank, str(r.path)))
    return ranks


def _reduced_here(trace: RankTrace, reduce_rank: Callable[..., RankTables] | None,
                  only_trace: bool, run_folder: bool, keep_events: bool) -> None:
    """The rank's tables computed in this process, its events dropped unless kept."""
    if reduce_rank is None:
        return
    trace.tables = reduce_rank(trace, only_trace=only_trace, run_folder=run_folder)
    if not keep_events:
        trace.events = None


def _records_only_ranks(run_dir: Path, files: list[Path], ranks: list[RankTrace],
                        reduce_rank: Callable[..., RankTables] | None, problems: list[str]
                        ) -> list[RankTrace]:
    """The ranks with the tracer's records but no readable trace, in every folder of the run,
    each reduced (its tables are those of no event)."""
    found = {r.rank for r in ranks}
    added = []
    for folder in _record_folders(run_dir, files):
        for rank in sorted(record_ranks(folder) - found):
            if rank >= MAX_WORLD_SIZE:
                problems.append(f"{folder}: rank {shown(rank)}: record files of a rank "
                                f"out of range (0..{MAX_WORLD_SIZE - 1}); not read")
                continue
            trace = _records_only_rank(folder, rank)
            _reduced_here(trace, reduce_rank, False, True, True)
            added.append(trace)
            found.add(rank)
    return added


def _world_size(ranks: list[RankTrace], where) -> tuple[int | None, list[str]]:
    """The run's world size: the largest that a trace's distributedInfo or a manifest's
    run_start gives (each checked against its range where it was read), and a problem naming
    the sources where they disagree."""
    claims: dict[int, list[str]] = {}
    for r in ranks:
        if r.world_size and r.has_trace:
            claims.setdefault(r.world_size, []).append(f"{r.label}'s trace")
        for record in r.records.manifest if r.records is not None else []:
            if isinstance(record, schema.RunStart) and record.world_size:
                claims.setdefault(record.world_size, []).append(f"{r.label}'s manifest")
    if not claims:
        return None, []
    world_size = max(claims)
    if len(claims) == 1:
        return world_size, []
    said = "; ".join(f"{size} by {', '.join(dict.fromkeys(sources))}"
                     for size, sources in sorted(claims.items()))
    return world_size, [f"{where}: the files disagree on the world size ({said}); the "
                        f"largest, {world_size}, is used"]


def _missing_ranks(where, ranks: list[RankTrace], world_size: int) -> list[str]:
    """The one problem naming the ranks of the world that have no trace here, counted from the
    ranks found (never a set of the whole world: a world size is at most MAX_WORLD_SIZE, but
    the ranks here are far fewer)."""
    found = sorted({r.rank for r in ranks if 0 <= r.rank < world_size})
    if not found:
        return []
    gaps = [(low, high) for low, high in zip([-1, *found], [*found, world_size])
            if high - low > 1]
    if not gaps:
        return []
    missing = sum(high - low - 1 for low, high in gaps)
    which = ", ".join(str(low + 1) if high - low == 2 else f"{low + 1}-{high - 1}"
                     for low, high in gaps)
    which = (f"ranks {which} of world size {world_size} have" if missing > 1
             else f"rank {which} of world size {world_size} has")
    return [f"{where}: {which} no trace here ({len(found)} of {world_size} ranks analysed)"]


def _with_events(parsed: ParsedTrace, reader: EventsReader) -> ParsedTrace:
    if parsed.events is not None:
        return parsed
    return dataclasses.replace(parsed, events=read_trace(parsed.path, reader.use_cache,
                                                         reader.max_bytes).events)


def _record_folders(run_dir: Path, files: list[Path]) -> list[Path]:
    """The run folder, then every other folder that holds one of the run's trace files."""
    return list(dict.fromkeys([run_dir] + [f.parent for f in files]))


def _rank_trace(trace: ParsedTrace, rank, extra: list[Path], run_dir: Path | None,
                steps: list[int] | None, hta_compatible: bool, comm_kernels=(),
                max_bytes: int | None = None) -> RankTrace:
    problems = list(trace.problems)
    where = f"{trace.path}: rank {rank if rank != UNKNOWN_RANK else '?'}"
    records = None
    if run_dir is not None and rank != UNKNOWN_RANK:
        records, found = read_records(run_dir, rank, max_bytes)
        problems += found
    if trace.steps.empty:
        problems.append(f"{where}: no ProfilerStep in the trace; the whole trace span is "
                        f"analysed as one window (step -1)")
        selected = trace.steps
    else:
        selected, found = select_steps(trace.steps, steps, hta_compatible, where,
                                       steps_ended(records))
        problems += found
    events = (mark_comm_kernels(trace.events, comm_kernels) if trace.events is not None
              else None)
    return RankTrace(rank=rank, world_size=trace.world_size, path=trace.path,
                     events=events, steps=selected, records=records, problems=problems,
                     float_timestamps=trace.float_timestamps, all_steps=trace.steps,
                     extra_paths=extra, backend=trace.backend,
                     process_groups=trace.process_groups,
                     status=run_status(records.manifest) if records is not None else None)


def _records_only_rank(run_dir: Path, rank: int) -> RankTrace:
    """A rank with the tracer's records but no readable trace (killed before writing it)."""
    records, problems = read_records(run_dir, rank)
    path = next((found for pattern in RECORD_FILES
                 if (found := records_path(run_dir, pattern, rank)) is not None), run_dir)
    status = run_status(records.manifest) if records is not None else None
    world_size = None
    if records is not None:
        starts = [r for r in records.manifest if isinstance(r, schema.RunStart)]
        world_size = starts[-1].world_size if starts else None
        problems.append(
            f"{run_dir}: rank {rank}: no readable Kineto trace (run status: "
            f"{status or 'unknown, no manifest'}); its records are still "
            f"analysed: {len(records.steps)} step records, {len(records.comms)} comm ops")
    else:
        problems.append(f"{run_dir}: rank {rank}: no readable Kineto trace and no readable "
                        f"records")
    empty = steps_frame()
    return RankTrace(rank=rank, world_size=world_size, path=path, events=empty_events(),
                     steps=empty, records=records, problems=problems, all_steps=empty,
                     has_trace=False, status=status)


def _unmarked_steps(run_dir: Path, ranks: list[RankTrace]) -> list[str]:
    """The one problem of a run whose tracer records hold comm ops but no step."""
    unmarked = [r.rank for r in ranks if r.records is not None and r.records.steps.empty
                and not r.records.comms.empty and (r.all_steps is None or r.all_steps.empty)]
    if not unmarked:
        return []
    return [f"{run_dir}: ranks {format_ranges(unmarked)}: no steps were marked (no torch.optim "
            f"optimizer stepped), so there is no per-step breakdown; the comm records are "
            f"analysed over the whole run. To mark steps, call tracer.step() at the end of each "
            f"step, see docs/tracer.md"]


def load_path(path, steps=None, *, run: str | None = None, progress: Progress | None = None,
              reduce_rank: Callable[..., RankTables] | None = None,
              **options) -> LoadResult:
    """Load the run that `path` names (a run folder, a folder of runs: the newest, a trace file);
    `steps` as --steps ("3-5,7", or a list), the other `options` LoadOptions' fields, and
    `reduce_rank` as in load_files.

    Raises NothingToAnalyse when `path` holds no trace at all.
    """
    if isinstance(steps, str):
        steps = parse_step_spec(steps)
    paths = [Path(p) for p in (path if isinstance(path, (list, tuple)) else [path])]
    (run_dir, files), = resolve_runs(paths, run=run)
    return load_files(files, run_dir, LoadOptions(steps=steps, **options), progress=progress,
                      reduce_rank=reduce_rank)

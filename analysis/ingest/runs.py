"""Which trace files a PATH names: a run folder, a folder of runs, or trace files; and the rank a
ranktrace file name gives (file names from tracer.schema)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analysis.core.limits import MAX_WORLD_SIZE
from analysis.ingest.records import RECORD_FILE_RE, manifest_world_sizes, record_ranks
from tracer import schema

# Any Chrome/Kineto JSON trace: ours (schema.KINETO_TRACE_RE, a subset) or another tool's, such
# as `sampled_rank-0.json.gz`; tracer.schema promises that nothing else in a run folder ends so.
TRACE_SUFFIXES = (".json", ".json.gz")
# The folder beside a trace that holds its Parquet cache (analysis.ingest.cache); never a run.
CACHE_DIR = ".ranktrace-cache"


def cache_file(trace: Path) -> Path:
    """Where analysis.ingest.cache keeps the parsed events of `trace`."""
    return trace.parent / CACHE_DIR / (trace.name + ".parquet")


# What the tracer leaves of a trace when it is killed while writing one (tracer/probes/profiler.py),
# best first: Kineto's export, complete but not yet gzipped (`<trace>.raw.tmp`); the gzipped
# copy not yet renamed (`<trace>.tmp`); Kineto's own export still being written.
UNRENAMED_SUFFIXES = (".raw" + schema.TEMP_SUFFIX, schema.TEMP_SUFFIX,
                      ".raw" + schema.TEMP_SUFFIX + schema.TEMP_SUFFIX)


def is_trace_file(path: Path) -> bool:
    """Named like a trace and not a folder: a link that leads nowhere, a FIFO or a device named
    so is listed too, and refused by name when read (analysis.ingest.kineto)."""
    return path.name.endswith(TRACE_SUFFIXES) and not path.is_dir()


def final_name(name: str) -> str:
    """The name a trace file has once renamed: `name` without an unrenamed suffix."""
    for suffix in UNRENAMED_SUFFIXES[::-1]:  # ".raw.tmp.tmp" before the ".tmp" it ends in
        if name.endswith(suffix) and name[:-len(suffix)].endswith(TRACE_SUFFIXES):
            return name[:-len(suffix)]
    return name


def is_unrenamed(path: Path) -> bool:
    return final_name(path.name) != path.name


# How torch.profiler's export names a trace (`<worker>.<span>.pt.trace.json[.gz]`, ours and
# tensorboard_trace_handler's): in a folder that holds such a trace or the tracer's records, the
# only JSON files read as traces. Another tool's traces, named freely, are read where a folder
# holds nothing else to go by.
PROFILER_TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


@dataclass(frozen=True)
class FolderContents:
    """What one folder holds for the analysis, told from the names of its entries."""

    traces: list[Path]  # the trace files read, best unrenamed file of each included
    strays: list[Path]  # JSON files that are neither the run's traces nor its records: ignored
    record_ranks: set[int]  # ranks with a record file of the tracer (schema.RECORD_FILES)

    @property
    def is_run(self) -> bool:
        return bool(self.traces) or bool(self.record_ranks)


def _best_of_each(entries: list[Path]) -> list[Path]:
    """Each trace once: its renamed file, else the best file the tracer left unrenamed of it."""
    found = {p.name: p for p in entries if is_trace_file(p)}
    unrenamed: dict[str, Path] = {}
    for suffix in UNRENAMED_SUFFIXES:
        for entry in entries:
            final = final_name(entry.name)
            if (entry.name == final + suffix and final not in found and final not in unrenamed
                    and not entry.is_dir()):
                unrenamed[final] = entry
    return sorted([*found.values(), *unrenamed.values()])


def _is_profiler_trace(path: Path) -> bool:
    return final_name(path.name).endswith(PROFILER_TRACE_SUFFIXES)


def folder_contents(folder: Path) -> FolderContents:
    """A folder is a run by its records: the tracer's record files or torch.profiler's trace
    files make it one, and every other JSON file in it is a stray. A folder with neither is a
    run of other tools' traces, every JSON file one, unless it holds folders with traces or
    records in them: it is then a folder of runs, and its own JSON files are strays (a command's
    output saved beside the runs)."""
    entries = list(folder.iterdir())
    json_files = _best_of_each(entries)
    ranks = record_ranks(folder)
    named = [p for p in json_files if _is_profiler_trace(p)]
    others = [p for p in json_files if not _is_profiler_trace(p)]
    if named or ranks or not others:
        return FolderContents(traces=named, strays=others, record_ranks=ranks)
    if any(_holds_traces_or_records(child) for child in _subfolders(entries)):
        return FolderContents(traces=[], strays=others, record_ranks=ranks)
    return FolderContents(traces=others, strays=[], record_ranks=ranks)


def _subfolders(entries: list[Path]) -> list[Path]:
    return sorted(p for p in entries if p.is_dir() and p.name != CACHE_DIR)


def _holds_traces_or_records(folder: Path) -> bool:
    try:
        return any(is_trace_file(p) or RECORD_FILE_RE.match(p.name) for p in folder.iterdir())
    except OSError:  # unreadable: named when it is the one analysed, not here
        return False


def trace_files(folder: Path) -> list[Path]:
    """The trace files of a run folder (folder_contents), with the best file the tracer left
    unrenamed of each trace it was killed while writing (only where the renamed trace is not
    there)."""
    return folder_contents(folder).traces


def is_run_dir(folder: Path) -> bool:
    return folder_contents(folder).is_run


def stray_notes(folder: Path) -> list[str]:
    """One line per JSON file in `folder` that the analysis does not read (folder_contents)."""
    return _notes(folder_contents(folder))


def _notes(contents: FolderContents) -> list[str]:
    why = ("not one of the run's traces (*.pt.trace.json[.gz] beside the tracer's records)"
           if contents.is_run else "a file beside run folders, not a run")
    return [f"{path}: ignored: {why}" for path in contents.strays]


def _run_files(run: Path) -> list[Path]:
    """The files the analysis reads in a run folder: its traces and its record files."""
    contents = folder_contents(run)
    return [*contents.traces, *(p for p in run.iterdir() if RECORD_FILE_RE.match(p.name))]


def find_runs(folder: Path) -> list[Path]:
    """Run folders inside `folder` (one level down, or two for a folder of trace sets), oldest
    first by their newest trace or record file (not by what a command wrote there since: a
    report, a timeline, tables)."""
    runs = []
    for child in _subfolders(list(folder.iterdir())):
        if is_run_dir(child):
            runs.append(child)
        else:
            runs += [g for g in _subfolders(list(child.iterdir())) if is_run_dir(g)]

    def newest(run: Path) -> float:
        return max((p.stat().st_mtime for p in _run_files(run) if p.is_file()), default=0.0)

    return sorted(runs, key=lambda r: (newest(r), str(r)))


class NothingToAnalyse(Exception):
    """PATH holds no trace; the message says what was looked at."""


@dataclass(frozen=True)
class Resolved:
    """The runs that PATH names, and a note for each stray file met on the way there."""

    runs: list[tuple[Path | None, list[Path]]]  # (run folder or None, trace files) per run
    notes: list[str]


def resolve_runs(paths: list[Path], run: str | None = None, all_runs: bool = False
                 ) -> list[tuple[Path | None, list[Path]]]:
    """(run folder or None, trace files) for each run that PATH names."""
    return resolve(paths, run, all_runs).runs


def resolve(paths: list[Path], run: str | None = None, all_runs: bool = False) -> Resolved:
    """The runs that PATH names (resolve_runs), with the notes on the stray files (JSON files
    that are neither traces nor records) of the folders read."""
    files = [p for p in paths if p.is_file()]
    folders = [p for p in paths if p.is_dir()]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise NothingToAnalyse(f"{missing[0]}: no such file or folder")
    if files and folders:
        raise NothingToAnalyse("give either trace files or one folder, not both")
    if files:
        return Resolved([(None, files)], [])
    if len(folders) > 1:
        run_dir, traces = one_run_of_folders(folders, run)
        notes = [n for f in folders for n in stray_notes(f / run if run is not None else f)]
        return Resolved([(run_dir, traces)], notes)
    folder = folders[0]
    if run is not None:
        candidate = folder / run
        if not candidate.is_dir():
            names = ", ".join(r.name for r in find_runs(folder)) or "none"
            raise NothingToAnalyse(f"{folder}: no run named {run!r} (runs: {names})")
        folder = candidate
    contents = folder_contents(folder)
    if contents.is_run:
        return Resolved([(folder, contents.traces)], _notes(contents))
    runs = find_runs(folder)
    if not runs:
        raise NothingToAnalyse(f"{folder}: no Kineto trace (*.json, *.json.gz) and no run "
                               f"folder with one")
    chosen = runs if all_runs else runs[-1:]
    notes = _notes(contents) + [n for r in chosen for n in stray_notes(r)]
    return Resolved([(r, trace_files(r)) for r in chosen], notes)


def one_run_of_folders(folders: list[Path], run: str | None = None) -> tuple[Path, list[Path]]:
    """Run folders written apart (one per node, no shared file system) as one run: (the first
    folder, the trace files of all). They fit when no rank is in two of them and their
    manifests agree on the world size; each rank's records are read beside its trace."""
    runs = []
    for folder in folders:
        candidate = folder / run if run is not None else folder
        if not is_run_dir(candidate):
            raise NothingToAnalyse(f"{candidate}: not a run folder (no Kineto trace and no "
                                   f"records); several folders are analysed as one run only "
                                   f"when each is a run folder")
        runs.append(candidate)
    held: dict[int, Path] = {}
    for folder in runs:
        for rank in sorted(folder_ranks(folder)):
            if rank in held:
                raise NothingToAnalyse(f"{held[rank]} and {folder} both hold rank {rank}: "
                                       f"not parts of one run")
            held[rank] = folder
    sizes = {folder: manifest_world_sizes(folder) for folder in runs}
    if len(set().union(*sizes.values())) > 1:
        said = "; ".join(f"{folder}: {', '.join(map(str, sorted(found)))}"
                         for folder, found in sizes.items() if found)
        raise NothingToAnalyse(f"the folders disagree on the world size ({said}): not parts "
                               f"of one run")
    return runs[0], [f for folder in runs for f in trace_files(folder)]


def folder_ranks(folder: Path) -> set[int]:
    """The ranks a run folder holds: named by a trace file or by a record file."""
    named = {file_rank(p) for p in trace_files(folder)}
    return {r for r in named if r is not None} | record_ranks(folder)


def kineto_worker(path: Path) -> str | None:
    match = schema.KINETO_TRACE_RE.match(final_name(path.name))
    return match.group("worker") if match else None


def named_rank(path: Path) -> int | None:
    """The rank a ranktrace file name says, whatever its size."""
    worker = kineto_worker(path)
    match = schema.RANK_WORKER_RE.match(worker) if worker else None
    return int(match.group("rank")) if match else None


def file_rank(path: Path) -> int | None:
    """The rank a ranktrace file name gives; None for none, or for one out of range
    (0..MAX_WORLD_SIZE - 1, which analysis.ingest.load names)."""
    rank = named_rank(path)
    return rank if rank is not None and rank < MAX_WORLD_SIZE else None

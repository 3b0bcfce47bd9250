"""Which trace files a PATH names: a run folder, a folder of runs, or trace files; and the rank a
ranktrace file name gives (file names from tracer.schema)."""

from __future__ import annotations

from pathlib import Path

from analysis.core.limits import MAX_WORLD_SIZE
from analysis.ingest.records import manifest_world_sizes, record_ranks
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


def trace_files(folder: Path) -> list[Path]:
    """The trace files of a run folder, with the best file the tracer left unrenamed of each
    trace it was killed while writing (only where the renamed trace is not there)."""
    entries = list(folder.iterdir())
    found = {p.name: p for p in entries if is_trace_file(p)}
    unrenamed: dict[str, Path] = {}
    for suffix in UNRENAMED_SUFFIXES:
        for entry in entries:
            final = final_name(entry.name)
            if (entry.name == final + suffix and final not in found and final not in unrenamed
                    and not entry.is_dir()):
                unrenamed[final] = entry
    return sorted([*found.values(), *unrenamed.values()])


def is_run_dir(folder: Path) -> bool:
    return bool(trace_files(folder)) or bool(record_ranks(folder))


def find_runs(folder: Path) -> list[Path]:
    """Run folders inside `folder` (one level down, or two for a folder of trace sets), oldest
    first by their newest file."""
    runs = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and p.name != CACHE_DIR):
        if is_run_dir(child):
            runs.append(child)
        else:
            runs += [g for g in sorted(child.iterdir())
                     if g.is_dir() and g.name != CACHE_DIR and is_run_dir(g)]

    def newest(run: Path) -> float:
        return max((p.stat().st_mtime for p in run.iterdir() if p.is_file()), default=0.0)

    return sorted(runs, key=lambda r: (newest(r), str(r)))


class NothingToAnalyse(Exception):
    """PATH holds no trace; the message says what was looked at."""


def resolve_runs(paths: list[Path], run: str | None = None, all_runs: bool = False
                 ) -> list[tuple[Path | None, list[Path]]]:
    """(run folder or None, trace files) for each run that PATH names."""
    files = [p for p in paths if p.is_file()]
    folders = [p for p in paths if p.is_dir()]
    missing = [p for p in paths if not p.exists()]
    if missing:
        raise NothingToAnalyse(f"{missing[0]}: no such file or folder")
    if files and folders:
        raise NothingToAnalyse("give either trace files or one folder, not both")
    if files:
        return [(None, files)]
    if len(folders) > 1:
        return [one_run_of_folders(folders, run)]
    folder = folders[0]
    if run is not None:
        candidate = folder / run
        if not candidate.is_dir():
            names = ", ".join(r.name for r in find_runs(folder)) or "none"
            raise NothingToAnalyse(f"{folder}: no run named {run!r} (runs: {names})")
        folder = candidate
    if is_run_dir(folder):
        return [(folder, trace_files(folder))]
    runs = find_runs(folder)
    if not runs:
        raise NothingToAnalyse(f"{folder}: no Kineto trace (*.json, *.json.gz) and no run "
                               f"folder with one")
    chosen = runs if all_runs else runs[-1:]
    return [(r, trace_files(r)) for r in chosen]


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

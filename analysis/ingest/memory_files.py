"""What the memory section of a run reads (analysis.findings.memory_section; docs/memory.md):
each rank's step records and clock offset, the memory profiles of the profiler's windows
(rank{R}.memory.jsonl, --profile-memory) and the CUDA allocator snapshots the tracer writes as
records (rank{R}.step{S}.memory_snapshot.jsonl: on the first out-of-memory error, and at the end
with --memory-snapshot), as one MemoryInputs (analysis.core.contracts); docs/trace-format.md
describes both files.

msgspec decodes the records into tracer.schema's MemoryProfileRecord and MemorySnapshotRecord;
the snapshot pickles beside them are never opened. Each record's numbers are checked against
their sane range (analysis.core.limits): a memory profile out of range is set aside, a snapshot
file that does not decode or is out of range is set aside whole, and one larger than a record
file may be (a share of RANKTRACE_MAX_TRACE_MB) is not read. Each problem names the file, the
rank and what is wrong; the rest is read.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from analysis.core.contracts import MemoryInputs
from analysis.core.limits import (
    MAX_BYTES,
    MAX_STEP,
    MAX_TIME_NS,
    MAX_WORLD_SIZE,
    WHOLE_DECODE_SHARE,
    int_within,
    max_trace_bytes,
)
from analysis.core.model import UNKNOWN_RANK, LoadResult
from analysis.ingest.records import read_jsonl, records_path
from tracer import schema


def memory_inputs(loaded: LoadResult) -> MemoryInputs | None:
    """Everything the memory section reads of a loaded run: each rank's step records and
    clock_sync offset and, in a run folder, its memory profiles and the snapshot records; None
    for a run without the tracer's step records."""
    records = {int(t.rank): t.records for t in loaded.ranks
               if t.rank != UNKNOWN_RANK and t.records is not None}
    if not records:
        return None
    profiles: dict[int, list] = {}
    snapshots: list = []
    problems: list[str] = []
    if loaded.run_dir is not None:
        for rank in records:
            profiles[rank], found = read_memory_profiles(Path(loaded.run_dir), rank)
            problems += found
        snapshots, found = read_snapshots(Path(loaded.run_dir))
        problems += found
    offsets = {rank: r.offset_ns for rank, rank_records in records.items()
               for r in rank_records.manifest if isinstance(r, schema.ClockSync)}
    return MemoryInputs(steps={rank: r.steps for rank, r in records.items()},
                        profiles=profiles, snapshots=snapshots, offsets_ns=offsets,
                        problems=problems)


# ---- memory profiles -----------------------------------------------------------------------------
def _profile_problem(record: schema.MemoryProfileRecord, rank: int) -> str | None:
    """What is wrong with one memory profile, or None."""
    if record.rank != rank:
        return f"rank {record.rank} in the file of rank {rank}"
    for name in ("first_step", "last_step", "peak_step"):
        value = getattr(record, name)
        if value is not None and not int_within(value, 0, MAX_STEP):
            return f"'{name}' out of range ({value!r})"
    if not int_within(record.t_ns, 0, MAX_TIME_NS):
        return f"'t_ns' out of range ({record.t_ns!r})"
    if not int_within(record.peak_bytes, 0, MAX_BYTES):
        return f"'peak_bytes' out of range ({record.peak_bytes!r})"
    unknown = sorted(set(record.categories) - set(schema.MEMORY_CATEGORIES))
    if unknown:
        return f"unknown categories {', '.join(map(repr, unknown[:3]))}"
    if any(not int_within(v, 0, MAX_BYTES) for v in record.categories.values()):
        return "a category's bytes out of range"
    if sum(record.categories.values()) != record.peak_bytes:
        return "categories that do not sum to 'peak_bytes'"
    if not (record.device == "cpu" or re.fullmatch(r"cuda:\d{1,4}", record.device)):
        return f"unknown device {record.device[:40]!r}"
    return None


def read_memory_profiles(run_dir: Path, rank: int, max_bytes: int | None = None
                         ) -> tuple[list[schema.MemoryProfileRecord], list[str]]:
    """The rank's memory profiles, one per profiler window ([] without the file); `max_bytes`
    as records.read_jsonl's."""
    path = records_path(Path(run_dir), schema.MEMORY_PROFILE_FILE, rank)
    if path is None:
        return [], []
    records, problems = read_jsonl(path, schema.MemoryProfileRecord, rank, max_bytes)
    kept = []
    for number, record in enumerate(records, start=1):
        why = _profile_problem(record, rank)
        if why is None:
            kept.append(record)
        else:
            problems.append(f"{path}: rank {rank}: memory profile {number} set aside ({why})")
    return kept, problems


# ---- snapshot records ----------------------------------------------------------------------------
_SNAPSHOT_NAME = schema.MEMORY_SNAPSHOT_RECORD_RE


def _sizes_problem(segment: schema.SnapshotSegment) -> str | None:
    for name in ("total_size", "allocated_size", "active_size", "requested_size"):
        if not int_within(getattr(segment, name), 0, MAX_BYTES):
            return f"a segment's '{name}' out of range"
    for block in segment.blocks:
        if not (int_within(block.size, 0, MAX_BYTES)
                and int_within(block.requested_size, 0, MAX_BYTES)):
            return "a block's size out of range"
        if block.state not in schema.SNAPSHOT_BLOCK_STATES:
            return f"a block's unknown state {block.state[:40]!r}"
    return None


def _snapshot_problem(record: schema.MemorySnapshotRecord, rank: int, step: int) -> str | None:
    """What is wrong with one snapshot record, or None."""
    if (record.rank, record.step) != (rank, step):
        return (f"it says rank {record.rank}, step {record.step}: not the rank and step of its "
                f"file name")
    if record.reason not in schema.SNAPSHOT_REASONS:
        return f"unknown reason {record.reason[:40]!r}"
    if not int_within(record.t_ns, 0, MAX_TIME_NS):
        return f"'t_ns' out of range ({record.t_ns!r})"
    if record.device_total_bytes is not None and not int_within(record.device_total_bytes, 0,
                                                                  MAX_BYTES):
        return "'device_total_bytes' out of range"
    oom = record.oom
    if oom is not None and not all(int_within(v, 0, MAX_BYTES) for v in (
            oom.requested_bytes, oom.device_allocated_bytes, oom.device_free_bytes)):
        return "the failed allocation's sizes out of range"
    for segment in record.segments:
        why = _sizes_problem(segment)
        if why is not None:
            return why
    return None


def snapshot_files(run_dir: Path) -> list[tuple[int, int, Path]]:
    """(rank, step, path) of every snapshot record file in the run folder, by rank and step."""
    found = []
    for entry in Path(run_dir).iterdir():
        match = _SNAPSHOT_NAME.match(entry.name)
        if match and entry.is_file():
            rank, step = int(match["rank"]), int(match["step"])
            if rank < MAX_WORLD_SIZE and step <= MAX_STEP:
                found.append((rank, step, entry))
    return sorted(found)


def read_snapshot(path: Path, rank: int, step: int, max_bytes: int | None = None
                  ) -> tuple[schema.MemorySnapshotRecord | None, list[str]]:
    """One snapshot record, or None with the problem that kept it out."""
    limit = (max_trace_bytes() if max_bytes is None else max_bytes) // WHOLE_DECODE_SHARE
    try:
        size = path.stat().st_size
        if size > limit:
            return None, [f"{path}: rank {rank}: memory snapshot too large to read: "
                          f"{size / (1 << 20):.1f} MB, over the limit of "
                          f"{limit / (1 << 20):g} MB for a record file; not read"]
        data = path.read_bytes()
    except OSError as exc:
        return None, [f"{path}: rank {rank}: cannot read ({exc.strerror or exc})"]
    try:
        record = schema.decoder(schema.MemorySnapshotRecord).decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        why = "JSON nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        return None, [f"{path}: rank {rank}: memory snapshot not read ({why})"]
    why = _snapshot_problem(record, rank, step)
    if why is not None:
        return None, [f"{path}: rank {rank}: memory snapshot set aside ({why})"]
    return record, []


def read_snapshots(run_dir: Path, max_bytes: int | None = None
                   ) -> tuple[list[schema.MemorySnapshotRecord], list[str]]:
    """Every readable snapshot record of the run folder, by rank and step, and the problems of
    the others."""
    records, problems = [], []
    for rank, step, path in snapshot_files(run_dir):
        record, found = read_snapshot(path, rank, step, max_bytes)
        problems += found
        if record is not None:
            records.append(record)
    return records, problems

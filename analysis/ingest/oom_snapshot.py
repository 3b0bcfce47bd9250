"""Reading the CUDA allocator snapshots the tracer writes as records
(rank{R}.step{S}.memory_snapshot.jsonl, docs/trace-format.md, Memory snapshots): on the first
out-of-memory error, and at the end with --memory-snapshot.

msgspec decodes each file into tracer.schema.MemorySnapshotRecord; the pickles beside them are
never opened. A file larger than a record file may be (a share of RANKTRACE_MAX_TRACE_MB) is not
read; one that does not decode, or whose rank, step, sizes or states are out of range, is set
aside whole. Each problem names the file, the rank and what is wrong; the other snapshots are
read.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from analysis.core.limits import (
    MAX_BYTES,
    MAX_STEP,
    MAX_TIME_NS,
    MAX_WORLD_SIZE,
    WHOLE_DECODE_SHARE,
    int_within,
    max_trace_bytes,
)
from tracer import schema

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

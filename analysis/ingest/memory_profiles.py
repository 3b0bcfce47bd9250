"""Reading the memory profiles of the profiler's windows (rank{R}.memory.jsonl, --profile-memory;
docs/trace-format.md): msgspec decodes them into tracer.schema.MemoryProfileRecord, each record's
numbers are checked against their sane range (analysis.core.limits), and a record out of range is
set aside with a problem naming the file, the rank and the field; the rest is read.
"""

from __future__ import annotations

import re
from pathlib import Path

from analysis.core.limits import (
    MAX_BYTES,
    MAX_STEP,
    MAX_TIME_NS,
    int_within,
)
from analysis.ingest.records import read_jsonl, records_path
from tracer import schema


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

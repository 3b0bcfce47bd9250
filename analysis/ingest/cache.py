"""The Parquet cache of parsed traces: `.ranktrace-cache/<trace file name>.parquet` beside a trace.

An entry is keyed by the trace's size, modification time, the trace schema version and
CACHE_FORMAT; a stale, foreign or half-written entry is ignored and the trace parsed again. A
folder that cannot be written (a read-only trace folder) just means no cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis.core.events import STEP_COLUMNS, TEXT_COLUMNS
from analysis.ingest.kineto import max_trace_bytes
from analysis.ingest.parsed_trace import ParsedTrace, parse_trace
from analysis.ingest.runs import CACHE_DIR, cache_file  # noqa: F401  (CACHE_DIR re-exported)
from tracer import schema

if TYPE_CHECKING:
    from analysis.ingest.parse_ahead import DecodeAhead

# Bump when the events frame or the cache layout changes: old cache files are then ignored.
CACHE_FORMAT = 3


def _cache_key(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}:{schema.SCHEMA_VERSION}:{CACHE_FORMAT}"


def read_cache(path: Path) -> ParsedTrace | None:
    import pyarrow.parquet as pq

    cached = cache_file(path)
    try:
        if not cached.is_file():
            return None
        table = pq.read_table(cached)
        meta = json.loads(table.schema.metadata[b"ranktrace"])
        if meta["key"] != _cache_key(path):
            return None
        events = table.to_pandas()
        for column in TEXT_COLUMNS:  # back to the object dtype with None that parsing gives
            values = events[column].astype(object)
            events[column] = values.where(values.notna(), None)
    except Exception:  # a stale, foreign or half-written cache file: parse the trace instead
        return None
    steps = pd.DataFrame({c: np.array(meta["steps"][c], dtype=np.int64) for c in STEP_COLUMNS})
    return ParsedTrace(path=path, rank=meta["rank"], world_size=meta["world_size"],
                       backend=meta["backend"], events=events, steps=steps,
                       float_timestamps=meta["float_timestamps"], problems=meta["problems"],
                       process_groups=meta["process_groups"])


def write_cache(parsed: ParsedTrace) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cached = cache_file(parsed.path)
    if not _writable(parsed.path.parent):
        return
    meta = {
        "key": _cache_key(parsed.path), "rank": parsed.rank, "world_size": parsed.world_size,
        "backend": parsed.backend, "float_timestamps": parsed.float_timestamps,
        "problems": parsed.problems, "process_groups": parsed.process_groups,
        "steps": {c: parsed.steps[c].tolist() for c in STEP_COLUMNS},
    }
    try:
        cached.parent.mkdir(exist_ok=True)
        table = pa.Table.from_pandas(parsed.events, preserve_index=False)
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), b"ranktrace": json.dumps(meta).encode()})
        partial = cached.with_name(f"{cached.name}.{os.getpid()}.tmp")
        pq.write_table(table, partial)
        os.replace(partial, cached)
    except OSError:
        pass  # a read-only trace folder or a full disk: the cache is only an optimisation


def _writable(folder: Path) -> bool:
    """Whether we may add to `folder`: by its permission bits too, which root would bypass
    (a read-only trace folder must stay untouched even for root)."""
    try:
        mode = folder.stat().st_mode
    except OSError:
        return False
    return bool(mode & 0o222) and os.access(folder, os.W_OK)


def read_trace(path: Path, use_cache: bool = True, max_bytes: int | None = None,
               decoded_ahead: DecodeAhead | None = None) -> ParsedTrace:
    """parse_trace through the Parquet cache; `decoded_ahead` may hold the file decoded
    already (analysis.ingest.parse_ahead)."""
    path = Path(path)
    if use_cache:
        cached = read_cache(path)
        if cached is not None:
            return cached
    decoded = None
    if decoded_ahead is not None:
        decoded = decoded_ahead.take(path, max_trace_bytes() if max_bytes is None else max_bytes)
    parsed = parse_trace(path, max_bytes=max_bytes, decoded=decoded)
    if use_cache:
        write_cache(parsed)
    return parsed

"""The Parquet cache of parsed traces: `.ranktrace-cache/<trace file name>.parquet` beside a trace.

An entry is keyed by the trace's size, modification time, the trace schema version and
CACHE_FORMAT; a stale, foreign or half-written entry is ignored and the trace parsed again. A
folder that cannot be written (a read-only trace folder) just means no cache.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.events import STEP_COLUMNS, TEXT_COLUMNS
from analysis.kineto import ParsedTrace, parse_trace
from tracer import schema

# Bump when the events frame or the cache layout changes: old cache files are then ignored.
CACHE_FORMAT = 3
CACHE_DIR = ".ranktrace-cache"


def _cache_path(path: Path) -> Path:
    return path.parent / CACHE_DIR / (path.name + ".parquet")


def _cache_key(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}:{schema.SCHEMA_VERSION}:{CACHE_FORMAT}"


def read_cache(path: Path) -> ParsedTrace | None:
    import pyarrow.parquet as pq

    cached = _cache_path(path)
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

    cached = _cache_path(parsed.path)
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


def read_trace(path: Path, use_cache: bool = True, max_bytes: int | None = None) -> ParsedTrace:
    """parse_trace through the Parquet cache."""
    path = Path(path)
    if use_cache:
        cached = read_cache(path)
        if cached is not None:
            return cached
    parsed = parse_trace(path, max_bytes=max_bytes)
    if use_cache:
        write_cache(parsed)
    return parsed

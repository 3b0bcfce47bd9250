"""The Parquet cache of parsed traces: `.ranktrace-cache/<trace file name>.parquet` beside a trace.

An entry is keyed by the trace's size, modification time, the trace schema version and
CACHE_FORMAT; a stale, foreign or half-written entry is ignored and the trace parsed again. The
key and the entry's size are read from its footer before any of its data: an entry that would
take more memory than its trace could (RANKTRACE_MAX_TRACE_MB) is ignored unread. A folder that
cannot be written (a read-only trace folder) just means no cache, and the cache folder is never
written through a symbolic link.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from analysis.core.event_kinds import STEP_COLUMNS, TEXT_COLUMNS
from analysis.core.frames import check_events, contract_categories, steps_frame
from analysis.core.limits import max_trace_bytes
from analysis.ingest.parsed_trace import ParsedTrace, parse_trace
from analysis.ingest.runs import cache_file
from tracer import schema

if TYPE_CHECKING:
    from analysis.ingest.parse_ahead import DecodeAhead

# Bump when the events frame or the cache layout changes: old cache files are then ignored.
CACHE_FORMAT = 5
# The most a footer may hold (its schema, the steps and the problems): a larger one is not ours.
MAX_FOOTER_BYTES = 64 << 20


def _cache_key(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}:{schema.SCHEMA_VERSION}:{CACHE_FORMAT}"


def read_cache(path: Path) -> ParsedTrace | None:
    import pyarrow.parquet as pq

    cached = cache_file(path)
    try:
        if cached.parent.is_symlink() or cached.is_symlink() or not cached.is_file():
            return None
        with cached.open("rb") as handle:
            if not _footer_is_small(handle):
                return None
            entry = pq.ParquetFile(handle)
            meta = json.loads(entry.schema_arrow.metadata[b"ranktrace"])
            # An events frame takes about half its JSON's bytes: twice the limit is no real entry.
            if (meta["key"] != _cache_key(path)
                    or _data_bytes(entry.metadata) > 2 * max_trace_bytes()):
                return None
            table = entry.read()
        events = table.to_pandas()
        for column in TEXT_COLUMNS:  # back to the object dtype with None that parsing gives
            values = events[column].astype(object)
            events[column] = values.where(values.notna(), None)
        # Parquet gives str categories back: objects again, as parsing gives them.
        events = check_events(contract_categories(events))
    except Exception:  # a stale, foreign or half-written cache file: parse the trace instead
        return None
    steps = steps_frame(*(np.array(meta["steps"][c], dtype=np.int64) for c in STEP_COLUMNS))
    return ParsedTrace(path=path, rank=meta["rank"], world_size=meta["world_size"],
                       backend=meta["backend"], events=events, steps=steps,
                       float_timestamps=meta["float_timestamps"], problems=meta["problems"],
                       process_groups=meta["process_groups"])


def _footer_is_small(handle) -> bool:
    """Whether the Parquet footer's length (the 4 bytes before the closing "PAR1") is at most
    MAX_FOOTER_BYTES, so that reading the key costs little whatever the file claims."""
    handle.seek(0, os.SEEK_END)
    size = handle.tell()
    if size < 12:
        return False
    handle.seek(size - 8)
    tail = handle.read(8)
    handle.seek(0)
    return tail[4:] == b"PAR1" and int.from_bytes(tail[:4], "little") <= MAX_FOOTER_BYTES


def _data_bytes(metadata) -> int:
    """What the entry's data takes once read, from its footer: at least 8 bytes a value (a
    dictionary-encoded column states only its encoded size), or the stated decompressed size."""
    stated = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    return max(stated, metadata.num_rows * metadata.num_columns * 8)


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
    folder = None
    try:
        folder = _cache_folder(cached.parent)
        table = pa.Table.from_pandas(parsed.events, preserve_index=False)
        table = table.replace_schema_metadata(
            {**(table.schema.metadata or {}), b"ranktrace": json.dumps(meta).encode()})
        partial = f"{cached.name}.{os.getpid()}.tmp"
        # Created here, never followed: a name planted in the folder is not written through.
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o644, dir_fd=folder)
        with os.fdopen(descriptor, "wb") as handle:
            pq.write_table(table, handle)
        os.replace(partial, cached.name, src_dir_fd=folder, dst_dir_fd=folder)
    except OSError:
        pass  # a read-only trace folder, a full disk or a linked cache folder: no cache
    finally:
        if folder is not None:
            os.close(folder)


def _cache_folder(folder: Path) -> int:
    """A descriptor of the cache folder, made if missing; OSError if it is a symbolic link (a
    folder elsewhere that the trace's folder points the cache to)."""
    try:
        folder.mkdir()
    except FileExistsError:
        pass
    return os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)


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

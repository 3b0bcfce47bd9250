"""Reading one Kineto trace file (plain or gzipped JSON) into the columns of its events.

The file is decoded a few MB of JSON at a time (analysis.ingest.kineto_events builds the columns),
so memory stays near the size of the resulting columns; analysis.ingest.parsed_trace makes the
events frame of them. A file that cannot be read (not a regular file, not gzip, invalid or too
deeply nested JSON, too large) raises TraceReadError naming the file and the problem; a value of
distributedInfo out of its range (analysis.core.limits) is set aside with a problem. Nothing read
is evaluated or unpickled. This module does not import pandas: it runs before
the command imports it (analysis.ingest.parse_ahead).
"""

from __future__ import annotations

import gc
import gzip
import os
import re
import stat
import sys
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from analysis.core.event_kinds import PROFILER_STEP_RE
from analysis.core.limits import (
    MAX_STEP,
    MAX_TIME_NS,
    MAX_TRACE_ENV,
    MAX_WORLD_SIZE,
    MB,
    WHOLE_DECODE_SHARE,
    int_within,
    max_trace_bytes,
    shown,
)
from analysis.ingest.kineto_events import (
    EVENTS_DECODER,
    TRACE_DECODER,
    EventColumns,
    TraceDocument,
    int_or_none,
    name_text,
)
from analysis.ingest.runs import file_rank


class TraceReadError(Exception):
    """A trace that cannot be analysed; the message names the file and the problem."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


@dataclass
class DecodedTrace:
    """One Kineto file's events as columns (analysis.ingest.kineto_events), and what its
    distributedInfo says."""

    path: Path
    columns: EventColumns
    rank: int | None
    world_size: int | None
    backend: str | None
    # distributedInfo.pg_config: one dict per process group (pg_name, pg_desc, pg_size, ranks).
    process_groups: list[dict] = field(default_factory=list)


# ---- reading a file in chunks -------------------------------------------------------------------
# Pieces of 256 kB: 1 MB ones cost more in page faults (a fresh mapping per piece) than they save.
READ_BYTES = 256 << 10
CHUNK_BYTES = 2 << 20  # decoded events live for one chunk of JSON at a time
_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
# White space as JSON may have it between events (and as `\s` matches it in a bytes pattern).
_WHITESPACE = b" \t\n\r\f\v"


def _megabytes(nbytes: int) -> str:
    return f"{nbytes / MB:.1f} MB" if nbytes >= MB else f"{nbytes / MB:.3g} MB"


def _too_large(path: Path, size: str, limit: int, why: str = "") -> TraceReadError:
    return TraceReadError(
        path, f"too large to analyse: {size}, over the limit of {limit / MB:g} MB"
              f"{why} ({MAX_TRACE_ENV}). Re-record with a shorter profiler window (fewer "
              f"active steps in torch.profiler's schedule, docs/tracer.md), or, where this "
              f"machine has about 2 GB of memory per GB of JSON, raise {MAX_TRACE_ENV}")


class _NotChunkable(Exception):
    """The file's layout defeats chunking; decode it whole (which also names any real error)."""


class _EventTooLong(Exception):
    """More JSON than a file decoded whole may hold without one place to cut it: whether it is
    one event or not, it could only be decoded whole, and is refused at once."""

    def __init__(self, read: int, total: int):
        super().__init__(read)
        self.read, self.total = read, total


def _pieces(path: Path, limit: int | None = None, why: str = ""):
    """The file's (decompressed) bytes, READ_BYTES at a time; TraceReadError once there are
    more than `limit` of them (a plain file is refused before anything is read)."""
    try:
        raw = _open_regular(path)
        stored = os.fstat(raw.fileno()).st_size
        if stored == 0:
            raw.close()
            raise TraceReadError(path, "an empty file")
        gzipped = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        if not gzipped and path.name.endswith(".gz"):
            raw.close()
            raise TraceReadError(path, "not gzip (the name ends in .gz but the file does not "
                                       "start with gzip's magic bytes)")
        if limit is not None and not gzipped and stored > limit:
            raw.close()
            raise _too_large(path, f"{_megabytes(stored)} of JSON", limit, why)
        opened = gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw
        read = 0
        with raw, opened as handle:
            while piece := handle.read(READ_BYTES):
                read += len(piece)
                if limit is not None and read > limit:
                    raise _too_large(path, f"more than {limit / MB:g} MB of JSON once "
                                           f"decompressed ({_megabytes(stored)} gzipped)",
                                     limit, why)
                yield piece
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceReadError(path, f"truncated or corrupt gzip ({exc})") from None
    except OSError as exc:
        raise TraceReadError(path, f"cannot read ({exc.strerror or exc})") from None


def _open_regular(path: Path):
    """`path` opened for reading, if it is a regular file: a FIFO would block the read until
    something writes to it, and a device (/dev/zero) never ends. Opened without blocking, so
    that opening a FIFO returns at once to be refused."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        kind = stat.S_IFMT(os.fstat(descriptor).st_mode)
    except OSError:
        os.close(descriptor)
        raise
    if kind != stat.S_IFREG:
        os.close(descriptor)
        raise TraceReadError(path, f"not a regular file ({_FILE_KINDS.get(kind, 'not a file')});"
                                   f" not read")
    return os.fdopen(descriptor, "rb")


_FILE_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a device",
               stat.S_IFBLK: "a device", stat.S_IFSOCK: "a socket"}


def read_trace_bytes(path: Path, limit: int | None = None, why: str = "") -> bytes:
    return b"".join(_pieces(path, limit, why))


def _decode_in_chunks(path: Path, columns: EventColumns, limit: int) -> TraceDocument:
    """Feed traceEvents to `columns` a few MB at a time; returns the rest of the document.

    The events array is cut only between two events (a `}` then `,` then `{`); a cut that lands
    anywhere else (inside a string, or in nested arguments) makes a chunk that is not a valid
    JSON array of events, so it cannot go unnoticed: _NotChunkable is raised and the caller
    decodes the file whole instead.
    """
    pieces = _pieces(path, limit)
    longest = limit // WHOLE_DECODE_SHARE
    try:
        return _feed_chunks(pieces, columns, longest)
    except _EventTooLong as exc:
        raise _too_large(path, f"more than {_megabytes(exc.read)} of JSON with no place "
                               f"between two events, after {_megabytes(exc.total)} read", limit,
                         f", of which one event may hold 1/{WHOLE_DECODE_SHARE}") from None
    finally:
        pieces.close()


def _last_cut(buffer: bytearray, filled: int, searched: int = 0) -> tuple[int, int] | None:
    """(where its "}" is, where its "{" is) of the last place between two events in
    `buffer[:filled]`: a "}", then ",", then "{", with white space between them or not.

    Only an "{" at or after `searched` is looked at: the caller has looked at those before it
    already. Each "{" is looked at once and each run of white space read at most twice, so that
    the time over a whole file stays linear in its size, however long an event is or however
    much white space pads the events."""
    opening = filled
    while (opening := buffer.rfind(b"{", searched, opening)) >= 0:
        comma = _last_non_space(buffer, opening)
        if comma < 0 or buffer[comma] != 0x2C:  # ","
            continue
        brace = _last_non_space(buffer, comma)
        if brace >= 0 and buffer[brace] == 0x7D:  # "}"
            return brace, opening
    return None


def _last_non_space(buffer: bytearray, end: int) -> int:
    """The position of the last byte before `end` that is not white space; -1 if none. Read
    backwards in ever longer pieces, by bytes.rstrip: linear in the white space, in C."""
    length = 64
    while True:
        start = max(end - length, 0)
        kept = len(bytes(buffer[start:end]).rstrip(_WHITESPACE))
        if kept:
            return start + kept - 1
        if start == 0:
            return -1
        end, length = start, length * 4


def _feed_chunks(pieces, columns: EventColumns, longest: int) -> TraceDocument:
    buffer = bytearray()
    total = 0
    found = None
    for piece in pieces:
        buffer += piece
        found = _EVENTS_KEY_RE.search(buffer)
        if found:
            break
        if len(buffer) > 4 * CHUNK_BYTES:
            raise _NotChunkable("traceEvents not near the start")
    if found is None:
        raise _NotChunkable("no traceEvents key")
    head = bytes(buffer[:found.start()]) + b'"traceEvents":[]}'
    # One buffer for the whole file, filled up to `filled` and decoded where it lies: no copy of
    # a chunk, and no fresh memory per chunk. Its first byte is the one before the next event,
    # overwritten with "[" (the array's own "[" now, a separator byte later).
    rest = buffer[found.end() - 1:]
    filled = len(rest)
    buffer = bytearray(max(CHUNK_BYTES + READ_BYTES, filled))
    buffer[:filled] = rest
    del rest
    wanted = CHUNK_BYTES
    searched = 0  # no cut starts with an "{" before this: looked at already
    while True:
        while filled < wanted and (piece := next(pieces, None)) is not None:
            end = filled + len(piece)
            if end > len(buffer):
                buffer.extend(bytes(end - len(buffer)))
            buffer[filled:end] = piece
            filled = end
        if filled < wanted:  # the file is read to its end: the rest is the tail
            break
        cut = _last_cut(buffer, filled, searched)
        if cut is None:  # one event longer than the buffer: read on
            if filled > longest:
                raise _EventTooLong(filled, total + filled)
            searched = filled
            wanted = filled + CHUNK_BYTES
            continue
        wanted = CHUNK_BYTES
        brace, opening = cut
        # "]" over the byte after the last event of the chunk.
        close = brace + 1
        buffer[close] = ord("]")
        try:
            events = EVENTS_DECODER.decode(memoryview(buffer)[:close + 1])
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise _NotChunkable(str(exc)) from None
        # Raw arguments point into the buffer: the events go before it is written again.
        columns.add(events)
        del events
        start = opening - 1
        total += start
        buffer[:filled - start] = buffer[start:filled]
        filled -= start
        buffer[0] = ord("[")
        # The cut was the last one: no "{" after it starts another.
        searched = filled
    try:
        tail = TRACE_DECODER.decode(b'{"traceEvents":' + memoryview(buffer)[:filled])
        document = TRACE_DECODER.decode(head)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _NotChunkable(str(exc)) from None
    del buffer
    columns.add(tail.traceEvents or [])
    if document.distributedInfo is None:
        document.distributedInfo = tail.distributedInfo
    return document


def _decode_whole(path: Path, columns: EventColumns, limit: int, why: str) -> TraceDocument:
    data = read_trace_bytes(path, limit, why)
    try:
        document = TRACE_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise TraceReadError(path, f"not a Kineto trace ({exc})") from None
    except msgspec.DecodeError as exc:
        raise TraceReadError(path, f"invalid JSON ({exc})") from None
    del data
    if document.traceEvents is None:
        raise TraceReadError(path, "no 'traceEvents' list; not a Kineto/Chrome trace")
    columns.add(document.traceEvents)
    document.traceEvents = None
    return document


def decode_trace(path: Path, chunked: bool = True, max_bytes: int | None = None
                 ) -> DecodedTrace:
    """Decode one Kineto trace file into columns. Raises TraceReadError naming the file when it
    can't, or when its JSON is over `max_bytes` (default: max_trace_bytes()).

    `chunked=False` decodes the whole file at once (what a chunked read falls back to).
    """
    path = Path(path)
    max_bytes = max_trace_bytes() if max_bytes is None else max_bytes
    with gc_paused():
        return _decode(path, chunked, max_bytes)


@contextmanager
def gc_paused():
    """The cyclic garbage collector off for the block, as it was after it. Decoding (and the
    events frame built of it) makes hundreds of thousands of short-lived objects and no reference
    cycles: the collector would only rescan them, over and over (10-30% of parse time)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _decode(path: Path, chunked: bool, max_bytes: int) -> DecodedTrace:
    columns = EventColumns()
    try:
        try:
            if not chunked:
                raise _NotChunkable("asked for a whole-file decode")
            document = _decode_in_chunks(path, columns, max_bytes)
        except _NotChunkable as exc:
            columns = EventColumns()
            why = (f" for a file decoded whole, 1/{WHOLE_DECODE_SHARE} of "
                   f"{max_bytes / MB:g} MB, as it cannot be read a chunk at a time ({exc})")
            document = _decode_whole(path, columns, max_bytes // WHOLE_DECODE_SHARE, why)
    except RecursionError:  # msgspec decodes nested values on the C stack, to Python's limit
        raise TraceReadError(path, f"JSON nested too deeply to decode (more than about "
                                   f"{sys.getrecursionlimit()} levels of arrays or objects)"
                             ) from None
    info = document.distributedInfo
    named = columns.rank = file_rank(path)
    _name_step_numbers(columns, path)
    if info is None:
        return DecodedTrace(path=path, columns=columns, rank=None, world_size=None,
                            backend=None)
    rank, world_size = distributed_identity(
        info.rank, info.world_size, named,
        f"{path}: rank {named}" if named is not None else str(path), columns.notes)
    if rank is not None:
        columns.rank = rank
    where = f"{path}: rank {columns.rank}" if columns.rank is not None else str(path)
    return DecodedTrace(
        path=path, columns=columns, rank=rank, world_size=world_size,
        backend=name_text(info.backend) if info.backend is not None else None,
        process_groups=process_group_configs(info.pg_config, world_size, where, columns.notes))


def _name_step_numbers(columns: EventColumns, path: Path) -> None:
    """A problem naming the ProfilerStep#N names whose N is out of range (analysis.ingest.
    parsed_trace takes them for no step); one look at each distinct name."""
    far = [name for name in columns.names.codes_of
           if isinstance(name, str) and (m := PROFILER_STEP_RE.match(name))
           and (len(m.group(1)) > len(str(MAX_STEP)) or int(m.group(1)) > MAX_STEP)]
    if far:
        where = f"{path}: rank {columns.rank}" if columns.rank is not None else str(path)
        columns.notes.append(f"{where}: {len(far)} ProfilerStep names have a step number out "
                             f"of range (first {shown(far[0])}, outside 0..{MAX_STEP}); those "
                             f"spans are not taken as steps")


def distributed_identity(rank, world_size, named: int | None, where: str, problems: list
                         ) -> tuple[int | None, int | None]:
    """distributedInfo's rank and world size, each set aside (None, with a problem naming it)
    where it is not an int in range: a rank in 0..MAX_WORLD_SIZE-1, a world size in
    1..MAX_WORLD_SIZE, and the rank below the world size (the one of the two that the file
    name, `named`, does not confirm is set aside)."""
    checked_rank, checked_size = int_or_none(rank), int_or_none(world_size)
    if rank is not None and not int_within(checked_rank, 0, MAX_WORLD_SIZE - 1):
        problems.append(f"{where}: distributedInfo rank {shown(rank)} is out of range "
                        f"(0..{MAX_WORLD_SIZE - 1}); set aside")
        checked_rank = None
    if world_size is not None and not int_within(checked_size, 1, MAX_WORLD_SIZE):
        problems.append(f"{where}: distributedInfo world_size {shown(world_size)} is out of "
                        f"range (1..{MAX_WORLD_SIZE}); set aside")
        checked_size = None
    if checked_rank is not None and checked_size is not None and checked_rank >= checked_size:
        if named == checked_rank:
            problems.append(f"{where}: distributedInfo world_size {checked_size} is not above "
                            f"its rank {checked_rank}; the world size is set aside")
            checked_size = None
        else:
            problems.append(f"{where}: distributedInfo rank {checked_rank} is not below its "
                            f"world_size {checked_size}; the rank is set aside")
            checked_rank = None
    return checked_rank, checked_size


_GROUP_KEYS = ("pg_name", "pg_desc", "backend_config", "pg_size", "ranks")


def process_group_configs(config, world_size: int | None = None, where: str = "",
                          problems: list | None = None) -> list[dict]:
    """distributedInfo.pg_config as a list of dicts (torch writes a list; a dict keyed by group
    is read as its values); anything else is no group. A group's pg_size or ranks out of range
    (a size of 1..world size, ranks below it) are set aside, with a problem in `problems`."""
    if isinstance(config, dict):
        config = list(config.values())
    if not isinstance(config, list):
        return []
    # The keys torch writes, of the kinds it writes them: the rest is read by nothing.
    groups = [{key: value for key, value in group.items() if key in _GROUP_KEYS
               and (key in ("pg_size", "ranks") or isinstance(value, str) or value is None
                    or int_within(value, -MAX_TIME_NS, MAX_TIME_NS))}
              for group in config[:MAX_WORLD_SIZE] if isinstance(group, dict)]
    largest = world_size or MAX_WORLD_SIZE
    for group in groups:
        size, ranks = group.get("pg_size"), group.get("ranks")
        if size is not None and not int_within(size, 1, largest):
            group.pop("pg_size")
            if problems is not None:
                problems.append(f"{where}: process group {shown(group.get('pg_name'))}: "
                                f"pg_size {shown(size)} is out of range (1..{largest}); set "
                                f"aside")
        if ranks is not None and not (isinstance(ranks, list) and len(ranks) <= largest
                                      and all(int_within(r, 0, largest - 1) for r in ranks)):
            group.pop("ranks")
            if problems is not None:
                problems.append(f"{where}: process group {shown(group.get('pg_name'))}: its "
                                f"ranks are not all ranks below {largest}; set aside")
    return groups

"""Reading one Kineto trace file (plain or gzipped JSON) into the columns of its events.

The file is decoded a few MB of JSON at a time: a typed msgspec decoder materialises only the
fields the analysis uses, and `EventColumns` turns each decoded chunk into numpy columns at once,
so that only one chunk of decoded events lives and memory stays near the size of the resulting
columns; analysis.ingest.parsed_trace makes the events frame of them. A file that cannot be read
(not a regular file, not gzip, invalid or too deeply nested JSON, too large) raises
TraceReadError naming the file and the problem; a value of distributedInfo out of its range
(analysis.core.limits) is set aside with a problem. Nothing read is evaluated or unpickled. This
module does not import pandas: it runs before the command imports it
(analysis.ingest.parse_ahead).
"""

from __future__ import annotations

import gc
import gzip
import json
import math
import os
import re
import stat
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
from isal import igzip, isal_zlib

from analysis.core.event_kinds import (
    COMM_KERNEL_RE,
    COMM_TEXT_COLUMNS,
    CPU_OP_CAT,
    GPU_CATS,
    HOST_COMM_RE,
    HOST_OP_CATS,
    NUMBER_COLUMNS,
    PROFILER_STEP_RE,
    normal_cat,
)
from analysis.core.limits import (
    MAX_BYTES,
    MAX_DUR_US,
    MAX_STEP,
    MAX_TIME_NS,
    MAX_TRACE_ENV,
    MAX_TS_US,
    MAX_WORLD_SIZE,
    MB,
    WHOLE_DECODE_SHARE,
    as_number,
    int_within,
    max_trace_bytes,
    outside,
    shown,
)
from analysis.core.op_names import is_modelled_op
from analysis.ingest.runs import file_rank


class TraceReadError(Exception):
    """A trace that cannot be analysed; the message names the file and the problem."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


@dataclass
class DecodedTrace:
    """One Kineto file's events as columns (analysis.ingest.kineto), and what its
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
        # ISA-L's inflate: about 4 times zlib's (12 ms against 47 for a 54 MB trace)
        opened = igzip.IGzipFile(fileobj=raw, mode="rb") if gzipped else raw
        read = 0
        with raw, opened as handle:
            while piece := handle.read(READ_BYTES):
                read += len(piece)
                if limit is not None and read > limit:
                    raise _too_large(path, f"more than {limit / MB:g} MB of JSON once "
                                           f"decompressed ({_megabytes(stored)} gzipped)",
                                     limit, why)
                yield piece
    except (EOFError, gzip.BadGzipFile, isal_zlib.error) as exc:
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
    try_int_timed = True  # until a chunk's events are not all integer-timed
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
        events = None
        if try_int_timed and not columns.float_timestamps:
            try:
                events = INT_TIMED_EVENTS_DECODER.decode(memoryview(buffer)[:close + 1])
            except (msgspec.DecodeError, msgspec.ValidationError):
                try_int_timed = False  # the decoders below say what is wrong, if anything is
        int_timed = events is not None
        if events is None:
            try:
                events = EVENTS_DECODER.decode(memoryview(buffer)[:close + 1])
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise _NotChunkable(str(exc)) from None
        # Raw arguments point into the buffer: the events go before it is written again.
        columns.add(events, int_timestamps=int_timed)
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


# ---- the typed decoder ---------------------------------------------------------------------------
# Fields are typed loosely (Any) so that an odd value in one event is a per-event problem, not a
# failed file; `args` is a Struct so that only the keys below are ever materialised.
class _Args(msgspec.Struct, gc=False):
    stream: Any = None
    correlation: Any = None
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    # Raw: kept as undecoded JSON text, and only turned into a str for the few comm events and
    # the host ops the perf model knows (analysis.core.op_names).
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""),
                                                 name="Concrete Inputs")
    flops: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""))


class KinetoEvent(msgspec.Struct, gc=False):
    name: Any = None
    cat: Any = None
    ph: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: _Args | None = None


class _DistributedInfo(msgspec.Struct):
    rank: Any = None
    world_size: Any = None
    backend: Any = None
    pg_config: Any = None


class TraceDocument(msgspec.Struct, gc=False):
    traceEvents: list[KinetoEvent] | None = None
    distributedInfo: _DistributedInfo | None = None


# ---- the fast decoder ----------------------------------------------------------------------------
# Most events are not complete ("X") events (flows, instants, metadata), and only the X ones become
# rows. A union tagged by "ph" materialises only their `ts` (float_timestamps reads it) and checks
# their `args` is an object or null, as _Args does. Whatever it does not take (a "ph" it does not
# list, or that is not a string) fails it, and the general decoder decodes the same bytes again:
# the same events, or the same error.
class _CheckedArgs(msgspec.Struct, gc=False):
    pass


class _CompleteEvent(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    ph = "X"  # a class attribute, not a field: what KinetoEvent.ph would hold
    # In the order Kineto writes them: msgspec looks a key up from the field after the last found.
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: _Args | None = None


# The Trace Event Format's other phases, the deprecated ones (I, S, T, p, F) included.
_OTHER_PHASES = "B E i I C b n e S T p F s t f P N O D M V v R c ( )".split()
_FastEvent = Union[(_CompleteEvent, *(
    msgspec.defstruct(f"_Phase{i}Event", [("ts", Any, None), ("args", _CheckedArgs | None, None)],
                      namespace={"ph": phase}, tag_field="ph", tag=phase, gc=False,
                      module=__name__)
    for i, phase in enumerate(_OTHER_PHASES)))]


class _FastDocument(msgspec.Struct, gc=False):
    traceEvents: list[_FastEvent] | None = None
    distributedInfo: _DistributedInfo | None = None


class _FallbackDecoder:
    """Decodes with a fast decoder, and where that fails, with the general one."""

    def __init__(self, fast, general):
        self.fast = msgspec.json.Decoder(fast)
        self.general = msgspec.json.Decoder(general)

    def decode(self, data):
        try:
            return self.fast.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return self.general.decode(data)


TRACE_DECODER = _FallbackDecoder(_FastDocument, TraceDocument)
EVENTS_DECODER = _FallbackDecoder(list[_FastEvent], list[KinetoEvent])


# ---- the integer-timed decoder -------------------------------------------------------------------
# The fast decoder's events, each with an integer ts (what many Kineto versions write): decoded
# by it, a chunk is known to have no float or missing timestamp without reading every event's
# again (EventColumns.add; 7 ms of a 50 MB trace's 216,000 events). msgspec's int takes exactly
# the JSON numbers its Any decodes to int. A chunk it refuses is decoded as before, and so is
# the rest of its file. kw_only: a required ts among optional fields, in the same order.
class _IntTimedCompleteEvent(msgspec.Struct, gc=False, tag_field="ph", tag="X", kw_only=True):
    ph = "X"
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: int
    dur: Any = None
    args: _Args | None = None


_IntTimedEvent = Union[(_IntTimedCompleteEvent, *(
    msgspec.defstruct(f"_IntTimedPhase{i}Event", [("ts", int), ("args", _CheckedArgs | None, None)],
                      namespace={"ph": phase}, tag_field="ph", tag=phase, gc=False,
                      kw_only=True, module=__name__)
    for i, phase in enumerate(_OTHER_PHASES)))]
INT_TIMED_EVENTS_DECODER = msgspec.json.Decoder(list[_IntTimedEvent])


def int_or_none(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 24:
        return int(value)  # longer: out of every range, and slow (or refused) to convert
    return None


def _hta_int(value) -> int:
    """Python's int() of a stream or correlation argument, -1 where that fails (as HTA does)."""
    if value is None or isinstance(value, bool):
        return -1
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return -1


def _to_ns(values: list, high_us: int) -> tuple[np.ndarray, int, np.ndarray | None]:
    """Kineto microseconds (int or float) to int64 nanoseconds, how many were not numbers, and
    where a number was outside [0, high_us] (None where none was).

    Exact for what float64 holds: a float timestamp of ~1.7e15 us has a resolution of 0.25 us
    in float64, and splitting whole and fractional microseconds keeps the value the file's float
    denotes, with no further rounding. Non-numbers and numbers out of range become 0: the range
    is checked on the microseconds, before the multiplication that could overflow.
    """
    try:
        # One C-level pass for the usual list of ints (a bool among them reads as 0 or 1, as the
        # float path below reads it too); anything else takes the checks below.
        as_read = np.array(values)
        if as_read.dtype == np.int64 and as_read.ndim == 1:
            # Two reductions, no mask, for the usual chunk whose values are all in range.
            if not len(as_read) or (as_read.min() >= 0 and as_read.max() <= high_us):
                return as_read * 1000, 0, None
            far = outside(as_read, 0, high_us)
            return np.where(far, 0, as_read) * 1000, 0, far
        if as_read.ndim != 1 or as_read.dtype == object:
            raise TypeError("not one number per event")
        as_float = as_read.astype(np.float64)  # floats, bools, ints over int64, numeric text
    except (TypeError, ValueError, OverflowError):
        as_float = np.array([as_number(v) for v in values], dtype=np.float64)
    bad = ~np.isfinite(as_float)
    if not bad.any() and (not len(as_float) or (as_float.min() >= 0
                                                and as_float.max() <= high_us)):
        far = np.zeros(0, dtype=bool)  # every value a number in range
    else:
        far = outside(as_float, 0, high_us) & ~bad
        as_float = np.where(bad | far, 0.0, as_float)
    whole = np.floor(as_float)
    ns = whole.astype(np.int64) * 1000 + np.rint((as_float - whole) * 1000).astype(np.int64)
    return ns, int(bad.sum()), far if far.any() else None


def _raw_text(raw: msgspec.Raw) -> str | None:
    return bytes(raw).decode("utf-8", "replace") if len(raw) else None


def _comm_value(value):
    if value is None or isinstance(value, (list, dict)):
        return None if value is None else json.dumps(value)
    return value


def _as_float(value) -> float:
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def name_text(value) -> str:
    """A decoded name (or pid, tid) as the events frame's text."""
    if value is None:
        return ""
    try:
        return str(value)
    except ValueError:  # an int of more digits than Python converts to text
        return shown(value)


def _place_text(place: tuple) -> tuple:
    return place


class ValueCodes:
    """Values -> int32 codes, shared by all chunks of a file, in first-seen order;
    `text(value)` is how the value reads as a category (analysis.ingest.parsed_trace)."""

    def __init__(self, text=name_text):
        self.codes_of: dict = {}
        self.text = text

    def add(self, values: list) -> np.ndarray:
        codes_of = self.codes_of
        n = len(values)
        if len(codes_of) > 0:
            # Most values of a later chunk are known: a C-level lookup each, then the new ones
            # (-1) in order, which gives them codes in first-seen order as below.
            codes = np.fromiter(map(codes_of.get, values, repeat(-1)), dtype=np.int32, count=n)
            new = np.flatnonzero(codes < 0)
            if len(new) * 4 < n:
                for i in new.tolist():
                    codes[i] = codes_of.setdefault(values[i], len(codes_of))
                return codes
        return np.fromiter((codes_of.setdefault(v, len(codes_of)) for v in values),
                           dtype=np.int32, count=n)


# (comm kernel, host comm, modelled op) of the names seen so far in this process: a worker reads
# many ranks of the same program, and the kernel pattern is slow on long templated names.
_FLAGS_OF_NAME: dict[str, tuple[bool, bool, bool]] = {}
_FLAGS_OF_NAME_MAX = 1 << 16


def _name_flags(name: str) -> tuple[bool, bool, bool]:
    flags = _FLAGS_OF_NAME.get(name)
    if flags is None:
        if len(_FLAGS_OF_NAME) >= _FLAGS_OF_NAME_MAX:
            _FLAGS_OF_NAME.clear()
        flags = _FLAGS_OF_NAME[name] = (bool(COMM_KERNEL_RE.search(name)),
                                        bool(HOST_COMM_RE.match(name)), is_modelled_op(name))
    return flags


def _place_flags(place: tuple) -> tuple[bool, bool, bool]:
    """(device work, host op, cpu_op) of a (cat, pid, tid) place."""
    cat = normal_cat(place[0])
    return cat in GPU_CATS, cat in HOST_OP_CATS, cat == CPU_OP_CAT


_NULL = b"null"  # an argument the event does not have, in OP_ARGS_COLUMN's text
_NO_ARGS = "[null,null,null,null]"  # OP_ARGS_COLUMN's text of an op without arguments


class EventColumns:
    """The events frame, built chunk by chunk so that only one chunk of decoded events lives."""

    def __init__(self):
        self.names = ValueCodes()
        # (cat, pid, tid) coded together: one dict lookup per event instead of three.
        self.places = ValueCodes(_place_text)
        self.parts: dict[str, list[np.ndarray]] = {c: [] for c in (
            "name", "place", "ts_ns", "dur_ns", "stream", "correlation", "is_gpu", "is_comm")}
        # The rows of the communication events, and their values of each comm column
        # (COMM_TEXT_COLUMNS then NUMBER_COLUMNS), a list per column: flat lists, which the
        # decoder forked ahead hands back (analysis.ingest.parse_ahead) at a fraction of the
        # cost of a tuple per event.
        self.comm_rows: list[int] = []
        self.comm_columns: tuple[list, ...] = tuple(
            [] for _ in (*COMM_TEXT_COLUMNS, *NUMBER_COLUMNS))
        # The rows of the host ops the perf model knows, and their op_args texts (each distinct
        # text one str).
        self.op_args_rows: list[int] = []
        self.op_args_texts: list[str] = []
        self._op_texts: dict[bytes, str] = {}
        self.rows = 0
        self.bad = {"ts": 0, "dur": 0}
        # Per field (_RANGES): [events out of range, the first such value as read].
        self.far: dict[str, list] = {field: [0, None] for field in _RANGES}
        # The rank the file is of, for the problem lines, and problems found outside the events
        # (distributedInfo's values): both given by analysis.ingest.kineto once decoded.
        self.rank: int | None = None
        self.notes: list[str] = []
        self.float_timestamps = False
        # per code: (comm kernel, host comm, modelled op) / (gpu, host, cpu_op)
        self._flags = {"name": [], "place": []}

    def add(self, chunk: list[KinetoEvent], int_timestamps: bool = False) -> None:
        """The events of one chunk; `int_timestamps`: every event's ts is an int (the
        chunk's decoder required it)."""
        # HTA's pandas frame gets float64 timestamps when any event's ts is a float (or missing).
        if not self.float_timestamps and not int_timestamps:
            # A set of the types: no generator to resume per event (a fifth of any()'s time).
            self.float_timestamps = bool({type(e.ts) for e in chunk} - {int})
        events = [e for e in chunk if e.ph == "X" and e.ts is not None and e.dur is not None]
        ts_ns, bad_ts = self._times([e.ts for e in events], "ts", MAX_TS_US)
        if bad_ts is not None:  # an event that cannot be placed is left out
            kept = ~bad_ts
            events = [e for e, keep in zip(events, kept.tolist()) if keep]
            ts_ns = ts_ns[kept]
        # Zero-length, where out of range.
        dur_ns, _ = self._times([e.dur for e in events], "dur", MAX_DUR_US)
        n = len(events)
        names = self.names.add([e.name for e in events])
        places = self.places.add([(e.cat, e.pid, e.tid) for e in events])
        # A list each, then one array: item assignment into an array costs more per event.
        arguments = [e.args for e in events]
        stream = np.array([-1 if a is None or (v := a.stream) is None else
                           v if type(v) is int else _hta_int(v) for a in arguments],
                          dtype=np.int64)
        correlation = np.array([-1 if a is None or (v := a.correlation) is None else
                                v if type(v) is int else _hta_int(v) for a in arguments],
                               dtype=np.int64)
        name_flags = self._lookup("name", self.names, _name_flags)
        place_flags = self._lookup("place", self.places, _place_flags)
        is_gpu = place_flags[places, 0]
        is_host = place_flags[places, 1]
        is_comm = (is_gpu & name_flags[names, 0]) | (is_host & name_flags[names, 1])
        # Comm arguments are taken now: Raw values hold on to the chunk's bytes.
        comm = [i for i in np.flatnonzero(is_comm).tolist() if events[i].args is not None]
        if comm:
            self.comm_rows += [self.rows + i for i in comm]
            for column, values in zip(self.comm_columns, zip(*(
                    self._comm_values(events[i].args) for i in comm))):
                column += values
        modelled = np.flatnonzero(place_flags[places, 2] & name_flags[names, 2] & ~is_comm)
        if len(modelled):
            self.op_args_rows += (modelled + self.rows).tolist()
            self.op_args_texts += self._op_args_texts([events[i].args
                                                       for i in modelled.tolist()])
        for column, values in (("name", names), ("place", places), ("ts_ns", ts_ns),
                               ("dur_ns", dur_ns), ("stream", stream),
                               ("correlation", correlation), ("is_gpu", is_gpu),
                               ("is_comm", is_comm)):
            self.parts[column].append(values)
        self.rows += n

    def _times(self, values: list, field: str, high_us: int
               ) -> tuple[np.ndarray, np.ndarray | None]:
        """One time field of the events (`values`) in ns (0 where not a number or out of
        [0, high_us]), counted, and where it was out of range (None: nowhere)."""
        ns, not_numbers, far = _to_ns(values, high_us)
        self.bad[field] += not_numbers
        if far is not None:
            count = self.far[field]
            if count[1] is None:
                count[1] = values[int(np.argmax(far))]
            count[0] += int(far.sum())
        return ns, far

    def _lookup(self, kind: str, codes: ValueCodes, flags_of) -> np.ndarray:
        """(code -> three flags) for every code so far, computed once per distinct value."""
        known = self._flags[kind]
        values = list(codes.codes_of)
        for value in values[len(known):]:
            known.append(flags_of(codes.text(value)))
        return np.array(known, dtype=bool).reshape(len(known), 3)

    def problems(self, path: Path) -> list[str]:
        where = f"{path}: rank {self.rank}" if self.rank is not None else str(path)
        then = {"ts": "they are placed at 0", "dur": "they are treated as zero-length"}
        problems = [f"{where}: {count} events have a non-numeric '{key}'; {then[key]}"
                    for key, count in self.bad.items() if count]
        for key, (low, high, unit, then) in _RANGES.items():
            count, first = self.far[key]
            if count:
                value = shown(first)
                value += unit if value[-1].isdigit() else ""  # not after "an integer of N bits"
                problems.append(f"{where}: {count} events have '{key}' out of range (first "
                                f"{value}, outside {low}..{high}{unit}); {then}")
        return problems + self.notes

    def _op_args_texts(self, arguments: list) -> list[str]:
        """OP_ARGS_COLUMN's text of each op's arguments (None: the event has none, which the
        FLOP count names too), the same str for the same text (a step's ops repeat their
        shapes). Joined from the Raw values' buffers, with no copy of each; a loop of its own,
        as it runs once per modelled op."""
        known, join, null = self._op_texts, b",".join, _NULL
        texts = []
        for args in arguments:
            if args is None or not (args.input_dims or args.input_type or args.concrete_inputs
                                    or args.flops):
                texts.append(_NO_ARGS)  # what the four nulls join to (most ops, no shapes)
                continue
            key = join((args.input_dims or null, args.input_type or null,
                        args.concrete_inputs or null, args.flops or null))
            text = known.get(key)
            if text is None:
                text = known[key] = "[" + key.decode("utf-8", "replace") + "]"
            texts.append(text)
        return texts

    def _comm_values(self, args: _Args) -> tuple:
        """The comm columns (TEXT_COLUMNS then NUMBER_COLUMNS) of one event's arguments; a size
        out of range is set aside (NaN, as a missing one)."""
        return (_comm_value(args.collective), _comm_value(args.dtype),
                None if args.pg_name is None else str(_comm_value(args.pg_name)),
                None if args.pg_desc is None else str(_comm_value(args.pg_desc)),
                _raw_text(args.input_dims), _raw_text(args.input_type),
                self._size(args.in_nelems, "In msg nelems"),
                self._size(args.out_nelems, "Out msg nelems"),
                self._size(args.group_size, "Group size"))

    def _size(self, value, field: str) -> float:
        number = _as_float(value)
        low, high = _RANGES[field][:2]
        if number != number or low <= number <= high:  # NaN: missing, as before
            return number
        count = self.far[field]
        count[0] += 1
        if count[1] is None:
            count[1] = value
        return math.nan


# Per field: (lowest, highest, unit, what is done with a value outside); ts and dur are every
# complete event's (in Kineto's microseconds), the rest a communication event's arguments.
_RANGES = {
    "ts": (0, MAX_TS_US, " us", "they are left out"),
    "dur": (0, MAX_DUR_US, " us", "they are treated as zero-length"),
    "In msg nelems": (0, MAX_BYTES, "", "set aside"),
    "Out msg nelems": (0, MAX_BYTES, "", "set aside"),
    "Group size": (1, MAX_WORLD_SIZE, "", "set aside"),
}

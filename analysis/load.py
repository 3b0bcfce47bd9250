"""Finding runs and reading Kineto traces and ranktrace records into per-rank DataFrames.

This is the analysis' only reader of files. A Kineto trace is decoded by a typed msgspec decoder
that materialises only the fields the analysis uses, and becomes one `RankTrace` whose `events`
frame has the columns in `EVENT_COLUMNS` (docs/analysis.md describes them). Records written by
the tracer (`tracer.schema`) are attached when the trace sits in a ranktrace run folder.

Nothing read is evaluated or unpickled. A file that cannot be read becomes a problem naming the
file (and rank, where known) and the rest is still loaded. Parsed traces are cached as Parquet in
a `.ranktrace-cache/` folder beside them, keyed by size, mtime and format version; a folder that
cannot be written (a read-only trace folder) just means no cache.
"""

from __future__ import annotations

import gc
import gzip
import json
import math
import os
import re
import sys
import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import msgspec
import numpy as np
import pandas as pd

from analysis.records import (RunRecords, _record_ranks, _records_path,  # noqa: F401
                              read_jsonl, read_records, run_status)
from analysis.steps import (WHOLE_TRACE_STEP, format_ranges, parse_step_spec,  # noqa: F401
                            select_steps)
from tracer import schema

# Bump when the events frame or the cache layout changes: old cache files are then ignored.
CACHE_FORMAT = 2
CACHE_DIR = ".ranktrace-cache"

EVENT_COLUMNS = [
    "name", "cat", "ts_ns", "dur_ns", "end_ns", "pid", "tid", "stream", "correlation",
    "is_gpu", "is_comm", "collective", "in_nelems", "out_nelems", "comm_dtype", "group_size",
    "pg_name", "input_dims", "input_type",
]
STEP_COLUMNS = ["step", "start_ns", "end_ns"]
TEXT_COLUMNS = ("collective", "comm_dtype", "pg_name", "input_dims", "input_type")
NUMBER_COLUMNS = ("in_nelems", "out_nelems", "group_size")

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
MEMORY_CATS = frozenset({"gpu_memcpy", "gpu_memset"})
HOST_OP_CATS = frozenset({"cpu_op", "user_annotation"})
# Kineto's categories before torch 1.10 (the TensorBoard plugin's samples use them).
_LEGACY_CATS = {
    "operator": "cpu_op", "memcpy": "gpu_memcpy", "memset": "gpu_memset",
    "runtime": "cuda_runtime", "driver": "cuda_driver", "python": "python_function",
}
# Device kernels that count as communication in our breakdown (docs/definitions.md, "GPU traces"),
# searched anywhere in the name, case-insensitively. HTA's own classes are in analysis.breakdown.
COMM_KERNEL_PATTERNS = (
    r"^(?:nccl|rccl|msccl)\w*?kernel",  # NCCL, RCCL, MSCCL collectives and p2p
    r"(?:deep_ep|dpsk::ep)::",  # DeepEP expert-parallel dispatch/combine (intra- and internode)
    r"nvshmem",  # NVSHMEM one-sided puts, gets and collectives
    r"cross_device_reduce",  # vLLM's custom all-reduce
    r"symm_mem|symmetric_memory|multimem|one_shot_all_reduce|two_shot_all_reduce",  # torch
)
COMM_KERNEL_RE = re.compile("|".join(f"(?:{p})" for p in COMM_KERNEL_PATTERNS), re.IGNORECASE)
HOST_COMM_RE = re.compile(
    r"^(?:gloo:|nccl:|mpi:|ucc:|c10d::|c10d_functional::|_c10d_functional::|record_param_comms$)")
PROFILER_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
TRACE_NAME_RE = re.compile(r"\.json(?:\.gz)?$")


class TraceReadError(Exception):
    """A trace that cannot be analysed; the message names the file and the problem."""

    def __init__(self, path: Path, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = Path(path)
        self.reason = reason


# ---- data model (described in docs/analysis.md) -------------------------------------------------
@dataclass
class RankTrace:
    rank: Optional[int]
    world_size: Optional[int]
    path: Path
    events: pd.DataFrame
    steps: pd.DataFrame  # the selected ProfilerStep spans
    records: Optional[RunRecords]
    problems: list[str]
    # Whether any timestamp in the file was written as a float: HTA rounds such traces to whole
    # microseconds, and the HTA-compatible columns must do the same.
    float_timestamps: bool = False
    # Every ProfilerStep span in the trace, before --steps selection.
    all_steps: Optional[pd.DataFrame] = None
    # More files of the same rank (further profiler windows); their events are in `events`.
    extra_paths: list[Path] = field(default_factory=list)
    backend: Optional[str] = None
    # False for a rank known only from the tracer's records (killed before its trace was written).
    has_trace: bool = True
    # How the rank's run ended, from its manifest: ok, failed, interrupted or crashed (no run_end).
    status: Optional[str] = None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else "rank ?"


@dataclass
class LoadResult:
    ranks: list[RankTrace]
    problems: list[str]
    run_dir: Optional[Path]
    world_size: Optional[int] = None
    files: list[Path] = field(default_factory=list)


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
    # Raw: kept as undecoded JSON text, and only turned into a str for the few comm events.
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


class _Event(msgspec.Struct, gc=False):
    name: Any = None
    cat: Any = None
    ph: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: Optional[_Args] = None


class _DistributedInfo(msgspec.Struct):
    rank: Any = None
    world_size: Any = None
    backend: Any = None


class _TraceDocument(msgspec.Struct, gc=False):
    traceEvents: Optional[list[_Event]] = None
    distributedInfo: Optional[_DistributedInfo] = None


_TRACE_DECODER = msgspec.json.Decoder(_TraceDocument)


@dataclass
class ParsedTrace:
    """One Kineto file, before rank grouping and step selection."""

    path: Path
    rank: Optional[int]
    world_size: Optional[int]
    backend: Optional[str]
    events: pd.DataFrame
    steps: pd.DataFrame
    float_timestamps: bool
    problems: list[str]


def _int_or_none(value) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _hta_int(value) -> int:
    """Python's int() of a stream or correlation argument, -1 where that fails (as HTA does)."""
    if value is None or isinstance(value, bool):
        return -1
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return -1


def _to_ns(values: list) -> tuple[np.ndarray, int]:
    """Kineto microseconds (int or float) to int64 nanoseconds, and how many were not numbers.

    Exact for what float64 holds: a float timestamp of ~1.7e15 us has a resolution of 0.25 us
    in float64, and splitting whole and fractional microseconds keeps the value the file's float
    denotes, with no further rounding. Non-numbers become 0.
    """
    try:
        if all(type(v) is int for v in values):
            return np.array(values, dtype=np.int64) * 1000, 0
        as_float = np.array(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        as_float = np.array([v if isinstance(v, (int, float)) and not isinstance(v, bool)
                             else math.nan for v in values], dtype=np.float64)
    bad = ~np.isfinite(as_float)
    if bad.any():
        as_float = np.where(bad, 0.0, as_float)
    whole = np.floor(as_float)
    ns = whole.astype(np.int64) * 1000 + np.rint((as_float - whole) * 1000).astype(np.int64)
    return ns, int(bad.sum())


def _normal_cat(cat) -> str:
    text = "" if cat is None else str(cat).lower()
    return _LEGACY_CATS.get(text, text)


def _raw_text(raw: msgspec.Raw) -> Optional[str]:
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


class _Codes:
    """Values -> int32 codes, shared by all chunks of a file; categories at the end."""

    def __init__(self, text=None):
        self.codes_of: dict = {}
        self.text = text or (lambda v: "" if v is None else str(v))

    def add(self, values: list) -> np.ndarray:
        codes_of = self.codes_of
        return np.fromiter((codes_of.setdefault(v, len(codes_of)) for v in values),
                           dtype=np.int32, count=len(values))

    def categorical(self, codes: np.ndarray) -> pd.Categorical:
        categories = [self.text(v) for v in self.codes_of]
        unique = list(dict.fromkeys(categories))
        if len(unique) != len(categories):  # e.g. 7 and "7", or "Kernel" and "kernel"
            position = {c: i for i, c in enumerate(unique)}
            remap = np.array([position[c] for c in categories], dtype=np.int32)
            codes, categories = remap[codes], unique
        return pd.Categorical.from_codes(codes, categories=pd.Index(categories, dtype=object))


class _EventColumns:
    """The events frame, built chunk by chunk so that only one chunk of decoded events lives."""

    def __init__(self):
        self.names = _Codes()
        # (cat, pid, tid) coded together: one dict lookup per event instead of three.
        self.places = _Codes(lambda v: v)
        self.parts: dict[str, list[np.ndarray]] = {c: [] for c in (
            "name", "place", "ts_ns", "dur_ns", "stream", "correlation", "is_gpu", "is_comm")}
        self.comm: list[tuple] = []  # (row, comm column values) of communication events
        self.rows = 0
        self.bad = {"ts": 0, "dur": 0}
        self.float_timestamps = False
        self._flags = {"name": [], "place": []}  # per code: (comm kernel, host comm) / (gpu, host)

    def add(self, chunk: list[_Event]) -> None:
        # HTA's pandas frame gets float64 timestamps when any event's ts is a float (or missing).
        if not self.float_timestamps:
            self.float_timestamps = any(type(e.ts) is not int for e in chunk)
        events = [e for e in chunk if e.ph == "X" and e.ts is not None and e.dur is not None]
        n = len(events)
        ts_ns, bad_ts = _to_ns([e.ts for e in events])
        dur_ns, bad_dur = _to_ns([e.dur for e in events])
        self.bad["ts"] += bad_ts
        self.bad["dur"] += bad_dur
        names = self.names.add([e.name for e in events])
        places = self.places.add([(e.cat, e.pid, e.tid) for e in events])
        stream = np.full(n, -1, dtype=np.int64)
        correlation = np.full(n, -1, dtype=np.int64)
        for i, e in enumerate(events):
            args = e.args
            if args is None:
                continue
            value = args.stream
            if value is not None:
                stream[i] = value if type(value) is int else _hta_int(value)
            value = args.correlation
            if value is not None:
                correlation[i] = value if type(value) is int else _hta_int(value)
        name_flags = self._lookup("name", self.names, lambda name: (
            bool(COMM_KERNEL_RE.search(name)), bool(HOST_COMM_RE.match(name))))
        place_flags = self._lookup("place", self.places, lambda place: (
            _normal_cat(place[0]) in GPU_CATS, _normal_cat(place[0]) in HOST_OP_CATS))
        is_gpu = place_flags[places, 0]
        is_host = place_flags[places, 1]
        is_comm = (is_gpu & name_flags[names, 0]) | (is_host & name_flags[names, 1])
        # Comm arguments are taken now: Raw values hold on to the chunk's bytes.
        for i in np.flatnonzero(is_comm):
            args = events[i].args
            if args is not None:
                self.comm.append((self.rows + int(i), _comm_values(args)))
        for column, values in (("name", names), ("place", places), ("ts_ns", ts_ns),
                               ("dur_ns", dur_ns), ("stream", stream),
                               ("correlation", correlation), ("is_gpu", is_gpu),
                               ("is_comm", is_comm)):
            self.parts[column].append(values)
        self.rows += n

    def _lookup(self, kind: str, codes: _Codes, flags_of) -> np.ndarray:
        """(code -> two flags) for every code so far, computed once per distinct value."""
        known = self._flags[kind]
        values = list(codes.codes_of)
        for value in values[len(known):]:
            known.append(flags_of(codes.text(value)))
        return np.array(known, dtype=bool).reshape(len(known), 2)

    def problems(self, path: Path) -> list[str]:
        where = {"ts": "they are placed at 0", "dur": "they are treated as zero-length"}
        return [f"{path}: {count} events have a non-numeric '{field}'; {where[field]}"
                for field, count in self.bad.items() if count]

    def frame(self) -> pd.DataFrame:
        def joined(column, dtype):
            parts = self.parts[column]
            return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

        n = self.rows
        ts_ns, dur_ns = joined("ts_ns", np.int64), joined("dur_ns", np.int64)
        text = {c: np.full(n, None, dtype=object) for c in TEXT_COLUMNS}
        numbers = {c: np.full(n, math.nan) for c in NUMBER_COLUMNS}
        for row, values in self.comm:
            for column, value in zip(TEXT_COLUMNS + NUMBER_COLUMNS, values):
                (text if column in text else numbers)[column][row] = value
        places = list(self.places.codes_of)
        place = joined("place", np.int32)
        by_place = {}
        for i, (column, codes) in enumerate((("cat", _Codes(_normal_cat)), ("pid", _Codes()),
                                             ("tid", _Codes()))):
            of_place = codes.add([p[i] for p in places])
            by_place[column] = codes.categorical(of_place[place] if n else of_place[:0])
        columns = {
            "name": self.names.categorical(joined("name", np.int32)),
            "cat": by_place["cat"],
            "ts_ns": ts_ns, "dur_ns": dur_ns, "end_ns": ts_ns + dur_ns,
            "pid": by_place["pid"], "tid": by_place["tid"],
            "stream": joined("stream", np.int64), "correlation": joined("correlation", np.int64),
            "is_gpu": joined("is_gpu", bool), "is_comm": joined("is_comm", bool), **numbers,
            # Mostly-None text stays a numpy object array: pandas would otherwise infer (and
            # convert to) its string dtype, which costs more than the whole decode.
            **{c: pd.Series(values, dtype=object, copy=False) for c, values in text.items()},
        }
        return pd.DataFrame({c: columns[c] for c in EVENT_COLUMNS}, copy=False)


def _comm_values(args: _Args) -> tuple:
    """The comm columns (TEXT_COLUMNS then NUMBER_COLUMNS) of one event's arguments."""
    return (_comm_value(args.collective), _comm_value(args.dtype),
            None if args.pg_name is None else str(_comm_value(args.pg_name)),
            _raw_text(args.input_dims), _raw_text(args.input_type),
            _as_float(args.in_nelems), _as_float(args.out_nelems), _as_float(args.group_size))


def empty_events() -> pd.DataFrame:
    return _EventColumns().frame()


# ---- reading a file in chunks -------------------------------------------------------------------
READ_BYTES = 1 << 20
CHUNK_BYTES = 2 << 20  # decoded events live for one chunk of JSON at a time
CUT_WINDOW = 1 << 16  # where a cut between events is looked for first: the buffer's end
_EVENTS_KEY_RE = re.compile(rb'"traceEvents"\s*:\s*\[')
_BETWEEN_EVENTS_RE = re.compile(rb"\}\s*,\s*\{")
_EVENTS_DECODER = msgspec.json.Decoder(list[_Event])


class _NotChunkable(Exception):
    """The file's layout defeats chunking; decode it whole (which also names any real error)."""


def _pieces(path: Path):
    """The file's (decompressed) bytes, READ_BYTES at a time."""
    try:
        with path.open("rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        if not gzipped and path.name.endswith(".gz"):
            raise TraceReadError(path, "not gzip (the name ends in .gz but the file does not "
                                       "start with gzip's magic bytes)")
        opened = gzip.open(path, "rb") if gzipped else path.open("rb")
        with opened as handle:
            while piece := handle.read(READ_BYTES):
                yield piece
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise TraceReadError(path, f"truncated or corrupt gzip ({exc})") from None
    except OSError as exc:
        raise TraceReadError(path, f"cannot read ({exc.strerror or exc})") from None


def read_trace_bytes(path: Path) -> bytes:
    return b"".join(_pieces(path))


def _decode_in_chunks(path: Path, columns: _EventColumns) -> _TraceDocument:
    """Feed traceEvents to `columns` a few MB at a time; returns the rest of the document.

    The events array is cut only between two events (a `}` then `,` then `{`); a cut that lands
    anywhere else (inside a string, or in nested arguments) makes a chunk that is not a valid
    JSON array of events, so it cannot go unnoticed: _NotChunkable is raised and the caller
    decodes the file whole instead.
    """
    pieces = _pieces(path)
    try:
        return _feed_chunks(pieces, columns)
    finally:
        pieces.close()


def _last_cut(buffer: bytearray):
    """The last place between two events in `buffer`: near its end if possible."""
    for start in (max(len(buffer) - CUT_WINDOW, 0), 0):
        cut = None
        for cut in _BETWEEN_EVENTS_RE.finditer(buffer, start):
            pass
        if cut is not None or start == 0:
            return cut
    return None


def _feed_chunks(pieces, columns: _EventColumns) -> _TraceDocument:
    buffer = bytearray()
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
    # The buffer always starts with one byte before the next event that may be overwritten
    # with "[": the array's own "[" now, a separator byte later.
    del buffer[:found.end() - 1]
    wanted = CHUNK_BYTES
    while True:
        while len(buffer) < wanted and (piece := next(pieces, None)) is not None:
            buffer += piece
        if len(buffer) < wanted:  # the file is read to its end: the rest is the tail
            break
        cut = _last_cut(buffer)
        if cut is None:  # one event longer than the buffer: read on
            wanted = len(buffer) + CHUNK_BYTES
            continue
        wanted = CHUNK_BYTES
        # "]" over the separator byte after the last event of the chunk: one copy, no joins.
        buffer[cut.start() + 1] = ord("]")
        with memoryview(buffer) as view:
            chunk = bytes(view[:cut.start() + 2])
        del buffer[:cut.end() - 2]
        buffer[0] = ord("[")
        try:
            columns.add(_EVENTS_DECODER.decode(chunk))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise _NotChunkable(str(exc)) from None
        del chunk
    try:
        tail = _TRACE_DECODER.decode(b'{"traceEvents":' + bytes(buffer))
        document = _TRACE_DECODER.decode(head)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise _NotChunkable(str(exc)) from None
    columns.add(tail.traceEvents or [])
    if document.distributedInfo is None:
        document.distributedInfo = tail.distributedInfo
    return document


def _decode_whole(path: Path, columns: _EventColumns) -> _TraceDocument:
    data = read_trace_bytes(path)
    try:
        document = _TRACE_DECODER.decode(data)
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


def parse_trace(path: Path, chunked: bool = True) -> ParsedTrace:
    """Decode one Kineto trace file. Raises TraceReadError naming the file when it can't.

    `chunked=False` decodes the whole file at once (what a chunked read falls back to).
    """
    path = Path(path)
    # Decoding makes hundreds of thousands of short-lived objects and no reference cycles: the
    # cyclic garbage collector would only rescan them, over and over (10-30% of parse time).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _parse(path, chunked)
    finally:
        if collecting:
            gc.enable()


def _parse(path: Path, chunked: bool) -> ParsedTrace:
    columns = _EventColumns()
    try:
        if not chunked:
            raise _NotChunkable("asked for a whole-file decode")
        document = _decode_in_chunks(path, columns)
    except _NotChunkable:
        columns = _EventColumns()
        document = _decode_whole(path, columns)
    info = document.distributedInfo
    rank = _int_or_none(info.rank) if info is not None else None
    world_size = _int_or_none(info.world_size) if info is not None else None
    backend = str(info.backend) if info is not None and info.backend is not None else None
    frame = columns.frame()
    return ParsedTrace(path=path, rank=rank, world_size=world_size, backend=backend,
                       events=frame, steps=profiler_steps(frame),
                       float_timestamps=columns.float_timestamps,
                       problems=columns.problems(path))


def profiler_steps(events: pd.DataFrame) -> pd.DataFrame:
    """ProfilerStep#N spans on the host (not their GPU-side copies), one row per step number."""
    names = events["name"]
    categories = names.cat.categories if isinstance(names.dtype, pd.CategoricalDtype) else None
    if categories is not None:
        step_of = {i: int(m.group(1)) for i, c in enumerate(categories)
                   if (m := PROFILER_STEP_RE.match(c))}
        if not step_of:
            return pd.DataFrame({c: np.zeros(0, dtype=np.int64) for c in STEP_COLUMNS})
        codes = names.cat.codes.to_numpy()
        mask = np.isin(codes, list(step_of)) & events["cat"].isin(HOST_OP_CATS).to_numpy()
        numbers = np.array([step_of[c] for c in codes[mask]], dtype=np.int64)
    else:
        matches = names.astype(str).str.extract(PROFILER_STEP_RE.pattern)[0]
        mask = (matches.notna() & events["cat"].isin(HOST_OP_CATS)).to_numpy()
        numbers = matches[mask].astype(np.int64).to_numpy()
    steps = pd.DataFrame({
        "step": numbers,
        "start_ns": events["ts_ns"].to_numpy()[mask],
        "end_ns": events["end_ns"].to_numpy()[mask],
    })
    # Kineto writes each step once; keep the longest span should a file repeat one.
    steps = (steps.sort_values(["step", "end_ns"], ascending=[True, False], kind="stable")
             .drop_duplicates("step").reset_index(drop=True))
    return steps


# ---- Parquet cache -------------------------------------------------------------------------------
def _cache_path(path: Path) -> Path:
    return path.parent / CACHE_DIR / (path.name + ".parquet")


def _cache_key(path: Path) -> str:
    stat = path.stat()
    return f"{stat.st_size}:{stat.st_mtime_ns}:{schema.SCHEMA_VERSION}:{CACHE_FORMAT}"


def _read_cache(path: Path) -> Optional[ParsedTrace]:
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
                       float_timestamps=meta["float_timestamps"], problems=meta["problems"])


def _write_cache(parsed: ParsedTrace) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    cached = _cache_path(parsed.path)
    if not _writable(parsed.path.parent):
        return
    meta = {
        "key": _cache_key(parsed.path), "rank": parsed.rank, "world_size": parsed.world_size,
        "backend": parsed.backend, "float_timestamps": parsed.float_timestamps,
        "problems": parsed.problems,
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


def read_trace(path: Path, use_cache: bool = True) -> ParsedTrace:
    """parse_trace through the Parquet cache."""
    path = Path(path)
    if use_cache:
        cached = _read_cache(path)
        if cached is not None:
            return cached
    parsed = parse_trace(path)
    if use_cache:
        _write_cache(parsed)
    return parsed


def _read_trace_job(args: tuple[str, bool]):
    """Process-pool job: a ParsedTrace, or the error message (exceptions cross processes badly)."""
    path, use_cache = args
    try:
        return read_trace(Path(path), use_cache)
    except TraceReadError as exc:
        rank = _file_rank(exc.path)
        return f"{exc.path}: rank {rank}: {exc.reason}" if rank is not None else str(exc)


# ---- finding runs -------------------------------------------------------------------------------
def is_trace_file(path: Path) -> bool:
    return path.is_file() and bool(TRACE_NAME_RE.search(path.name))


def trace_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if is_trace_file(p))


def is_run_dir(folder: Path) -> bool:
    return bool(trace_files(folder)) or bool(_record_ranks(folder))


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


def resolve_runs(paths: list[Path], run: Optional[str] = None, all_runs: bool = False
                 ) -> list[tuple[Optional[Path], list[Path]]]:
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
        raise NothingToAnalyse("give one folder (a run, or a folder of runs)")
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


# ---- loading a run ------------------------------------------------------------------------------
def _kineto_worker(path: Path) -> Optional[str]:
    match = schema.KINETO_TRACE_RE.match(path.name)
    return match.group("worker") if match else None


def _file_rank(path: Path) -> Optional[int]:
    worker = _kineto_worker(path)
    match = schema.RANK_WORKER_RE.match(worker) if worker else None
    return int(match.group("rank")) if match else None


def _parse_all(files: list[Path], use_cache: bool, jobs: Optional[int], progress: bool
               ) -> list:
    jobs = jobs or min(len(files), os.cpu_count() or 1)
    items = [(str(f), use_cache) for f in files]
    show = progress and sys.stderr.isatty()
    results = []
    start = time.monotonic()
    if len(files) > 1 and jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for done, result in enumerate(pool.map(_read_trace_job, items), start=1):
                results.append(result)
                if show:
                    _progress(done, len(files), start)
    else:
        for done, item in enumerate(items, start=1):
            results.append(_read_trace_job(item))
            if show:
                _progress(done, len(files), start)
    if show:
        print(file=sys.stderr)
    return results


def _progress(done: int, total: int, start: float) -> None:
    print(f"\rranktrace: parsed {done}/{total} trace files ({time.monotonic() - start:.1f} s)",
          end="", file=sys.stderr, flush=True)


def _merge_windows(parts: list[ParsedTrace]) -> ParsedTrace:
    """Several profiler windows of one rank (one file each) as one trace."""
    parts = sorted(parts, key=lambda p: int(p.steps["start_ns"].min()) if len(p.steps)
                   else int(p.events["ts_ns"].min()) if len(p.events) else 0)
    first = parts[0]
    events = pd.concat([p.events for p in parts], ignore_index=True)
    events["name"] = events["name"].astype("category")
    steps = (pd.concat([p.steps for p in parts], ignore_index=True)
             .sort_values("step", kind="stable").drop_duplicates("step").reset_index(drop=True))
    return ParsedTrace(path=first.path, rank=first.rank, world_size=first.world_size,
                       backend=first.backend, events=events, steps=steps,
                       float_timestamps=any(p.float_timestamps for p in parts),
                       problems=[m for p in parts for m in p.problems])


def load_files(files: list[Path], run_dir: Optional[Path] = None, steps: Optional[list[int]] = None,
               hta_compatible: bool = False, use_cache: bool = True, jobs: Optional[int] = None,
               progress: bool = False, comm_kernels: tuple = ()) -> LoadResult:
    """Parse trace files (in parallel processes when several) into one RankTrace per rank.

    `comm_kernels`: regular expressions (str or compiled) naming more device kernels that count
    as communication, besides COMM_KERNEL_PATTERNS.
    """
    problems: list[str] = []
    where = run_dir if run_dir is not None else (files[0].parent if files else Path("."))
    if not files and run_dir is None:
        return LoadResult([], [f"{where}: no Kineto trace files"], run_dir)
    parsed: list[ParsedTrace] = []
    for result in _parse_all(files, use_cache, jobs, progress):
        if isinstance(result, str):
            problems.append(result)
        else:
            parsed.append(result)

    # Ranks: distributedInfo first, else a ranktrace file name (rank{R}.<span>...).
    by_rank: dict = {}
    unranked: list[ParsedTrace] = []
    for trace in parsed:
        named = _file_rank(trace.path)
        if trace.rank is None and named is not None:
            trace.rank = named
        elif trace.rank is not None and named is not None and named != trace.rank:
            trace.problems.append(f"{trace.path}: distributedInfo says rank {trace.rank} but the "
                                  f"file name says rank {named}; using {trace.rank}")
        if trace.rank is None:
            unranked.append(trace)
        else:
            by_rank.setdefault(trace.rank, []).append(trace)
    for trace in unranked:
        if len(parsed) == 1:
            # Alone, it is rank 0 whatever it was (HTA assumes the same).
            trace.problems.append(f"{trace.path}: no rank in distributedInfo; analysed as "
                                  f"rank 0, the only trace")
            trace.rank = 0
            by_rank.setdefault(0, []).append(trace)
        else:
            trace.problems.append(f"{trace.path}: no rank in distributedInfo; analysed as an "
                                  f"unranked trace (shown as rank ?)")
            by_rank.setdefault(("unranked", str(trace.path)), []).append(trace)

    ranks: list[RankTrace] = []
    for key, group in by_rank.items():
        group = sorted(group, key=lambda t: t.path.name)
        kept = [group[0]]
        worker = _kineto_worker(group[0].path)
        for other in group[1:]:
            if worker is not None and worker == _kineto_worker(other.path):
                kept.append(other)  # another profiler window of the same process
            else:
                problems.append(f"duplicate rank {key}: {group[0].path} and {other.path} both "
                                f"say rank {key}; analysing {group[0].path} only")
        trace = _merge_windows(kept) if len(kept) > 1 else kept[0]
        rank = key if isinstance(key, int) else None
        ranks.append(_rank_trace(trace, rank, [k.path for k in kept[1:]], run_dir, steps,
                                 hta_compatible, comm_kernels))

    ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, str(r.path)))
    world_size = max((r.world_size for r in ranks if r.world_size), default=None)
    if run_dir is not None:
        found = {r.rank for r in ranks}
        for rank in sorted(_record_ranks(run_dir) - found):
            ranks.append(_records_only_rank(run_dir, rank))
        ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0,
                                  str(r.path)))
        problems += _unmarked_steps(run_dir, ranks)
        for r in ranks:
            for record in r.records.manifest if r.records is not None else []:
                if isinstance(record, schema.RunStart):
                    world_size = max(world_size or 0, record.world_size)
    if world_size:
        found = {r.rank for r in ranks if r.rank is not None}
        missing = sorted(set(range(world_size)) - found)
        if missing and found:
            which = f"ranks {format_ranges(missing)} of world size {world_size} have" \
                if len(missing) > 1 else f"rank {missing[0]} of world size {world_size} has"
            problems.append(f"{where}: {which} no trace here ({len(found)} of {world_size} "
                            f"ranks analysed)")
    for r in ranks:
        problems += r.problems
    if not ranks and not problems:
        problems.append(f"{where}: no Kineto trace files")
    return LoadResult(ranks=ranks, problems=problems, run_dir=run_dir, world_size=world_size,
                      files=list(files))


def _rank_trace(trace: ParsedTrace, rank, extra: list[Path], run_dir: Optional[Path],
                steps: Optional[list[int]], hta_compatible: bool, comm_kernels=()) -> RankTrace:
    problems = list(trace.problems)
    where = f"{trace.path}: rank {rank if rank is not None else '?'}"
    records = None
    if run_dir is not None and rank is not None:
        records, found = read_records(run_dir, rank)
        problems += found
    if trace.steps.empty:
        problems.append(f"{where}: no ProfilerStep in the trace; the whole trace span is "
                        f"analysed as one window (step -1)")
        selected = trace.steps
    else:
        selected, found = select_steps(trace.steps, steps, hta_compatible, where,
                                       records.steps if records is not None else None)
        problems += found
    events = mark_comm_kernels(trace.events, comm_kernels)
    return RankTrace(rank=rank, world_size=trace.world_size, path=trace.path,
                     events=events, steps=selected, records=records, problems=problems,
                     float_timestamps=trace.float_timestamps, all_steps=trace.steps,
                     extra_paths=extra, backend=trace.backend,
                     status=run_status(records.manifest) if records is not None else None)


def mark_comm_kernels(events: pd.DataFrame, patterns) -> pd.DataFrame:
    """`events` with the device kernels whose name matches any of `patterns` marked is_comm."""
    if not patterns or events.empty:
        return events
    extra = re.compile("|".join(f"(?:{getattr(p, 'pattern', p)})" for p in patterns))
    names = events["name"]
    categories = names.cat.categories if isinstance(names.dtype, pd.CategoricalDtype) else None
    if categories is not None:
        hits = np.array([bool(extra.search(str(c))) for c in categories] + [False])
        matched = hits[names.cat.codes.to_numpy()]  # code -1 (no name) reads the False at the end
    else:
        matched = names.astype(str).map(lambda n: bool(extra.search(n))).to_numpy(dtype=bool)
    matched &= events["cat"].astype(str).to_numpy() == "kernel"
    if not matched.any():
        return events
    events = events.copy()
    events["is_comm"] = events["is_comm"].to_numpy() | matched
    return events


def _records_only_rank(run_dir: Path, rank: int) -> RankTrace:
    """A rank with the tracer's records but no readable trace (killed before writing it)."""
    records, problems = read_records(run_dir, rank)
    path = next((found for pattern in (schema.MANIFEST_FILE, schema.STEPS_FILE, schema.COMMS_FILE,
                                       schema.SAMPLES_FILE)
                 if (found := _records_path(run_dir, pattern, rank)) is not None), run_dir)
    status = run_status(records.manifest) if records is not None else None
    world_size = None
    if records is not None:
        starts = [r for r in records.manifest if isinstance(r, schema.RunStart)]
        world_size = starts[-1].world_size if starts else None
        problems.append(
            f"{run_dir}: rank {rank}: no readable Kineto trace (run status: "
            f"{status or 'unknown, no manifest'}); its records are still "
            f"analysed: {len(records.steps)} step records, {len(records.comms)} comm ops")
    else:
        problems.append(f"{run_dir}: rank {rank}: no readable Kineto trace and no readable "
                        f"records")
    empty = pd.DataFrame({c: np.zeros(0, dtype=np.int64) for c in STEP_COLUMNS})
    return RankTrace(rank=rank, world_size=world_size, path=path, events=empty_events(),
                     steps=empty, records=records, problems=problems, all_steps=empty,
                     has_trace=False, status=status)


def _unmarked_steps(run_dir: Path, ranks: list[RankTrace]) -> list[str]:
    """The one problem of a run whose tracer records hold comm ops but no step."""
    unmarked = [r.rank for r in ranks if r.records is not None and r.records.steps.empty
                and not r.records.comms.empty and (r.all_steps is None or r.all_steps.empty)]
    if not unmarked:
        return []
    return [f"{run_dir}: ranks {format_ranges(unmarked)}: no steps were marked (no torch.optim "
            f"optimizer stepped), so there is no per-step breakdown; the comm records are "
            f"analysed over the whole run. To mark steps, call tracer.step() at the end of each "
            f"step, see docs/tracer.md"]


def load_path(path, steps=None, *, run: Optional[str] = None,
              hta_compatible: bool = False, use_cache: bool = True, jobs: Optional[int] = None,
              progress: bool = False, comm_kernels: tuple = ()) -> LoadResult:
    """Load the run that `path` names (a run folder, a folder of runs: the newest, a trace file).

    Raises NothingToAnalyse when `path` holds no trace at all.
    """
    if isinstance(steps, str):
        steps = parse_step_spec(steps)
    paths = [Path(p) for p in (path if isinstance(path, (list, tuple)) else [path])]
    (run_dir, files), = resolve_runs(paths, run=run)
    return load_files(files, run_dir, steps=steps, hta_compatible=hta_compatible,
                      use_cache=use_cache, jobs=jobs, progress=progress,
                      comm_kernels=comm_kernels)

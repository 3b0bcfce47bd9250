"""Decoding Kineto events into numpy columns, a chunk of events at a time.

A typed msgspec decoder materialises only the fields the analysis uses; `EventColumns` turns each
decoded chunk into numpy columns at once, so that only one chunk of decoded events lives
(analysis.ingest.parsed_trace makes the events frame of them). Nothing read is evaluated or
unpickled. This module does not import pandas: it runs before the command imports it
(analysis.ingest.parse_ahead).
"""

from __future__ import annotations

import json
import math
from itertools import repeat
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np

from analysis.core.event_kinds import (
    COMM_KERNEL_RE,
    GPU_CATS,
    HOST_COMM_RE,
    HOST_OP_CATS,
    normal_cat,
)


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
    # Raw: kept as undecoded JSON text, and only turned into a str for the few comm events.
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


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


def int_or_none(value) -> int | None:
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
        # One C-level pass for the usual list of ints (a bool among them reads as 0 or 1, as the
        # float path below reads it too); anything else takes the checks below.
        as_read = np.array(values)
        if as_read.dtype == np.int64 and as_read.ndim == 1:
            return as_read * 1000, 0
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
    return "" if value is None else str(value)


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


# (comm kernel, host comm) of the names seen so far in this process: a worker reads many ranks
# of the same program, and the kernel pattern is slow on long templated names.
_FLAGS_OF_NAME: dict[str, tuple[bool, bool]] = {}
_FLAGS_OF_NAME_MAX = 1 << 16


def _name_flags(name: str) -> tuple[bool, bool]:
    flags = _FLAGS_OF_NAME.get(name)
    if flags is None:
        if len(_FLAGS_OF_NAME) >= _FLAGS_OF_NAME_MAX:
            _FLAGS_OF_NAME.clear()
        flags = _FLAGS_OF_NAME[name] = (bool(COMM_KERNEL_RE.search(name)),
                                        bool(HOST_COMM_RE.match(name)))
    return flags


def _place_flags(place: tuple) -> tuple[bool, bool]:
    """(device work, host op) of a (cat, pid, tid) place."""
    cat = normal_cat(place[0])
    return cat in GPU_CATS, cat in HOST_OP_CATS


class EventColumns:
    """The events frame, built chunk by chunk so that only one chunk of decoded events lives."""

    def __init__(self):
        self.names = ValueCodes()
        # (cat, pid, tid) coded together: one dict lookup per event instead of three.
        self.places = ValueCodes(_place_text)
        self.parts: dict[str, list[np.ndarray]] = {c: [] for c in (
            "name", "place", "ts_ns", "dur_ns", "stream", "correlation", "is_gpu", "is_comm")}
        self.comm: list[tuple] = []  # (row, comm column values) of communication events
        self.rows = 0
        self.bad = {"ts": 0, "dur": 0}
        self.float_timestamps = False
        self._flags = {"name": [], "place": []}  # per code: (comm kernel, host comm) / (gpu, host)

    def add(self, chunk: list[KinetoEvent]) -> None:
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

    def _lookup(self, kind: str, codes: ValueCodes, flags_of) -> np.ndarray:
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


def _comm_values(args: _Args) -> tuple:
    """The comm columns (TEXT_COLUMNS then NUMBER_COLUMNS) of one event's arguments."""
    return (_comm_value(args.collective), _comm_value(args.dtype),
            None if args.pg_name is None else str(_comm_value(args.pg_name)),
            None if args.pg_desc is None else str(_comm_value(args.pg_desc)),
            _raw_text(args.input_dims), _raw_text(args.input_type),
            _as_float(args.in_nelems), _as_float(args.out_nelems), _as_float(args.group_size))

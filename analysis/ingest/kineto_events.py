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
    CPU_OP_CAT,
    GPU_CATS,
    HOST_COMM_RE,
    HOST_OP_CATS,
    normal_cat,
)
from analysis.core.limits import (
    MAX_BYTES,
    MAX_DUR_US,
    MAX_TS_US,
    MAX_WORLD_SIZE,
    as_number,
    outside,
    shown,
)
from analysis.core.op_names import is_modelled_op


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
        self.comm: list[tuple] = []  # (row, comm column values) of communication events
        # (row, op_args text) of the host ops the perf model knows; each distinct text once
        self.op_args: list[tuple[int, str]] = []
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

    def add(self, chunk: list[KinetoEvent]) -> None:
        # HTA's pandas frame gets float64 timestamps when any event's ts is a float (or missing).
        if not self.float_timestamps:
            self.float_timestamps = any(type(e.ts) is not int for e in chunk)
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
        for i in np.flatnonzero(is_comm):
            args = events[i].args
            if args is not None:
                self.comm.append((self.rows + int(i), self._comm_values(args)))
        modelled = np.flatnonzero(place_flags[places, 2] & name_flags[names, 2] & ~is_comm)
        if len(modelled):
            rows = (modelled + self.rows).tolist()
            self.op_args += zip(rows, self._op_args_texts([events[i].args
                                                           for i in modelled.tolist()]))
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
        problems = [f"{where}: {count} events have a non-numeric '{field}'; {then[field]}"
                    for field, count in self.bad.items() if count]
        for field, (low, high, unit, then) in _RANGES.items():
            count, first = self.far[field]
            if count:
                value = shown(first)
                value += unit if value[-1].isdigit() else ""  # not after "an integer of N bits"
                problems.append(f"{where}: {count} events have '{field}' out of range (first "
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
            if args is None:
                texts.append(_NO_ARGS)
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

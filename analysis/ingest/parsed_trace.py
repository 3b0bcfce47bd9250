"""One Kineto trace file as the analysis takes it: its events frame (analysis.core.events) and its
ProfilerStep spans, from the columns analysis.ingest.kineto decodes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.event_kinds import (
    COMM_TEXT_COLUMNS,
    HOST_OP_CATS,
    NUMBER_COLUMNS,
    OP_ARGS_COLUMN,
    PROFILER_STEP_RE,
    TEXT_COLUMNS,
    normal_cat,
)
from analysis.core.events import cat_is
from analysis.core.frames import events_frame, steps_frame
from analysis.core.limits import MAX_STEP
from analysis.ingest.kineto import DecodedTrace, EventColumns, ValueCodes, decode_trace, gc_paused


@dataclass
class ParsedTrace:
    """One Kineto file, before rank grouping and step selection."""

    path: Path
    rank: int | None
    world_size: int | None
    backend: str | None
    events: pd.DataFrame
    steps: pd.DataFrame
    float_timestamps: bool
    problems: list[str]
    # distributedInfo.pg_config: one dict per process group (pg_name, pg_desc, pg_size, ranks).
    process_groups: list[dict] = field(default_factory=list)
    # (rank, problems of this file then, its RankTrace reduced and without events): what its
    # worker computed (analysis.ingest.load._reduce).
    reduced: tuple | None = None


def parse_trace(path: Path, chunked: bool = True, max_bytes: int | None = None,
                decoded: DecodedTrace | None = None) -> ParsedTrace:
    """Read one Kineto trace file (analysis.ingest.kineto.decode_trace, whose TraceReadError it
    raises), or take `decoded`, the same file decoded already (analysis.ingest.parse_ahead)."""
    with gc_paused():
        if decoded is None:
            decoded = decode_trace(path, chunked, max_bytes)
        frame = decoded_events(decoded.columns)
        return ParsedTrace(path=Path(path), rank=decoded.rank, world_size=decoded.world_size,
                           backend=decoded.backend, events=frame, steps=profiler_steps(frame),
                           float_timestamps=decoded.columns.float_timestamps,
                           problems=decoded.columns.problems(Path(path)),
                           process_groups=decoded.process_groups)


def _categorical(codes: ValueCodes, of_row: np.ndarray) -> pd.Categorical:
    categories = [codes.text(v) for v in codes.codes_of]
    unique = list(dict.fromkeys(categories))
    if len(unique) != len(categories):  # e.g. 7 and "7", or "Kernel" and "kernel"
        position = {c: i for i, c in enumerate(unique)}
        remap = np.array([position[c] for c in categories], dtype=np.int32)
        of_row, categories = remap[of_row], unique
    return pd.Categorical.from_codes(of_row, categories=pd.Index(categories, dtype=object))


def decoded_events(decoded: EventColumns) -> pd.DataFrame:
    """The events frame (analysis.core.frames) of a file's decoded columns."""
    def joined(column, dtype):
        parts = decoded.parts[column]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    n = decoded.rows
    ts_ns, dur_ns = joined("ts_ns", np.int64), joined("dur_ns", np.int64)
    # numpy fills an empty object array with None, at a quarter of np.full's cost.
    text = {c: np.empty(n, dtype=object) for c in TEXT_COLUMNS}
    numbers = {c: np.full(n, math.nan) for c in NUMBER_COLUMNS}
    if decoded.comm_rows:
        count = len(decoded.comm_rows)
        rows = np.array(decoded.comm_rows, dtype=np.intp)
        for column, values in zip(COMM_TEXT_COLUMNS + NUMBER_COLUMNS, decoded.comm_columns):
            if column in text:
                # As objects: a list of texts would be read as a string array.
                text[column][rows] = np.fromiter(values, dtype=object, count=count)
            else:
                numbers[column][rows] = values
    if decoded.op_args_rows:
        count = len(decoded.op_args_rows)
        text[OP_ARGS_COLUMN][np.array(decoded.op_args_rows, dtype=np.intp)] = np.fromiter(
            decoded.op_args_texts, dtype=object, count=count)
    places = list(decoded.places.codes_of)
    place = joined("place", np.int32)
    by_place = {}
    for i, (column, codes) in enumerate((("cat", ValueCodes(normal_cat)), ("pid", ValueCodes()),
                                         ("tid", ValueCodes()))):
        of_place = codes.add([p[i] for p in places])
        by_place[column] = _categorical(codes, of_place[place] if n else of_place[:0])
    columns = {
        "name": _categorical(decoded.names, joined("name", np.int32)),
        "cat": by_place["cat"],
        "ts_ns": ts_ns, "dur_ns": dur_ns, "end_ns": ts_ns + dur_ns,
        "pid": by_place["pid"], "tid": by_place["tid"],
        "stream": joined("stream", np.int64), "correlation": joined("correlation", np.int64),
        "is_gpu": joined("is_gpu", bool), "is_comm": joined("is_comm", bool), **numbers, **text,
    }
    return events_frame(columns)


def profiler_steps(events: pd.DataFrame) -> pd.DataFrame:
    """ProfilerStep#N spans on the host (not their GPU-side copies), one row per step number."""
    names = events["name"].array
    # A step number out of range is no step (analysis.ingest.kineto names it).
    step_of = {i: int(m.group(1)) for i, c in enumerate(names.categories)
               if (m := PROFILER_STEP_RE.match(c)) and len(m.group(1)) <= len(str(MAX_STEP))
               and int(m.group(1)) <= MAX_STEP}
    if not step_of:
        return steps_frame()
    codes = names.codes
    mask = np.isin(codes, list(step_of)) & cat_is(events, HOST_OP_CATS)
    numbers = np.array([step_of[c] for c in codes[mask]], dtype=np.int64)
    start_ns = events["ts_ns"].to_numpy()[mask]
    end_ns = events["end_ns"].to_numpy()[mask]
    # Kineto writes each step once; keep the longest span should a file repeat one: by step,
    # then latest end first (~end: descending without overflow), ties in file order.
    order = np.lexsort((~end_ns, numbers))
    numbers = numbers[order]
    first = np.ones(len(numbers), dtype=bool)
    first[1:] = numbers[1:] != numbers[:-1]
    keep = order[first]
    return steps_frame(numbers[first], start_ns[keep], end_ns[keep])


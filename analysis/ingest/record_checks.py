"""Every number in the tracer's records checked against its sane range (analysis.core.limits)
before anything uses it: a value out of range is named (file, rank, field, value) and set aside,
the rest of the file is analysed.

A record that cannot do without the value (a step's times, an op's bytes: its required fields) is
set aside whole; an optional value (an op's peer, a sample's power) is set aside alone. The frames
are checked a column at a time, with numpy; the manifest (a few records) a record at a time.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import numpy as np

from analysis.core.limits import (
    MAX_BYTES,
    MAX_COUNT,
    MAX_DUR_US,
    MAX_DURATION_NS,
    MAX_STEP,
    MAX_TIME_NS,
    MAX_WORLD_SIZE,
    as_floats,
    outside,
    shown,
)
from tracer import schema

if TYPE_CHECKING:
    import pandas as pd

# A field's range, by name; other ints count things (0..MAX_COUNT), other floats are rates,
# shares or readings (0..MAX_FLOAT).
_RANGES = {
    "step": (0, MAX_STEP), "record_cap_step": (0, MAX_STEP),
    "rank": (0, MAX_WORLD_SIZE - 1), "local_rank": (0, MAX_WORLD_SIZE - 1),
    "peer": (0, MAX_WORLD_SIZE - 1),
    "world_size": (1, MAX_WORLD_SIZE), "pg_size": (1, MAX_WORLD_SIZE),
    "start_ns": (0, MAX_TIME_NS), "end_ns": (0, MAX_TIME_NS), "t_ns": (0, MAX_TIME_NS),
    "issue_ns": (0, MAX_TIME_NS),
    "offset_ns": (-MAX_TIME_NS, MAX_TIME_NS), "uncertainty_ns": (0, MAX_TIME_NS),
    "bytes": (0, MAX_BYTES), "comm_bytes": (0, MAX_BYTES), "duration_us": (0, MAX_DUR_US),
    "cpu_ns": (0, MAX_DURATION_NS),
    "exit_code": (-(1 << 31), (1 << 31) - 1), "samples_missed_pct": (0, 100),
}
MAX_FLOAT = 1e18
# Fields whose highest value is the rank's own world size, where its manifest gives one.
_BELOW_WORLD = {"peer": -1, "pg_size": 0}


def _numeric_fields(record_type) -> list[tuple[str, bool, tuple]]:
    """(name, required, (low, high)) of each int or float field of a record type."""
    found = []
    for field in msgspec.structs.fields(record_type):
        kinds = set(typing.get_args(field.type)) if isinstance(
            field.type, types.UnionType) or typing.get_origin(field.type) is typing.Union \
            else {field.type}
        kinds.discard(type(None))
        if kinds <= {int} and kinds:
            default = (0, MAX_COUNT)
        elif kinds <= {int, float} and kinds:
            default = (0, MAX_FLOAT)
        else:
            continue
        required = field.required
        found.append((field.name, required, _RANGES.get(field.name, default)))
    return found


_FIELDS: dict = {}


def numeric_fields(record_type) -> list[tuple[str, bool, tuple]]:
    fields = _FIELDS.get(record_type)
    if fields is None:
        fields = _FIELDS[record_type] = _numeric_fields(record_type)
    return fields


def _kind(record_type) -> str:
    return {schema.CommRecord: "comm", schema.StepRecord: "step", schema.DeviceSample: "sample",
            schema.IssueRecord: "issue"}.get(record_type, record_type.__name__)


def checked_frame(frame: pd.DataFrame, record_type, path: Path, rank: int,
                  world_size: int | None) -> tuple[pd.DataFrame, list[str]]:
    """`frame` (one row per record of `record_type`) with each value out of range set aside:
    its record where the field is required, else the value (NaN); one problem per field."""
    import pandas as pd

    if frame.empty:
        return frame, []
    problems = []
    where = f"{path}: rank {rank}"
    kind = _kind(record_type)
    aside = np.zeros(len(frame), dtype=bool)
    converted = {}
    for name, required, (low, high) in numeric_fields(record_type):
        if world_size is not None and name in _BELOW_WORLD:
            high = world_size + _BELOW_WORLD[name]
        column = frame[name].to_numpy()
        # Ints and floats as they are (compared at once); objects (ints past int64, None among
        # ints) as floats first.
        values = column if column.dtype.kind in "iuf" else as_floats(column)
        if len(values) and values.dtype.kind in "iu" and low <= values.min() \
                and values.max() <= high:
            continue
        bad = outside(values, low, high)
        if not required and values.dtype.kind == "f":
            bad &= ~np.isnan(values)  # missing is allowed
        if not bad.any():  # (an int past int64 is out of every range: not an object column)
            continue
        first = column[int(np.argmax(bad))]
        then = "those records are set aside" if required else "the value is set aside"
        problems.append(f"{where}: {int(bad.sum())} {kind} records have '{name}' out of range "
                        f"(first {shown(first)}, outside {low}..{high}); {then}")
        if required:
            aside |= bad
        else:
            frame[name] = frame[name].where(~bad)
        converted[name] = None
    if {"start_ns", "end_ns"} <= set(frame.columns):
        # In int64, exact (float64 rounds an epoch time to 256 ns): the times of the records
        # not set aside are in range, the others count as 0.
        start, end = (np.where(aside, 0, frame[c].to_numpy()).astype(np.int64)
                      for c in ("start_ns", "end_ns"))
        bad = outside(end - start, 0, MAX_DURATION_NS) & ~aside
        if bad.any():
            first = int(np.argmax(bad))
            problems.append(f"{where}: {int(bad.sum())} {kind} records end before they start or "
                            f"last longer than {MAX_DURATION_NS // 10 ** 9} s (first: start_ns "
                            f"{shown(frame['start_ns'].iloc[first])}, end_ns "
                            f"{shown(frame['end_ns'].iloc[first])}); those records are set aside")
            aside |= bad
    if aside.any():
        frame = frame[~aside].reset_index(drop=True)
    for name in converted:  # an int past int64 made the column objects: numbers again
        if frame[name].dtype == object:
            frame[name] = pd.to_numeric(frame[name])
    return frame, problems


def checked_manifest(manifest: list, path: Path, rank: int) -> tuple[list, list[str]]:
    """The manifest's records with each value out of range set aside (None); a clock_sync
    with one, whose measurement it is, is set aside whole. A record that names another rank
    than its file is named too (the file's rank is the one used)."""
    return checked_structs(manifest, path, rank,
                           lambda record, name, required: isinstance(record, schema.ClockSync))


def checked_dumps(dumps: list, path: Path, rank: int) -> tuple[list, list[str]]:
    """A rank's stack dumps (rank{R}.stacks.jsonl) checked as the manifest is: a dump whose
    time is out of range is set aside whole, a rank out of range alone (the file's is used)."""
    return checked_structs(dumps, path, rank, lambda record, name, required: required
                           and name != "rank")


def checked_structs(records: list, path: Path, rank: int, whole_if) -> tuple[list, list[str]]:
    """`records` (a record at a time) with each value out of range set aside (None), and the
    record itself where `whole_if(record, name, required)` says so."""
    kept, problems = [], []
    where = f"{path}: rank {rank}"
    for record in records:
        whole = False
        for name, required, (low, high) in numeric_fields(type(record)):
            value = getattr(record, name)
            if value is None and not required:
                continue
            if isinstance(value, bool) or not (low <= value <= high):
                aside = whole_if(record, name, required)
                problems.append(f"{where}: {_tag(record)} {name} {shown(value)} is out of range "
                                f"({low}..{high}); "
                                + ("the record is set aside" if aside else "set aside"))
                whole = whole or aside
                setattr(record, name, None)
        said = getattr(record, "rank", None)
        if said is not None and said != rank:
            problems.append(f"{where}: its {_tag(record)} record says rank {said}; the file's "
                            f"rank {rank} is used")
        if not whole:
            kept.append(record)
    return kept, problems


def _tag(record) -> str:
    """A manifest record's kind, as its line names it."""
    return type(record).__struct_config__.tag or (
        "stack dump" if isinstance(record, schema.StackDump) else type(record).__name__)


def manifest_world_size(manifest: list) -> int | None:
    """The world size the rank's last run_start gives (checked already), None if none."""
    starts = [r.world_size for r in manifest if isinstance(r, schema.RunStart)
              and r.world_size is not None]
    return starts[-1] if starts else None

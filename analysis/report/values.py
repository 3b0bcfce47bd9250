"""Values as the writers show them: JSON-ready values and records, times, shares and
sizes as text, and the steps each rank's rows cover."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.steps import WHOLE_TRACE_STEP

MS = 1e6  # ns per ms


def plain(value):
    """A JSON-ready Python value: numpy scalars unwrapped, NaN/NA -> None, a dataclass (a
    Verdict) as the dict of its fields."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return None if math.isnan(value) or math.isinf(value) else float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Path):
        return str(value)
    return value


def records(frame: pd.DataFrame) -> list[dict]:
    if frame is None or frame.empty:
        return []
    if not frame.columns.is_unique:
        return [{str(k): plain(v) for k, v in row.items()}
                for row in frame.astype(object).to_dict("records")]
    keys = [str(k) for k in frame.columns]
    columns = [_plain_column(column) for _, column in frame.items()]
    return [dict(zip(keys, row)) for row in zip(*columns)]


def _plain_column(column: pd.Series) -> list:
    """plain() of every value; numpy number columns converted whole (tables of many ranks)."""
    dtype = column.dtype
    if isinstance(dtype, np.dtype) and dtype.kind in "iub":
        return column.to_numpy().tolist()
    if isinstance(dtype, np.dtype) and dtype.kind == "f":
        return [None if math.isnan(v) or math.isinf(v) else v
                for v in column.to_numpy().tolist()]
    # The values as objects (an array, not a Series: a tenth of astype's cost on a short table).
    return [plain(v) for v in column.to_numpy(dtype=object)]


def _ms(value) -> str:
    value = plain(value)
    return "-" if value is None else f"{value / MS:,.2f}"


def _pct(value) -> str:
    value = plain(value)
    return "-" if value is None else f"{value:.1f}%"


def _us(value) -> str:
    value = plain(value)
    return "-" if value is None else f"{value:,.0f}"


def human_bytes(value) -> str:
    """Bytes in binary units: 331227136 -> "315.9 MiB"; "-" where missing."""
    value = plain(value)
    if value is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


def _rank(value) -> str:
    value = plain(value)
    return "?" if value is None else str(value)


def _share(part, whole) -> str:
    part, whole = plain(part), plain(whole)
    if part is None or not whole:
        return "-"
    return f"{part / whole * 100:.1f}%"


WINDOW_STEPS, WINDOW_WHOLE_TRACE, WINDOW_NONE = "steps", "whole trace", "none"


def steps_by_rank(per_step: pd.DataFrame) -> dict:
    """rank -> the step numbers of its rows in the breakdown, in table order ([-1] for a trace
    analysed whole); rows without a rank are under None. Built once: a lookup per rank, not a
    scan of the table per rank."""
    by_rank: dict = {}
    if per_step.empty:
        return by_rank
    for rank, step in zip(per_step["rank"].astype(object), per_step["step"].astype(object)):
        by_rank.setdefault(None if pd.isna(rank) else rank, []).append(int(step))
    return by_rank


def window_of(steps: list[int]) -> str:
    """What a rank with these analysed steps was analysed over: its steps, its whole trace (no
    ProfilerStep), or none."""
    if not steps:
        return WINDOW_NONE
    return WINDOW_WHOLE_TRACE if steps == [WHOLE_TRACE_STEP] else WINDOW_STEPS

"""The host ops of a Kineto trace with the arguments a FLOP count needs: torch.profiler's own
`flops` (where the trace has it), `Input Dims`, `Input type` and `Concrete Inputs` (recorded
with record_shapes).

The trace decoder keeps these arguments, for the ops the perf model knows only, in the events
frame's `op_args` column (analysis.core.event_kinds): they are read from there, with no second
read of the trace file, and each distinct text is decoded once.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.core.event_kinds import OP_ARGS_COLUMN
from analysis.core.limits import max_trace_bytes
from analysis.ingest.parsed_trace import parse_trace

OP_COLUMNS = ["name", "tid", "ts_ns", "end_ns", "flops", "input_dims", "input_type",
              "concrete_inputs", "args_key"]


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else math.nan


def _decoded(text: str) -> tuple:
    """(input_dims, input_type, concrete_inputs, flops) of one op_args text: a list or None
    each, and the flops a number or NaN."""
    try:
        dims, types, concrete, flops = json.loads(text)
    except (ValueError, TypeError):
        return None, None, None, math.nan
    return (dims if isinstance(dims, list) else None, types if isinstance(types, list) else None,
            concrete if isinstance(concrete, list) else None, _number(flops))


def ops_of_events(events: pd.DataFrame) -> pd.DataFrame:
    """One row per host op of the events frame whose arguments the decoder kept: OP_COLUMNS,
    times in ns as in the events frame, `flops` NaN where the trace has none, the three other
    arguments as decoded (lists) or None, and `args_key`, the same int for the ops of one name
    and one argument text (their lists are the same objects). Sorted by thread, start, and the
    longer first where two start at the same time (an op before those nested in it)."""
    texts = events[OP_ARGS_COLUMN].to_numpy(dtype=object) if len(events) else np.zeros(0, object)
    rows = np.flatnonzero(pd.notna(texts))
    codes, distinct = pd.factorize(texts[rows])
    decoded = [_decoded(t) for t in distinct]
    tid_texts, tid_codes = _texts_and_codes(events["tid"], rows)
    ts_ns = events["ts_ns"].to_numpy()[rows].astype(np.int64)
    end_ns = events["end_ns"].to_numpy()[rows].astype(np.int64)
    # By thread (as text), start, and the longer first; stable: in file order otherwise.
    order = np.lexsort((-end_ns, ts_ns, np.argsort(np.argsort(tid_texts, kind="stable"),
                                                   kind="stable")[tid_codes]))
    rows, codes = rows[order], codes[order]

    def argument(i: int) -> pd.Series:
        values = np.empty(len(decoded), dtype=object)
        values[:] = [d[i] for d in decoded]
        return pd.Series(values[codes] if len(rows) else np.zeros(0, dtype=object),
                         dtype=object)

    name_texts, name_codes = _texts_and_codes(events["name"], rows)
    flops = np.array([d[3] for d in decoded], dtype=np.float64)
    args_key = pd.factorize(name_codes.astype(np.int64) * max(len(decoded), 1) + codes)[0]
    return pd.DataFrame({
        "name": pd.Series(name_texts[name_codes], dtype=object),
        "tid": pd.Series(tid_texts[tid_codes[order]], dtype=object),
        "ts_ns": ts_ns[order], "end_ns": end_ns[order],
        "flops": flops[codes] if len(rows) else np.zeros(0, dtype=np.float64),
        "input_dims": argument(0), "input_type": argument(1), "concrete_inputs": argument(2),
        "args_key": args_key.astype(np.int64),
    }, columns=OP_COLUMNS)


def _texts_and_codes(column: pd.Series, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a categorical column's categories as str objects, each converted once; the codes of
    its values at `rows`)."""
    values = column.array
    texts = np.array([str(c) for c in values.categories], dtype=object)
    return texts, values.codes[rows].astype(np.intp)


def read_ops(paths: list[Path]) -> pd.DataFrame:
    """ops_of_events of the trace files, parsed as the analysis parses them (no cache)."""
    frames = [ops_of_events(parse_trace(Path(p), max_bytes=max_trace_bytes()).events)
              for p in paths]
    if len(frames) == 1:
        return frames[0]
    offset = 0
    for frame in frames:  # one file's keys apart from another's
        frame["args_key"] += offset
        offset += int(frame["args_key"].max()) + 1 if len(frame) else 0
    return pd.concat(frames, ignore_index=True).sort_values(
        ["tid", "ts_ns", "end_ns"], ascending=[True, True, False], kind="stable",
        ignore_index=True)

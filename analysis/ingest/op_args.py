"""The host ops of a Kineto trace with the arguments a FLOP count needs: torch.profiler's own
`flops` (where the trace has it), `Input Dims`, `Input type` and `Concrete Inputs` (recorded
with record_shapes).

The events frame (analysis.core.frames) keeps these arguments for communication events only, so
they are read here, from the rank's trace file(s) again, only when FLOPs are asked for.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from analysis.core.event_kinds import CPU_OP_CAT, normal_cat
from analysis.core.limits import max_trace_bytes
from analysis.ingest.kineto import read_trace_bytes

OP_COLUMNS = ["name", "tid", "ts_ns", "end_ns", "flops", "input_dims", "input_type",
              "concrete_inputs"]


class _OpArgs(msgspec.Struct, gc=False):
    flops: Any = None
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    concrete_inputs: Any = msgspec.field(default=None, name="Concrete Inputs")


class _OpEvent(msgspec.Struct, gc=False):
    name: Any = None
    cat: Any = None
    ph: Any = None
    ts: Any = None
    dur: Any = None
    tid: Any = None
    args: _OpArgs | None = None


class _OpDocument(msgspec.Struct, gc=False):
    traceEvents: list[_OpEvent] | None = None


_DECODER = msgspec.json.Decoder(_OpDocument)


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else math.nan


def read_ops(paths: list[Path]) -> pd.DataFrame:
    """One row per complete cpu_op event of the files: OP_COLUMNS, times in ns as in the
    events frame, `flops` NaN where the trace has none, the two shape arguments as decoded
    (lists) or None."""
    rows: dict[str, list] = {c: [] for c in OP_COLUMNS}
    for path in paths:
        document = _DECODER.decode(read_trace_bytes(Path(path), max_trace_bytes()))
        for e in document.traceEvents or ():
            if e.ph != "X" or normal_cat(e.cat) != CPU_OP_CAT:
                continue
            ts, dur = _number(e.ts), _number(e.dur)
            if ts != ts or dur != dur:
                continue
            args = e.args
            rows["name"].append(str(e.name))
            rows["tid"].append(str(e.tid))
            rows["ts_ns"].append(round(ts * 1000))
            rows["end_ns"].append(round((ts + dur) * 1000))
            rows["flops"].append(math.nan if args is None else _number(args.flops))
            dims = None if args is None else args.input_dims
            types = None if args is None else args.input_type
            rows["input_dims"].append(dims if isinstance(dims, list) else None)
            rows["input_type"].append(types if isinstance(types, list) else None)
            concrete = None if args is None else args.concrete_inputs
            rows["concrete_inputs"].append(concrete if isinstance(concrete, list) else None)
    frame = pd.DataFrame({
        "name": pd.Series(rows["name"], dtype=object),
        "tid": pd.Series(rows["tid"], dtype=object),
        "ts_ns": np.asarray(rows["ts_ns"], dtype=np.int64),
        "end_ns": np.asarray(rows["end_ns"], dtype=np.int64),
        "flops": np.asarray(rows["flops"], dtype=np.float64),
        "input_dims": pd.Series(rows["input_dims"], dtype=object),
        "input_type": pd.Series(rows["input_type"], dtype=object),
        "concrete_inputs": pd.Series(rows["concrete_inputs"], dtype=object),
    })
    # An op before those nested in it, where both start at the same time: the longer first.
    return frame.sort_values(["tid", "ts_ns", "end_ns"], ascending=[True, True, False],
                             kind="stable", ignore_index=True)

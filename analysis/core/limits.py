"""The sane range of every number the analysis reads from a file (docs/reliability.md, "Damaged
and hostile input"), and array-wide checks against them.

A value outside its range is named as a problem (file, rank, field, value) and set aside alone:
the event, record or claim that holds it, never the file. The ranges are wide enough for any real
run and narrow enough that no value inside them can overflow int64 arithmetic (a time plus a
duration, nanoseconds from microseconds) or make memory or time grow past what the files hold.
This module imports no pandas: Kineto decoding uses it (analysis.ingest.kineto).
"""

from __future__ import annotations

import math
import os

import numpy as np

from tracer.options.environment import MAX_TRACE_ENV

# Ranks in one job: the largest jobs run ~10^5 ranks; anything per rank stays cheap up to this.
MAX_WORLD_SIZE = 1 << 20
# Optimizer steps of one run: 2^31 is 68 years at one step a second.
MAX_STEP = (1 << 31) - 1
# A point in time, in ns from its clock's origin (time.time_ns's epoch, or a Kineto trace's own):
# 2^62 ns is 146 years; the headroom below int64's 2^63 lets a time and a duration add safely.
MAX_TIME_NS = 1 << 62
# One event's, op's or step's duration: no profiler window, step or collective lasts 11 days.
MAX_DURATION_NS = 10 ** 15
# One op's bytes, and any count a record carries (ops, samples, bytes written): 1 PiB and 2^62.
MAX_BYTES = 1 << 50
MAX_COUNT = 1 << 62
# Kineto writes microseconds: the same limits in its unit.
MAX_TS_US = MAX_TIME_NS // 1000
MAX_DUR_US = MAX_DURATION_NS // 1000


def outside(values: np.ndarray, low, high) -> np.ndarray:
    """Where `values` (a numeric array; NaN counts as outside) is not within [low, high]."""
    with np.errstate(invalid="ignore"):
        return ~((values >= low) & (values <= high))


def as_number(value) -> float:
    """A value read as a float: NaN for what is not a number (bools included); an int too large
    for a float is out of every range, whatever its size."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return math.nan
    try:
        return float(value)
    except OverflowError:
        return _FAR if value > 0 else -_FAR


_FAR = 1e300  # a number out of every range, finite


def as_floats(values) -> np.ndarray:
    """A column of numbers (ints of any size, floats, None) as float64, None as NaN, anything
    that is not a number as NaN."""
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        return np.array([as_number(v) for v in values], dtype=np.float64)


def shown(value) -> str:
    """A value as a problem line names it: an integer in full up to 24 digits, else short."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = int(value)
        if -10 ** 24 < value < 10 ** 24:
            return str(value)
        try:
            return f"{float(value):.3g}"
        except OverflowError:  # past float's range (and str's limit of 4300 digits, maybe)
            return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.6g}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def int_within(value, low: int, high: int) -> bool:
    """Whether `value` is an int (not a bool) within [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


# The most JSON one trace file may hold (decompressed): a file read a chunk at a time takes about
# 0.7 bytes of memory per byte of JSON, its events frame about 0.5 (docs/analysis.md, "Large runs
# and Dask"). RANKTRACE_MAX_TRACE_MB (MAX_TRACE_ENV, named in tracer.options.environment, which
# the tracer lets through) overrides it.
MAX_TRACE_MB = 2048
# A file that defeats chunking is decoded whole, which takes about four times the memory: it may
# hold only this share of the limit.
WHOLE_DECODE_SHARE = 4
MB = 1 << 20


def max_trace_bytes() -> int:
    """The limit on one trace file's JSON, in bytes: RANKTRACE_MAX_TRACE_MB or MAX_TRACE_MB.

    Raises ValueError naming the variable when it is not a positive number.
    """
    text = os.environ.get(MAX_TRACE_ENV, "").strip()
    if not text:
        return MAX_TRACE_MB * MB
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = 0.0
    if not megabytes > 0 or megabytes == float("inf"):
        raise ValueError(f"{MAX_TRACE_ENV}={text!r}: not a positive number of MB")
    return int(megabytes * MB)

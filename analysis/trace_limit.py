"""How much JSON one trace file may hold (docs/analysis.md, "Large runs and Dask"). Without numpy
or pandas: the command reads the limit before it forks its decoder (analysis.parse_ahead)."""

from __future__ import annotations

import os

# The most JSON one trace file may hold (decompressed): a file read a chunk at a time takes about
# 0.7 bytes of memory per byte of JSON, its events frame about 0.5 (docs/analysis.md, "Large runs
# and Dask"). RANKTRACE_MAX_TRACE_MB overrides it.
MAX_TRACE_MB = 2048
MAX_TRACE_ENV = "RANKTRACE_MAX_TRACE_MB"
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

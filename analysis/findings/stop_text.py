"""How the stop diagnosis writes sizes, rank lists and clock times."""

from __future__ import annotations

import datetime

from analysis.core.steps import format_ranges


def mbytes(nbytes) -> str:
    if nbytes != nbytes:
        return "? B"
    nbytes = int(nbytes)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def ranks_text(ranks) -> str:
    ranks = sorted(int(r) for r in ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + format_ranges(ranks)


def clock_text(t_ns) -> str:
    """Local wall-clock time of a host-clock nanosecond stamp."""
    return datetime.datetime.fromtimestamp(int(t_ns) / 1e9).strftime("%H:%M:%S")


def op_signature(row) -> str:
    """What the members must agree on at a position: op, size and dtype."""
    return f"{row['op']} {mbytes(row['bytes'])} {row['dtype']}"

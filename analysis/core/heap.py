"""Memory made ready while a command would only wait (analysis.ingest.parse_ahead).

A process's first write to a page of fresh memory is a page fault: the kernel finds and zeroes a
page. On a virtual machine it costs a few microseconds a page; the events frame of a 50 MB trace
and its unpickled columns take about 6,500 new pages, 10 ms of the command's path, while the
command had been waiting 20-30 ms for its decoder child with nothing to do. `keep_freed_memory`
has glibc's allocator serve large blocks from its heap and keep what is freed there instead of
handing it back (both on glibc only); `fault_in_while` then writes to heap memory while the
command waits, and frees it: what the command allocates next reuses those pages, faulted in
already. The results are the same; only where the time is spent changes.
"""

from __future__ import annotations

import os
from collections.abc import Callable

# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks up to this size come from the heap: a column of an events frame of millions of rows.
_FROM_HEAP_BYTES = 64 << 20
# Freed memory is handed back to the system only beyond this much at the heap's top.
_KEPT_BYTES = 1 << 30
_PIECE_BYTES = 1 << 20


def keep_freed_memory() -> bool:
    """Whether glibc's allocator now serves blocks of up to _FROM_HEAP_BYTES from its heap and
    keeps freed memory there (False: not glibc, or it refused)."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        import ctypes  # numpy has imported it already: no import time

        mallopt = ctypes.CDLL(None).mallopt
        return bool(mallopt(_M_MMAP_THRESHOLD, _FROM_HEAP_BYTES)
                    and mallopt(_M_TRIM_THRESHOLD, _KEPT_BYTES))
    except (AttributeError, OSError, ValueError):
        return False


def fault_in_while(waiting: Callable[[], bool], limit: int) -> int:
    """Write to new heap memory a MiB at a time while `waiting()` and under `limit` bytes, then
    free it for what comes next (keep_freed_memory first, or it is handed back); the bytes
    written."""
    pieces = []
    written = 0
    while written + _PIECE_BYTES <= limit and waiting():
        pieces.append(bytearray(_PIECE_BYTES))  # zeroed: every page written
        written += _PIECE_BYTES
    del pieces
    return written

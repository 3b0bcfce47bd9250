"""analysis.core.heap: memory is written while the caller waits, up to its limit, and stops the
moment the wait ends."""

from __future__ import annotations

import os
import sys

import pytest

from analysis.core.heap import _PIECE_BYTES, fault_in_while, keep_freed_memory


def test_memory_is_written_while_waiting_and_not_after():
    answers = iter([True, True, True, False, True])
    assert fault_in_while(lambda: next(answers), 100 * _PIECE_BYTES) == 3 * _PIECE_BYTES


def test_memory_written_stays_within_the_limit():
    assert fault_in_while(lambda: True, 5 * _PIECE_BYTES + 1) == 5 * _PIECE_BYTES
    assert fault_in_while(lambda: True, _PIECE_BYTES - 1) == 0


def test_nothing_is_written_when_the_wait_is_over():
    assert fault_in_while(lambda: False, 100 * _PIECE_BYTES) == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_glibcs_allocator_keeps_freed_memory_where_it_is_glibc():
    try:
        glibc = bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        glibc = False
    # In a child: the setting is the process's for good, and would change how much later tests
    # in this one see its resident memory grow.
    pid = os.fork()
    if pid == 0:
        os._exit(0 if keep_freed_memory() is glibc else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0

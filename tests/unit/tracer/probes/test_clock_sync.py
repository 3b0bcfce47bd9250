"""Clock offsets to rank 0 (tracer.probes.clock_sync): measured within their uncertainty over a
store, and given up on in bounded time when rank 0 never answers."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from tracer.probes.clock_sync import measure_clock_offset


def test_clock_offset_is_measured_within_its_uncertainty():
    store = dist.HashStore()
    skew_ns = 7_000_000_000  # rank 1's clock runs 7 s ahead of rank 0's
    results = {}

    def rank(r, clock):
        results[r] = measure_clock_offset(store, r, 3, "ranktrace/clock/t", round_trips=5,
                                          timeout_s=10, clock=clock)

    threads = [threading.Thread(target=rank, args=(1, lambda: time.time_ns() + skew_ns)),
               threading.Thread(target=rank, args=(2, time.time_ns))]
    for t in threads:
        t.start()
    rank(0, time.time_ns)
    for t in threads:
        t.join(10)
    assert results[0] == (0, 0, 0)
    for r, true_offset in ((1, skew_ns), (2, 0)):
        offset, uncertainty, round_trips = results[r]
        assert round_trips == 5
        assert 0 < uncertainty < 1_000_000_000
        assert abs(offset - true_offset) <= uncertainty


def test_clock_sync_gives_up_instead_of_hanging():
    with pytest.raises(Exception, match="ranktrace/clock/u/1/pong0|gave up|timeout|Timeout"):
        measure_clock_offset(dist.HashStore(), 1, 2, "ranktrace/clock/u", timeout_s=0.3)

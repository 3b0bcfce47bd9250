"""Clock offsets to rank 0 (tracer.probes.clock_sync): measured within their uncertainty over a
store, and given up on in bounded time when rank 0 never answers; measured at once by a clock
sync that starts in a process group, after telling the session the rank it has there."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from tracer.probes.clock_sync import ClockSync, measure_clock_offset


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


def test_a_clock_sync_started_in_a_process_group_measures_at_once_and_names_the_rank(one_rank):
    written, joined = [], []
    clock = ClockSync(written.append, 0, lambda rank, world: joined.append((rank, world)))
    clock.start()
    try:
        assert joined == [(0, 1)]
        (record,) = written
        assert (record.rank, record.world_size, record.round_trips) == (0, 1, 0)
    finally:
        clock.close()


def test_a_session_that_closes_on_hearing_the_rank_measures_nothing(one_rank):
    written = []
    clock = ClockSync(written.append, 0, lambda rank, world: clock.close())
    clock.start()
    assert written == [] and not clock.failed

"""torch's Flight Recorder entries as ranktrace records: op names, nccl-tests sizes, timing, and
which entries a hooked call issued (tracer.comms.flight_entries)."""

import msgspec
import pytest

from helpers.flight_entries import MAIN_THREAD, T0, ddp_gloo_entries, gloo_entry, nccl_entry
from tracer import schema
from tracer.comms.flight_entries import (
    RETIRE_WAIT_NS,
    FrEntry,
    is_done,
    native_op,
    op_name,
    payload,
    span_index,
    within_span,
)


def entry(raw: dict) -> FrEntry:
    return msgspec.convert(raw, FrEntry)


@pytest.mark.parametrize("name, expected", [
    ("gloo:all_reduce", ("all_reduce", None, None)),
    ("nccl:all_reduce", ("all_reduce", None, None)),
    ("nccl:_allgather_base", ("all_gather", None, None)),
    ("nccl:_reduce_scatter_base", ("reduce_scatter", None, None)),
    ("nccl:all_reduce_barrier", ("barrier", None, None)),
    ("gloo:barrier", ("barrier", None, None)),
    ("nccl:send 0->1", ("send", 0, 1)),
    ("nccl:recv 0<-1", ("recv", 1, 0)),
    ("gloo:no_such_op", None),
])
def test_profiling_names_map_to_comm_ops(name, expected):
    assert op_name(name) == expected


def test_sizes_follow_the_nccl_tests_convention():
    entries = [entry(e) for e in ddp_gloo_entries()]
    # (dtype, elements, bytes); all_gather: the gathered output, 2 parts of one int64
    assert payload("all_gather", entries[0], 2) == ("int64", 2, 16)
    assert payload("broadcast", entries[2], 2) == ("float32", 110, 440)
    assert payload("all_reduce", entries[3], 2) == ("float32", 110, 440)
    assert payload("broadcast", entries[4], 2) == ("int32", 3, 12)
    assert payload("barrier", entries[7], 2) == ("none", 0, 0)
    gather = entry(gloo_entry(9, 9, "gloo:gather", T0, [[5]], ["Half"], []))
    assert payload("gather", gather, 4) == ("float16", 20, 40)
    scatter = entry(gloo_entry(9, 9, "gloo:scatter", T0, [], ["Double"], [[3]]))
    assert payload("scatter", scatter, 4) == ("float64", 12, 96)
    assert native_op(entries[3], 2, 0).elements == 110


def test_a_gloo_entry_becomes_an_issue_timed_native_record():
    raw = ddp_gloo_entries()[6]
    op = native_op(entry(raw), 2, step=1)
    record = op.comm_record(entry(raw))
    assert (record.op, record.source, record.pg, record.pg_size, record.dtype, record.bytes) == (
        "all_reduce", "native", "0", 2, "float32", 440)
    assert record.step == 1 and record.position == 6  # collective_seq_id 7, 0-based
    assert record.timing == schema.TIMING_ISSUE == "issue"
    assert record.start_ns == record.end_ns == raw["time_created_ns"]
    assert record.duration_us == record.algbw_gbps == record.busbw_gbps == 0.0
    issue = op.issue_record()
    assert (issue.source, issue.position, issue.issue_ns, issue.bytes) == (
        "native", 6, raw["time_created_ns"], 440)


def test_an_nccl_entry_with_timing_gets_its_cuda_event_duration():
    raw = nccl_entry(3, 4, T0, duration_ms=0.5, sizes=((1_000_000,),), dtype="Float")
    op = native_op(entry(raw), 8, step=0)
    record = op.comm_record(entry(raw))
    assert record.timing == "cuda_event"
    assert record.duration_us == pytest.approx(500.0)
    assert record.end_ns == T0 + 500_000
    assert record.algbw_gbps == pytest.approx(4e6 / 0.5e-3 / 1e9)  # 8 GB/s
    assert record.busbw_gbps == pytest.approx(record.algbw_gbps * 2 * 7 / 8)


def test_an_nccl_entry_without_timing_is_issue_timed_and_waits_until_done():
    started = entry(nccl_entry(3, 4, T0, state="started"))
    assert not is_done(started)
    done = entry(nccl_entry(3, 4, T0, state="completed"))
    assert is_done(done, T0)
    assert native_op(done, 2, 0).comm_record(done).timing == "issue"


def test_an_nccl_entry_seen_complete_waits_for_the_watchdog_that_times_it():
    # torch's dump marks an entry completed as soon as its end event has run; the watchdog
    # retires it later, and only then sets duration_ms (TORCH_NCCL_ENABLE_TIMING=1).
    seen = entry(nccl_entry(3, 4, T0, state="completed", retired=False))
    completed = seen.time_discovered_completed_ns
    assert completed == T0 + 5000
    assert not is_done(seen, completed + RETIRE_WAIT_NS - 1)
    retired = entry(nccl_entry(3, 4, T0, state="completed", duration_ms=0.25))
    assert is_done(retired, completed + 1)
    assert native_op(retired, 2, 0).comm_record(retired).duration_us == pytest.approx(250.0)
    # never retired: written untimed once it has waited long enough, or at the last drain
    assert is_done(seen, completed + RETIRE_WAIT_NS)
    assert is_done(seen, None)
    assert not is_done(entry(nccl_entry(3, 4, T0, state="started")), None)


def test_native_p2p_takes_its_peer_from_the_name_and_its_position_from_p2p_seq():
    raw = nccl_entry(5, 0, T0, name="nccl:send 0->1", p2p_seq=3)
    op = native_op(entry(raw), 2, 0, global_rank=lambda local: local + 10)
    assert (op.op, op.peer, op.position) == ("send", 11, 2)


def test_unknown_ops_give_no_record():
    assert native_op(entry(gloo_entry(0, 1, "gloo:mystery", T0, [[1]], ["Float"])), 2, 0) is None


def test_entries_inside_a_hooked_call_on_their_thread_are_the_hooks():
    spans = span_index([[MAIN_THREAD, T0 - 10, T0 + 10], [MAIN_THREAD, T0 + 100, None],
                        [7, T0 + 40, T0 + 60]])
    inside = entry(gloo_entry(0, 1, "gloo:all_reduce", T0, [[1]], ["Float"]))
    between = entry(gloo_entry(1, 2, "gloo:all_reduce", T0 + 50, [[1]], ["Float"]))
    other_thread = entry(gloo_entry(2, 3, "gloo:all_reduce", T0 + 50, [[1]], ["Float"],
                                    thread=7))
    still_open = entry(gloo_entry(3, 4, "gloo:all_reduce", T0 + 500, [[1]], ["Float"]))
    before = entry(gloo_entry(4, 5, "gloo:all_reduce", T0 - 11, [[1]], ["Float"]))
    assert within_span(spans, inside)
    assert not within_span(spans, between)  # the reducer's, between two hooked calls
    assert within_span(spans, other_thread)
    assert within_span(spans, still_open)
    assert not within_span(spans, before)


def test_an_op_issued_at_a_coalescing_blocks_end_is_the_blocks():
    # The block [0, 100] holds two hooked calls; its coalesced op is created at its exit.
    spans = span_index([[MAIN_THREAD, T0, T0 + 100], [MAIN_THREAD, T0 + 10, T0 + 20],
                        [MAIN_THREAD, T0 + 30, T0 + 40]])
    at_exit = entry(gloo_entry(0, 1, "nccl:all_reduce_coalesced", T0 + 90, [[1]], ["Float"]))
    assert within_span(spans, at_exit)

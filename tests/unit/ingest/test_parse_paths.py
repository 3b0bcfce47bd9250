"""The parser's fast paths give what its general paths give (analysis.ingest.kineto).

Events are decoded by a union tagged by "ph" that materialises little of the events that are not
complete ("X") events; what it cannot take is decoded again by the general decoder.
"""

import gzip
import json
import re

import msgspec
import pandas as pd
import pytest

from analysis.core.frames import events_frame
from analysis.ingest import kineto, parsed_trace
from analysis.ingest.kineto import TraceReadError

COMPLETE = {"ph": "X", "cat": "kernel", "pid": 0, "tid": 7}


def trace_text(events: list) -> str:
    """A trace of `events` (dicts, or JSON text for what json.dumps cannot write)."""
    body = ",\n".join(e if isinstance(e, str) else json.dumps(e) for e in events)
    return '{"distributedInfo": {"rank": 1, "world_size": 2},\n"traceEvents": [\n' + body + "]}"


def mixed_events() -> list:
    return [
        {"ph": "M", "name": "process_name", "ts": 0, "pid": 0, "args": {"name": "python"}},
        {**COMPLETE, "name": "ncclDevKernel_AllReduce", "ts": 10, "dur": 5,
         "args": {"stream": 7, "correlation": 3, "Collective name": "allreduce",
                  "In msg nelems": 4, "Input Dims": [[2, 2]]}},
        {"ph": "f", "id": 3, "ts": 12, "pid": 0, "tid": 7, "args": {"stream": 9}},
        {**COMPLETE, "cat": "cpu_op", "name": "ProfilerStep#1", "ts": 0, "dur": 40},
        {"ph": "s", "id": 3, "ts": 2, "pid": 0, "tid": 1},
        {"ph": "i", "name": "mark", "ts": 20, "pid": 0, "tid": 1, "s": "t"},
        {"ph": "B", "name": "open", "ts": 21}, {"ph": "E", "ts": 22},
        {"ph": "C", "name": "memory", "ts": 23, "args": {"bytes": 5}},
        {**COMPLETE, "name": "gemm", "ts": 30, "dur": 2, "args": {"stream": 7}},
    ]


class _Refusing:
    """A decoder that takes nothing, as the fast decoder does with what it cannot decode."""

    def __init__(self, calls: list):
        self.calls = calls

    def decode(self, data):
        self.calls.append(len(data))
        raise msgspec.ValidationError("refused")


class _Counting:
    def __init__(self, real, calls: list):
        self.real, self.calls = real, calls

    def decode(self, data):
        self.calls.append(len(data))
        return self.real.decode(data)


def cut_small(monkeypatch):
    """Cut the events into chunks of a few events, each decoded on its own."""
    monkeypatch.setattr(kineto, "READ_BYTES", 64)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 256)


def parse_both(path, monkeypatch, chunked=True):
    fast = parsed_trace.parse_trace(path, chunked=chunked)
    calls = []
    with monkeypatch.context() as patch:
        for decoder in (kineto.EVENTS_DECODER, kineto.TRACE_DECODER):
            patch.setattr(decoder, "fast", _Refusing(calls))
        patch.setattr(kineto, "INT_TIMED_EVENTS_DECODER", _Refusing(calls))
        general = parsed_trace.parse_trace(path, chunked=chunked)
    assert calls  # the general decoder really was the one used
    return fast, general


def assert_same(a, b):
    pd.testing.assert_frame_equal(a.events, b.events, check_exact=True)
    pd.testing.assert_frame_equal(a.steps, b.steps, check_exact=True)
    assert (a.rank, a.world_size, a.float_timestamps, a.problems) == (
        b.rank, b.world_size, b.float_timestamps, b.problems)


@pytest.mark.parametrize("chunked, small", [(True, False), (True, True), (False, False)])
def test_fast_and_general_decoders_give_the_same_trace(tmp_path, monkeypatch, chunked, small):
    chunks = []
    if small:
        cut_small(monkeypatch)
        monkeypatch.setattr(kineto, "INT_TIMED_EVENTS_DECODER",
                            _Counting(kineto.INT_TIMED_EVENTS_DECODER, chunks))
    path = tmp_path / "t.json"
    path.write_text(trace_text(mixed_events()))
    fast, general = parse_both(path, monkeypatch, chunked)
    assert len(chunks) > 1 if small else not chunks
    assert_same(fast, general)
    events = fast.events
    assert events["name"].astype(str).tolist() == ["ncclDevKernel_AllReduce", "ProfilerStep#1",
                                                   "gemm"]
    assert events["ts_ns"].tolist() == [10_000, 0, 30_000]
    assert events["stream"].tolist() == [7, -1, 7]
    assert events["correlation"].tolist() == [3, -1, -1]
    assert events["is_comm"].tolist() == [True, False, False]
    assert events["collective"].tolist() == ["allreduce", None, None]
    assert events["input_dims"].tolist() == ["[[2, 2]]", None, None]
    assert not fast.float_timestamps  # every ts an integer, and no event without one
    assert fast.steps["step"].tolist() == [1] and fast.rank == 1


def test_a_float_ts_outside_complete_events_still_counts(tmp_path, monkeypatch):
    # HTA reads every event's ts: one float among the flows makes the timestamps float.
    events = mixed_events()
    events[2]["ts"] = 12.5
    path = tmp_path / "t.json"
    path.write_text(trace_text(events))
    fast, general = parse_both(path, monkeypatch)
    assert fast.float_timestamps and general.float_timestamps
    assert_same(fast, general)


def test_every_phase_of_the_trace_event_format_takes_the_fast_decoder(tmp_path, monkeypatch):
    phases = "B E X i I C b n e S T p F s t f P N O D M V v R c ( )".split()
    events = [{"ph": ph, "name": f"e{i}", "cat": "kernel", "ts": i, "dur": 1, "pid": 0, "tid": 7,
               "args": {"stream": 7, "id": i}} for i, ph in enumerate(phases)]
    path = tmp_path / "t.json"
    path.write_text(trace_text(events))
    fallbacks = []
    for decoder in (kineto.EVENTS_DECODER, kineto.TRACE_DECODER):
        monkeypatch.setattr(decoder, "general", _Counting(decoder.general, fallbacks))
    fast = parsed_trace.parse_trace(path)
    assert not fallbacks
    assert fast.events["name"].astype(str).tolist() == ["e2"]
    fast_again, general = parse_both(path, monkeypatch)
    assert_same(fast, general)


@pytest.mark.parametrize("small", [False, True])
@pytest.mark.parametrize("odd, rows", [
    ('{"ph": 5, "name": "a", "ts": 1, "dur": 1}', 3),
    ('{"name": "a", "ts": 1, "dur": 1}', 3),
    ('{"ph": "Z", "name": "a", "ts": 1, "dur": 1}', 3),
    ('{"ph": null, "name": "a", "ts": 1, "dur": 1}', 3),
    # a key given twice: the last one is the event's phase
    ('{"ph": "X", "ph": "s", "name": "a", "ts": 1, "dur": 1}', 3),
    ('{"ph": "s", "ph": "X", "name": "a", "ts": 1, "dur": 1}', 4),
])
def test_a_phase_the_fast_decoder_cannot_take_is_decoded_by_the_general_one(tmp_path, monkeypatch,
                                                                            odd, rows, small):
    if small:
        cut_small(monkeypatch)
    path = tmp_path / "t.json"
    path.write_text(trace_text(mixed_events() + [odd]))
    fallbacks = []
    for decoder in (kineto.EVENTS_DECODER, kineto.TRACE_DECODER):
        monkeypatch.setattr(decoder, "general", _Counting(decoder.general, fallbacks))
    fast, general = parse_both(path, monkeypatch)
    assert fallbacks  # the fast decoder refused the chunk, and the general one decoded it
    assert len(fast.events) == rows
    assert_same(fast, general)


@pytest.mark.parametrize("chunked", [True, False])
def test_arguments_that_are_not_an_object_fail_either_way(tmp_path, monkeypatch, chunked):
    # The general decoder refuses them on any event; skipping them on flows would read a file
    # it refuses.
    events = mixed_events()
    events[4]["args"] = 5
    path = tmp_path / "t.json"
    path.write_text(trace_text(events))
    with pytest.raises(TraceReadError) as fast:
        parsed_trace.parse_trace(path, chunked=chunked)
    assert "not a Kineto trace" in str(fast.value)
    with monkeypatch.context() as patch:
        for decoder in (kineto.EVENTS_DECODER, kineto.TRACE_DECODER):
            patch.setattr(decoder, "fast", _Refusing([]))
        with pytest.raises(TraceReadError) as general:
            parsed_trace.parse_trace(path, chunked=chunked)
    assert str(fast.value) == str(general.value)


# ---- gzip, read by ISA-L ----------------------------------------------------------------------
def two_member_gzip(tmp_path, damage: str):
    """A trace gzipped as two members (as concatenated copies are), damaged as named."""
    events = [{**COMPLETE, "name": f"kernel{i % 7}", "ts": i * 10, "dur": 5, "args": {"stream": 7}}
              for i in range(600)]
    text = trace_text(events).encode()
    first, second = gzip.compress(text[:9000], mtime=0), gzip.compress(text[9000:], mtime=0)
    data = bytearray(first + second)
    if damage == "crc":
        data[-6] ^= 0xFF
    elif damage == "length":
        data[len(first) - 2] ^= 1
    elif damage == "deflate":
        data[len(first) + len(second) // 2] ^= 0x55
    elif damage == "magic":
        data[len(first) + 1] ^= 1
    elif damage == "truncated":
        del data[len(first) + len(second) // 2:]
    elif damage == "garbage":
        data += b"\0\0xyz"
    elif damage == "zeros":
        data += b"\0\0\0"
    path = tmp_path / "t.json.gz"
    path.write_bytes(bytes(data))
    return path


def parse_outcome(path):
    try:
        return parsed_trace.parse_trace(path)
    except TraceReadError as exc:
        return str(exc)


DAMAGES = ["none", "crc", "length", "deflate", "magic", "truncated", "garbage", "zeros"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_gzip_file_is_named_as_such(tmp_path, monkeypatch, damage):
    monkeypatch.setattr(kineto, "READ_BYTES", 1024)
    outcome = parse_outcome(two_member_gzip(tmp_path, damage))
    if damage in ("none", "zeros"):
        assert len(outcome.events) == 600
    else:
        assert "truncated or corrupt gzip" in outcome


# ---- where a chunk is cut ------------------------------------------------------------------------
BETWEEN_EVENTS = re.compile(rb"\}\s*,\s*\{")


@pytest.mark.parametrize("padding", [b"", b" ", b"\n  \t", b" " * 300])
def test_the_cut_is_the_last_place_between_two_events(padding):
    # events of very different lengths, nested arguments that hold "},{" too, and white space
    # between the events of every length the backward reads step through
    events = [json.dumps({"ph": "X", "name": "n" * (7 ** (i % 5)),
                          "args": {"a": [{"b": i}, {"c": i}]}}).encode() for i in range(40)]
    buffer = bytearray(b"[" + (padding + b"," + padding).join(events) + b"]")
    everywhere = [(m.start(), m.end() - 1) for m in BETWEEN_EVENTS.finditer(buffer)]
    assert len(everywhere) > 40  # the nested arguments hold some too
    for filled in range(0, len(buffer) + 1, 97):
        before = [span for span in everywhere if span[1] < filled]
        assert kineto._last_cut(buffer, filled) == (before[-1] if before else None)
        # looking only from `searched` on finds the same cut where it lies after it
        searched = filled // 2
        after = [span for span in before if span[1] >= searched]
        assert kineto._last_cut(buffer, filled, searched) == (after[-1] if after else None)


# ---- ProfilerStep spans --------------------------------------------------------------------------
def test_profiler_steps_are_the_host_spans_one_per_step():
    names = ["ProfilerStep#2", "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3",
             "ProfilerStep#4", "aten::mm", "ProfilerStep#2"]
    cats = ["cpu_op", "user_annotation", "cpu_op", "gpu_user_annotation", None, "cpu_op",
            "cpu_op"]
    starts = [100, 0, 100, 200, 300, 5, 90]
    ends = [150, 90, 180, 290, 390, 9, 180]
    events = events_frame({"name": names, "cat": cats, "ts_ns": starts,
                           "dur_ns": [e - s for s, e in zip(starts, ends)],
                           "pid": ["1"] * 7, "tid": ["1"] * 7})
    steps = parsed_trace.profiler_steps(events)
    # step 3 is on the GPU and step 4 has no category: neither is a host span; of step 2's
    # three spans, the two longest end alike and the first in the file is kept
    assert steps["step"].tolist() == [1, 2]
    assert steps["start_ns"].tolist() == [0, 100]
    assert steps["end_ns"].tolist() == [90, 180]


@pytest.mark.parametrize("float_at", [None, 0, 40])
def test_integer_timed_chunks_need_no_timestamp_check_and_a_float_later_still_counts(
        tmp_path, monkeypatch, float_at):
    # Chunks of a few events: those before the float one are decoded with integer timestamps,
    # it and every chunk after it as before; the frame is the general decoder's either way.
    cut_small(monkeypatch)
    events = [{**COMPLETE, "name": f"op{i}", "ts": 10 * i, "dur": 5} for i in range(60)]
    if float_at is not None:
        events.insert(float_at, {"ph": "f", "id": 1, "ts": 12.5, "pid": 0, "tid": 7})
    path = tmp_path / "t.json"
    path.write_text(trace_text(events))
    int_timed = []
    monkeypatch.setattr(kineto, "INT_TIMED_EVENTS_DECODER",
                        _Counting(kineto.INT_TIMED_EVENTS_DECODER, int_timed))
    fast, general = parse_both(path, monkeypatch)
    assert fast.float_timestamps is (float_at is not None) is general.float_timestamps
    assert len(int_timed) > 1 if float_at != 0 else len(int_timed) == 1
    assert_same(fast, general)

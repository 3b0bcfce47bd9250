"""The frame contract (analysis.core.frames): the parser's events and steps frames meet it, a frame
built by hand from plain lists has exactly the parser's dtypes, and a wrong frame raises TypeError
naming the column, the dtype expected and the dtype found. Ranks are ints (analysis.core.model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.core import frames
from analysis.core.event_kinds import EVENT_COLUMNS, STEP_COLUMNS
from analysis.core.model import UNKNOWN_RANK, RankTrace, known_rank
from analysis.ingest.cache import read_trace
from analysis.ingest.load import load_path
from analysis.ingest.parsed_trace import parse_trace
from helpers.comm_events import event, events_frame
from helpers.synthetic import TraceBuilder, trace_name


def gpu_trace(rank=0, steps=(1, 2)) -> TraceBuilder:
    b = TraceBuilder(rank=rank, world_size=2)
    for n in steps:
        start = (n - 1) * 100
        b.step(n, start, start + 100).compute(start + 10, start + 40).nccl(start + 30, start + 60)
        b.memcpy(start + 70, start + 75)
    b.op("record_param_comms", 5, 6, args={
        "Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
        "dtype": "Float", "Group size": 2, "Process Group Name": "0",
        "Input Dims": [[1024]], "Input type": ["float"]})
    b.annotation("gloo:all_reduce", 7, 9, tid=2)
    return b


@pytest.fixture
def parsed(tmp_path):
    return parse_trace(gpu_trace().write(tmp_path / trace_name(0)))


def dtypes(frame: pd.DataFrame) -> dict:
    """Each column's dtype, a categorical's with its categories' dtype."""
    return {c: (str(d), str(d.categories.dtype)) if isinstance(d, pd.CategoricalDtype) else str(d)
            for c, d in frame.dtypes.items()}


# ---- the parser's frames ------------------------------------------------------------------------
def test_the_parsers_frames_meet_the_contract(parsed):
    assert frames.check_events(parsed.events) is parsed.events
    assert frames.check_steps(parsed.steps) is parsed.steps
    assert list(parsed.events.columns) == EVENT_COLUMNS
    assert list(parsed.steps.columns) == STEP_COLUMNS
    assert dtypes(parsed.events) == {c: ("category", "object") if d is frames.CATEGORY else str(d)
                                     for c, d in frames.EVENT_DTYPES.items()}
    frames.check_events(frames.empty_events())
    frames.check_steps(frames.steps_frame())


def test_a_cached_trace_and_merged_windows_have_the_parsers_dtypes(tmp_path, parsed):
    path = gpu_trace().write(tmp_path / "cached" / trace_name(0))
    read_trace(path)  # writes the Parquet cache
    cached = read_trace(path)
    pd.testing.assert_frame_equal(cached.events, parse_trace(path).events, check_exact=True)
    assert dtypes(cached.events) == dtypes(parsed.events)
    run = tmp_path / "windows"
    gpu_trace(steps=(1, 2)).write(run / trace_name(0, span=111))
    later = gpu_trace(steps=(5, 6))
    later.events = later.events[3:]  # other categories, in another order
    later.write(run / trace_name(0, span=222))
    merged = load_path(run, use_cache=False).ranks[0]
    assert merged.extra_paths and dtypes(merged.events) == dtypes(parsed.events)


# ---- built by hand ------------------------------------------------------------------------------
def test_the_builder_gives_the_parsers_frame_from_plain_lists(parsed):
    by_hand = frames.events_frame({c: parsed.events[c].tolist() for c in EVENT_COLUMNS})
    pd.testing.assert_frame_equal(by_hand, parsed.events, check_exact=True)
    assert dtypes(by_hand) == dtypes(parsed.events)
    steps = frames.steps_frame(*(parsed.steps[c].tolist() for c in STEP_COLUMNS))
    pd.testing.assert_frame_equal(steps, parsed.steps, check_exact=True)


def test_rows_written_by_hand_get_the_parsers_dtypes(parsed):
    rows = [event("aten::mm", "cpu_op", 0, 10),
            event("ncclKernel_AllReduce", "kernel", 5, 3, tid="7", is_gpu=True, is_comm=True,
                  collective="allreduce", in_nelems=1024, pg_name="0")]
    assert dtypes(events_frame(rows)) == dtypes(parsed.events)
    assert dtypes(events_frame([])) == dtypes(parsed.events)
    # Columns left out take an event's defaults; end_ns is ts_ns + dur_ns.
    least = frames.events_frame({"name": ["k"], "cat": ["kernel"], "ts_ns": [5], "dur_ns": [3],
                                 "pid": [0], "tid": [7]})
    assert dtypes(least) == dtypes(parsed.events)
    assert least.iloc[0][["end_ns", "stream", "correlation", "is_gpu", "pid"]].tolist() == \
        [8, -1, -1, False, "0"]
    assert least["collective"].tolist() == [None] and np.isnan(least["in_nelems"].iloc[0])


# ---- wrong frames -------------------------------------------------------------------------------
def test_an_object_name_column_is_refused_naming_it(parsed):
    with pytest.raises(TypeError, match=r"column 'name': expected category of object, found "
                                        r"object"):
        frames.check_events(parsed.events.astype({"name": object}))
    with pytest.raises(TypeError, match=r"column 'pid': expected category of object, found "
                                        r"object"):
        frames.events_frame({**{c: parsed.events[c] for c in EVENT_COLUMNS},
                             "pid": parsed.events["pid"].astype(object)})


def test_str_categories_are_refused_and_made_objects_by_contract_categories(parsed):
    as_parquet = parsed.events.astype({"tid": pd.CategoricalDtype(
        parsed.events["tid"].cat.categories.astype("str"))})
    with pytest.raises(TypeError, match=r"column 'tid': expected category of object, found "
                                        r"category of str"):
        frames.check_events(as_parquet)
    mended = frames.check_events(frames.contract_categories(as_parquet))
    pd.testing.assert_frame_equal(mended, parsed.events, check_exact=True)


def test_other_wrong_columns_are_refused_naming_them(parsed):
    with pytest.raises(TypeError, match=r"column 'ts_ns': expected int64, found float64"):
        frames.check_events(parsed.events.astype({"ts_ns": "float64"}))
    with pytest.raises(TypeError, match=r"column 'is_comm': expected bool, found object"):
        frames.events_frame({**{c: parsed.events[c] for c in EVENT_COLUMNS},
                             "is_comm": [None] * len(parsed.events)})
    with pytest.raises(TypeError, match=r"no column 'cat'"):
        frames.check_events(parsed.events.drop(columns="cat"))
    with pytest.raises(TypeError, match=r"no column 'tid'"):
        frames.events_frame({"name": ["k"], "cat": ["kernel"], "ts_ns": [5], "dur_ns": [3],
                             "pid": ["0"]})


def test_a_float_step_is_refused_naming_it():
    with pytest.raises(TypeError, match=r"steps frame column 'step': expected int64, found "
                                        r"float64"):
        frames.steps_frame([1.0, 2.0], [0, 100], [100, 200])
    with pytest.raises(TypeError, match=r"column 'end_ns': expected int64, found float64"):
        frames.check_steps(pd.DataFrame({"step": [1], "start_ns": [0], "end_ns": [np.nan]}))


def test_a_none_rank_is_refused_naming_it():
    steps = pd.DataFrame({"rank": [0, None], "step": [1, 1], "start_ns": [0, 0],
                          "end_ns": [10, 10]})
    with pytest.raises(TypeError, match=r"column 'rank': expected int64 \(-1 for an unknown "
                                        r"rank\), found (object|float64)"):
        frames.check_steps(steps)
    frames.check_steps(steps.fillna(UNKNOWN_RANK).astype({"rank": "int64"}))
    with pytest.raises(TypeError, match=r"RankTrace.rank: expected int .*found NoneType"):
        RankTrace(rank=None, world_size=2, path=Path("x.json"), events=frames.empty_events(),
                  steps=frames.steps_frame(), records=None, problems=[])


# ---- ranks and events read again ----------------------------------------------------------------
def test_an_unknown_rank_is_minus_one_shown_as_rank_question_mark():
    def rank(number):
        return RankTrace(rank=number, world_size=None, path=Path("x.json"), events=None,
                         steps=frames.steps_frame(), records=None, problems=[])

    unknown = rank(UNKNOWN_RANK)
    assert unknown.label == "rank ?" and known_rank(unknown) is None
    assert rank(3).label == "rank 3" and known_rank(rank(3)) == 3
    with pytest.raises(ValueError, match="nothing to read them again with"):
        unknown.with_events()
    read = []
    unknown.read_events = lambda trace: read.append(trace.label) or frames.empty_events()
    assert unknown.with_events().events.empty and read == ["rank ?"]
    assert unknown.events is None  # the events read again are not kept

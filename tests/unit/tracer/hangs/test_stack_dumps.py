"""Stack dumps (tracer.hangs.stack_dumps): every thread's stack without the tracer's own frames,
from whichever of its folders they come, the ops pending, and at most MAX_DUMPS per process."""

from __future__ import annotations

import os
import threading

import tracer
from helpers.tracer_files import read_jsonl
from tracer import schema
from tracer.comms.patching import recording_wrapper
from tracer.hangs import stack_dumps

TRACER_DIR = os.path.dirname(os.path.abspath(tracer.__file__)) + os.sep


class Recorder:
    active, issue_spans = True, None


def stacks_seen_through_a_tracer_wrapper():
    """thread_stacks() taken inside a call that went through a wrapper of tracer.comms."""
    taken = []
    wrapper = recording_wrapper(Recorder(), "op", lambda: None,
                                lambda args, kwargs: taken.append(
                                    stack_dumps.thread_stacks(skip_current=False)),
                                lambda described, result: None)
    wrapper()
    return taken[0]


def test_the_tracers_own_frames_are_left_out_wherever_they_are_in_the_tracer():
    stacks = stacks_seen_through_a_tracer_wrapper()
    [mine] = [s for s in stacks if s.thread_id == threading.get_ident()]
    functions = [f.function for f in mine.frames]
    assert functions[-2:] == ["stacks_seen_through_a_tracer_wrapper", "<lambda>"]
    assert "wrapper" not in functions  # tracer/comms/patching.py's frame in between
    assert not any(f.file.startswith(TRACER_DIR) for s in stacks for f in s.frames)
    assert stacks[0].main and stacks[0].name == threading.main_thread().name


def test_a_dump_is_one_line_of_every_thread_and_the_pending_ops(tmp_path, monkeypatch):
    monkeypatch.setattr(stack_dumps, "_dumps", 0)
    monkeypatch.setattr(stack_dumps, "_dumped", [])
    pending = [schema.IssueRecord(step=3, op="all_reduce", source="c10d", pg="0", pg_size=2,
                                  dtype="float32", bytes=8, position=5, issue_ns=1)]
    path = tmp_path / "rank1.stacks.jsonl"
    error = RuntimeError("the peer died\nmore text")
    assert stack_dumps.dump(str(path), 1, "exception", pending, error)
    [line] = read_jsonl(path)
    assert (line["rank"], line["reason"]) == (1, "exception")
    assert line["exception"] == "RuntimeError: the peer died"
    assert [(p["op"], p["position"]) for p in line["pending"]] == [("all_reduce", 5)]
    assert threading.get_ident() in [t["thread_id"] for t in line["threads"]]
    assert stack_dumps.was_dumped(error)


def test_no_more_than_max_dumps_are_written(tmp_path, monkeypatch):
    monkeypatch.setattr(stack_dumps, "_dumps", stack_dumps.MAX_DUMPS - 1)
    monkeypatch.setattr(stack_dumps, "_dumped", [])
    path = tmp_path / "rank0.stacks.jsonl"
    assert stack_dumps.dump(str(path), 0, "sigusr1", [])
    assert not stack_dumps.dump(str(path), 0, "sigusr1", [])
    assert len(read_jsonl(path)) == 1


def test_a_dump_that_cannot_be_written_returns_false_and_raises_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(stack_dumps, "_dumps", 0)
    assert not stack_dumps.dump(str(tmp_path / "gone" / "rank0.stacks.jsonl"), 0, "sigusr1", [])

"""analysis.core.forked: a value computed in a forked child is the value computed here; a
failure there is raised when it is taken; a child that dies leaves it to be computed here."""

from __future__ import annotations

import os
import pickle
import sys
import time

import numpy as np
import pandas as pd
import pytest

from analysis.core import forked
from analysis.core.forked import ComputedElsewhereFailed, ForkedResult, forked_results

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="values are computed beside on Linux only")


def _frames(n: int) -> dict:
    # Larger than a pipe's buffer: the child blocks until the value is taken.
    return {"frame": pd.DataFrame({"a": np.arange(n), "b": np.arange(n) * 0.5}),
            "pid": os.getpid()}


def test_the_value_is_computed_in_another_process_and_equals_the_one_computed_here():
    beside = ForkedResult(lambda: _frames(100_000))
    child = beside._child._pid
    value = beside.result()
    pd.testing.assert_frame_equal(value["frame"], _frames(100_000)["frame"])
    assert value["pid"] == child != os.getpid()
    assert beside.result() is value  # taken once
    forked.reap_children()
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)  # reaped


def test_a_failure_in_the_child_is_raised_when_the_value_is_taken():
    def broken():
        raise ValueError("no step end")

    beside = ForkedResult(broken)
    with pytest.raises(ComputedElsewhereFailed, match="^ValueError: no step end$") as failed:
        beside.result()
    assert failed.value.why == "ValueError: no step end"


def _dies_in_a_child(here: int):
    """A computation that ends any process but `here` before it returns."""
    def compute():
        if os.getpid() != here:
            os._exit(3)
        return "computed here"

    return compute


def test_a_child_that_dies_leaves_the_value_to_be_computed_here():
    assert ForkedResult(_dies_in_a_child(os.getpid())).result() == "computed here"


def test_without_a_fork_the_value_is_computed_here(monkeypatch):
    def no_fork():
        raise OSError("no process to spare")

    monkeypatch.setattr(forked.os, "fork", no_fork)
    beside = ForkedResult(lambda: os.getpid())
    assert beside._child is None and beside.result() == os.getpid()


def _answers_then_lingers(compute, write_fd: int) -> None:
    """A child's life whose end comes a second after its answer (a large process's exit)."""
    with os.fdopen(write_fd, "wb") as pipe:
        pipe.write(pickle.dumps(compute()))
    time.sleep(1.0)
    os._exit(0)


def test_the_answer_is_taken_without_waiting_for_the_child_to_end_and_it_is_reaped_later():
    child = forked.ForkedChild(lambda: "answer", _answers_then_lingers)
    pid = child._pid
    started = time.monotonic()
    assert child.answer() == "answer"
    assert time.monotonic() - started < 0.8  # the child's second not waited for
    assert pid in forked._ENDING
    forked.ForkedChild(lambda: None).answer()  # a later fork reaps it only once it has ended
    assert pid in forked._ENDING
    forked.reap_children()
    assert forked._ENDING == []
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_pickled_it_travels_as_its_value_and_close_ends_an_untaken_child():
    assert pickle.loads(pickle.dumps(ForkedResult(lambda: [1, 2, 3]))) == [1, 2, 3]
    untaken = ForkedResult(lambda: _frames(100_000))
    child = untaken._child._pid
    untaken.close()
    assert untaken._child._pid is None
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)


def test_a_child_whose_answer_is_never_taken_ends_with_its_holder():
    untaken = ForkedResult(lambda: _frames(100_000))
    child = untaken._child._pid
    del untaken
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)


def test_several_values_are_computed_in_one_child_and_each_fails_alone():
    def broken():
        raise ValueError("no shapes")

    parts = forked_results({"pid": os.getpid, "broken": broken, "frames": lambda: _frames(10)})
    assert list(parts) == ["pid", "broken", "frames"]
    child = parts["pid"]._outcomes._child._pid
    assert parts["pid"].result() == child != os.getpid()
    assert parts["frames"].result()["pid"] == child  # the same child
    with pytest.raises(ComputedElsewhereFailed, match="^ValueError: no shapes$"):
        parts["broken"].result()
    assert pickle.loads(pickle.dumps(parts["frames"]))["pid"] == child
    forked.reap_children()
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)  # reaped


def test_the_first_value_is_taken_while_the_child_computes_the_next(tmp_path):
    gate = tmp_path / "taken"

    def waits_for_the_first_to_be_taken():
        while not gate.exists():  # never returns unless the first was taken before it
            time.sleep(0.01)
        return "second"

    parts = forked_results({"first": lambda: "first", "second": waits_for_the_first_to_be_taken})
    assert parts["first"].result() == "first"
    gate.touch()
    assert parts["second"].result() == "second"


def test_values_the_child_did_not_send_are_computed_here():
    here = os.getpid()
    parts = forked_results({"b": os.getpid, "a": _dies_in_a_child(here), "c": os.getpid})
    assert parts["b"].result() != here  # sent before the child died
    assert parts["a"].result() == "computed here" and parts["c"].result() == here


def test_an_answer_comes_through_shared_memory_and_the_pipe_carries_only_its_size(
        monkeypatch):
    loaded = []
    real = pickle.loads

    def loads(data, *args, **kwargs):
        loaded.append((type(data).__name__, len(data)))
        return real(data, *args, **kwargs)

    monkeypatch.setattr(forked.pickle, "loads", loads)
    child = forked.ForkedChild(lambda: np.arange(1_000_000))
    assert child._shared is not None
    assert np.array_equal(child.answer(), np.arange(1_000_000))
    (pipe_kind, pipe_bytes), (shared_kind, shared_bytes) = loaded
    assert pipe_kind == "bytes" and pipe_bytes < 200  # the size of the answer only
    assert shared_kind == "memoryview" and shared_bytes > 8_000_000
    assert child._shared is None  # released once taken


def test_an_answer_larger_than_the_shared_memory_comes_through_the_pipe(monkeypatch):
    monkeypatch.setattr(forked, "SHARED_ANSWER_BYTES", 4096)
    child = forked.ForkedChild(lambda: np.arange(100_000))
    assert len(child._shared) == 4096
    assert np.array_equal(child.answer(), np.arange(100_000))


def test_without_shared_memory_the_answer_comes_through_the_pipe(monkeypatch):
    def refused(*args, **kwargs):
        raise OSError("no memory to map")

    monkeypatch.setattr(forked.mmap, "mmap", refused)
    child = forked.ForkedChild(lambda: {"frame": pd.DataFrame({"a": np.arange(50_000)})})
    assert child._shared is None
    assert child.answer()["frame"]["a"].sum() == sum(range(50_000))


def test_an_untaken_answer_releases_its_shared_memory_when_closed():
    child = forked.ForkedChild(lambda: np.arange(10))
    child.close()
    assert child._shared is None and not child.waiting


def test_a_child_has_answered_once_its_answer_can_be_read_without_waiting():
    read, write = os.pipe()

    def after_the_signal():
        os.read(read, 1)  # blocks until the test writes
        return "done"

    child = forked.ForkedChild(after_the_signal)
    assert not child.answered()
    os.write(write, b"x")
    deadline = time.monotonic() + 10
    while not child.answered() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.answered()
    assert child.answer() == "done"
    assert child.answered()  # taken: nothing left to wait for
    os.close(read)
    os.close(write)


def test_a_child_sending_answers_one_by_one_computes_the_next_before_the_last_is_read():
    # 300 KB, more than a pipe's usual 64 KB: with the pipe widened, the child sends it and
    # goes on to the next while nothing is read yet.
    def large():
        return b"x" * 300_000

    def stamped():
        return time.monotonic()

    results = forked_results({"large": large, "stamped": stamped})
    time.sleep(1.0)
    read_at = time.monotonic()
    assert results["large"].result() == b"x" * 300_000
    computed_at = results["stamped"].result()
    if forked.PIPE_BYTES <= _pipe_limit():
        assert computed_at < read_at
    forked.reap_children()


def _pipe_limit() -> int:
    try:
        with open("/proc/sys/fs/pipe-max-size") as limit:
            return int(limit.read())
    except OSError:
        return 0

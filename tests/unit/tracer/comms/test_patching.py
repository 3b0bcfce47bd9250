"""Replacing torch functions and putting the very same objects back, and the one wrapper skeleton
every recorded function gets (tracer.comms.patching), on a recorder that notes what it is told."""

from __future__ import annotations

import collections
import sys
import threading
import types

import pytest

from tracer.comms import patching
from tracer.comms.patching import Patches, argument, parameter_positions, recording_wrapper


class NotingRecorder:
    """What a wrapper uses of the comms recorder, noting its failures and the op errors."""

    def __init__(self, spans=True):
        self.active = True
        self.issue_spans = collections.deque() if spans else None
        self.failures = []
        self.op_errors = []

    def fail(self, what, exc=None):
        self.failures.append((what, exc))

    def on_op_error(self, exc):
        self.op_errors.append(exc)


def test_an_argument_is_found_by_position_or_by_name_else_its_default():
    def collective(tensor, group=None, async_op=False):
        pass

    positions = parameter_positions(collective)
    assert positions == {"tensor": 0, "group": 1, "async_op": 2}
    assert argument(("t", "g"), {}, positions, "group") == "g"
    assert argument(("t",), {"group": "k"}, positions, "group") == "k"
    assert argument(("t",), {}, positions, "async_op", False) is False
    assert argument(("t",), {}, positions, "not a parameter", 7) == 7


def test_a_wrapped_call_records_once_around_the_original_and_returns_its_result():
    recorder = NotingRecorder()
    seen = []

    def original(x, scale=1):
        seen.append(("call", x, scale, patching.thread.depth))
        return x * scale

    wrapper = recording_wrapper(
        recorder, "op", original,
        describe=lambda args, kwargs: seen.append(("describe", args, kwargs)) or "described",
        complete=lambda described, result: seen.append(("complete", described, result)))
    assert wrapper(3, scale=2) == 6
    assert seen == [("describe", (3,), {"scale": 2}), ("call", 3, 2, 1),
                    ("complete", "described", 6)]
    assert patching.thread.depth == 0
    [(thread, start_ns, end_ns)] = recorder.issue_spans
    assert thread == threading.get_ident() and 0 < start_ns <= end_ns
    assert recorder.failures == [] and recorder.op_errors == []


def test_a_wrapped_call_inside_another_passes_through_and_only_the_outer_one_records():
    recorder = NotingRecorder()
    described = []
    inner = recording_wrapper(recorder, "inner", lambda x: x + 1,
                              lambda args, kwargs: described.append("inner"), lambda d, r: None)
    outer = recording_wrapper(recorder, "outer", lambda x: inner(x) * 10,
                              lambda args, kwargs: described.append("outer") or True,
                              lambda d, r: None)
    assert outer(1) == 20
    assert described == ["outer"] and len(recorder.issue_spans) == 1


def test_off_or_undescribed_calls_go_straight_to_the_original():
    recorder = NotingRecorder()
    completed = []
    wrapper = recording_wrapper(recorder, "op", lambda x: -x, lambda args, kwargs: None,
                                lambda d, r: completed.append(r))
    assert wrapper(4) == -4  # describe said None: not an op to record
    recorder.active = False
    assert recording_wrapper(recorder, "op", lambda x: -x, lambda a, k: 1 / 0,
                             lambda d, r: None)(5) == -5  # off: describe is not even asked
    assert completed == [] and len(recorder.issue_spans) == 0 and recorder.failures == []


def test_a_fault_of_ours_switches_recording_off_and_the_call_still_happens_once():
    recorder = NotingRecorder()
    calls = []

    def original(x):
        calls.append(x)
        return x

    def bad_describe(args, kwargs):
        raise KeyError("describe")

    def bad_complete(described, result):
        raise ValueError("complete")

    assert recording_wrapper(recorder, "op", original, bad_describe, lambda d, r: None)(1) == 1
    assert recording_wrapper(recorder, "op", original, lambda a, k: 1, bad_complete)(2) == 2
    assert calls == [1, 2]
    assert [(what, type(exc)) for what, exc in recorder.failures] == [
        ("recording op", KeyError), ("recording op", ValueError)]


def test_the_users_error_reaches_the_user_as_it_is_and_the_stacks_are_asked_for():
    recorder = NotingRecorder()
    error = RuntimeError("the peer died")

    def original():
        raise error

    wrapper = recording_wrapper(recorder, "op", original, lambda a, k: 1, lambda d, r: None)
    with pytest.raises(RuntimeError) as raised:
        wrapper()
    assert raised.value is error and raised.value.__context__ is None
    assert recorder.op_errors == [error] and recorder.failures == []
    assert patching.thread.depth == 0
    [(_, start_ns, end_ns)] = recorder.issue_spans
    assert end_ns is not None and end_ns >= start_ns


def test_without_the_flight_recorder_no_span_is_kept():
    recorder = NotingRecorder(spans=False)
    assert patching.open_span(recorder) is None
    patching.close_span(None)  # nothing to close
    assert recording_wrapper(recorder, "op", lambda: 7, lambda a, k: 1, lambda d, r: None)() == 7


def test_patches_put_the_very_same_objects_back_in_reverse_order():
    owner = types.SimpleNamespace(f="first", g="other")
    patches = Patches(fail=lambda what, exc: pytest.fail(what))
    patches.patch(owner, "f", "second")
    patches.patch(owner, "f", "third")
    patches.patch(owner, "g", "replaced")
    assert (owner.f, owner.g) == ("third", "replaced")
    patches.restore()
    assert (owner.f, owner.g) == ("first", "other")
    patches.restore()  # a second restore changes nothing
    assert (owner.f, owner.g) == ("first", "other")


def test_a_wrapper_replaces_its_original_wherever_torch_distributed_holds_it_and_back(
        monkeypatch):
    def original():
        return "original"

    def wrapper():
        return "wrapper"

    holder = types.ModuleType("torch.distributed._ranktrace_test_holder")
    holder.by_name, holder.other = original, len
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    patches = Patches(fail=lambda what, exc: pytest.fail(what))
    patches.replace_everywhere([(original, wrapper)])
    assert holder.by_name is wrapper and holder.other is len
    # a module imported while the wrappers are in place binds the wrapper by name
    late = types.ModuleType("torch.distributed._ranktrace_test_late")
    late.imported = wrapper
    monkeypatch.setitem(sys.modules, late.__name__, late)
    patches.restore()
    assert holder.by_name is original and late.imported is original


def test_a_restore_that_fails_is_reported_and_the_rest_is_restored():
    class Owner:
        frozen = False

        def __setattr__(self, name, value):
            if self.frozen and name == "locked":
                raise AttributeError("read-only")
            object.__setattr__(self, name, value)

    owner = Owner()
    owner.free, owner.locked = "before", "before"
    failures = []
    patches = Patches(fail=lambda what, exc: failures.append((what, str(exc))))
    patches.patch(owner, "free", "after")
    patches.patch(owner, "locked", "after")
    owner.frozen = True
    patches.restore()  # the last patch first: it fails, and the one before is still restored
    assert (owner.locked, owner.free) == ("after", "before")
    assert failures == [("restoring locked", "read-only")]

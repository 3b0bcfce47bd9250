"""Where a training step ends (tracer.steps.step_clock, docs/tracer.md, Steps): at the optimizer
step of the first optimizer that ever stepped, or at tracer.step() from its first call on, a
first call right after an optimizer step marking that same step."""

from __future__ import annotations

import gc
import time

import pytest
import torch

import tracer
from tracer.steps.step_clock import StepClock


@pytest.fixture
def clock():
    """A started clock whose step ends are listed in `clock.seen` as (step, start_ns, end_ns)."""
    seen = []
    made = StepClock(lambda step, start_ns, end_ns: seen.append((step, start_ns, end_ns)))
    made.seen = seen
    made.start(made.manual_step)
    yield made
    made.close()


def optimizer():
    return torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)


def test_each_optimizer_step_ends_a_step_that_starts_where_the_last_one_ended(clock):
    sgd = optimizer()
    for _ in range(3):
        sgd.step()
    assert [step for step, _, _ in clock.seen] == [0, 1, 2] and clock.steps == 3
    assert all(start <= end for _, start, end in clock.seen)
    # each step starts once the previous step end's work is done, never before that end
    assert all(later[1] >= earlier[2] for earlier, later in zip(clock.seen, clock.seen[1:]))


def test_with_several_optimizers_the_first_that_stepped_keeps_time(clock):
    first, second = optimizer(), optimizer()
    second.step()  # the first to step, whatever the order of creation
    first.step()
    second.step()
    first.step()
    assert clock.steps == 2


def test_a_new_optimizer_keeps_time_once_the_first_is_gone(clock):
    first = optimizer()
    first.step()
    del first
    gc.collect()
    second = optimizer()
    second.step()
    second.step()
    assert clock.steps == 3


def test_tracer_step_ends_steps_and_from_its_first_call_on_the_optimizer_does_not(clock):
    sgd = optimizer()
    assert tracer._step_callback == clock.manual_step
    tracer.step()
    sgd.step()
    sgd.step()
    tracer.step()
    assert [step for step, _, _ in clock.seen] == [0, 1]


def test_a_first_tracer_step_right_after_an_optimizer_step_marks_that_same_step(clock):
    sgd = optimizer()
    sgd.step()
    tracer.step()  # the loop calls both: this is still step 0
    assert clock.steps == 1
    sgd.step()  # from now on only tracer.step() ends steps
    tracer.step()
    assert [step for step, _, _ in clock.seen] == [0, 1]


def test_step_ends_are_kept_in_order_for_each_part_that_asks_for_them(clock):
    sgd = optimizer()
    sgd.step()
    assert clock._end_queues == ()  # nothing asked: nothing kept
    ends = clock.track_ends()
    sgd.step()
    other = clock.track_ends()  # a deque of its own, from its asking on
    assert other is not ends
    sgd.step()
    assert list(ends) == [end for _, _, end in clock.seen[1:]]
    ends.popleft()  # one part taking its ends leaves the other's
    assert list(other) == [clock.seen[2][2]]
    newest = clock.track_ends(maxlen=2)  # a reader that may stop reading: the newest kept
    for _ in range(3):
        sgd.step()
    assert list(newest) == [end for _, _, end in clock.seen[-2:]]


def test_a_failing_step_end_still_starts_the_next_step(clock):
    def fail(step, start_ns, end_ns):
        raise RuntimeError("step end")

    clock.on_step_end = fail
    before = time.time_ns()
    with pytest.raises(RuntimeError, match="step end"):
        clock.end_step()
    assert clock.steps == 1 and clock.start_ns >= before


def test_a_closed_clock_ends_no_steps_and_tracer_step_does_nothing_again():
    seen = []
    clock = StepClock(lambda *args: seen.append(args))
    clock.start(clock.manual_step)
    clock.close()
    optimizer().step()
    tracer.step()
    assert seen == [] and tracer._step_callback is None

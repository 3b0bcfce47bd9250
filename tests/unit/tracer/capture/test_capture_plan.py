"""Which requested windows every rank opens (tracer.capture.slow_steps.CapturePlan): the same
decisions from the same list, one window per slowdown, the budget that keeps its last capture
for a larger change, and requests out of range."""

from __future__ import annotations

from tracer.capture.slow_steps import MAX_LEAD_STEPS, CapturePlan


def plan(max_captures: int = 3) -> CapturePlan:
    return CapturePlan(max_captures=max_captures, window_steps=4, warmup=1, max_window_steps=20)


def test_every_rank_opens_the_same_windows_from_the_same_requests():
    def decisions():
        p = plan(max_captures=2)
        return [p.decide(t, s, f, 3, x).accepted for t, s, f, x in
                (("slow_step", 20, 30, 5.0), ("slow_step", 21, 31, 4.0),  # a peer, a step later
                 ("on_demand", 30, 33, None),  # no idle step between it and step 32
                 ("slow_step", 60, 70, 3.0),   # the last capture: only a larger change
                 ("slow_step", 80, 90, 6.0), ("slow_step", 100, 110, 9.0))]  # bound of 2
    assert decisions() == decisions() == [True, False, False, False, True, False]
    p = plan()
    assert p.decide("on_demand", 5, 10, 3).accepted
    why = p.decide("on_demand", 5, 14, 3)
    assert not why.accepted and why.why == "it overlaps the window of steps 10-12"
    assert p.decide("on_demand", 5, 15, 3).accepted  # warm-up 14, one idle step (13) between


def test_requests_of_one_slowdown_from_several_ranks_open_one_window_in_any_order():
    p = plan()
    # Rank 0's request came first but for later steps (its margin at a slower pace); rank 1's
    # change began a step earlier: the same slowdown either way.
    assert p.decide("slow_step", 51, 80, 3, 20.0).accepted
    why = p.decide("slow_step", 50, 60, 3, 25.0)
    assert not why.accepted
    assert why.why == ("the slowdown from step 51 has its window (changes that began within 8 "
                       "steps of each other are one)")
    # A change that began later than the cool-down is another slowdown.
    assert p.decide("slow_step", 60, 90, 3, 2.0).accepted


def test_the_last_capture_is_kept_for_a_change_larger_than_any_captured():
    p = plan(max_captures=3)
    assert p.decide("slow_step", 100, 110, 3, 3.0).accepted
    assert p.decide("slow_step", 200, 210, 3, 2.5).accepted
    why = p.decide("slow_step", 300, 310, 3, 2.9)
    assert not why.accepted
    assert why.why == "the last of --max-captures 3 is kept for a change larger than 3x"
    assert p.decide("slow_step", 20_000, 20_010, 3, 60.0).accepted  # late in a long run
    why = p.decide("slow_step", 30_000, 30_010, 3, 100.0)
    assert (why.accepted, why.why) == (False, "--max-captures 3 reached")
    # On demand windows take nothing of the budget.
    assert p.decide("on_demand", 40_000, 40_010, 3).accepted
    # One capture: the first change has it.
    one = plan(max_captures=1)
    assert one.decide("slow_step", 100, 110, 3, 2.0).accepted
    assert not one.decide("slow_step", 200, 210, 3, 50.0).accepted
    assert not plan(max_captures=0).decide("slow_step", 100, 110, 3, 50.0).accepted


def test_requests_out_of_range_are_refused_by_every_rank_alike():
    p = plan()
    refused = {
        (10, 20, 0): "no steps to trace (0)",
        (10, 20, 21): "21 steps, more than --max-window-steps 20",
        (10, 20, 10**9): "1000000000 steps, more than --max-window-steps 20",
        (-10**12, -10**12, 10): f"steps before the run's first ({-10**12}, asked at step "
                                f"{-10**12})",
        (10, 0, 3): "steps before the run's first (0, asked at step 10)",
        (50, 40, 3): (f"its first step 40 is not within {MAX_LEAD_STEPS} steps after the step "
                      f"it was asked at (50)"),
        (10, 10**11, 3): (f"its first step {10**11} is not within {MAX_LEAD_STEPS} steps after "
                          f"the step it was asked at (10)"),
    }
    for (asked_at, first, steps), why in refused.items():
        decision = p.decide("on_demand", asked_at, first, steps)
        assert (decision.accepted, decision.why) == (False, why)
    assert p.windows == []
    assert p.decide("on_demand", 10, 30, 20).accepted

"""The host's cores under a what-if (analysis.crossrank.what_if_cores, docs/critical-path.md,
"The host's cores"): hand-built runs whose bounds are computed by hand."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis.crossrank import analyse as cross_rank_pass
from analysis.crossrank import critical_path, step_graph, what_if, what_if_cores, what_if_idle
from helpers.crossrank_ops import MS, frame, op
from tracer import schema

STEP = 100 * MS
OVERLAPPED = "all_reduce on group 0 (4-8 KiB) transfer overlapped"


def late_rank(steps=(1, 2, 3, 4)):
    """Rank 0 works 10 ms, rank 1 35, before one all_reduce per step (2 ms after both
    arrived); step ends 3 ms (rank 0) and 4 ms (rank 1) after it: steps of 40 and 41 ms."""
    rows = []
    for s in steps:
        base, end = s * STEP, s * STEP + 37 * MS
        rows += [op(0, base + 10 * MS, end, step=s), op(1, base + 35 * MS, end, step=s)]
    stepped = pd.DataFrame([{"rank": r, "step": s, "start_ns": s * STEP,
                             "end_ns": s * STEP + e * MS} for s in steps
                            for r, e in ((0, 40), (1, 41))])
    offsets = pd.DataFrame({"rank": [0, 1], "offset_ns": 0, "uncertainty_ns": 0})
    return cross_rank_pass(frame(rows), stepped, offsets, 2), stepped


def cores(cpu_ms: dict, groups, steps=(1, 2, 3, 4), sharing=()) -> what_if_cores.HostCores:
    cpu = pd.DataFrame([{"rank": r, "step": s, "cpu_ns": ms * MS}
                        for r, ms in cpu_ms.items() for s in steps])
    return what_if_cores.HostCores(cpu, groups, list(sharing))


def answers(cross, stepped, host=None) -> dict:
    """The answers held to the bound of the host's cores alone (not served by sharing)."""
    result = critical_path.analyse(cross, stepped, cores=host, sharing=False)
    return {a["change"]: a for a in result.what_if}


def test_a_late_rank_on_time_cannot_beat_the_cpu_the_ranks_need_on_one_core():
    cross, stepped = late_rank()
    free = answers(cross, stepped)["rank 1 on time"]
    assert free["saved_ms_per_step"] == (26 + 25 + 25 + 25) / 4  # test_what_if's answer
    # Rank 1's 35 ms of CPU a step at the others' median, 10: on one CPU shared by both
    # ranks a step takes at least 20 ms, so each step saves at most 40.5 - 20.
    one_core = answers(cross, stepped, cores({0: 10, 1: 35}, [((0, 1), 1, "h")]))
    held = one_core["rank 1 on time"]
    assert held["saved_ms_per_step"] == 20.5 and held["predicted_step_ms"] == 20.0
    assert held["assumptions"].endswith(
        "; but no step shorter than its ranks' CPU time over the CPUs they share (the host's "
        "cores): held to it in 4 of 4 steps, where it is 20.00 ms a step")
    # On two CPUs the bound is 10 ms: the graph's answer stands, and says nothing of the cores.
    two_cores = answers(cross, stepped, cores({0: 10, 1: 35}, [((0, 1), 2, "h")]))
    assert two_cores["rank 1 on time"]["saved_ms_per_step"] == 25.25
    assert two_cores["rank 1 on time"]["assumptions"].endswith("(the host's cores)")
    assert "the host's cores" not in free["assumptions"]  # no CPU times: no bound


def test_a_change_that_leaves_the_work_keeps_its_cpu_and_a_rank_of_its_own_core_bounds_alone():
    cross, stepped = late_rank()
    # The transfer overlapped takes no CPU off: 10 + 27 ms on one CPU leave 3.5 ms of the
    # 40.5-ms step, of the 2 ms it saves: not held.
    host = cores({0: 10, 1: 27}, [((0, 1), 1, "h")])
    overlapped = answers(cross, stepped, host)[OVERLAPPED]
    assert overlapped["saved_ms_per_step"] == 2.0
    # Rank 1 alone on one CPU with 39.5 ms of CPU a step: at most 1 ms saved.
    alone = cores({0: 10, 1: 39.5}, [((0,), 1, "h"), ((1,), 1, "h")])
    held = answers(cross, stepped, alone)[OVERLAPPED]
    assert held["saved_ms_per_step"] == 1.0


def test_a_step_without_every_ranks_cpu_time_is_not_bounded():
    cross, stepped = late_rank()
    host = cores({0: 10, 1: 35}, [((0, 1), 1, "h")], steps=(1, 2))
    held = answers(cross, stepped, host)["rank 1 on time"]
    # steps 1 and 2 held to 20.5 each, steps 3 and 4 keep their 25
    assert held["saved_ms_per_step"] == (20.5 + 20.5 + 25 + 25) / 4
    assert "held to it in 2 of 4 steps" in held["assumptions"]


def test_a_saving_is_never_turned_into_a_cost():
    saved, limited = what_if.capped(np.array([5.0, 5.0, -1.0, 5.0]),
                                    np.array([10.0, 10.0, 10.0, 10.0]),
                                    np.array([7.0, 12.0, 12.0, np.nan]))
    assert saved.tolist() == [3.0, 0.0, -1.0, 5.0]
    assert limited.tolist() == [True, True, False, False]


def _trace(rank, steps_cpu_ms=None, host="a", cpu_ids=(0, 1, 2, 3), device="cpu", cpus=None):
    start = schema.RunStart(schema_version=1, run_name="r", rank=rank, local_rank=rank,
                            world_size=4, host=host, pid=1, start_ns=0, argv=[], script="s",
                            script_args=[], torch_version="2", config={}, device_type=device,
                            cpu_ids=list(cpu_ids) if cpu_ids else None,
                            cpus=cpus if cpus is not None else len(cpu_ids or ()))
    steps = pd.DataFrame({"step": list(range(len(steps_cpu_ms or []))),
                          "cpu_ns": [float(ms * MS) for ms in steps_cpu_ms or []]})
    return SimpleNamespace(rank=rank, records=SimpleNamespace(manifest=[start], steps=steps))


def test_the_cpu_time_of_a_step_is_its_records_and_a_record_without_it_is_left_out():
    trace = _trace(0, [8, 9, 7])
    trace.records.steps.loc[1, "cpu_ns"] = np.nan
    found = what_if_cores.host_cores([trace])
    assert found.cpu.to_dict("list") == {"rank": [0, 0], "step": [0, 2],
                                         "cpu_ns": [8e6, 7e6]}


def test_a_hosts_ranks_share_the_union_of_their_masks_and_each_has_its_own():
    found = what_if_cores.host_cores([
        _trace(0, [1, 2, 3], cpu_ids=(0,)), _trace(1, [1, 2, 3], cpu_ids=(1,)),
        _trace(2, [1, 2, 3], host="b", cpu_ids=(0, 1, 2, 3)),
        _trace(3, [1, 2, 3], host="b", cpu_ids=None, cpus=4)])
    assert sorted(found.groups) == sorted([((0,), 1, "a"), ((1,), 1, "a"), ((2,), 4, "b"),
                                           ((3,), 4, "b"), ((0, 1), 2, "a"), ((2, 3), 4, "b")])


def test_ranks_on_a_device_and_hosts_with_a_rank_without_records_get_no_host_bound():
    assert what_if_cores.host_cores([_trace(0, [1, 2, 3], device="cuda")]) is None
    old = _trace(1, [1, 2, 3], device=None)
    assert what_if_cores.host_cores([old]) is None
    found = what_if_cores.host_cores([_trace(0, [1, 2, 3]), _trace(1, None)])
    assert found.groups == [((0,), 4, "a")]  # rank 1 shares the host without CPU records


def loader_late(step=1):
    """One step: rank 0 works 10 ms, rank 1 waits 20 ms for its data loader and then works
    10 ms, before one all_reduce whose transfer takes 2 ms after both arrived; the step ends
    with it (32 ms)."""
    base = step * STEP
    rows = [op(0, base + 10 * MS, base + 32 * MS, step=step),
            op(1, base + 30 * MS, base + 32 * MS, step=step)]
    stepped = pd.DataFrame([{"rank": r, "step": step, "start_ns": base,
                             "end_ns": base + 32 * MS} for r in (0, 1)])
    offsets = pd.DataFrame({"rank": [0, 1], "offset_ns": 0, "uncertainty_ns": 0})
    gaps = pd.DataFrame([{"rank": 1, "step": step, "start_ns": base, "end_ns": base + 20 * MS,
                          "dur_ns": 20 * MS, "host_activity": "data_loading"}])
    return cross_rank_pass(frame(rows), stepped, offsets, 2), stepped, gaps


NO_LOADER = "no data loading gaps on rank 1"


def test_work_done_in_turn_shares_the_cores_once_a_change_runs_it_at_once():
    """Measured, the ranks work in turn (rank 0 while rank 1's loader sleeps), each with a core
    to itself; the two transfers share the host's cores. Without the sleep both ranks work at
    once: on one core each of their 10 ms takes 20, and the transfers 2 ms as measured (each
    had half the core then too): the step takes 22 ms, saving 10 of 32. On two cores every
    thread has a core: 12 ms, saving 20, what the graph alone says."""
    cross, stepped, gaps = loader_late()
    free = critical_path.analyse(cross, stepped, idle_gaps=gaps).what_if
    assert {a["change"]: a for a in free}[NO_LOADER]["saved_ms_per_step"] == 20.0
    # CPU time low enough that the bound of the host's cores holds nothing
    for cpus, saved in ((1, 10.0), (2, 20.0)):
        host = cores({0: 1, 1: 1}, [((0, 1), cpus, "h")], steps=(1,), sharing=[((0, 1), cpus)])
        found = {a["change"]: a for a in critical_path.analyse(
            cross, stepped, idle_gaps=gaps, cores=host).what_if}
        assert found[NO_LOADER]["saved_ms_per_step"] == saved, cpus
        assert "held to it" not in found[NO_LOADER]["assumptions"]
    assert what_if.IGNORED_ON_SHARED_CORES in found[NO_LOADER]["assumptions"]
    assert what_if.IGNORED not in found[NO_LOADER]["assumptions"]


def test_processor_sharing_gives_back_the_measured_durations_and_a_lone_threads_work():
    """Column 0 (the measured run) is returned as it came; a change that leaves every overlap
    as it was leaves every duration."""
    cross, stepped, gaps = loader_late()
    graph = step_graph.build(cross.ops, step_graph.steps_on_common_clock(stepped, cross.clock))
    host = cores({0: 1, 1: 1}, [((0, 1), 1, "h")], steps=(1,), sharing=[((0, 1), 1)])
    waiting = graph.duration - what_if_idle.without_gaps(graph, gaps)
    durations = np.column_stack([graph.duration, graph.duration])
    shared = what_if_cores.on_shared_cores(host, graph, durations, waiting)
    assert np.array_equal(shared[:, 0], graph.duration)
    assert np.array_equal(shared[:, 1], graph.duration)


def test_the_share_of_a_core_is_the_cores_over_the_busy_threads_where_they_outnumber_them():
    # three threads on two cores for 10 ms, then one alone for 10 ms
    speed = what_if_cores._mean_speed(np.array([0, 0, 0]), np.array([10, 10, 20]) * MS, 2)
    assert speed.tolist() == pytest.approx([2 / 3, 2 / 3, (10 * 2 / 3 + 10) / 20])
    assert what_if_cores._mean_speed(np.array([5]), np.array([5]), 1).tolist() == [1.0]


def test_ranks_share_cores_where_their_masks_overlap_and_a_host_without_masks_as_one():
    found = what_if_cores.host_cores([
        _trace(0, [1], cpu_ids=(0,)), _trace(1, [1], cpu_ids=(1,)),
        _trace(2, [1], host="b", cpu_ids=(0, 1)), _trace(3, [1], host="b", cpu_ids=(1, 2)),
        _trace(4, [1], host="b", cpu_ids=(5,)),
        _trace(5, [1], host="c", cpu_ids=(0,)), _trace(6, [1], host="c", cpu_ids=None, cpus=8),
        _trace(7, [1], host="d", device="cuda")])
    assert found.sharing == [((0,), 1), ((1,), 1), ((2, 3), 3), ((4,), 1), ((5, 6), 8)]


def test_ranks_pinned_to_cores_of_their_own_do_not_slow_each_other():
    """The example above with each rank held to a core of its own: both ranks working at once
    take no longer, as on two shared cores (each transfer on its rank's core, alone there)."""
    cross, stepped, gaps = loader_late()
    host = cores({0: 1, 1: 1}, [((0,), 1, "h"), ((1,), 1, "h")], steps=(1,),
                 sharing=[((0,), 1), ((1,), 1)])
    found = {a["change"]: a for a in critical_path.analyse(
        cross, stepped, idle_gaps=gaps, cores=host).what_if}
    assert found[NO_LOADER]["saved_ms_per_step"] == 20.0

"""Each cause of a late rank tested on evidence with a known answer (analysis.findings.
late_causes; docs/report.md, "Why a rank is late"), and device throttling on a hand-built run
folder of two GPU ranks whose NVML samples show rank 1's SM clock low."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis import open_run
from analysis.findings.late_causes import (
    CONTENTION,
    DATA_LOADING,
    HIGH,
    LARGER_INPUTS,
    LOW,
    MEDIUM,
    OTHER_HARDWARE,
    OUTSIDE,
    OWN_WORK,
    SLOWER,
    THROTTLING,
    late_causes,
    more_work,
)
from analysis.findings.late_evidence import LateEvidence
from analysis.findings.late_ranks import ON_AVERAGE, LateRank, said_late
from helpers.late_rank_run import AHEAD_NS, RECORDS_CLOCK_NS, STEP_US, STEPS, US, late_rank_run
from helpers.tracer_files import write_jsonl
from tracer import schema

MS = 1_000_000
STEP_NUMBERS = (1, 2, 3)
BLOCK = json.dumps([[256], [16, 256], [256, 256], [], []])  # rank 0's addmm inputs


def _ops(rows) -> pd.DataFrame:
    """(rank, name, dims, ms) per step, for every step."""
    return pd.DataFrame([{"rank": r, "step": s, "name": n, "dims": d, "dur_ns": int(ms * MS),
                          "device": False} for r, n, d, ms in rows for s in STEP_NUMBERS])


def _host(step_ms=100.0, loading=None, outside=None, ranks=(0, 1)) -> pd.DataFrame:
    loading, outside = loading or {}, outside or {}
    return pd.DataFrame([{"rank": r, "step": s, "step_ns": int(step_ms * MS),
                          "loading_ns": int(loading.get(r, 1.0) * MS),
                          "outside_ns": int(outside.get(r, 1.0) * MS)}
                         for r in ranks for s in STEP_NUMBERS])


def _samples(**by_rank) -> pd.DataFrame:
    """Per rank ("r0", "r1"), a dict of sample columns, the same in every step."""
    return pd.DataFrame([{"rank": int(r[1:]), "step": s, **values}
                         for r, values in by_rank.items() for s in STEP_NUMBERS])


def _ranks(hosts=("a", "a"), devices=(None, None), cpus=(8, 8)) -> pd.DataFrame:
    return pd.DataFrame({"rank": range(len(hosts)), "host": hosts, "device": devices,
                         "cpus": cpus})


def _evidence(ops=None, host=None, names=None, samples=None, ranks=None) -> LateEvidence:
    return LateEvidence(
        ops=ops if ops is not None else _ops([(0, "aten::addmm", BLOCK, 10),
                                             (1, "aten::addmm", BLOCK, 10)]),
        host=host if host is not None else _host(),
        names=names if names is not None else pd.DataFrame(
            columns=["rank", "step", "name", "dur_ns"]),
        samples=samples if samples is not None else _samples(r0={}, r1={}),
        ranks=ranks if ranks is not None else _ranks())


def _named(causes) -> dict:
    return {c.cause: c for c in causes}


def test_ranks_alike_name_no_cause():
    assert late_causes(1, STEP_NUMBERS, _evidence(), late_ms=20.0) == []


def test_larger_inputs_say_the_shapes_and_the_dimension():
    ops = _ops([(0, "aten::addmm", BLOCK, 10),
                (1, "aten::addmm", json.dumps([[256], [64, 256], [256, 256], [], []]), 40)])
    larger = _named(late_causes(1, STEP_NUMBERS, _evidence(ops=ops), late_ms=30.0))
    cause = larger[LARGER_INPUTS]
    assert "[[256], [64, 256], [256, 256], [], []]" in cause.proof and BLOCK in cause.proof
    assert "dimension 0 of input 1: 64 against 16 (4.0x)" in cause.proof
    assert cause.explains_ms == pytest.approx(30.0) and cause.confidence == HIGH
    assert "drop_last=True" in cause.advice and "bucket" in cause.advice
    assert SLOWER not in larger and CONTENTION not in larger


def test_smaller_inputs_explain_nothing():
    """A pipeline's last stage also runs its head's smaller matmul: not larger inputs."""
    head = json.dumps([[10], [16, 256], [256, 10], [], []])
    ops = _ops([(0, "aten::addmm", BLOCK, 10), (1, "aten::addmm", BLOCK, 10),
                (1, "aten::addmm", head, 8)])
    assert LARGER_INPUTS not in _named(late_causes(1, STEP_NUMBERS, _evidence(ops=ops)))


def _slower(**kw) -> dict:
    ops = _ops([(0, "aten::addmm", BLOCK, 10), (1, "aten::addmm", BLOCK, 30)])
    return _named(late_causes(1, STEP_NUMBERS, _evidence(ops=ops, **kw), late_ms=20.0))


def test_slower_at_equal_inputs_on_a_saturated_oversubscribed_host_is_contention():
    causes = _slower(samples=_samples(r0={"cpu_system_pct": 98.0}, r1={"cpu_system_pct": 99.0}),
                     ranks=_ranks(cpus=(1, 1)))
    cause = causes[CONTENTION]
    assert cause.confidence == HIGH and cause.explains_ms == pytest.approx(20.0)
    assert "take 3.00x their time" in cause.proof
    assert "99% busy" in cause.proof and "2 ranks share host a, where each may use 1 CPUs" in \
        cause.proof
    assert "fewer ranks per host" in cause.advice and SLOWER not in causes


def test_slower_at_equal_inputs_with_a_lower_sm_clock_is_throttling():
    causes = _slower(samples=_samples(r0={"sm_clock_mhz": 1980.0, "power_w": 690.0},
                                      r1={"sm_clock_mhz": 1200.0, "power_w": 700.0}))
    assert "1200 MHz against the others' 1980 MHz" in causes[THROTTLING].proof
    assert "power 700 W against 690" in causes[THROTTLING].proof
    assert "power cap" in causes[THROTTLING].advice and CONTENTION not in causes


def test_slower_at_equal_inputs_on_another_device_is_other_hardware():
    causes = _slower(ranks=_ranks(devices=("NVIDIA H100", "NVIDIA A100")))
    assert "its device is NVIDIA A100, the others' NVIDIA H100" in causes[OTHER_HARDWARE].proof


def test_slower_at_equal_inputs_without_a_reason_says_so_with_low_confidence():
    causes = _slower()
    assert list(causes) == [SLOWER] and causes[SLOWER].confidence == LOW


def test_a_rank_late_only_on_average_is_named_by_causes_that_say_why():
    """Not named by the straggler rule, a rank is late only by a cause above low confidence:
    slower at equal inputs without a reason is dropped (a clean run on a shared host stays
    quiet), a slow DataLoader is kept; a straggler keeps every cause tested."""
    slower = late_causes(1, STEP_NUMBERS, _evidence(ops=_ops(
        [(0, "aten::addmm", BLOCK, 10), (1, "aten::addmm", BLOCK, 30)])), late_ms=20.0)
    loading = late_causes(1, STEP_NUMBERS, _evidence(host=_host(loading={1: 30.0})),
                          late_ms=20.0)
    assert [c.cause for c in slower] == [SLOWER] and [c.cause for c in loading] == [DATA_LOADING]
    assert said_late(LateRank(1, ON_AVERAGE, 20.0, slower)) is None
    both = said_late(LateRank(1, ON_AVERAGE, 20.0, slower + loading))
    assert [c.cause for c in both.causes] == [DATA_LOADING] and both.how == ON_AVERAGE
    assert said_late(LateRank(1, "straggler", 20.0, slower)).causes == slower
    assert said_late(LateRank(1, "straggler", 20.0, [])).causes == []


def test_a_rank_late_only_on_average_needs_host_time_of_half_its_lateness():
    """6 ms more in the DataLoader (6% of the 100-ms step) of a 20-ms lateness: a straggler is
    told it (medium confidence), a rank late only on average is not (the scheduler of a shared
    host gives some rank of a clean run that much: the CI machine once gave rank 1 1.14 ms more
    of a 2.3-ms lateness); the same for time outside every op, which at 11 ms names it."""
    part = _evidence(host=_host(loading={1: 7.0}))
    assert [(c.cause, c.confidence) for c in late_causes(1, STEP_NUMBERS, part, late_ms=20.0)
            ] == [(DATA_LOADING, MEDIUM)]
    assert late_causes(1, STEP_NUMBERS, part, late_ms=20.0, by_elimination=False) == []
    busy = _samples(r0={"cpu_process_pct": 73.0}, r1={"cpu_process_pct": 86.0})
    outside = _evidence(host=_host(outside={1: 7.0}), samples=busy)
    assert [(c.cause, c.confidence) for c in late_causes(1, STEP_NUMBERS, outside, late_ms=20.0)
            ] == [(OWN_WORK, MEDIUM)]
    assert late_causes(1, STEP_NUMBERS, outside, late_ms=20.0, by_elimination=False) == []
    most = late_causes(1, STEP_NUMBERS, _evidence(host=_host(outside={1: 12.0}), samples=busy),
                       late_ms=20.0, by_elimination=False)
    assert [(c.cause, c.confidence) for c in most] == [(OWN_WORK, HIGH)]
    assert said_late(LateRank(1, ON_AVERAGE, 20.0, most)).causes == most


def test_one_step_stretched_by_the_scheduler_is_no_cause_but_a_slow_step_in_most_is():
    """Host times at each rank's median over its steps: rank 1's DataLoader descheduled in one of
    three steps (31 ms once, 1 ms twice) is no cause; slow in two of three, it is (30 ms)."""
    def loading(per_step):
        return pd.DataFrame([{"rank": r, "step": s, "step_ns": 100 * MS,
                              "loading_ns": int((per_step[i] if r == 1 else 1.0) * MS),
                              "outside_ns": MS}
                             for r in (0, 1) for i, s in enumerate(STEP_NUMBERS)])
    once = late_causes(1, STEP_NUMBERS, _evidence(host=loading((31.0, 1.0, 1.0))), late_ms=10.0)
    assert DATA_LOADING not in _named(once)
    most = _named(late_causes(1, STEP_NUMBERS, _evidence(host=loading((31.0, 31.0, 1.0))),
                              late_ms=10.0))
    assert most[DATA_LOADING].explains_ms == pytest.approx(30.0)
    assert "31.00 ms per step in the DataLoader's next batch, the others 1.00 ms" in (
        most[DATA_LOADING].proof)


def test_a_slow_data_loader_is_data_loading():
    causes = _named(late_causes(1, STEP_NUMBERS, _evidence(host=_host(loading={1: 31.0})),
                                late_ms=30.0))
    assert list(causes) == [DATA_LOADING]
    assert causes[DATA_LOADING].explains_ms == pytest.approx(30.0)
    assert "num_workers" in causes[DATA_LOADING].advice


def test_host_ops_only_one_rank_runs_are_its_own_work_but_not_a_pipeline_stages():
    names = pd.DataFrame([{"rank": r, "step": s, "name": n, "dur_ns": int(ms * MS)}
                          for r, n, ms in ((0, "aten::addmm", 10), (1, "aten::addmm", 10),
                                           (1, "evaluate", 25)) for s in STEP_NUMBERS])
    causes = _named(late_causes(1, STEP_NUMBERS, _evidence(names=names)))
    assert "evaluate 25.00 ms" in causes[OWN_WORK].proof
    assert OWN_WORK not in _named(late_causes(1, STEP_NUMBERS, _evidence(names=names),
                                              stage=True))


def test_time_outside_ops_is_own_work_when_busy_and_waiting_outside_the_trace_when_idle():
    host = _host(outside={1: 26.0})
    busy = _named(late_causes(1, STEP_NUMBERS, _evidence(host=host, samples=_samples(
        r0={"cpu_process_pct": 20.0}, r1={"cpu_process_pct": 90.0}))))
    assert list(busy) == [OWN_WORK]
    assert ("uses 70.00 ms of CPU per step more than the others' (90% of a core against 20%)"
            in busy[OWN_WORK].proof)
    idle = _named(late_causes(1, STEP_NUMBERS, _evidence(host=host, samples=_samples(
        r0={"cpu_process_pct": 20.0}, r1={"cpu_process_pct": 3.0}))))
    assert list(idle) == [OUTSIDE] and idle[OUTSIDE].confidence == LOW
    # Named only where no other cause holds; never for a rank tested without elimination.
    assert late_causes(1, STEP_NUMBERS, _evidence(host=host, samples=_samples(
        r0={"cpu_process_pct": 20.0}, r1={"cpu_process_pct": 3.0})), by_elimination=False) == []


def test_time_outside_ops_without_its_cpu_time_is_not_own_work_on_a_cpu_trace():
    """A clean CPU run beside another process (the CI machine): rank 1 held off its core 4 ms a
    step outside the ops, its process at 61% of a core against 51% over 20-ms steps, 2 ms of CPU
    more: not work (that needs 3 ms, OWN_CPU_SHARE); where the host's CPUs are saturated, the
    ranks compete for cores."""
    host = _host(step_ms=20.0, outside={1: 5.0})
    shares = {"r0": {"cpu_process_pct": 51.0}, "r1": {"cpu_process_pct": 61.0}}
    held = _named(late_causes(1, STEP_NUMBERS, _evidence(host=host, samples=_samples(**shares))))
    assert list(held) == [OUTSIDE]
    assert "uses 2.00 ms of CPU per step more than the others'" in held[OUTSIDE].proof
    saturated = {r: {**v, "cpu_system_pct": 97.0} for r, v in shares.items()}
    crowded = _named(late_causes(1, STEP_NUMBERS, _evidence(host=host,
                                                            samples=_samples(**saturated))))
    assert list(crowded) == [CONTENTION]


def test_time_outside_ops_on_a_gpu_trace_is_own_work_where_its_one_thread_is_busy():
    """On a GPU trace a rank's host is its one Python thread, and a waiting peer may spin in a
    device sync: half a core busy says work."""
    kernels = pd.DataFrame([{"rank": r, "step": s, "name": "gemm", "dims": "", "dur_ns": MS,
                             "device": True} for r in (0, 1) for s in STEP_NUMBERS])
    busy = _named(late_causes(1, STEP_NUMBERS, _evidence(
        ops=kernels, host=_host(outside={1: 26.0}),
        samples=_samples(r0={"cpu_process_pct": 98.0}, r1={"cpu_process_pct": 99.0}))))
    assert list(busy) == [OWN_WORK]
    assert "99% of a core busy (the others' 98%)" in busy[OWN_WORK].proof
    alone = _named(late_causes(1, STEP_NUMBERS, _evidence(
        ops=kernels, host=_host(outside={1: 26.0}),
        samples=_samples(r1={"cpu_process_pct": 99.0}))))
    assert alone[OWN_WORK].proof.endswith("keeps 99% of a core busy: host work in Python only it "
                                          "does.")


def test_every_rank_starved_alike_on_an_oversubscribed_host_is_contention():
    causes = _named(late_causes(1, STEP_NUMBERS, _evidence(ranks=_ranks(cpus=(1, 1)))))
    assert list(causes) == [CONTENTION]
    assert "which one arrives last is the scheduler's pick" in causes[CONTENTION].proof


def test_a_stage_with_more_ops_has_more_work_priced_at_the_common_speed():
    ops = _ops([(0, "aten::addmm", BLOCK, 10), (1, "aten::addmm", BLOCK, 30),
                (1, "aten::mm", BLOCK, 10)])
    # rank 1's addmm at the ranks' median (20 ms) and its mm at its own 10 ms: 30 against 20
    assert more_work(1, STEP_NUMBERS, _evidence(ops=ops)) == pytest.approx(1.5)
    assert more_work(0, STEP_NUMBERS, _evidence(ops=ops)) == pytest.approx(20 / 30)


def test_device_throttling_on_a_run_folder_with_nvml_samples(tmp_path):
    """Two GPU ranks (helpers.late_rank_run): rank 1's gemm kernels run 580 us a step against
    rank 0's 90 us, and its NVML samples put its SM clock at 1100 MHz against 1980 (one
    mid-step, on each rank's records clock: rank 1's runs AHEAD_NS ahead)."""
    folder = late_rank_run(tmp_path / "run")
    for rank, clock in ((0, 1980.0), (1, 1100.0)):
        start = RECORDS_CLOCK_NS + (AHEAD_NS if rank else 0)
        write_jsonl(folder / schema.SAMPLES_FILE.format(rank=rank), [
            schema.DeviceSample(t_ns=start + (n - 1) * STEP_US * US + 500 * US,
                                source="nvml", device=0, sm_clock_mhz=clock, power_w=400.0,
                                temp_c=85.0 if rank else 60.0) for n in STEPS])
    run = open_run(folder, use_cache=False)
    causes = _named(run.late[1].causes)
    assert "1100 MHz against the others' 1980 MHz" in causes[THROTTLING].proof
    assert "temperature 85 C against 60" in causes[THROTTLING].proof
    assert any(line.startswith("Why rank 1 is late: ") and THROTTLING in line
               for line in run.verdict.lines)
    assert any(c["cause"] == THROTTLING for c in run.document()["late_causes"])


def test_an_oversubscribed_host_is_named_after_a_cause_of_the_ranks_own():
    causes = late_causes(1, STEP_NUMBERS, _evidence(host=_host(loading={1: 31.0}),
                                                    ranks=_ranks(cpus=(1, 1))))
    assert [c.cause for c in causes] == [DATA_LOADING, CONTENTION]
    assert causes[1].proof.endswith("every rank on the host is slowed besides.")


def test_where_ranks_compete_for_cores_host_time_counts_only_if_it_is_half_the_lateness():
    """A starved rank's DataLoader is stretched by the scheduler: 6 ms more of a 30 ms lateness
    on an oversubscribed host is contention's, 16 ms is data loading's."""
    crowded = _ranks(cpus=(1, 1))
    small = late_causes(1, STEP_NUMBERS, _evidence(host=_host(loading={1: 7.0}), ranks=crowded),
                        late_ms=30.0)
    assert [c.cause for c in small] == [CONTENTION]
    large = late_causes(1, STEP_NUMBERS, _evidence(host=_host(loading={1: 16.0}),
                                                   ranks=crowded), late_ms=30.0)
    assert [c.cause for c in large] == [DATA_LOADING, CONTENTION]
    alone = late_causes(1, STEP_NUMBERS, _evidence(host=_host(loading={1: 7.0})), late_ms=30.0)
    assert [c.cause for c in alone] == [DATA_LOADING]

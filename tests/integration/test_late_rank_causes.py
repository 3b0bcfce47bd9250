"""Why a rank is late, on recorded runs (docs/report.md, "Why a rank is late"): each cause tested
against the evidence of a run that has it, with the tracer's default options, and a run without
a late rank that names none. The runs are shared (tests/helpers/runs.py): the uneven batch, the
slow DataLoader and the pipeline on 2 CPUs are this module's; the late rank by a busy loop
(`ddp-late-default`) and the run without delay (`ddp-even-0`) are the cross-rank tests'."""

import pytest

from analysis import open_run
from analysis.findings.late_causes import (
    CONTENTION,
    DATA_LOADING,
    LARGER_INPUTS,
    LOW,
    OUTSIDE,
    OWN_WORK,
    SLOWER,
)
from helpers.runs import SLOW_DATA_MS


@pytest.fixture(scope="module")
def analysed(shared_runs):
    runs = {}

    def get(name):
        if name not in runs:
            runs[name] = open_run(shared_runs[name].run_dir, use_cache=False)
        return runs[name]
    return get


def _causes(run, rank: int) -> dict:
    assert rank in run.late, f"rank {rank} not late: {run.verdict.lines}"
    return {c.cause: c for c in run.late[rank].causes}


def _advice(run) -> list[str]:
    """Every suggestion of the findings and every line of the verdict."""
    return [*run.findings["suggestion"], *run.verdict.lines]


def test_an_uneven_batch_is_larger_inputs_with_its_shapes_and_tried_first(analysed):
    """ddp.py --uneven-batch 1:4: rank 1's linear layers take [128, 256] where rank 0's take
    [32, 256]; the change tried first is about rank 1, with the what-if's saving."""
    run = analysed("ddp-uneven-batch")
    larger = _causes(run, 1)[LARGER_INPUTS]
    assert "[128, 256]" in larger.proof and "[32, 256]" in larger.proof
    assert "dimension 0 of input 0: 128 against 32 (4.0x)" in larger.proof
    assert larger.explains_ms > 0
    first = run.verdict.tries[0]
    assert first["change"].startswith("Rank 1 is late because its inputs are larger")
    priced = [t["saved_ms_per_step"] for t in run.verdict.tries
              if t["saved_ms_per_step"] is not None]
    assert first["saved_ms_per_step"] == max(priced) > 0
    line = next(line for line in run.verdict.lines if line.startswith("Try first"))
    assert f"(saves {first['saved_ms_per_step']:.2f} ms per step by the what-if)" in line
    assert any("drop_last=True" in s for s in run.findings["suggestion"])
    assert any("4.0x the elements" in e for e in run.findings["evidence"])
    document = run.document()
    assert any(c["rank"] == 1 and c["cause"] == LARGER_INPUTS for c in document["late_causes"])


def test_a_balanced_pipeline_on_two_cpus_is_told_to_stop_competing_not_to_move_layers(analysed):
    """pipeline.py, 4 stages of equal blocks, 4 ranks pinned to 2 CPUs: the stage that holds
    the others back has no more work than theirs, so no advice moves layers; the verdict names
    the competition for cores."""
    run = analysed("pipeline-4-on-2-cpus")
    stage = [item for item in run.late.values() if item.how == "pipeline stage"]
    assert len(stage) == 1, run.verdict.lines
    assert CONTENTION in _causes(run, stage[0].rank), (stage[0], run.cross_rank.pipeline)
    contention = _causes(run, stage[0].rank)[CONTENTION]
    assert "4 ranks share host" in contention.proof and "each may use 2 CPUs" in contention.proof
    assert stage[0].work_ratio is not None and stage[0].work_ratio < 1.2
    assert not any("move layers off" in text for text in _advice(run))
    assert any(line.startswith(f"Why rank {stage[0].rank} is late: ") and CONTENTION in line
               for line in run.verdict.lines)
    pipeline = run.findings[run.findings["finding"] == "pipeline bubble"].iloc[0]
    assert "do not move layers" in pipeline["suggestion"]
    assert "fewer ranks per host" in pipeline["suggestion"]


def test_a_slow_data_loader_is_data_loading(analysed):
    """ddp.py --slow-data 1:30: rank 1's DataLoader sleeps 30 ms in each batch."""
    run = analysed("ddp-slow-data")
    loading = _causes(run, 1)[DATA_LOADING]
    assert loading.explains_ms >= 0.75 * SLOW_DATA_MS
    assert run.late[1].causes[0].cause == DATA_LOADING
    assert any("num_workers" in s and "Rank 1 is late because it waits longer for its data" in s
               for s in run.findings["suggestion"])


def test_extra_host_work_is_work_only_that_rank_does(analysed):
    """ddp.py --straggle 1:25: rank 1 busy-loops 25 ms in Python before each forward: host time
    outside every op, its process busy."""
    run = analysed("ddp-late-default")
    causes = _causes(run, 1)
    assert OWN_WORK in causes and OUTSIDE not in causes
    assert causes[OWN_WORK].explains_ms >= 0.5 * 25
    assert LARGER_INPUTS not in causes and DATA_LOADING not in causes


def test_a_run_without_a_late_rank_names_no_cause_of_its_own(analysed):
    """DDP without delay: no rank has larger inputs, other work, a slower loader or a wait
    outside the trace. Where the straggler rule names none, no cause is named at all, though
    the others may wait for one rank most and its ops run slower (the 2-core CI machine once
    made rank 1's 1.35x slower at equal shapes, with nothing to say why: low confidence, which
    names no rank the straggler rule does not). A shared host can slow one rank for most of a
    run, and then it is a real straggler (docs/cross-rank.md): the causes it can be told are
    those the machine gives, that the ranks compete for cores (with the host's CPU as proof) or
    that the rank runs the same ops on the same shapes slower while the samples do not say why
    (low confidence; the CI machine once gave it to rank 1 of this run at a host CPU below
    90%)."""
    run = analysed("ddp-even-0")
    causes = run.document()["late_causes"]
    assert {c["cause"] for c in causes} <= {CONTENTION, SLOWER}, causes
    assert all("% busy" in c["proof"] for c in causes if c["cause"] == CONTENTION)
    assert all(c["confidence"] == LOW and "same input shapes" in c["proof"]
               and "neither the samples nor the manifests say why" in c["proof"]
               for c in causes if c["cause"] == SLOWER), causes
    stragglers = run.cross_rank.stragglers
    if not stragglers["fires"].astype(bool).any():
        assert run.late == {} and causes == []
        assert not any(line.startswith("Why rank") for line in run.verdict.lines)

"""FLOPs and MFU of a real traced run: 2-rank DDP over bias-free linear layers (the shared run
`linear-ddp`, traced with the default options). Each rank's FLOPs per profiled step are
FlopCounterMode's count for one step, taken in a separate untraced process; the peak was
measured on CPU before the script started, and the training's losses are those of an untraced
process, bit for bit."""

import subprocess
import sys

import pandas as pd
import pytest

from analysis.ingest.load import load_path
from analysis.rank import flops
from analysis.rank.step_breakdown import breakdown_per_step
from helpers.launch import REPO, torchrun_env
from helpers.runs import LINEAR_DDP

RUN = "linear-ddp"


def untraced(*args) -> str:
    result = subprocess.run([sys.executable, LINEAR_DDP, *args], cwd=REPO, env=torchrun_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def run(shared_runs):
    return shared_runs[RUN]


@pytest.fixture(scope="module")
def table(run):
    loaded = load_path(run.run_dir)
    per_step = pd.concat([breakdown_per_step(t) for t in loaded.ranks], ignore_index=True)
    return flops.mfu_table(loaded.ranks, per_step)


def test_each_ranks_flops_per_step_are_flop_counter_modes_count(table):
    reference = int(untraced("--count-flops").split()[-1])
    # 3 layers forward, 3 weight gradients, 2 input gradients (none for the batch's)
    assert reference == 8 * (2 * 32 * 128 * 128)
    assert sorted(set(table["rank"])) == [0, 1]
    assert sorted(set(table["step"])) == [7, 8, 9]  # the default window's active steps
    for value in table["flops_per_step"]:
        assert abs(value - reference) <= 0.02 * reference
    assert set(table["flops_per_step"]) == {float(reference)}  # exact, in fact


def test_mfu_comes_from_the_measured_peak_and_its_lost_points_add_up(table):
    assert set(table["peak_source"]) == {"measured"}
    assert (table["peak_tflops"] > 0).all()
    achieved = table["flops_per_step"] / (table["step_ns"] * 1e-9) / 1e12
    assert table["achieved_tflops"].tolist() == pytest.approx(achieved.tolist())
    assert table["mfu_pct"].tolist() == pytest.approx(
        (100 * table["achieved_tflops"] / table["peak_tflops"]).tolist())
    lost = table[["lost_transfer_pts", "lost_waiting_pts", "lost_idle_pts",
                  "lost_compute_pts"]].sum(axis=1)
    assert lost.tolist() == pytest.approx((100 - table["mfu_pct"]).tolist(), abs=1e-9)


def test_the_traced_training_is_bit_identical_to_an_untraced_process(run, tmp_path):
    # Both ranks train on the same batch, so DDP's average gradient is each rank's own, exactly.
    untraced("--steps", "12", "--save", tmp_path / "losses")
    plain = (tmp_path / "losses.rank0").read_text()
    for rank in (0, 1):
        assert (run.folder / f"out.pt.rank{rank}").read_text() == plain

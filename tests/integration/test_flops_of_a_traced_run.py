"""FLOPs and MFU of a real traced run: 2-rank DDP over bias-free linear layers (the shared run
`linear-ddp`, traced with the default options). Each rank's FLOPs per profiled step are
FlopCounterMode's count for one step, taken in a separate untraced process; the peak was
measured on CPU before the script started, and the training's losses are those of an untraced
process, bit for bit. The MFU is read as a user reads it: through open_run (the command line's
tables) and its JSON document."""

import json
import subprocess
import sys

import pytest

from analysis import open_run
from analysis.rank import flops
from analysis.report import json_document, text_report
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
def analysed(run):
    """The run as the analysis's front gives it (the command line's tables)."""
    return open_run(run.run_dir, use_cache=False)


@pytest.fixture(scope="module")
def table(analysed):
    return analysed.report.mfu


def test_each_ranks_flops_per_step_are_flop_counter_modes_count(table):
    reference = int(untraced("--count-flops").split()[-1])
    # 3 layers forward, 3 weight gradients, 2 input gradients (none for the batch's)
    assert reference == 8 * (2 * 32 * 128 * 128)
    assert sorted(set(table["rank"])) == [0, 1]
    assert sorted(set(table["step"])) == [7, 8, 9]  # the default window's active steps
    for value in table["flops_per_step"]:
        assert abs(value - reference) <= 0.02 * reference
    assert set(table["flops_per_step"]) == {float(reference)}  # exact, in fact


def test_mfu_comes_from_the_measured_peak_and_its_lost_points_add_up(analysed, table):
    assert set(table["peak_source"]) == {"measured"}
    assert (table["peak_tflops"] > 0).all()
    achieved = table["flops_per_step"] / (table["step_ns"] * 1e-9) / 1e12
    assert table["achieved_tflops"].tolist() == pytest.approx(achieved.tolist())
    assert table["mfu_pct"].tolist() == pytest.approx(
        (100 * table["achieved_tflops"] / table["peak_tflops"]).tolist())
    lost = table[flops.LOST_COLUMNS].sum(axis=1)
    assert lost.tolist() == pytest.approx((100 - table["mfu_pct"]).tolist(), abs=1e-9)
    # The waiting is the split's: the breakdown's peer_wait_ns of the same steps.
    steps = analysed.report.per_step.set_index(["rank", "step"])
    for row in table.itertuples():
        waited = steps.loc[(row.rank, row.step), "peer_wait_ns"]
        assert row.lost_waiting_pts == pytest.approx(100 * waited / row.step_ns)


def test_the_json_document_and_the_text_report_carry_the_mfu(analysed, table):
    document = json.loads(json_document.dumps(analysed.document()))
    assert [(r["rank"], r["step"]) for r in document["mfu"]] == list(
        zip(table["rank"], table["step"]))
    assert {r["peak_source"] for r in document["mfu"]} == {"measured"}
    assert {r["rank"] for r in document["roofline"]} == {0, 1}
    for rank in (0, 1):  # the layers' GEMMs are among each rank's slowest ops
        assert "aten::mm" in {r["name"] for r in document["roofline"] if r["rank"] == rank}
    text = text_report.text_report(analysed.report)
    assert "MFU (model FLOPs utilisation)" in text and "Slowest ops against their roofline" in text


def test_the_traced_training_is_bit_identical_to_an_untraced_process(run, tmp_path):
    # Both ranks train on the same batch, so DDP's average gradient is each rank's own, exactly.
    untraced("--steps", "12", "--save", tmp_path / "losses")
    plain = (tmp_path / "losses.rank0").read_text()
    for rank in (0, 1):
        assert (run.folder / f"out.pt.rank{rank}").read_text() == plain

"""The workloads train exactly like a single-process reference on the same data and seed, and
inject the faults their flags ask for.

Each launch costs a few seconds on CPU, so every run uses a tiny model and few steps. The tiny
model's runs of ddp, model_parallel and pipeline (gpipe) are the shared runs `*-tiny`
(tests/helpers/runs.py), which are also the untraced side of the traced-training identity
(test_traced_training_bit_identical.py). Bad flags are rejected by each rank's argument parser
before any process group starts, so each is checked in this process as rank 0 and as rank 1 of
two would parse it, and one of them end to end under torchrun.
"""

import importlib.util
import re
import runpy
import signal
import sys
import time
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from helpers.launch import DDP, REPO, launch, start
from helpers.runs import TINY_BATCH, TINY_HIDDEN, TINY_LAYERS, TINY_LR, TINY_SEED, TINY_STEPS
from workloads.common import SILENT_RANK_EXIT_DELAY_S, SyntheticDataset, build_model

HIDDEN, LAYERS, SEED, LR = TINY_HIDDEN, TINY_LAYERS, TINY_SEED, TINY_LR
MODEL_FLAGS = ["--hidden", HIDDEN, "--layers", LAYERS, "--seed", SEED, "--lr", LR]
DIST_FLAGS = MODEL_FLAGS + ["--pg-timeout-s", 30]
TOLERANCE = dict(rtol=1e-4, atol=1e-6)
PIPELINE, MODEL_PARALLEL = "workloads/pipeline.py", "workloads/model_parallel.py"


def reference_training(batch_size: int, steps: int, amp: bool = False):
    """Plain single-process SGD on full batches: (model, losses, first logits, first grads)."""
    model = build_model(HIDDEN, LAYERS, SEED)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    dataset = SyntheticDataset(steps * batch_size, HIDDEN, SEED)
    losses, first_logits, first_grads = [], None, None
    for inputs, targets in DataLoader(dataset, batch_size=batch_size):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
            logits = model(inputs)
            loss = F.cross_entropy(logits, targets)
        loss.backward()
        if first_logits is None:
            first_logits = logits.detach().clone()
            first_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
        losses.append(loss.item())
    return model, losses, first_logits, first_grads


def check_ok(result, steps: int):
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for step in range(1, steps + 1):
        assert result.stdout.count(f"step {step} loss ") == 1, output  # only one rank logs
    assert "Traceback" not in output and "Warning" not in output, output


def assert_params_close(actual: dict, model: torch.nn.Module):
    expected = dict(model.named_parameters())
    assert actual.keys() == expected.keys()
    for name, tensor in actual.items():
        torch.testing.assert_close(tensor, expected[name].detach(), **TOLERANCE, msg=name)


def load(path):
    return torch.load(path, weights_only=True)



def test_ddp_matches_full_batch_training(shared_runs):
    # Per rank 8 samples a step: a step covers 8 * 2 consecutive samples.
    run = shared_runs["ddp-tiny"]
    check_ok(run.result, TINY_STEPS)
    model, _, _, _ = reference_training(TINY_BATCH * 2, TINY_STEPS)
    saved = load(run.saved)
    assert_params_close(saved["params"], model)
    assert saved["losses"].shape == (TINY_STEPS,)


def test_ddp_with_gradient_accumulation_in_small_buckets_matches_full_batch_training(tmp_path):
    # Per rank and micro-step 4 samples: a step covers 4 * 2 * 2 consecutive samples.
    steps, per_rank, grad_accum = 3, 4, 2
    result = launch(DDP, *DIST_FLAGS, "--steps", steps, "--batch-size", per_rank,
                    "--grad-accum", grad_accum, "--save", tmp_path / "ddp.pt",
                    "--bucket-cap-mb", 0.001, nproc=2, timeout=120)  # several 1 KiB buckets
    check_ok(result, steps)
    model, _, _, _ = reference_training(per_rank * grad_accum * 2, steps)
    saved = load(tmp_path / "ddp.pt")
    assert_params_close(saved["params"], model)
    assert saved["losses"].shape == (steps,)


def test_ddp_single_rank_amp_under_runpy(tmp_path):
    steps = 2
    result = launch(DDP, *DIST_FLAGS, "--steps", steps, "--batch-size", 8, "--amp",
                    "--save", tmp_path / "amp.pt", count_steps=True, timeout=120)
    check_ok(result, steps)
    assert f"optimizer steps {steps}" in result.stdout
    model, losses, _, _ = reference_training(8, steps, amp=True)
    saved = load(tmp_path / "amp.pt")
    assert_params_close(saved["params"], model)
    torch.testing.assert_close(saved["losses"].tolist(), losses, **TOLERANCE)


def test_dp_matches_plain_training(tmp_path):
    steps = 3
    result = launch("workloads/dp.py", *MODEL_FLAGS, "--steps", steps, "--batch-size", 8,
                    "--save", tmp_path / "dp.pt", count_steps=True, timeout=120)
    check_ok(result, steps)
    assert "no GPU visible" in result.stdout and f"optimizer steps {steps}" in result.stdout
    model, losses, _, _ = reference_training(8, steps)
    saved = load(tmp_path / "dp.pt")
    assert_params_close(saved["params"], model)
    torch.testing.assert_close(saved["losses"].tolist(), losses, **TOLERANCE)


def unshard(shards: list[dict]) -> dict:
    """Rebuild full tensors from the two ranks' local shards (layout as in model_parallel.py)."""
    full = {}
    for name in shards[0]:
        parts = [shard[name] for shard in shards]
        if ".fc1." in name:
            full[name] = torch.cat(parts, dim=0)
        elif name.endswith("fc2.weight"):
            full[name] = torch.cat(parts, dim=1)
        else:  # replicated: every rank must hold the same values
            torch.testing.assert_close(parts[0], parts[1], **TOLERANCE, msg=name)
            full[name] = parts[0]
    return full


def test_model_parallel_matches_unsharded_model(shared_runs):
    run = shared_runs["model_parallel-tiny"]
    check_ok(run.result, TINY_STEPS)
    ranks = [load(run.folder / f"out.rank{rank}.pt") for rank in range(2)]
    assert ranks[0]["params"]["blocks.0.fc1.weight"].shape == (HIDDEN // 2, HIDDEN)
    assert ranks[1]["params"]["blocks.1.fc2.weight"].shape == (HIDDEN, HIDDEN // 2)
    model, losses, first_logits, first_grads = reference_training(TINY_BATCH, TINY_STEPS)
    for saved in ranks:
        torch.testing.assert_close(saved["first_logits"], first_logits, **TOLERANCE)
        torch.testing.assert_close(saved["losses"].tolist(), losses, **TOLERANCE)
    grads = unshard([saved["first_grads"] for saved in ranks])
    assert grads.keys() == first_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, first_grads[name], **TOLERANCE, msg=name)
    assert_params_close(unshard([saved["params"] for saved in ranks]), model)


def check_pipeline(result, first_file, last_file, steps: int, batch: int) -> None:
    check_ok(result, steps)
    first, last = load(first_file), load(last_file)
    assert sorted({name.split(".")[1] for name in first["params"]}) == ["0"]  # blocks.0 only
    # Mean of the equal microbatch losses == full-batch mean loss, step after step.
    model, losses, _, _ = reference_training(batch, steps)
    torch.testing.assert_close(last["losses"].tolist(), losses, **TOLERANCE)
    assert first["losses"].numel() == 0
    assert_params_close({**first["params"], **last["params"]}, model)


def test_pipeline_gpipe_loss_matches_unsplit_model(shared_runs):
    run = shared_runs["pipeline-tiny"]  # 2 microbatches, gpipe (the default schedule)
    assert "gpipe, 2 microbatches" in run.result.stdout
    check_pipeline(run.result, run.folder / "out.rank0.pt", run.folder / "out.rank1.pt",
                   TINY_STEPS, TINY_BATCH)


def test_pipeline_1f1b_loss_matches_unsplit_model(tmp_path):
    steps, batch = 3, 8
    result = launch(PIPELINE, *DIST_FLAGS, "--steps", steps, "--batch-size", batch,
                    "--schedule", "1f1b", "--microbatches", 4, "--save", tmp_path / "pp.pt",
                    nproc=2, timeout=120)
    check_pipeline(result, tmp_path / "pp.rank0.pt", tmp_path / "pp.rank1.pt", steps, batch)


BAD_INPUT = [
    (PIPELINE, ["--layers", 3], "--layers 3 cannot be split evenly over 2 pipeline stages"),
    (MODEL_PARALLEL, ["--hidden", 33], "--hidden 33 cannot be sharded over 2 ranks"),
    (DDP, ["--steps", 0], "argument --steps: must be > 0, got 0"),
    (DDP, ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (DDP, ["--crash", "1"], "argument --crash: must be RANK:STEP, got 1"),
    (PIPELINE, ["--hang", "1:0"], "argument --hang: must be RANK:STEP, got 1:0"),
    (MODEL_PARALLEL, ["--straggle", "x:5"], "argument --straggle: must be RANK:MS, got x:5"),
]
BAD_INPUT_IDS = [f"{Path(script).stem}{args[0]}" for script, args, _ in BAD_INPUT]


def run_main_as(monkeypatch, capsys, script: str, args, rank=None, world_size=None):
    """`script`'s main() in this process, as the rank `rank` of `world_size` ranks under
    torchrun runs it (RANK and WORLD_SIZE set as torchrun sets them; None: one plain process),
    up to its exit: (exit status, stdout, stderr, the sleeps it asked for). The sleeps return at
    once, and starting the process group fails the test: a flag must be rejected before it."""
    spec = importlib.util.spec_from_file_location("common", REPO / "workloads" / "common.py")
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    slept = []
    monkeypatch.setattr(common, "time", types.SimpleNamespace(sleep=slept.append))
    monkeypatch.setitem(sys.modules, "common", common)  # the scripts' `from common import`
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    if world_size is not None:
        for name, value in (("RANK", rank), ("LOCAL_RANK", rank), ("WORLD_SIZE", world_size)):
            monkeypatch.setenv(name, str(value))
    main = runpy.run_path(str(REPO / script), run_name="bad_input")["main"]

    def no_process_group(args):
        raise AssertionError(f"{script} started its process group with {args}")

    monkeypatch.setitem(main.__globals__, "init_distributed", no_process_group)
    monkeypatch.setattr(sys, "argv", [script.split("/")[1], *map(str, args)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    return exited.value.code, out, err, slept


@pytest.mark.parametrize("script, args, message", BAD_INPUT, ids=BAD_INPUT_IDS)
def test_bad_input_is_one_message_from_rank_0_before_the_process_group(monkeypatch, capsys,
                                                                       script, args, message):
    code, out, err, slept = run_main_as(monkeypatch, capsys, script, [*args, "--pg-timeout-s", 5],
                                        rank=0, world_size=2)
    assert code == 2 and out == "" and slept == []
    assert err.count(message) == 1 and "Traceback" not in err, err
    # Rank 1 says nothing and waits for the launcher to stop it once rank 0 has exited, so that
    # rank 0's message is never cut off.
    code, out, err, slept = run_main_as(monkeypatch, capsys, script, [*args, "--pg-timeout-s", 5],
                                        rank=1, world_size=2)
    assert (code, out, err, slept) == (2, "", "", [SILENT_RANK_EXIT_DELAY_S])


def test_bad_input_fails_fast_with_one_message_under_torchrun():
    # End to end, for one of the flags above: rank 0's one message, and the launcher stopping
    # rank 1 in its wait at once, so the run fails fast, with no traceback from a rank.
    script, args, message = BAD_INPUT[0]
    start = time.monotonic()
    result = launch(script, *args, "--pg-timeout-s", 5, nproc=2, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert output.count(message) == 1, output
    assert script + '", line' not in output, output  # no traceback from ranks
    assert time.monotonic() - start < 45


def test_pipeline_rejects_batch_not_divisible_by_microbatches(monkeypatch, capsys):
    code, out, err, _ = run_main_as(monkeypatch, capsys, PIPELINE,
                                    ["--batch-size", 10, "--microbatches", 4])
    assert (code, out) == (2, "")
    assert err.strip() == ("pipeline.py: error: --batch-size 10 is not divisible by "
                           "--microbatches 4")


# ---- fault flags ---------------------------------------------------------------------------------
FAULT_FLAGS = MODEL_FLAGS + ["--batch-size", 8]
# How long a hung run must go on after its hang before it is stopped.
HANG_SECONDS = 2  # two of the hung rank's 1 s sleeps
STEP_TIMES = re.compile(r"^rank (\d) step (\d+) wall_ms ([\d.]+) cpu_ms ([\d.]+)$", re.M)


def test_straggle_spends_busy_host_time_on_its_rank_only():
    # Not alone(): the ratio of the ranks' CPU times holds beside other work. Rank 1 spins for
    # 300 ms of wall time a step; on a host where three processes share each core it still gets
    # about 100 ms of CPU, and rank 0's step takes 2-4 ms (at load 2.5 on 2 cores).
    straggle_ms, steps = 300, 2
    result = launch(DDP, *FAULT_FLAGS, "--pg-timeout-s", 30, "--steps", steps,
                    "--straggle", f"1:{straggle_ms}", nproc=2, timeout=120)
    check_ok(result, steps)
    times = {(int(r), int(s)): (float(w), float(c))
             for r, s, w, c in STEP_TIMES.findall(result.stdout)}
    assert sorted(times) == [(rank, step) for rank in (0, 1) for step in range(1, steps + 1)]
    for step in range(1, steps + 1):
        cpu_0, (wall_1, cpu_1) = times[(0, step)][1], times[(1, step)]
        assert wall_1 >= straggle_ms  # the busy loop runs until MS have passed
        # Rank 0 waits for rank 1 in the gradient all-reduce without spending CPU; rank 1 spins.
        assert cpu_1 > 2 * cpu_0 + 10, times


@pytest.mark.parametrize("script", [DDP, MODEL_PARALLEL, PIPELINE],
                         ids=["ddp", "model_parallel", "pipeline"])
def test_crash_exits_the_rank_and_fails_the_run(script):
    result = launch(script, *FAULT_FLAGS, "--pg-timeout-s", 30, "--steps", 3, "--crash", "1:2",
                    nproc=2, timeout=120)
    assert result.returncode != 0
    assert "rank 1: --crash, exiting at step 2" in result.stdout
    assert "step 2 loss" not in result.stdout and "step 3 loss" not in result.stdout


def test_mismatched_all_reduce_fails_within_the_process_group_timeout():
    result = launch(DDP, *FAULT_FLAGS, "--pg-timeout-s", 10, "--steps", 3,
                    "--mismatch", "0:2", nproc=2, timeout=90)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "step 1 loss" in result.stdout and "step 2 loss" not in result.stdout


def test_hang_sleeps_until_the_launcher_is_stopped():
    # Under `timeout`, as a job's time limit would stop it. Once rank 1 says it hangs, both
    # ranks must still be there seconds later (rank 0 waits on it with a 300 s process-group
    # timeout); then SIGALRM makes `timeout` act as if its limit had passed: it stops the
    # launcher with SIGTERM and exits 124.
    started = start(PIPELINE, *FAULT_FLAGS, "--steps", 3, "--hang", "1:2", "--pg-timeout-s", 300,
                    nproc=2, prefix=["timeout", "-s", "TERM", "600"])
    try:
        started.wait_for_line("rank 1: --hang, sleeping forever at step 2", timeout=120)
        time.sleep(HANG_SECONDS)
        assert started.popen.poll() is None, "the run ended by itself"
        started.popen.send_signal(signal.SIGALRM)
        stdout, stderr = started.communicate(timeout=60)
    finally:
        if started.popen.poll() is None:
            started.popen.kill()
    assert started.popen.returncode == 124, stdout + stderr  # stopped by timeout's TERM
    assert "rank 1: --hang, sleeping forever at step 2" in stdout

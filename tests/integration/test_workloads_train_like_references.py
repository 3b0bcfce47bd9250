"""The workloads train exactly like a single-process reference on the same data and seed, and
inject the faults their flags ask for.

Each launch costs a few seconds on CPU, so every run uses a tiny model and few steps.
"""

import os
import re
import socket
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from helpers.launch import REPO
from helpers.launch import launch as launch_script
from workloads.common import SyntheticDataset, build_model

HIDDEN, LAYERS, SEED, LR = 32, 2, 3, 0.1
MODEL_FLAGS = ["--hidden", HIDDEN, "--layers", LAYERS, "--seed", SEED, "--lr", LR]
DIST_FLAGS = MODEL_FLAGS + ["--pg-timeout-s", 30]
TOLERANCE = dict(rtol=1e-4, atol=1e-6)


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


@pytest.fixture
def launch():
    """launch(script, *args, nproc=2): torchrun over nproc ranks; nproc=None: runpy, one process."""

    def run(script: str, *args, nproc: int | None = 2, timeout: float = 120):
        return launch_script(f"workloads/{script}", *args, nproc=nproc,
                             count_steps=nproc is None, timeout=timeout)

    return run


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_ddp_matches_full_batch_training(launch, tmp_path, grad_accum):
    # Per rank and micro-step 4 samples: a step covers 4 * grad_accum * 2 consecutive samples.
    steps, per_rank = 3, 4
    extra = ["--bucket-cap-mb", 0.005] if grad_accum > 1 else []  # several 5 KiB buckets
    result = launch("ddp.py", *DIST_FLAGS, "--steps", steps, "--batch-size", per_rank,
                    "--grad-accum", grad_accum, "--save", tmp_path / "ddp.pt", *extra)
    check_ok(result, steps)
    model, _, _, _ = reference_training(per_rank * grad_accum * 2, steps)
    saved = load(tmp_path / "ddp.pt")
    assert_params_close(saved["params"], model)
    assert saved["losses"].shape == (steps,)


def test_ddp_single_rank_amp_under_runpy(launch, tmp_path):
    steps = 2
    result = launch("ddp.py", *DIST_FLAGS, "--steps", steps, "--batch-size", 8, "--amp",
                    "--save", tmp_path / "amp.pt", nproc=None)
    check_ok(result, steps)
    assert f"optimizer steps {steps}" in result.stdout
    model, losses, _, _ = reference_training(8, steps, amp=True)
    saved = load(tmp_path / "amp.pt")
    assert_params_close(saved["params"], model)
    torch.testing.assert_close(saved["losses"].tolist(), losses, **TOLERANCE)


def test_dp_matches_plain_training(launch, tmp_path):
    steps = 3
    result = launch("dp.py", *MODEL_FLAGS, "--steps", steps, "--batch-size", 8,
                    "--save", tmp_path / "dp.pt", nproc=None)
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


def test_model_parallel_matches_unsharded_model(launch, tmp_path):
    steps = 2
    result = launch("model_parallel.py", *DIST_FLAGS, "--steps", steps, "--batch-size", 8,
                    "--save", tmp_path / "tp.pt")
    check_ok(result, steps)
    ranks = [load(tmp_path / f"tp.rank{rank}.pt") for rank in range(2)]
    assert ranks[0]["params"]["blocks.0.fc1.weight"].shape == (HIDDEN // 2, HIDDEN)
    assert ranks[1]["params"]["blocks.1.fc2.weight"].shape == (HIDDEN, HIDDEN // 2)
    model, losses, first_logits, first_grads = reference_training(8, steps)
    for saved in ranks:
        torch.testing.assert_close(saved["first_logits"], first_logits, **TOLERANCE)
        torch.testing.assert_close(saved["losses"].tolist(), losses, **TOLERANCE)
    grads = unshard([saved["first_grads"] for saved in ranks])
    assert grads.keys() == first_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, first_grads[name], **TOLERANCE, msg=name)
    assert_params_close(unshard([saved["params"] for saved in ranks]), model)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_loss_matches_unsplit_model(launch, tmp_path, schedule):
    steps, batch = 3, 8
    result = launch("pipeline.py", *DIST_FLAGS, "--steps", steps, "--batch-size", batch,
                    "--schedule", schedule, "--microbatches", 4, "--save", tmp_path / "pp.pt")
    check_ok(result, steps)
    first, last = (load(tmp_path / f"pp.rank{rank}.pt") for rank in range(2))
    assert sorted({name.split(".")[1] for name in first["params"]}) == ["0"]  # blocks.0 only
    # Mean of 4 equal microbatch losses == full-batch mean loss, step after step.
    model, losses, _, _ = reference_training(batch, steps)
    torch.testing.assert_close(last["losses"].tolist(), losses, **TOLERANCE)
    assert first["losses"].numel() == 0
    assert_params_close({**first["params"], **last["params"]}, model)


@pytest.mark.parametrize("script, args, message", [
    ("pipeline.py", ["--layers", 3], "--layers 3 cannot be split evenly over 2 pipeline stages"),
    ("model_parallel.py", ["--hidden", 33], "--hidden 33 cannot be sharded over 2 ranks"),
    ("ddp.py", ["--steps", 0], "argument --steps: must be > 0, got 0"),
    ("ddp.py", ["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    ("ddp.py", ["--crash", "1"], "argument --crash: must be RANK:STEP, got 1"),
    ("pipeline.py", ["--hang", "1:0"], "argument --hang: must be RANK:STEP, got 1:0"),
    ("model_parallel.py", ["--straggle", "x:5"], "argument --straggle: must be RANK:MS, got x:5"),
])
def test_bad_input_fails_fast_with_one_message(launch, script, args, message):
    start = time.monotonic()
    result = launch(script, *args, "--pg-timeout-s", 5, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert output.count(message) == 1, output
    assert "workloads/" + script + '", line' not in output, output  # no traceback from ranks
    assert time.monotonic() - start < 45


def test_pipeline_rejects_batch_not_divisible_by_microbatches(launch):
    result = launch("pipeline.py", "--batch-size", 10, "--microbatches", 4, nproc=None)
    assert result.returncode == 2
    assert result.stderr.strip() == ("pipeline.py: error: --batch-size 10 is not divisible by "
                                     "--microbatches 4")


# ---- fault flags ---------------------------------------------------------------------------------
FAULT_FLAGS = MODEL_FLAGS + ["--batch-size", 8]
STEP_TIMES = re.compile(r"^rank (\d) step (\d+) wall_ms ([\d.]+) cpu_ms ([\d.]+)$", re.M)


def test_straggle_spends_busy_host_time_on_its_rank_only(launch):
    straggle_ms, steps = 300, 2
    result = launch("ddp.py", *FAULT_FLAGS, "--pg-timeout-s", 30, "--steps", steps,
                    "--straggle", f"1:{straggle_ms}")
    check_ok(result, steps)
    times = {(int(r), int(s)): (float(w), float(c))
             for r, s, w, c in STEP_TIMES.findall(result.stdout)}
    assert sorted(times) == [(rank, step) for rank in (0, 1) for step in range(1, steps + 1)]
    for step in range(1, steps + 1):
        cpu_0, (wall_1, cpu_1) = times[(0, step)][1], times[(1, step)]
        assert wall_1 >= straggle_ms  # the busy loop runs until MS have passed
        # Rank 0 waits for rank 1 in the gradient all-reduce without spending CPU; rank 1 spins.
        assert cpu_1 > 2 * cpu_0 + 10, times


@pytest.mark.parametrize("script", ["ddp.py", "model_parallel.py", "pipeline.py"])
def test_crash_exits_the_rank_and_fails_the_run(launch, script):
    result = launch(script, *FAULT_FLAGS, "--pg-timeout-s", 30, "--steps", 3, "--crash", "1:2")
    assert result.returncode != 0
    assert "rank 1: --crash, exiting at step 2" in result.stdout
    assert "step 2 loss" not in result.stdout and "step 3 loss" not in result.stdout


def test_mismatched_all_reduce_fails_within_the_process_group_timeout(launch):
    result = launch("ddp.py", *FAULT_FLAGS, "--pg-timeout-s", 10, "--steps", 3,
                    "--mismatch", "0:2", timeout=90)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "step 1 loss" in result.stdout and "step 2 loss" not in result.stdout


def test_hang_sleeps_until_the_launcher_is_stopped(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    if any(name == "lo" for _, name in socket.if_nameindex()):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    command = ["timeout", "-s", "TERM", "20", sys.executable, "-m", "torch.distributed.run",
               "--standalone", "--nproc-per-node", "2", "workloads/pipeline.py",
               *map(str, FAULT_FLAGS), "--steps", "3", "--hang", "1:2", "--pg-timeout-s", "300"]
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 124, result.stdout + result.stderr  # stopped by timeout's TERM
    assert "rank 1: --hang, sleeping forever at step 2" in result.stdout

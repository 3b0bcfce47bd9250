"""The workloads train exactly like a single-process reference on the same data and seed.

Each launch costs a few seconds on CPU, so every run uses a tiny model and few steps.
"""

import time

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from workloads.common import SyntheticDataset, build_model

HIDDEN, LAYERS, SEED, LR = 32, 2, 3, 0.1
MODEL_FLAGS = ["--hidden", HIDDEN, "--layers", LAYERS, "--seed", SEED, "--lr", LR]
DIST_FLAGS = MODEL_FLAGS + ["--pg-timeout", 30]
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
])
def test_bad_input_fails_fast_with_one_message(launch, script, args, message):
    start = time.monotonic()
    result = launch(script, *args, "--pg-timeout", 5, timeout=60)
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

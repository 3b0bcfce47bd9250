"""What the framework scripts share: their command-line flags, the injected delay, the result
file (each step's loss as the bytes of its tensor, and a digest of the final parameters) and
their end."""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch
import torch.distributed as dist

from workloads.common import rank_and

SEED = 0
BATCH = 4  # samples per rank per step
SAMPLES = 256  # the synthetic data set: more than any run's steps x ranks x BATCH


def parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (max_steps)")
    parser.add_argument("--straggle", type=rank_and(float, "MS"), metavar="RANK:MS",
                        help="rank RANK sleeps MS milliseconds at the start of every step")
    parser.add_argument("--out", required=True,
                        help="rank 0 writes its losses and the final parameters' digest here")
    return parser


def straggle(spec: tuple[int, float] | None, rank: int) -> None:
    """The injected delay: a sleep at the start of the step on the named rank."""
    if spec is not None and spec[0] == rank:
        time.sleep(spec[1] / 1e3)


def token_data(vocab: int, length: int) -> torch.Tensor:
    """SAMPLES sequences of `length` token ids below `vocab`, the same on every rank and run."""
    generator = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab, (SAMPLES, length), generator=generator)


class Result:
    """Each step's loss (the bytes of the loss tensor, so equal means bit-identical) and, at the
    end, the final parameters: their count and a SHA-256 of their bytes in name order."""

    def __init__(self):
        self.losses: list[str] = []

    def loss(self, loss: torch.Tensor) -> None:
        self.losses.append(loss.detach().to("cpu", torch.float32).numpy().tobytes().hex())

    def write(self, path: str, model: torch.nn.Module, rank: int) -> None:
        if rank != 0:
            return
        digest = hashlib.sha256()
        params = dict(model.named_parameters())  # tied weights once
        for name in sorted(params):
            digest.update(name.encode())
            digest.update(params[name].detach().contiguous().numpy().tobytes())
        trained = sum(p.numel() for p in params.values() if p.requires_grad)
        with open(path, "w") as out:
            json.dump({"losses": self.losses, "params": trained,
                       "param_sha256": digest.hexdigest()}, out)


def shut_down() -> None:
    """Destroy the process group, as PyTorch asks of every script that ends (its distributed
    docs, "Shutdown"): a gloo group left to the interpreter's exit may abort the process when
    its threads outlive the interpreter ("terminate called without an active exception", as an
    untraced Lightning run once did in CI), and the frameworks leave it to the script."""
    if dist.is_initialized():
        dist.destroy_process_group()

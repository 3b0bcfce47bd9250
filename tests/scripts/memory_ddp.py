"""A 2-rank DDP loop on CPU whose ranks use memory differently, for the memory analysis
(docs/memory.md): one rank may hold an extra buffer all along, another keep a tensor every
step from some step on (a leak), as a user's script does by keeping losses or activations.

`--buffer RANK:MIB` allocates MIB MiB on RANK before training, written through so that it is
resident, and keeps it until the end. `--leak RANK:MIB:STEP` makes RANK keep a new MIB MiB
tensor (written through) in every step from STEP on, before the optimizer step ends it.
`--step-ms MS` sleeps MS at each step's start so that the device sampler sees every step.
`--parameters` prints the model's parameter count and exits (the reference for the memory
categories).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

MIB = 1 << 20
WIDTH = 256


def rank_value(spec: str | None) -> tuple[int, list[float]] | None:
    if not spec:
        return None
    rank, *values = spec.split(":")
    return int(rank), [float(v) for v in values]


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--buffer", help="RANK:MIB held from the start")
    p.add_argument("--leak", help="RANK:MIB:STEP kept every step from STEP on")
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--parameters", action="store_true")
    return p.parse_args()


def model_of() -> nn.Module:
    """Three 256 x 256 linear layers with biases: 197,376 parameters."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                         nn.Linear(WIDTH, WIDTH))


def resident(mib: float) -> torch.Tensor:
    """A tensor of `mib` MiB whose pages are all touched (resident, counted in RSS)."""
    return torch.ones(int(mib * MIB) // 4, dtype=torch.float32)


def main():
    args = parse_args()
    model = model_of()
    if args.parameters:
        print(f"parameters {sum(p.numel() for p in model.parameters())}")
        return
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    buffer, leak = rank_value(args.buffer), rank_value(args.leak)
    held = resident(buffer[1][0]) if buffer and buffer[0] == rank else None
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = torch.linspace(-1, 1, args.batch * WIDTH).reshape(args.batch, WIDTH)
    kept = []
    for step in range(args.steps):
        time.sleep(args.step_ms / 1e3)
        optimizer.zero_grad()
        model(batch).square().mean().backward()
        if leak and leak[0] == rank and step >= leak[1][1]:
            kept.append(resident(leak[1][0]))
        optimizer.step()  # the step's end: what it kept is in its memory
    dist.barrier()
    del held, kept
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()

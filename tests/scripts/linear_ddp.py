"""DDP over bias-free nn.Linear layers (ReLU between), SGD, a fixed batch: the run whose FLOPs per
step tests/integration/test_flops_of_a_traced_run.py checks against FlopCounterMode's count.

`--count-flops` runs one step alone (no process group, no DDP) under
torch.utils.flop_counter.FlopCounterMode and prints its total: the reference, never taken in a
traced process. `--save FILE` writes repr() of each step's loss to FILE.rank{R}, one a line.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--save")
    p.add_argument("--count-flops", action="store_true")
    return p.parse_args()


def model_of(args) -> nn.Module:
    torch.manual_seed(0)
    layers = []
    for i in range(args.layers):
        layers.append(nn.Linear(args.width, args.width, bias=False))
        if i < args.layers - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def step(model, optimizer, batch) -> torch.Tensor:
    optimizer.zero_grad()
    loss = model(batch).square().mean()
    loss.backward()
    optimizer.step()
    return loss


def main():
    args = parse_args()
    batch = torch.linspace(-1, 1, args.batch * args.width).reshape(args.batch, args.width)
    model = model_of(args)
    if args.count_flops:
        from torch.utils.flop_counter import FlopCounterMode

        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        with FlopCounterMode(display=False) as counter:
            step(model, optimizer, batch)
        print(f"flops {counter.get_total_flops()}")
        return
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = [repr(step(model, optimizer, batch).item()) for _ in range(args.steps)]
    if args.save:
        rank = dist.get_rank() if distributed else 0
        with open(f"{args.save}.rank{rank}", "w") as out:
            out.write("\n".join(losses) + "\n")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

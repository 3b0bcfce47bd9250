"""Data-parallel training with the gradients averaged by one explicit all_reduce per step (gloo,
CPU), at any world size, and optionally one rank spending a known host time in a busy loop before
every forward pass. The per-rank batch is fixed, so the global batch grows with the world size
(weak scaling).

    python -m tracer.sweep --nproc 1,4 tests/scripts/scaling_straggle.py --straggle 3:60
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from workloads.common import busy_wait, rank_and


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--straggle", type=rank_and(float, "MS"), metavar="RANK:MS")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # ranks share a small CPU: no intra-op threads competing
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    inputs = torch.randn(args.batch_size, args.hidden, generator=generator)
    targets = torch.randint(0, 10, (args.batch_size,), generator=generator)
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        if args.straggle is not None and args.straggle[0] == rank:
            busy_wait(args.straggle[1])
        F.cross_entropy(model(inputs), targets).backward()
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

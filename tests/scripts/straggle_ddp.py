"""A small DDP training loop (gloo, CPU) in which one rank spends a known host time before
every forward pass: a busy loop, so the rank is late at every gradient all-reduce.

    torchrun --nproc-per-node 2 -m tracer.record tests/scripts/straggle_ddp.py --straggle 1:25
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workloads.common import busy_wait, rank_and


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--straggle", type=rank_and(float, "MS"), metavar="RANK:MS")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # two ranks share a small CPU: no intra-op threads competing
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(32, args.hidden)
    targets = torch.randint(0, 10, (32,))
    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        if args.straggle is not None and args.straggle[0] == rank:
            busy_wait(args.straggle[1])
        F.cross_entropy(model(inputs), targets).backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

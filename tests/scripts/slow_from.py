"""A small DDP training loop (gloo, CPU) in which one rank turns slow from a given step on: MS
milliseconds more in each of its steps from STEP on (until --slow-until, if given).

    torchrun --nproc-per-node 2 -m tracer.record \
        tests/scripts/slow_from.py --steps 35 --slow-from 20 --slow-rank 1 --slow-ms 60

Where the time goes (--slow-where): `optimizer` (the default), a busy loop after the gradients
are reduced and before the optimizer step, so that it holds back this rank's step alone: the
other ranks wait for it at the next step's all-reduce, and so turn slow one step later;
`forward`, a sleep before the forward pass: the other ranks wait for it in the same step's
all-reduce; `data`, a sleep in the DataLoader's collate of this rank's batches (a loader that
turned slow). `--step-sleep-ms`: a pace that costs no CPU (a sleep in each step of every rank,
for runs whose steps need only their length). `--wait-for FILE`: before step `--slow-from`, say
so on stdout and wait (up to 60 s) until FILE exists, so that a test can act at a known step.
`--losses FILE`: each step's loss, repr(), one a line (rank 0).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset, default_collate

from workloads.common import busy_wait, cleanup


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=35)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--slow-from", type=int, help="the first slow step")
    parser.add_argument("--slow-until", type=int, help="the first step no longer slow")
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--slow-ms", type=float, default=60.0)
    parser.add_argument("--slow-where", choices=("optimizer", "forward", "data"),
                        default="optimizer")
    parser.add_argument("--step-ms", type=float, default=5.0,
                        help="host time every rank spends in each step (a steadier median)")
    parser.add_argument("--step-sleep-ms", type=float, default=0.0,
                        help="time every rank sleeps in each step")
    parser.add_argument("--wait-for", metavar="FILE")
    parser.add_argument("--losses", metavar="FILE")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1 + rank)
    data = TensorDataset(torch.randn(16 * args.steps, args.hidden, generator=generator),
                         torch.randint(0, 10, (16 * args.steps,), generator=generator))
    step = 0

    def slow_now() -> bool:
        return (rank == args.slow_rank and args.slow_from is not None
                and args.slow_from <= step < (args.slow_until or args.steps))

    def collate(samples):
        if args.slow_where == "data" and slow_now():
            time.sleep(args.slow_ms / 1e3)
        return default_collate(samples)

    losses = []
    for inputs, targets in DataLoader(data, batch_size=16, collate_fn=collate):
        if args.wait_for and step == args.slow_from:
            # One write: unbuffered, print() writes the newline apart, and two ranks' lines
            # on the shared pipe could run into one.
            print(f"rank {rank} waiting at step {step}\n", end="", flush=True)
            deadline = time.monotonic() + 60
            while not os.path.exists(args.wait_for) and time.monotonic() < deadline:
                time.sleep(0.05)
        if args.slow_where == "forward" and slow_now():
            time.sleep(args.slow_ms / 1e3)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        busy_wait(args.step_ms)
        if args.step_sleep_ms:
            time.sleep(args.step_sleep_ms / 1e3)
        if args.slow_where == "optimizer" and slow_now():
            busy_wait(args.slow_ms)
        optimizer.step()
        losses.append(loss.item())
        step += 1
    if args.losses and rank == 0:
        with open(args.losses, "w") as f:
            f.write("".join(f"{value!r}\n" for value in losses))


if __name__ == "__main__":
    main()
    # Once main's frame (its DDP model) is gone: the model's reference cycles collected, then the
    # group destroyed, so that no gloo thread is left to interpreter shutdown to abort the rank
    # ("terminate called without an active exception", seen on a loaded machine).
    cleanup()

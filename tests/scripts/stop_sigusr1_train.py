"""Trains a tiny model on one rank of a gloo group (in-memory store), all-reducing each loss, and
at --signal-at sends itself SIGUSR1, then waits until --wait-for exists (the tracer's stack
dump) before training on. Prints repr() of the final loss."""

import argparse
import glob
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--signal-at", type=int, help="send SIGUSR1 to this process at this step")
parser.add_argument("--wait-for", help="glob of the file to wait for after the signal")
args = parser.parse_args()

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data, target = torch.randn(64, 16), torch.randn(64, 1)
for step in range(args.steps):
    if step == args.signal_at:
        os.kill(os.getpid(), signal.SIGUSR1)
        deadline = time.monotonic() + 60
        while not glob.glob(args.wait_for) and time.monotonic() < deadline:
            time.sleep(0.01)
    loss = F.mse_loss(model(data), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    dist.all_reduce(loss.detach())
print(repr(loss.item()))
dist.destroy_process_group()

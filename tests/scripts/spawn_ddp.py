"""PyTorch's DDP tutorial ("Getting Started with Distributed Data Parallel", its basic use case)
as a script launches it: `demo_basic(rank, world_size)` trains a toy model under DDP on a gloo
group, each rank started by `torch.multiprocessing.spawn`. Seeded, so that two runs give the same
losses; the options make one rank misbehave in a way a test needs, or start the ranks another
way: torch.multiprocessing.start_processes, elastic_launch with a function, multiprocessing.Process.

    python -m tracer.record tests/scripts/spawn_ddp.py --steps 30
"""

import argparse
import gc
import os
import socket
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size, port, timeout_s):
    if "TORCHELASTIC_RUN_ID" in os.environ:  # elastic_launch's worker: its variables say all
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s))


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def busy_wait(ms):
    """Host time spent computing nothing: the rank is late at the next all-reduce."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def at(option, rank):
    """The step of a RANK:STEP option for this rank, or None."""
    if option is None:
        return None
    who, _, what = option.partition(":")
    return float(what) if int(who) == rank else None


def crash_if_due(args, rank, step):
    if at(args.crash, rank) == step:
        raise RuntimeError(f"rank {rank} fails on purpose at step {step}")


def demo_basic(rank, world_size, args):
    print(f"Running basic DDP example on rank {rank}.", flush=True)
    setup(rank, world_size, args.port, args.pg_timeout_s)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = ToyModel()
    ddp_model = DDP(model)
    if args.compile:
        ddp_model = torch.compile(ddp_model)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    generator = torch.Generator().manual_seed(1 + rank)
    losses = []
    for step in range(args.steps):
        crash_if_due(args, rank, step)
        if at(args.hang, rank) == step:
            print(f"rank {rank} hangs at step {step}", flush=True)
            while True:
                time.sleep(1)
        straggle_ms = at(args.straggle, rank)
        if straggle_ms:
            busy_wait(straggle_ms)
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, generator=generator))
        labels = torch.randn(20, 5, generator=generator)
        loss = loss_fn(outputs, labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if args.losses:
        with open(f"{args.losses}.rank{rank}", "w") as f:
            f.write("".join(f"{value!r}\n" for value in losses))
    crash_if_due(args, rank, args.steps)  # --crash R:STEPS: after the last step
    if args.compile:
        # The compiler's cache holds the DDP module, which holds its process group: freed
        # before the group is destroyed, its gloo threads end while the interpreter is whole,
        # not in its finalization, where a thread left running aborts the process.
        del ddp_model, optimizer
        torch.compiler.reset()
        gc.collect()
    cleanup()
    print(f"Finished running basic DDP example on rank {rank}.", flush=True)


def elastic_worker(world_size, args):
    demo_basic(int(os.environ["RANK"]), world_size, args)


def launch_elastic(world_size, args):
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=world_size,
                          rdzv_backend="c10d", rdzv_endpoint=f"127.0.0.1:{free_port()}",
                          run_id="spawn_ddp", max_restarts=0, monitor_interval=0.1,
                          start_method=args.start_method)
    elastic_launch(config, elastic_worker)(world_size, args)


def launch_processes(world_size, args):
    context = mp.get_context(args.start_method)
    processes = [context.Process(target=demo_basic, args=(rank, world_size, args))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    if any(process.exitcode for process in processes):
        sys.exit(f"exit codes {[process.exitcode for process in processes]}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--launcher", default="spawn", choices=("spawn", "elastic", "process"),
                        help="torch.multiprocessing.spawn (or start_processes), elastic_launch "
                             "with a function, or multiprocessing.Process")
    parser.add_argument("--start-method", default="spawn",
                        choices=("spawn", "fork", "forkserver"),
                        help="other than spawn: torch.multiprocessing.start_processes")
    parser.add_argument("--no-join", action="store_true",
                        help="start with join=False, then join the returned context")
    parser.add_argument("--compile", action="store_true", help="torch.compile the DDP model")
    parser.add_argument("--crash", metavar="RANK:STEP",
                        help="raise RuntimeError there (STEP = --steps: after the last step)")
    parser.add_argument("--hang", metavar="RANK:STEP", help="sleep for ever there")
    parser.add_argument("--straggle", metavar="RANK:MS", help="busy-wait MS before each step")
    parser.add_argument("--losses", metavar="PATH", help="write each rank's losses to PATH.rankR")
    parser.add_argument("--pg-timeout-s", type=float, default=60)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    args.port = args.port or free_port()
    world_size = args.world_size
    join = not args.no_join
    if args.launcher == "elastic":
        launch_elastic(world_size, args)
        context = None
    elif args.launcher == "process":
        launch_processes(world_size, args)
        context = None
    elif args.start_method == "spawn":
        context = mp.spawn(demo_basic, args=(world_size, args), nprocs=world_size, join=join)
    else:
        context = mp.start_processes(demo_basic, args=(world_size, args), nprocs=world_size,
                                     join=join, start_method=args.start_method)
    while context is not None and not context.join():
        pass
    print("all ranks done", file=sys.stderr)


if __name__ == "__main__":
    main()

"""A tiny training script for the tracer's tests: an MLP, SGD, synthetic data, a few steps.

Runs the same with or without the tracer and under torchrun (gloo) or alone (one rank, in-memory
store). Each option below makes it misbehave in one way a test needs.
"""

import argparse
import errno
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--ddp", action="store_true", help="wrap the model in DDP over a gloo group")
    p.add_argument("--losses", help="write repr() of each loss here, one per line")
    p.add_argument("--fail-at", type=int, help="raise RuntimeError at this step")
    p.add_argument("--fail-in-first-attempt", action="store_true",
                   help="raise at step 1 when TORCHELASTIC_RESTART_COUNT is 0 (elastic restart)")
    p.add_argument("--no-process-group", action="store_true",
                   help="train alone without torch.distributed, even under torchrun")
    p.add_argument("--exit-code", type=int, help="sys.exit(N) after the last step")
    p.add_argument("--block-at", type=int, help="block in a C call (store get) at this step")
    p.add_argument("--kill-rank", type=int, help="this rank SIGKILLs itself at --kill-at")
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--manual-steps", action="store_true",
                   help="update weights by hand and call tracer.step() instead of an optimizer")
    p.add_argument("--unmarked-steps", action="store_true",
                   help="with --manual-steps: never call tracer.step()")
    p.add_argument("--all-reduce-loss", action="store_true",
                   help="all-reduce each step's loss over the default group (one comm op a step)")
    p.add_argument("--also-tracer-step", action="store_true",
                   help="call tracer.step() after each optimizer step too")
    p.add_argument("--spawn", type=int, default=0,
                   help="start this many processes with torch.multiprocessing.spawn first")
    p.add_argument("--step-sleep", type=float, default=0.0, help="sleep this long in each step")
    p.add_argument("--two-optimizers", action="store_true", help="one optimizer per layer")
    p.add_argument("--break-steps-file-at", type=int,
                   help="make the tracer's steps file fail with ENOSPC from this step on")
    p.add_argument("--sigterm-handler", metavar="PATH",
                   help="install a SIGTERM handler that writes PATH and exits with code 7")
    p.add_argument("--set-samples", metavar="STEP=N",
                   help="call tracer.set_samples_per_step(N) at the start of step STEP")
    p.add_argument("--print-argv", action="store_true")
    return p.parse_args()


class NoSpaceFile:
    """Stands in for a file on a full disk."""

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self):
        pass


def break_steps_file():
    import gc

    from tracer.parts.record_files import JsonlWriter

    for obj in gc.get_objects():
        if isinstance(obj, JsonlWriter) and obj.name == "steps" and not obj.closed:
            # Under the writer's lock: the step-end worker may be flushing this file right now.
            with obj._lock:
                real, obj._file = obj._file, NoSpaceFile()
            real.close()


def spawned(index):
    print(f"spawned process {index}", flush=True)


def main():
    args = parse_args()
    if args.spawn:
        import torch.multiprocessing as mp

        mp.spawn(spawned, nprocs=args.spawn)
    if args.print_argv:
        print("argv", sys.argv, "file", __file__, "path0", sys.path[0], flush=True)
    if args.sigterm_handler:
        def on_sigterm(signum, frame):
            with open(args.sigterm_handler, "w") as f:
                f.write("handled\n")
            sys.exit(7)
        signal.signal(signal.SIGTERM, on_sigterm)
    if args.no_process_group:
        pass
    elif "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.hidden, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 4))
    if args.ddp:
        model = nn.parallel.DistributedDataParallel(model)
    if args.two_optimizers:
        optimizers = [torch.optim.SGD(layer.parameters(), lr=0.1) for layer in (model[0], model[2])]
    elif not args.manual_steps:
        optimizers = [torch.optim.SGD(model.parameters(), lr=0.1)]
    generator = torch.Generator().manual_seed(1 + rank)
    losses = []
    for step in range(args.steps):
        if (
            args.fail_in_first_attempt
            and step == 1
            and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0"
        ):
            raise RuntimeError("failing the first attempt on purpose")
        if args.fail_at == step:
            raise RuntimeError(f"failing on purpose at step {step}")
        if args.kill_rank == rank and args.kill_at == step:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.block_at == step:
            print(f"blocking at step {step}", flush=True)
            store = dist.HashStore()
            store.set_timeout(timedelta(seconds=60))
            store.get("never-set")
        if args.break_steps_file_at == step:
            break_steps_file()
        if args.set_samples and int(args.set_samples.partition("=")[0]) == step:
            import tracer

            tracer.set_samples_per_step(int(args.set_samples.partition("=")[2]))
        x = torch.randn(16, args.hidden, generator=generator)
        y = torch.randint(0, 4, (16,), generator=generator)
        loss = F.cross_entropy(model(x), y)
        if args.all_reduce_loss:
            dist.all_reduce(loss.detach().clone())
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if args.manual_steps:
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad
            if not args.unmarked_steps:
                import tracer

                tracer.step()
        else:
            for opt in optimizers:
                opt.zero_grad()
            loss.backward()
            for opt in optimizers:
                opt.step()
            if args.also_tracer_step:
                import tracer

                tracer.step()
        losses.append(loss.item())
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    if args.losses and rank == 0:
        with open(args.losses, "w") as f:
            f.write("".join(f"{value!r}\n" for value in losses))
    if dist.is_initialized():
        dist.destroy_process_group()
    if args.exit_code is not None:
        sys.exit(args.exit_code)


if __name__ == "__main__":
    main()

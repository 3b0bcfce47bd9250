"""Data parallel training with DistributedDataParallel (DDP).

Every rank holds a full replica of the model and trains on its own shard of each batch
(DistributedSampler); DDP all-reduces (averages) gradients in buckets during backward.
With --grad-accum N the first N-1 micro-steps run under no_sync(), so gradients are
all-reduced once per optimizer step. --batch-size is per rank and per micro-step, so one
optimizer step consumes batch_size * grad_accum * world_size samples.

The logged loss is rank 0's own shard loss: averaging it over ranks would add a
collective that is not part of DDP's traffic.

--compile compiles the DDP module with torch.compile.

--save PATH: rank 0 writes {"losses": float64[steps], "params": {name: tensor}}.

Without WORLD_SIZE in the environment it runs as a 1-rank world.

Faults for trying the tracer and the analysis: --straggle RANK:MS, --straggle-tail RANK:MS,
--slow-data RANK:MS, --uneven-batch RANK:FACTOR, --hang RANK:STEP, --mismatch RANK:STEP,
--crash RANK:STEP and --pg-timeout-s S (see --help).

    torchrun --nproc-per-node 2 workloads/ddp.py --steps 20 --grad-accum 2 --amp
"""

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler

# a script's own folder is sys.path[0], however it is run (python, torchrun, the tracer)
from common import (
    Faults,
    SyntheticDataset,
    build_model,
    cleanup,
    init_distributed,
    log,
    make_loader,
    make_parser,
    positive_float,
    positive_int,
    rank_batch_size,
    record_samples_per_step,
    save_results,
)


def parse_args():
    parser = make_parser(__doc__)
    parser.add_argument("--grad-accum", type=positive_int, default=1, metavar="N",
                        help="micro-steps per optimizer step; gradients sync on the last only")
    parser.add_argument("--amp", action="store_true",
                        help="bf16 autocast (CUDA, or CPU autocast without a GPU)")
    parser.add_argument("--bucket-cap-mb", type=positive_float, default=None,
                        help="DDP gradient bucket cap in MiB; unset keeps DDP's own default "
                             "(25 MiB, first bucket 1 MiB)")
    return parser.parse_args()


def train(args, rank: int, world_size: int, device: torch.device) -> list[float]:
    model = build_model(args.hidden, args.layers, args.seed).to(device)
    device_ids = [device.index] if device.type == "cuda" else None
    model = DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=args.bucket_cap_mb)
    if args.compile:
        model.compile()  # torch.compile of the DDP module: Dynamo splits graphs at buckets
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    micro_steps = args.steps * args.grad_accum
    # Every rank's shard holds the largest rank's samples (--uneven-batch): each takes its own.
    largest = max(rank_batch_size(args, r) for r in range(world_size))
    dataset = SyntheticDataset(micro_steps * largest * world_size, args.hidden, args.seed)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=False)
    batches = iter(make_loader(dataset, rank_batch_size(args, rank), args, device, sampler))

    losses, faults = [], Faults(args, rank, device)
    for step in range(1, args.steps + 1):
        faults.before_forward(step)
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=device)
        for micro in range(args.grad_accum):
            inputs, targets = (t.to(device, non_blocking=True) for t in next(batches))
            is_last_micro = micro == args.grad_accum - 1
            with nullcontext() if is_last_micro else model.no_sync():
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp):
                    # Dividing by N makes the accumulated gradient the mean over all micro-steps.
                    loss = F.cross_entropy(model(inputs), targets) / args.grad_accum
                loss.backward()
            step_loss += loss.detach()
        faults.before_optimizer(step)
        optimizer.step()
        losses.append(step_loss.item())
        log(f"step {step} loss {losses[-1]:.6f}")
        faults.after_step(step)

    if args.save and rank == 0:
        save_results(args.save, losses, dict(model.module.named_parameters()))
    return losses


def main():
    args = parse_args()
    try:
        rank, world_size, device = init_distributed(args)
        log(f"ddp: world size {world_size}, device {device.type}, amp {args.amp}")
        record_samples_per_step(args.grad_accum * sum(rank_batch_size(args, r)
                                                      for r in range(world_size)))
        train(args, rank, world_size, device)
    finally:
        cleanup()


if __name__ == "__main__":
    main()

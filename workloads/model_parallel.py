"""Intra-layer (tensor) model parallel training with torch.distributed.tensor.parallel.

In every residual block fc1 is sharded by output features (ColwiseParallel) and fc2 by
input features (RowwiseParallel), so each rank holds hidden/world_size of each and the
block's activations stay sharded between the two. fc2's partial outputs are all-reduced
in forward; the block input's gradient is all-reduced in backward. The classifier head
is replicated. All ranks read the same batches: they split the model, not the data.

--save PATH: each rank writes its own shards to PATH with a rank suffix (out.pt ->
out.rank0.pt, out.rank1.pt): {"losses": float64[steps], "params": {name: local shard},
"first_logits": logits of step 1, "first_grads": {name: local gradient shard of step 1}}.
fc1 weight/bias are split along dim 0, fc2 weight along dim 1; fc2 bias and the head
are whole on every rank.

--compile compiles the parallelized model with torch.compile.

Without WORLD_SIZE in the environment it runs as a 1-rank world (a 1-device mesh).

Faults for trying the tracer and the analysis: --straggle RANK:MS, --straggle-tail RANK:MS,
--slow-data RANK:MS, --hang RANK:STEP, --mismatch RANK:STEP, --crash RANK:STEP and
--pg-timeout-s S (see --help).

    torchrun --nproc-per-node 2 workloads/model_parallel.py --steps 20
"""

import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

# a script's own folder is sys.path[0], however it is run (python, torchrun, the tracer)
from common import (
    Faults,
    SyntheticDataset,
    build_model,
    cleanup,
    env_world_size,
    init_distributed,
    log,
    make_loader,
    make_parser,
    rank_path,
    record_samples_per_step,
    save_results,
)


def parse_args():
    parser = make_parser(__doc__)
    args = parser.parse_args()
    world_size = env_world_size()
    if args.hidden % world_size:
        parser.error(f"--hidden {args.hidden} cannot be sharded over {world_size} ranks; "
                     f"use a multiple of {world_size}")
    return args


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor; plain (replicated) tensors are returned as they are."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def train(args, rank: int, world_size: int, device: torch.device) -> list[float]:
    mesh = init_device_mesh(device.type, (world_size,))
    model = build_model(args.hidden, args.layers, args.seed).to(device)
    plan = {}
    for index in range(args.layers):
        plan[f"blocks.{index}.fc1"] = ColwiseParallel()
        plan[f"blocks.{index}.fc2"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    if args.compile:
        model.compile()  # DTensor redistributions become functional collectives in the graph
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    dataset = SyntheticDataset(args.steps * args.batch_size, args.hidden, args.seed)
    loader = make_loader(dataset, args.batch_size, args, device)

    losses, first_step, faults = [], {}, Faults(args, rank, device)
    for step, (inputs, targets) in enumerate(loader, start=1):
        faults.before_forward(step)
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        logits = model(inputs)
        loss = F.cross_entropy(logits, targets)
        loss.backward()
        if step == 1 and args.save:
            first_step = {"first_logits": logits.detach().cpu(),
                          "first_grads": {name: local_shard(p.grad).detach().cpu().clone()
                                          for name, p in model.named_parameters()}}
        faults.before_optimizer(step)
        optimizer.step()
        losses.append(loss.item())
        log(f"step {step} loss {losses[-1]:.6f}")
        faults.after_step(step)

    if args.save:
        params = {name: local_shard(p) for name, p in model.named_parameters()}
        save_results(rank_path(args.save, rank), losses, params, **first_step)
    return losses


def main():
    args = parse_args()
    try:
        rank, world_size, device = init_distributed(args)
        log(f"model_parallel: {args.layers} blocks, fc1/fc2 sharded over a {world_size}-rank "
            f"{device.type} mesh")
        record_samples_per_step(args.batch_size)  # every rank trains on the same batch
        train(args, rank, world_size, device)
    finally:
        cleanup()


if __name__ == "__main__":
    main()

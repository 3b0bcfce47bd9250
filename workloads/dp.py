"""Single-process data parallel training with torch.nn.DataParallel.

One process drives all visible GPUs: each forward scatters the batch over them, runs a
replica of the model on each and gathers the outputs on the first GPU; backward reduces
the gradients onto it. Without a GPU, DataParallel just runs the model on the CPU.
No process group is used, so --nproc-per-node must be 1 under torchrun.

--save PATH writes {"losses": float64[steps], "params": {name: tensor}}.
--compile compiles the DataParallel module with torch.compile.

    python workloads/dp.py --steps 20
    torchrun --nproc-per-node 1 workloads/dp.py --steps 20
"""

import torch
import torch.nn.functional as F
from torch import nn

# a script's own folder is sys.path[0], however it is run (python, torchrun, the tracer)
from common import (
    SyntheticDataset,
    build_model,
    env_world_size,
    log,
    make_loader,
    make_parser,
    pick_device,
    record_samples_per_step,
    save_results,
)


def parse_args():
    parser = make_parser(__doc__, distributed=False)
    args = parser.parse_args()
    if env_world_size() != 1:
        parser.error("DataParallel runs in one process; launch with --nproc-per-node 1 "
                     "(or use ddp.py for one process per GPU)")
    return args


def train(args) -> list[float]:
    device = pick_device()
    model = nn.DataParallel(build_model(args.hidden, args.layers, args.seed).to(device))
    if device.type == "cuda":
        log(f"dp: DataParallel over {len(model.device_ids)} GPU(s)")
    else:
        log("dp: no GPU visible, DataParallel runs the model on the CPU in this one process")
    if args.compile:
        model.compile()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    dataset = SyntheticDataset(args.steps * args.batch_size, args.hidden, args.seed)
    loader = make_loader(dataset, args.batch_size, args, device)

    losses = []
    for step, (inputs, targets) in enumerate(loader, start=1):
        inputs = inputs.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        log(f"step {step} loss {losses[-1]:.6f}")

    if args.save:
        save_results(args.save, losses, dict(model.module.named_parameters()))
    return losses


def main():
    args = parse_args()
    # Nothing to clean up: DataParallel needs no process group.
    record_samples_per_step(args.batch_size)
    train(args)


if __name__ == "__main__":
    main()

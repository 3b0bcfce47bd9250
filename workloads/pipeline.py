"""Pipeline parallel training with torch.distributed.pipelining.

Each rank is one stage holding layers/world_size consecutive residual blocks; the last
stage also holds the classifier head and computes the loss. Every batch is split into
--microbatches equal microbatches, scheduled with GPipe (all forwards, then all
backwards) or 1F1B (one forward, one backward in the steady state). Activations go
forward and their gradients backward with point-to-point send/recv between neighbours.
Every rank reads the same batches; only the first stage uses the inputs and only the
last stage the targets.

The last stage logs the loss (mean over the microbatches), so no extra collective
is needed to bring it to rank 0.

--save PATH: each rank writes its stage to PATH with a rank suffix (out.pt -> out.rank0.pt,
...): {"losses": float64[steps] (empty except on the last stage), "params": {name: tensor}}
with the full model's parameter names (blocks.2.fc1.weight, head.weight on the last stage).

--compile compiles each stage's module with torch.compile.

A single rank (no WORLD_SIZE, or --nproc-per-node 1) runs a one-stage pipeline.

Faults for trying the tracer and the analysis: --straggle RANK:MS, --straggle-tail RANK:MS,
--slow-data RANK:MS, --hang RANK:STEP, --mismatch RANK:STEP, --crash RANK:STEP and
--pg-timeout-s S (see --help).

    torchrun --nproc-per-node 2 workloads/pipeline.py --steps 20 --schedule 1f1b --microbatches 4
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

# a script's own folder is sys.path[0], however it is run (python, torchrun, the tracer)
from common import (
    NUM_CLASSES,
    Faults,
    SyntheticDataset,
    build_model,
    cleanup,
    env_world_size,
    init_distributed,
    log,
    make_loader,
    make_parser,
    positive_int,
    rank_path,
    record_samples_per_step,
    save_results,
)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def parse_args():
    parser = make_parser(__doc__)
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), default="gpipe")
    parser.add_argument("--microbatches", type=positive_int, default=4, metavar="M",
                        help="microbatches per step; must divide --batch-size")
    args = parser.parse_args()
    stages = env_world_size()
    if args.layers % stages:
        parser.error(f"--layers {args.layers} cannot be split evenly over {stages} pipeline "
                     f"stages (one per rank); use a multiple of {stages}")
    if args.batch_size % args.microbatches:
        parser.error(f"--batch-size {args.batch_size} is not divisible by "
                     f"--microbatches {args.microbatches}")
    if args.schedule == "1f1b" and args.microbatches < stages:
        parser.error(f"1f1b needs --microbatches >= {stages} (the number of stages)")
    return args


def build_stage_module(args, stage: int, stages: int) -> nn.Module:
    """The full model (same seed everywhere) cut down to this stage's slice of blocks."""
    model = build_model(args.hidden, args.layers, args.seed)
    per_stage = args.layers // stages
    model.blocks = model.blocks[stage * per_stage:(stage + 1) * per_stage]
    if stage != stages - 1:
        model.head = nn.Identity()
    return model


def train(args, rank: int, world_size: int, device: torch.device) -> list[float]:
    module = build_stage_module(args, rank, world_size).to(device)
    if args.compile:
        module.compile()  # the stage's forward; send/recv stay outside the compiled code
    microbatch = args.batch_size // args.microbatches
    is_last = rank == world_size - 1
    # Static example shapes let each stage size its send/recv buffers without a metadata
    # exchange; requires_grad marks which activations get gradients sent back.
    example_input = torch.empty(microbatch, args.hidden, device=device, requires_grad=rank > 0)
    example_output = torch.empty(microbatch, NUM_CLASSES if is_last else args.hidden,
                                 device=device, requires_grad=True)
    stage = PipelineStage(module, rank, world_size, device,
                          input_args=example_input, output_args=example_output)
    schedule = SCHEDULES[args.schedule](stage, n_microbatches=args.microbatches,
                                        loss_fn=F.cross_entropy)
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr)

    dataset = SyntheticDataset(args.steps * args.batch_size, args.hidden, args.seed)
    loader = make_loader(dataset, args.batch_size, args, device)

    losses, faults = [], Faults(args, rank, device)
    for step, (inputs, targets) in enumerate(loader, start=1):
        faults.before_forward(step)
        optimizer.zero_grad(set_to_none=True)
        step_inputs = (inputs.to(device),) if rank == 0 else ()
        microbatch_losses = []
        if is_last:
            schedule.step(*step_inputs, target=targets.to(device), losses=microbatch_losses)
        else:
            schedule.step(*step_inputs)
        # The schedule already divided the gradients by the number of microbatches.
        faults.before_optimizer(step)
        optimizer.step()
        if is_last:
            losses.append(torch.stack(microbatch_losses).mean().item())
            log(f"step {step} loss {losses[-1]:.6f}", on_rank=rank)
        faults.after_step(step)

    if args.save:
        save_results(rank_path(args.save, rank), losses, dict(module.named_parameters()))
    return losses


def main():
    args = parse_args()
    try:
        rank, world_size, device = init_distributed(args)
        log(f"pipeline: {world_size} stages x {args.layers // world_size} blocks, "
            f"{args.schedule}, {args.microbatches} microbatches, {device.type}")
        record_samples_per_step(args.batch_size)
        train(args, rank, world_size, device)
    finally:
        cleanup()


if __name__ == "__main__":
    main()

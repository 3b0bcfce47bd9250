r"""A tiny next-token model trained in a plain loop with Hugging Face accelerate on CPU ranks:
`Accelerator(cpu=True)` under torchrun is accelerate's MULTI_CPU type, a gloo process group and
the model wrapped in DistributedDataParallel (the script checks it). Synthetic in-memory data with
a fixed seed, sharded over the ranks by accelerator.prepare. `--straggle` delays one rank at the
start of every step in the loop; rank 0 writes each step's loss (the loss tensor's bytes) and the
final parameters' digest to `--out`.

    torchrun --nproc-per-node 2 -m tracer.record \
        tests/scripts/frameworks/accelerate_ddp.py --steps 20 --out accelerate.json
"""

import torch
import torch.nn.functional as F
from accelerate import Accelerator, DistributedType
from accelerate.utils import set_seed
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

from common import BATCH, SEED, Result, parser, shut_down, straggle, token_data

VOCAB, LENGTH, WIDTH = 64, 16, 32


def main():
    args = parser(__doc__).parse_args()
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    if accelerator.num_processes > 1 and accelerator.distributed_type != DistributedType.MULTI_CPU:
        raise SystemExit(f"expected DDP on CPU ranks, got {accelerator.distributed_type}")
    set_seed(SEED)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU(),
                          nn.Linear(WIDTH, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = DataLoader(TensorDataset(token_data(VOCAB, LENGTH)), batch_size=BATCH, shuffle=True,
                      drop_last=True)
    model, optimizer, data = accelerator.prepare(model, optimizer, data)
    if accelerator.num_processes > 1 and not isinstance(model, DistributedDataParallel):
        raise SystemExit(f"expected a DistributedDataParallel model, got {type(model).__name__}")
    result = Result()
    model.train()
    step = 0
    while step < args.steps:
        for (ids,) in data:
            straggle(args.straggle, accelerator.process_index)
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
            result.loss(loss)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == args.steps:
                break
    accelerator.wait_for_everyone()
    result.write(args.out, accelerator.unwrap_model(model), accelerator.process_index)
    accelerator.end_training()
    shut_down()


if __name__ == "__main__":
    main()

r"""A tiny next-token model trained by PyTorch Lightning's Trainer with strategy="ddp" on CPU
ranks (gloo): under torchrun, Lightning takes the ranks from torchrun's environment and starts no
processes itself. Synthetic in-memory data with a fixed seed; the loss is logged each step with
sync_dist=True, as users do (one scalar all-reduce per step besides DDP's gradients).
`--straggle` delays one rank in a Callback's on_train_batch_start; rank 0 writes each step's loss
(the loss tensor's bytes) and the final parameters' digest to `--out`.

    torchrun --nproc-per-node 2 -m tracer.record \
        tests/scripts/frameworks/lightning_ddp.py --steps 20 --out lightning.json
"""

import os

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from common import BATCH, SEED, Result, parser, shut_down, straggle, token_data

VOCAB, LENGTH, WIDTH = 64, 16, 32


class NextToken(L.LightningModule):
    """Embedding, one hidden layer, logits over the vocabulary; loss on the next token."""

    def __init__(self, result: Result):
        super().__init__()
        self.net = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, WIDTH), nn.GELU(),
                                 nn.Linear(WIDTH, VOCAB))
        self.result = result

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        logits = self.net(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        self.result.loss(loss)
        self.log("loss", loss, on_step=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Straggle(L.Callback):
    def __init__(self, spec):
        self.spec = spec

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        straggle(self.spec, trainer.global_rank)


def main():
    args = parser(__doc__).parse_args()
    torch.set_num_threads(1)
    L.seed_everything(SEED, verbose=False)
    result = Result()
    model = NextToken(result)
    data = DataLoader(TensorDataset(token_data(VOCAB, LENGTH)), batch_size=BATCH, shuffle=True,
                      drop_last=True)
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=int(os.environ.get(
                            "LOCAL_WORLD_SIZE", "1")), max_steps=args.steps,
                        callbacks=[Straggle(args.straggle)], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    trainer.fit(model, data)
    result.write(args.out, model.net, trainer.global_rank)
    shut_down()


if __name__ == "__main__":
    main()

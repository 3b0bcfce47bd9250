r"""A tiny GPT-2 (built from its config, nothing downloaded) trained by transformers.Trainer with
DDP on CPU ranks (gloo), on a synthetic in-memory data set with a fixed seed. `--straggle`
delays one rank through a TrainerCallback at every step's start; rank 0 writes each step's loss
(the loss tensor's bytes, from compute_loss) and the final parameters' digest to `--out`.

    torchrun --nproc-per-node 2 -m tracer.record \
        tests/scripts/frameworks/hf_trainer.py --steps 20 --out hf.json
"""

import os
import tempfile

import torch
import transformers
from torch.utils.data import Dataset

from common import BATCH, SEED, Result, parser, shut_down, straggle, token_data

VOCAB, LENGTH = 64, 16


class Tokens(Dataset):
    """Language-model samples: each sequence is its own labels (the model shifts them)."""

    def __init__(self):
        self.ids = token_data(VOCAB, LENGTH)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Straggle(transformers.TrainerCallback):
    def __init__(self, spec, rank):
        self.spec, self.rank = spec, rank

    def on_step_begin(self, args, state, control, **kwargs):
        straggle(self.spec, self.rank)


class LossRecordingTrainer(transformers.Trainer):
    """The Trainer as it is, with each training step's loss kept."""

    def __init__(self, *args, result: Result, **kwargs):
        super().__init__(*args, **kwargs)
        self.result = result

    def compute_loss(self, model, inputs, *args, **kwargs):
        loss = super().compute_loss(model, inputs, *args, **kwargs)
        if model.training:
            self.result.loss(loss[0] if isinstance(loss, tuple) else loss)
        return loss


def main():
    args = parser(__doc__).parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    transformers.set_seed(SEED)
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=VOCAB,
                                     n_positions=LENGTH, bos_token_id=0,
                                     eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    result = Result()
    with tempfile.TemporaryDirectory() as output_dir:
        training = transformers.TrainingArguments(
            output_dir=output_dir, max_steps=args.steps, per_device_train_batch_size=BATCH,
            learning_rate=1e-3, seed=SEED, data_seed=SEED, use_cpu=True, ddp_backend="gloo",
            ddp_find_unused_parameters=False, report_to=[], save_strategy="no",
            logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
        trainer = LossRecordingTrainer(model=model, args=training, train_dataset=Tokens(),
                                       callbacks=[Straggle(args.straggle, rank)], result=result)
        trainer.train()
    result.write(args.out, model, rank)
    shut_down()


if __name__ == "__main__":
    main()

"""A Hugging Face ``Trainer`` trained elastically through ``dyntrain.adapters.transformers``: a
tiny GPT-2 built from a config (dropout on), AdamW with linear warm-up and decay as ``Trainer``
builds them, gradient clipping, character blocks of a Python standard library module's source.
Run alone (``python``) or under ``dyntrain run``: the final model is bitwise the same."""

import argparse
import random
import tempfile
import textwrap
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset

# (first: in a dyntrain job it takes LOCAL_RANK out of accelerate's sight)
from dyntrain.adapters.transformers import elastic_trainer  # isort: skip
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

BLOCK = 16
HELD_CHUNK_S = 0.5


class CharBlocks(Dataset):
    """Fixed-length blocks of a text's characters (code points below 128), as token ids."""

    def __init__(self, text: str, blocks: int) -> None:
        ids = torch.tensor([min(ord(c), 127) for c in text[: blocks * BLOCK]])
        self.blocks = ids.view(blocks, BLOCK)

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.blocks[i], "labels": self.blocks[i].clone()}


def masking_collator(samples: list[dict]) -> dict:
    """Stacks the blocks and leaves a random position of each out of the loss (drawing from
    torch and from ``random``, as data collators do)."""
    batch = {k: torch.stack([s[k] for s in samples]) for k in samples[0]}
    drop = torch.randint(0, BLOCK, (len(samples),))
    for row, col in enumerate(drop.tolist()):
        batch["labels"][row, col] = -100
    batch["labels"][:, random.randrange(BLOCK)] = -100
    return batch


def build(out: str, **args) -> Trainer:
    set_seed(0)  # the same initial weights on every worker
    model = GPT2LMHeadModel(GPT2Config(vocab_size=128, n_positions=BLOCK, n_embd=32, n_layer=2,
                                       n_head=2, bos_token_id=0, eos_token_id=0,
                                       resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1))
    settings = dict(output_dir=out, per_device_train_batch_size=4,
                    gradient_accumulation_steps=2, num_train_epochs=6, learning_rate=3e-3,
                    warmup_steps=4, max_grad_norm=0.5, report_to="none", use_cpu=True,
                    save_strategy="steps", save_steps=8, seed=7, disable_tqdm=True)
    settings.update(args)
    text = Path(textwrap.__file__).read_text()
    evaluated = settings.get("eval_strategy", "no") != "no"
    return Trainer(model=model, args=TrainingArguments(**settings),
                   train_dataset=CharBlocks(text, 128), data_collator=masking_collator,
                   eval_dataset=CharBlocks(text[-BLOCK * 12:], 12) if evaluated else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hold-until-world", type=int, default=0,
                    help="each chunk sleeps 0.5 s more until the world has reached this size "
                    "(outside the arithmetic: the model is the same)")
    ap.add_argument("--sampling", default="random", help="train_sampling_strategy")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as unused:  # Trainer's output_dir: dyntrain has its own
        trainer = build(unused, train_sampling_strategy=args.sampling)
    elastic = elastic_trainer(trainer, world_size=2)
    if args.hold_until_world:
        compute_loss, reached = trainer.compute_loss, []

        def held(model, inputs, **kw):
            if not reached and elastic.world_size < args.hold_until_world:
                time.sleep(HELD_CHUNK_S)  # slow enough for joiners to arrive
            else:
                reached.append(True)
            return compute_loss(model, inputs, **kw)

        trainer.compute_loss = held
    elastic.fit()
    if elastic.is_leader:
        elastic.report(final_loss=round(elastic.last_result.loss, 6))


if __name__ == "__main__":
    main()

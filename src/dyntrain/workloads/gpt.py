"""A small GPT trained on the Python standard library's own source, byte by byte: a transformer
workload that needs no download and no extra package.

    dyntrain run --workers 1:4 --out runs/gpt -m dyntrain.workloads.gpt --model tiny \\
        --seq-len 64 --global-batch 16 --chunk-size 4 --max-steps 300

Every worker runs the same command. The corpus is the ``*.py`` files of this interpreter's
standard library (tests left out; about one file in twenty held out for validation; ``--corpus``
reads another folder), so every worker of a job needs the same Python version: the corpus
digest printed at start must agree. A sample is ``--seq-len`` bytes and their next bytes at a
fixed offset of the training stream. AdamW (no weight decay on LayerNorm parameters), linear
warmup and cosine decay per step, gradient clipping by the global norm of the reduced gradient,
optional bf16 autocast. The validation loss, perplexity and bits per byte on ``--val-samples``
held-out windows land in metrics.jsonl every ``--val-every`` steps and at the end
(``val_loss``, ``val_perplexity``, ``val_bpb``), the final ones in result.json.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from contextlib import nullcontext

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.step.validation import Validation
from dyntrain.elastic.trainer import ElasticTrainer
from dyntrain.errors import DyntrainError
from dyntrain.workloads.gpt_model import (
    GPT,
    PRESETS,
    GPTConfig,
    WarmupCosineLR,
    adamw_groups,
)
from dyntrain.workloads.textcorpus import byte_windows, load_corpus


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dyntrain.workloads.gpt", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sizes = ", ".join(f"{name}: {layers} layers x {width} wide, {heads} heads"
                      for name, (layers, heads, width) in PRESETS.items())
    ap.add_argument("--model", choices=list(PRESETS), default="tiny",
                    help=f"a preset size ({sizes}) [tiny]")
    ap.add_argument("--n-layer", type=int, help="blocks (overrides the preset)")
    ap.add_argument("--n-head", type=int, help="attention heads (overrides the preset)")
    ap.add_argument("--d-model", type=int, help="model width (overrides the preset)")
    ap.add_argument("--seq-len", type=int, default=256, help="bytes per sample [256]")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="dropout probability (seeded per chunk, so still exact) [0.0]")
    ap.add_argument("--global-batch", type=int, default=64,
                    help="sequences per optimizer step, whatever the world size [64]")
    ap.add_argument("--chunk-size", type=int, default=8,
                    help="sequences per chunk, the unit of work [8]")
    ap.add_argument("--epochs", type=int, default=1, help="passes over the corpus [1]")
    ap.add_argument("--max-steps", type=int, default=None, help="stop after N steps")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate [1e-3]")
    ap.add_argument("--min-lr-ratio", type=float, default=0.1,
                    help="final LR as a fraction of the peak [0.1]")
    ap.add_argument("--warmup-steps", type=int, default=100,
                    help="linear warmup steps, at most the whole run [100]")
    ap.add_argument("--weight-decay", type=float, default=0.1,
                    help="AdamW weight decay (not on LayerNorm) [0.1]")
    ap.add_argument("--grad-clip", type=float, default=1.0,
                    help="clip the reduced gradient to this global norm; 0: off [1.0]")
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                    help="bf16: forward and backward under bf16 autocast [fp32]")
    ap.add_argument("--val-every", type=int, default=100,
                    help="validate every N steps (and after the last) [100]")
    ap.add_argument("--val-samples", type=int, default=64,
                    help="held-out windows per validation [64]")
    ap.add_argument("--corpus", default=None,
                    help="a folder of *.py files to train on [this Python's standard library]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=100, help="steps [100]")
    ap.add_argument("--checkpoint-seconds", type=float, default=None,
                    help="also checkpoint when this many seconds passed since the last one")
    ap.add_argument("--step-delay", type=float, default=0.0,
                    help="extra seconds per chunk, to slow a demo down so events can be seen")
    ap.add_argument("--shard", type=int, choices=(0, 1, 2, 3), default=0,
                    help="0: every worker holds everything; 1: the AdamW state is sharded "
                         "(ZeRO-1); 2: the reduced gradients too (ZeRO-2); 3: the parameters "
                         "too, gathered per block (ZeRO-3); the same result at every level [0]")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="auto: the GPU of LOCAL_RANK when CUDA is available, else the CPU [auto]")
    ap.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                    help="collectives: auto is NCCL on GPUs, gloo on the CPU; gloo also carries "
                         "CUDA tensors (several workers on one GPU) [auto]")
    ap.add_argument("--shard-redundancy", type=int, default=2,
                    help="workers holding each tensor's optimizer state (and, with --shard 2 "
                         "or 3, its reduced gradient; with 3, its parameter) [2]")
    return ap


def model_config(args: argparse.Namespace) -> GPTConfig:
    """The GPT's shape: the preset, with any of ``--n-layer``/``--n-head``/``--d-model``."""
    layers, heads, width = PRESETS[args.model]
    return GPTConfig(n_layer=args.n_layer or layers, n_head=args.n_head or heads,
                     d_model=args.d_model or width, seq_len=args.seq_len, dropout=args.dropout)


def autocast(device: torch.device, precision: str):
    """bf16 autocast for ``bf16``, nothing for ``fp32``."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def next_byte_loss(precision: str, device: torch.device, delay: float = 0.0):
    """``loss_fn(model, batch)``: the mean cross-entropy of predicting each next byte."""
    def loss_fn(model: nn.Module, batch) -> torch.Tensor:
        if delay:
            time.sleep(delay)
        windows = batch[0].long()
        with autocast(device, precision):
            logits = model(windows[:, :-1])
        return F.cross_entropy(logits.float().flatten(0, 1), windows[:, 1:].flatten())

    return loss_fn


def evaluator(val: TensorDataset, samples: int, batch: int, precision: str,
              device: torch.device, trainer_ref: list):
    """A validation function: loss, perplexity and bits per byte over ``samples`` held-out
    windows spread evenly over the validation stream; the leader prints a line per call."""
    (windows,) = val.tensors
    picked = torch.linspace(0, len(windows) - 1, min(samples, len(windows))).round().long()

    def evaluate(model: nn.Module) -> dict[str, float]:
        total = 0.0
        for start in range(0, len(picked), batch):
            chunk = windows[picked[start : start + batch]].long().to(device)
            with autocast(device, precision):
                logits = model(chunk[:, :-1])
            total += float(F.cross_entropy(logits.float().flatten(0, 1),
                                           chunk[:, 1:].flatten(), reduction="sum"))
        loss = total / (len(picked) * (windows.shape[1] - 1))
        trainer = trainer_ref[0]
        print(f"step {trainer.step}/{trainer.total_steps} workers {trainer.world_size} "
              f"validation loss {loss:.4f} perplexity {math.exp(loss):.3f}", flush=True)
        return {"loss": loss, "perplexity": math.exp(loss), "bpb": loss / math.log(2)}

    return evaluate


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        trainer = build(args)
    except DyntrainError as exc:
        print(f"gpt: error: {exc}", file=sys.stderr)
        sys.exit(2)
    trainer.fit()
    if trainer.is_leader:
        final = trainer.validations[-1]
        print(f"validation loss {final['val_loss']:.4f} perplexity "
              f"{final['val_perplexity']:.3f} after {trainer.step} steps")
        gpu = ({"gpu_peak_mib": round(torch.cuda.max_memory_allocated() / 2**20)}
               if torch.cuda.is_available() else {})
        trainer.report(val_loss=final["val_loss"], val_perplexity=final["val_perplexity"],
                       val_bpb=final["val_bpb"], steps=trainer.step, device=trainer.device.type,
                       **gpu)


def pick_device(name: str) -> torch.device:
    """``cpu``, or the GPU of ``LOCAL_RANK`` (modulo the GPUs there) for ``cuda`` and for
    ``auto`` where CUDA is available.

    Raises:
        DyntrainError: ``cuda`` without a CUDA device.
    """
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise DyntrainError("--device cuda: this torch sees no CUDA device")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.device("cuda", local % torch.cuda.device_count())


def build(args: argparse.Namespace) -> ElasticTrainer:
    """The trainer of the command line ``args`` (corpus read, model built and seeded)."""
    for flag in ("val_every", "val_samples"):
        if getattr(args, flag) < 1:
            raise DyntrainError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.grad_clip < 0 or args.step_delay < 0:
        raise DyntrainError("--grad-clip and --step-delay must not be negative")
    cfg = model_config(args)
    config = TrainConfig(global_batch=args.global_batch, chunk_size=args.chunk_size,
                         epochs=args.epochs, max_steps=args.max_steps, seed=args.seed,
                         checkpoint_every_steps=args.checkpoint_every,
                         checkpoint_every_seconds=args.checkpoint_seconds,
                         grad_clip_norm=args.grad_clip or None, shard_level=args.shard,
                         shard_redundancy=args.shard_redundancy, backend=args.backend)
    corpus = load_corpus(args.corpus)
    train, val = byte_windows(corpus.train, cfg.seq_len), byte_windows(corpus.val, cfg.seq_len)
    total = config.total_steps(len(train))
    device = pick_device(args.device)
    torch.manual_seed(args.seed)
    model = GPT(cfg).to(device)
    print(f"{corpus.describe()}\nGPT {cfg.n_layer} layers x {cfg.d_model} wide, {cfg.n_head} "
          f"heads, {cfg.parameters():,} parameters, {cfg.seq_len} bytes per sample; "
          f"{len(train):,} samples, global batch {config.global_batch} = {config.num_chunks} "
          f"chunks of {config.chunk_size}, {total} steps; {args.precision} on {device.type}",
          flush=True)
    opt = torch.optim.AdamW(adamw_groups(model, args.weight_decay), lr=args.lr,
                            betas=(0.9, 0.95))
    sched = WarmupCosineLR(opt, min(args.warmup_steps, total), total, args.min_lr_ratio)
    trainer_ref: list[ElasticTrainer] = []
    validation = Validation(evaluator(val, args.val_samples, args.chunk_size, args.precision,
                                      device, trainer_ref), every_steps=args.val_every)
    trainer = ElasticTrainer(config, model, opt, train,
                             next_byte_loss(args.precision, device, args.step_delay),
                             lr_scheduler=sched, device=device, validation=validation)
    trainer_ref.append(trainer)
    return trainer


if __name__ == "__main__":
    main()

"""The ResNet-50 article's run as a workload: a recipe, image data on disk, the chunk loader.

    dyntrain run --workers 8:96 -m dyntrain.workloads.imagenet --data DIR_OR_SHARDS \\
        --recipe resnet50-goyal

``--data`` holds ``train/`` and ``val/``, each an image folder (``<class>/<image>.jpg``) or a pack
written by ``dyntrain data pack`` (local path or fsspec URL). Every worker runs the same command;
the derived numbers are printed at start, the validation accuracy every ``--val-every`` steps (and
each ``--val-every-epochs`` epochs) lands in metrics.jsonl, the final one in result.json.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
import time

import torch
from torch.utils.data import DataLoader

from dyntrain.elastic.step.validation import Validation
from dyntrain.elastic.trainer import ElasticTrainer
from dyntrain.errors import DyntrainError, install_excepthook
from dyntrain.extras import needs_extra

install_excepthook()  # without the data extra: one line naming it, not an ImportError
with needs_extra("the imagenet workload"):
    from dyntrain.data import ImageDataset, LoaderConfig
    from dyntrain.recipes import PRECISIONS, RECIPES, get_recipe


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dyntrain.workloads.imagenet", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder or URL with train/ and val/")
    ap.add_argument("--recipe", choices=sorted(RECIPES), default="resnet50-goyal")
    ap.add_argument("--global-batch", type=int)
    ap.add_argument("--chunk-size", type=int)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--lr", type=float, dest="schedule_base_lr", help="LR per 256 samples")
    ap.add_argument("--warmup-epochs", type=float, dest="schedule_warmup_epochs")
    ap.add_argument("--precision", choices=PRECISIONS)
    ap.add_argument("--label-smoothing", type=float)
    ap.add_argument("--lars", action="store_true", default=None)
    ap.add_argument("--no-bn-decay", action="store_false", default=None,
                    dest="decay_bn_and_bias", help="no weight decay on BatchNorm and biases")
    ap.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--compile", action="store_true", default=None)
    ap.add_argument("--grad-clip", type=float, dest="grad_clip_norm")
    ap.add_argument("--loader-workers", type=int, default=2,
                    help="DataLoader processes per training worker [2]")
    ap.add_argument("--prefetch", type=int, default=4, help="chunks in flight per worker [4]")
    ap.add_argument("--val-every", type=int, default=None, help="validate every N steps")
    ap.add_argument("--val-every-epochs", type=int, default=None)
    ap.add_argument("--val-batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--checkpoint-every", type=int, default=100, help="steps")
    ap.add_argument("--step-delay", type=float, default=0.0,
                    help="extra seconds per chunk, to slow a demo down so events can be seen")
    return ap


def evaluate_with(val: ImageDataset, batch: int, workers: int, forward, device):
    """A validation function: top-1 and top-5 accuracy over ``val``."""
    def evaluate(model) -> dict[str, float]:
        loader = DataLoader(val, batch_size=batch, num_workers=workers)
        top1 = top5 = n = 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = forward(model, x)
            best = logits.topk(min(5, logits.shape[1]), dim=1).indices
            top1 += int((best[:, 0] == y).sum())
            top5 += int((best == y[:, None]).any(1).sum())
            n += len(y)
        return {"accuracy": top1 / n, "top5": top5 / n}

    return evaluate


def _delayed(loss_fn, seconds: float):
    def slow(model, batch):
        time.sleep(seconds)
        return loss_fn(model, batch)

    return slow


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except DyntrainError as exc:
        print(f"imagenet: error: {exc}", file=sys.stderr)
        sys.exit(2)


def run(args: argparse.Namespace) -> None:
    overrides = {k: getattr(args, k) for k in (
        "global_batch", "chunk_size", "epochs", "schedule_base_lr", "schedule_warmup_epochs",
        "precision", "label_smoothing", "lars", "decay_bn_and_bias", "channels_last", "compile",
        "grad_clip_norm")}
    recipe = get_recipe(args.recipe).with_overrides(**overrides)
    train = ImageDataset(posixpath.join(args.data, "train"), recipe.transform)
    val = ImageDataset(posixpath.join(args.data, "val"), recipe.transform.evaluation())
    if val.classes != train.classes:
        raise DyntrainError(f"train/ and val/ have different classes under {args.data}")
    config = recipe.train_config(max_steps=args.max_steps, seed=args.seed,
                                 checkpoint_every_steps=args.checkpoint_every)
    print(recipe.describe(len(train)), flush=True)
    torch.manual_seed(args.seed)
    model = recipe.build_model(len(train.classes))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    opt, sched, scaler, loss_fn = recipe.build(model.to(device), len(train), config, device.type)
    if args.step_delay > 0:
        loss_fn = _delayed(loss_fn, args.step_delay)
    validation = Validation(evaluate_with(val, args.val_batch, args.loader_workers,
                                          recipe.forward_fn(device.type), device),
                            every_steps=args.val_every, every_epochs=args.val_every_epochs)
    trainer = ElasticTrainer(config, model, opt, train, loss_fn, lr_scheduler=sched,
                             scaler=scaler, device=device, validation=validation,
                             loader=LoaderConfig(workers=args.loader_workers,
                                                 prefetch=args.prefetch))
    trainer.fit()
    if trainer.is_leader:
        final = trainer.validations[-1]
        print(f"validation accuracy {final['val_accuracy']:.4f} (top-5 {final['val_top5']:.4f})"
              f" after {trainer.step} steps")
        trainer.report(val_accuracy=final["val_accuracy"], val_top5=final["val_top5"],
                       steps=trainer.step)


if __name__ == "__main__":
    main()

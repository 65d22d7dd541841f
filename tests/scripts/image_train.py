"""An image workload of a user's own: a small conv net on the digits as 16x16 images, random
crops and flips drawn in the data set (torch's generator), loader processes, and a precision:
``fp32``, ``bf16`` (autocast) or ``fp16`` (autocast and a dynamic loss scaler). It sets no
thread count and no kernel level: its job's numerics decide them."""

import argparse

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

from dyntrain import ElasticTrainer, TrainConfig
from dyntrain.data import LoaderConfig


class Digits16(Dataset):
    """scikit-learn's digits at 16x16 (or ``size`` x ``size``), each read with a random crop of
    the image padded by 2 and a random horizontal flip."""

    def __init__(self, size: int = 16) -> None:
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        self.size = size
        self.x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
        self.y = torch.tensor(digits.target)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        img = F.pad(self.x[i], (2, 2, 2, 2))
        dx, dy = torch.randint(0, 5, (2,)).tolist()
        img = img[:, dy:dy + self.size, dx:dx + self.size]
        if torch.rand(()) < 0.5:
            img = img.flip(-1)
        return img, self.y[i]


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1), nn.Linear(32, 10))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--loader-workers", type=int, default=2)
    ap.add_argument("--size", type=int, default=16,
                    help="image side (64: a chunk is larger than a pipe's buffer)")
    ap.add_argument("--hold", default=None, metavar="FILE",
                    help="each chunk takes holding.HELD_CHUNK_S longer while FILE exists")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10) if args.precision == "fp16" \
        else None

    def loss_fn(model, batch):
        x, y = batch
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            logits = model(x)
        return F.cross_entropy(logits.float(), y)

    if args.hold:
        from holding import slowed

        loss_fn = slowed(loss_fn, args.hold)

    config = TrainConfig(global_batch=32, chunk_size=8, epochs=1, max_steps=args.steps, seed=0)
    trainer = ElasticTrainer(config, model, opt, Digits16(args.size), loss_fn, scaler=scaler,
                             loader=LoaderConfig(workers=args.loader_workers, prefetch=2))
    trainer.fit()
    if trainer.is_leader:
        trainer.report(steps=trainer.step)


if __name__ == "__main__":
    main()

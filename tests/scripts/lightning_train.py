"""A LightningModule trained elastically through ``dyntrain.adapters.lightning``: BatchNorm,
dropout, SGD with momentum and an epoch-interval LR scheduler, data from a LightningDataModule.
Run alone (``python``) or under ``dyntrain run``: the final model is bitwise the same."""

import argparse
import os
import time

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from dyntrain import TrainConfig
from dyntrain.adapters.lightning import elastic_trainer

HELD_STEP_S = 0.5


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 0.1, step_delay: float = 0.0, hold: str = ""):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(),
                                 nn.Dropout(0.2), nn.Linear(16, 3))

    def training_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(self.hparams.step_delay)  # slow enough for a join to land mid-run
        if self.hparams.hold and os.path.exists(self.hparams.hold):
            time.sleep(HELD_STEP_S)  # held by a test until it saw what it waits for
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)  # no Lightning Trainer: Lightning warns and drops it
        return loss

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)
        return {"optimizer": opt,
                "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)}


class Blobs(pl.LightningDataModule):
    def setup(self, stage):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(192, 8, generator=g)
        self.train = TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=32, shuffle=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--step-delay", type=float, default=0.0, help="seconds of sleep per chunk")
    ap.add_argument("--hold", default="", help="each step sleeps 0.5 s more while this file "
                    "exists (outside the arithmetic: the model is the same)")
    ap.add_argument("--accumulate", type=int, default=1,
                    help="accumulate_grad_batches (anything but 1 is refused)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = TrainConfig(global_batch=32, chunk_size=4, epochs=args.epochs, seed=5,
                         checkpoint_every_steps=8)
    trainer = elastic_trainer(Classifier(step_delay=args.step_delay, hold=args.hold), config,
                              datamodule=Blobs(), accumulate_grad_batches=args.accumulate)
    trainer.fit()
    if trainer.is_leader:
        trainer.report(final_loss=round(trainer.last_result.loss, 6))


if __name__ == "__main__":
    main()

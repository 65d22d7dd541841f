"""``dyntrain.adapters.lightning``: a LightningModule trained elastically is bitwise its static
run; what cannot be exact is refused in one line."""

import os
import subprocess
import sys

import pytest
import torch

from conftest import DYNTRAIN, ROOT, SCRIPTS, read_jsonl, run_main
from dyntrain import TrainConfig
from dyntrain.testing.jobs import pinned_env
from dyntrain.testing.wait import wait_until

pl = pytest.importorskip("lightning.pytorch")
from dyntrain.adapters.lightning import (  # noqa: E402
    IntervalScheduler,
    LightningUnsupported,
    elastic_trainer,
)

SCRIPT = SCRIPTS / "lightning_train.py"
sys.path.insert(0, str(SCRIPTS))
from lightning_train import Blobs, Classifier  # noqa: E402


def alone(out, log, *args) -> subprocess.Popen:
    """The script trained alone into ``out``, started, its output in ``log`` (a job's
    numerics: the static reference)."""
    env = pinned_env(DYNTRAIN_OUT=str(out))
    env.pop("DYNTRAIN_COORDINATOR", None)
    with open(log, "w") as sink:
        return subprocess.Popen([sys.executable, str(SCRIPT), *map(str, args)], env=env,
                                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)


#: 48 steps: the joiner (started after the first) joins with momentum and BatchNorm statistics
#: to take over, and the epoch-interval StepLR(step_size=2) takes four values
EPOCHS = "8"


@pytest.mark.slow
def test_an_elastic_lightning_run_is_bitwise_its_static_run(tmp_path):
    """One worker alone, against a `dyntrain run` that grows from one worker to two mid-run:
    the same final.pt, bit for bit (with BatchNorm, dropout, momentum and an epoch-interval
    StepLR)."""
    static = tmp_path / "static"
    # the reference trains while the elastic run starts and waits for its joiner
    reference = alone(static, tmp_path / "static.log", "--epochs", EPOCHS)
    out, hold = tmp_path / "elastic", tmp_path / "hold"
    # held slow until the joiner is in: Lightning's import alone can take a worker longer than
    # the rest of the run on a loaded machine (26 s at load 8)
    hold.touch()
    with open(tmp_path / "launcher.log", "w") as log:
        launcher = subprocess.Popen(
            [*DYNTRAIN, "run", "--workers", "1:2", "--nproc", "1", "--events", "step=1:join=1",
             "--out", str(out), str(SCRIPT), "--epochs", EPOCHS, "--step-delay", "0.01",
             "--hold", str(hold)], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until(lambda: "world 1 -> 2" in (tmp_path / "launcher.log").read_text()
                   or launcher.poll() is not None, "the second worker to join", timeout=300)
        hold.unlink()
        assert launcher.wait(300) == 0, (tmp_path / "launcher.log").read_text()[-3000:]
        assert reference.wait(300) == 0, (tmp_path / "static.log").read_text()[-3000:]
    finally:
        for proc in (launcher, reference):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    said = (tmp_path / "launcher.log").read_text()
    assert "world 1 -> 2" in said, said[-3000:]
    same = run_main(["compare", out, static])
    assert same.returncode == 0 and same.stdout.startswith("match: max |a-b| = 0"), same.stdout
    # the epoch-interval StepLR(step_size=2, gamma=0.5) stepped at each epoch's end
    rows = read_jsonl(out / "metrics.jsonl")
    assert {r["epoch"] for r in rows} == set(range(int(EPOCHS)))
    for row in rows:
        assert row["lr"] == pytest.approx(0.1 * 0.5 ** (row["epoch"] // 2), rel=1e-5), row


def test_a_refused_feature_in_a_script_is_one_line(monkeypatch, capsys):
    """``elastic_trainer`` installs dyntrain's excepthook: a script's uncaught refusal is one
    line and exit status 2 (the hook in a real script: test_cli's bad_config.py)."""
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    with pytest.raises(LightningUnsupported) as err:
        elastic_trainer(Classifier(), CONFIG, datamodule=Blobs(), accumulate_grad_batches=2)
    with pytest.raises(SystemExit) as exit_:
        sys.excepthook(err.type, err.value, err.tb)
    said = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in said, said
    assert said.strip() == (
        "dyntrain: error: accumulate_grad_batches=2 is not supported: the global batch is "
        "already the samples per optimizer step; set TrainConfig(global_batch=...) to the "
        "batch size times the accumulation (chunk_size bounds the memory)")
    assert said.count("\n") == 1


CONFIG = TrainConfig(global_batch=32, chunk_size=4, epochs=1)


class Manual(Classifier):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False


class TwoOptimizers(Classifier):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.net[0].parameters(), lr=0.1),
                torch.optim.SGD(self.net[4].parameters(), lr=0.1)]


class Plateau(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": {
            "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt), "monitor": "loss"}}


class OwnStep(Classifier):
    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)


class BadInterval(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [{"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1),
                        "interval": "batch"}]


@pytest.mark.parametrize("module, message", [
    (Manual, "manual optimization (automatic_optimization = False) is not supported"),
    (TwoOptimizers, "configure_optimizers must give exactly one optimizer, got 2: several "
                    "optimizers (GANs) are not supported"),
    (Plateau, "the LR scheduler ReduceLROnPlateau follows a monitored metric: not supported"),
    (OwnStep, "OwnStep overrides optimizer_step, which would change how a step is computed"),
    (BadInterval, "LR scheduler interval 'batch' is not supported: use 'step' or 'epoch'"),
])
def test_features_that_cannot_be_exact_are_refused(module, message):
    with pytest.raises(LightningUnsupported) as err:
        elastic_trainer(module(), CONFIG, datamodule=Blobs())
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_the_shapes_configure_optimizers_may_take_give_one_optimizer_and_scheduler(tmp_path):
    """A bare optimizer; ([opt], [sched]) with Lightning's default epoch interval; a dict with a
    step-interval scheduler: the trainer gets the optimizer and a scheduler stepped as
    Lightning would."""

    class Bare(Classifier):
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Lists(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)]

    class PerStep(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": {
                "scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "interval": "step"}}

    assert elastic_trainer(Bare(), CONFIG, datamodule=Blobs()).parts.lr_scheduler is None
    lists = elastic_trainer(Lists(), CONFIG, datamodule=Blobs()).parts.lr_scheduler
    assert isinstance(lists, IntervalScheduler) and lists.every_steps == 192 // 32
    per_step = elastic_trainer(PerStep(), CONFIG, datamodule=Blobs()).parts.lr_scheduler
    assert isinstance(per_step, torch.optim.lr_scheduler.StepLR)


def test_an_epoch_interval_scheduler_steps_at_each_epoch_end_and_resumes():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = IntervalScheduler(torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5), 3)
    lrs = []
    for _ in range(7):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs == [1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    again = IntervalScheduler(torch.optim.lr_scheduler.StepLR(opt2, 1, gamma=0.5), 3)
    again.load_state_dict(sched.state_dict())
    opt2.param_groups[0]["lr"] = lrs[-1]
    opt2.step()
    again.step()
    opt2.step()
    again.step()
    assert opt2.param_groups[0]["lr"] == 0.125  # the 9th step ends the third epoch

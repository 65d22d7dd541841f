"""A run folder remembers its settings; a world of one resumes, shows progress and reports."""

import json

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from conftest import read_jsonl
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.runs.folder import RunFolderMismatch
from dyntrain.elastic.trainer import ElasticTrainer

DATA = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(1)),
                     torch.randint(0, 2, (64,), generator=torch.Generator().manual_seed(2)))


def trainer(out, *, epochs=2, lr=0.1, hidden=8, scheduler=False, checkpoint_every=None,
            global_batch=16):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    config = TrainConfig(global_batch=global_batch, chunk_size=8, epochs=epochs,
                         checkpoint_every_steps=checkpoint_every)
    sched = (torch.optim.lr_scheduler.CosineAnnealingLR(opt, config.total_steps(len(DATA)))
             if scheduler else None)
    return ElasticTrainer(config, model, opt, DATA,
                          lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]),
                          lr_scheduler=sched, out_dir=out, coordinator=None)


def params(t: ElasticTrainer) -> dict:
    return {k: v.clone() for k, v in t.parts.model.state_dict().items()}


def test_alone_run_writes_the_run_folder_reports_and_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    t = trainer(out, epochs=2)
    t.fit()
    t.report(accuracy=0.5)
    shown = capsys.readouterr().out.splitlines()
    assert shown[-3].startswith("step     8/8  epoch   1  world 1  loss ")
    assert shown[-2:] == [f"trained to step 8; model in {out / 'final.pt'}", "result: accuracy=0.5"]
    assert json.loads((out / "result.json").read_text()) == {"accuracy": 0.5}
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 9)) and rows[-1]["world_size"] == 1
    assert (out / "final.pt").exists() and (out / "run.json").exists()
    again = trainer(out, epochs=2)
    again.fit()
    assert f"resuming from step 8 ({out / 'checkpoints'}" in capsys.readouterr().out
    assert again.step == 8


def test_longer_run_without_a_scheduler_continues_exactly(tmp_path):
    """More epochs into the same folder (constant LR): the same model as a run planned that
    long from the start."""
    short = trainer(tmp_path / "a", epochs=1)
    short.fit()
    longer = trainer(tmp_path / "a", epochs=3)
    longer.fit()
    planned = trainer(tmp_path / "b", epochs=3)
    planned.fit()
    assert longer.step == planned.step == 12
    a, b = params(longer), params(planned)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("change, needle", [
    (dict(lr=0.05), "optimizer lr 0.1 -> 0.05"),
    (dict(global_batch=32), "global_batch 16 -> 32"),
    (dict(hidden=16), "model 0.weight shape [8, 4] -> [16, 4]"),
    (dict(scheduler=True, epochs=3), "lr_scheduler None -> CosineAnnealingLR"),
])
def test_other_settings_are_refused_naming_what_differs(tmp_path, change, needle):
    out = tmp_path / "run"
    trainer(out, epochs=1).fit()
    before = sorted(p.name for p in (out / "checkpoints").iterdir())
    with pytest.raises(RunFolderMismatch) as e:
        trainer(out, **{"epochs": 1, **change}).fit()
    message = str(e.value)
    assert needle in message and "\n" not in message, message
    assert message.endswith(f"use another output folder, or delete {out} to start fresh")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == before


def test_longer_run_with_a_scheduler_is_refused_and_says_why(tmp_path):
    out = tmp_path / "run"
    trainer(out, epochs=1, scheduler=True).fit()
    with pytest.raises(RunFolderMismatch, match=r"epochs 1 -> 3, lr_scheduler T_max 4 -> 12 "
                                                r"\(a longer or shorter run needs a fresh "
                                                r"folder when an LR scheduler is used"):
        trainer(out, epochs=3, scheduler=True).fit()


def test_settings_that_do_not_change_the_result_may_differ(tmp_path):
    out = tmp_path / "run"
    trainer(out, epochs=1).fit()
    trainer(out, epochs=1, checkpoint_every=2).fit()  # no error


def test_a_folder_without_checkpoints_takes_new_settings(tmp_path):
    """A run that stopped before its first checkpoint binds nothing."""
    out = tmp_path / "run"
    trainer(out, epochs=1).fit()
    for f in (out / "checkpoints").iterdir():
        f.unlink()
    (out / "final.pt").unlink()
    trainer(out, epochs=1, lr=0.05).fit()
    assert json.loads((out / "run.json").read_text())["setup"]["optimizer"]["groups"][0][
        "lr"] == 0.05

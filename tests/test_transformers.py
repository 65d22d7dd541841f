"""``dyntrain.adapters.transformers``: a Hugging Face Trainer trained elastically is bitwise its
static run; what cannot be exact is refused in one line."""

import random
import subprocess
import sys

import pytest
import torch
from torch.utils.data import IterableDataset

from conftest import ROOT, SCRIPTS, read_jsonl, run_cli
from dyntrain.testing.jobs import pinned_env

transformers = pytest.importorskip("transformers")
from dyntrain.adapters.transformers import (  # noqa: E402
    EvalLoss,
    TrainerUnsupported,
    elastic_trainer,
    train_config,
)

SCRIPT = SCRIPTS / "transformers_train.py"
sys.path.insert(0, str(SCRIPTS))
from transformers_train import build  # noqa: E402

LR, WARMUP, STEPS = 3e-3, 4, 48  # the script's arguments: 6 epochs of 8 global batches


def alone(out, *args):
    env = pinned_env(DYNTRAIN_OUT=str(out))  # a job's numerics: the static reference
    env.pop("DYNTRAIN_COORDINATOR", None)
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], env=env, timeout=300,
                          cwd=ROOT, capture_output=True, text=True)


def world_sizes(out) -> list[int]:
    sizes = []
    for row in read_jsonl(out / "metrics.jsonl"):
        if not sizes or sizes[-1] != row["world_size"]:
            sizes.append(row["world_size"])
    return sizes


@pytest.mark.slow
def test_an_elastic_trainer_run_is_bitwise_its_static_run(tmp_path):
    """One worker alone, against a `dyntrain run --workers 1:4` that grows to three workers,
    loses one to SIGKILL and then its rank 0 to a leave: the same final.pt, bit for bit (a
    GPT-2 with dropout, AdamW with warm-up and decay as Trainer builds them, clipping, a
    collator that draws from torch and `random`)."""
    static, out = tmp_path / "static", tmp_path / "elastic"
    proc = alone(static)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    # chunks are held slow until the two joiners are in: importing transformers alone can
    # take a worker longer than the rest of the run
    proc = run_cli(["run", "--workers", "1:4", "--nproc", "1", "--out", out, "--events",
                    "step=1:join=2,step=30:kill=1,step=38:leave=rank:0", SCRIPT,
                    "--hold-until-world", "3"], timeout=300, check=True)
    assert world_sizes(out) == [1, 3, 2, 1], proc.stdout[-3000:]
    events = read_jsonl(out / "events.jsonl")
    assert [e["event"] for e in events] == ["start", "join", "crash", "leave"], events
    assert all(e["steps_redone"] == 0 for e in events if e["event"] != "start")
    same = run_cli(["compare", out, static])
    assert same.returncode == 0 and same.stdout.startswith("match: max |a-b| = 0"), same.stdout
    # Trainer's linear schedule with warm-up, over the run's 48 steps, stepped once per step
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for row in rows:
        done = row["step"] - 1  # the steps before this one
        factor = done / WARMUP if done < WARMUP else (STEPS - done) / (STEPS - WARMUP)
        assert row["lr"] == pytest.approx(LR * factor, rel=1e-5), row  # (6 digits kept)


@pytest.mark.slow  # a Python that imports transformers: 10-30 s on a loaded machine
def test_a_refused_setting_in_a_script_is_one_line(tmp_path):
    proc = alone(tmp_path / "run", "--sampling", "group_by_length")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "dyntrain: error: TrainingArguments(train_sampling_strategy='group_by_length') is not "
        "supported: its batches are grouped in an order that depends on the world; use "
        "'random'")


def test_without_transformers_the_adapter_names_the_extra():
    code = ("import sys; sys.modules['transformers'] = None; "
            "import dyntrain.adapters.transformers")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "dyntrain: error: dyntrain.adapters.transformers needs transformers, which is not "
        "installed: pip install 'dyntrain[transformers]'")


class Stream(IterableDataset):
    def __iter__(self):
        yield from ()


class OwnStep(transformers.Trainer):
    def training_step(self, *args, **kwargs):
        return super().training_step(*args, **kwargs)


class Watcher(transformers.TrainerCallback):
    pass


def _setting(name, value):
    def change(trainer):
        setattr(trainer.args, name, value)
    return change


@pytest.mark.parametrize("arguments, change, message", [
    ({"train_sampling_strategy": "group_by_length"}, None,
     "TrainingArguments(train_sampling_strategy='group_by_length') is not supported: its "
     "batches are grouped in an order that depends on the world"),
    ({"train_sampling_strategy": "sequential"}, None,
     "TrainingArguments(train_sampling_strategy='sequential') is not supported: the data "
     "order is dyntrain's seeded shuffle"),
    ({}, _setting("deepspeed", {"zero_optimization": {"stage": 2}}),
     "TrainingArguments(deepspeed={'zero_optimization': {'stage': 2}}) is not supported: "
     "DeepSpeed shards and steps the model itself"),
    ({}, _setting("fsdp", "full_shard"),
     "TrainingArguments(fsdp='full_shard') is not supported: FSDP shards and steps the model"),
    ({}, _setting("fp16", True), "TrainingArguments(fp16=True) is not supported: float16 "
                                 "needs Trainer's loss scaler"),
    ({"auto_find_batch_size": True}, None,
     "TrainingArguments(auto_find_batch_size=True) is not supported: the batch would follow"),
    ({"activation_checkpointing": True}, None,
     "TrainingArguments(activation_checkpointing=True) is not supported"),
    ({"neftune_noise_alpha": 5.0}, None, "TrainingArguments(neftune_noise_alpha=5.0) is not "
                                         "supported: the adapter does not add NEFTune's"),
    ({"torch_compile": True}, None, "TrainingArguments(torch_compile=True) is not supported"),
    ({}, _setting("lr_scheduler_type", "reduce_lr_on_plateau"),
     "lr_scheduler_type='reduce_lr_on_plateau' is not supported: it follows an evaluation"),
    ({}, _setting("save_strategy", "best"), "save_strategy='best' is not supported"),
])
def test_settings_that_cannot_be_exact_are_refused(tmp_path, arguments, change, message):
    trainer = build(str(tmp_path), **arguments)
    if change is not None:
        change(trainer)
    with pytest.raises(TrainerUnsupported) as err:
        elastic_trainer(trainer, world_size=2)
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_an_iterable_data_set_is_refused(tmp_path):
    trainer = build(str(tmp_path))
    trainer.train_dataset = Stream()
    with pytest.raises(TrainerUnsupported, match=r"^an iterable data set \(Stream\) is not "
                                                 r"supported: the global batches are drawn"):
        elastic_trainer(trainer)


def test_a_trainer_that_overrides_its_step_is_refused(tmp_path):
    base = build(str(tmp_path))
    trainer = OwnStep(model=base.model, args=base.args, train_dataset=base.train_dataset)
    with pytest.raises(TrainerUnsupported, match=r"^OwnStep overrides training_step, which "
                                                 r"would change how a step is computed"):
        elastic_trainer(trainer)


def test_callbacks_of_the_users_are_refused(tmp_path):
    trainer = build(str(tmp_path))
    trainer.add_callback(Watcher())
    trainer.add_callback(transformers.EarlyStoppingCallback())
    with pytest.raises(TrainerUnsupported, match=r"^callbacks Watcher, EarlyStoppingCallback "
                                                 r"are not supported: the Trainer's loop"):
        elastic_trainer(trainer)


def test_the_arguments_give_the_global_batch_steps_clipping_and_checkpoints(tmp_path):
    """per_device x world x accumulation is the global batch, one device's batch a chunk; a
    fraction of an epoch ends the run early; max_steps wins over epochs."""
    args = build(str(tmp_path), num_train_epochs=2.5, save_steps=0.25).args
    config = train_config(args, 128, world_size=2)
    assert (config.global_batch, config.chunk_size, config.num_chunks) == (16, 4, 4)
    assert (config.epochs, config.max_steps, config.total_steps(128)) == (3, 20, 20)
    assert config.seed == 7 and config.grad_clip_norm == 0.5
    assert config.checkpoint_every_steps == 5  # a quarter of the run's steps
    args = build(str(tmp_path), max_steps=30, save_strategy="epoch", max_grad_norm=0.0).args
    config = train_config(args, 128, world_size=1)
    assert (config.global_batch, config.epochs, config.max_steps) == (8, 2, 30)
    assert config.checkpoint_every_steps == 16 and config.grad_clip_norm is None
    with pytest.raises(TrainerUnsupported, match="world_size must be a positive integer"):
        train_config(args, 128, world_size=0)


def test_the_optimizer_and_scheduler_are_the_ones_trainer_builds(tmp_path):
    trainer = build(str(tmp_path), weight_decay=0.1)
    elastic = elastic_trainer(trainer, world_size=2)
    assert elastic.parts.optimizer is trainer.optimizer
    assert elastic.parts.lr_scheduler is trainer.lr_scheduler
    assert elastic.total_steps == STEPS
    decays = sorted(g["weight_decay"] for g in trainer.optimizer.param_groups)
    assert decays == [0.0, 0.1]  # biases and LayerNorms apart, as Trainer groups them
    batch = elastic.stepper.fetch(0, 0, torch.arange(4))
    loss = elastic.stepper.loss_fn(trainer.model, batch)
    assert loss.dim() == 0 and torch.isfinite(loss)


def test_a_trainer_whose_arguments_started_torch_distributed_is_refused(tmp_path):
    trainer = build(str(tmp_path))
    torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0,
                                         world_size=1)
    try:
        with pytest.raises(TrainerUnsupported, match=r"^torch.distributed is already "
                                                     r"initialized \(by TrainingArguments"):
            elastic_trainer(trainer)
    finally:
        torch.distributed.destroy_process_group()


def test_bf16_steps_are_the_same_bits_whatever_workers_computed_their_chunks(tmp_path):
    """Two steps at 1 and at 3 simulated workers (each computes its chunks; the buffers are
    summed; every worker applies the sum): the same parameters, the forward under the
    Trainer's autocast (bfloat16 activations, float32 parameters)."""

    def train(world: int) -> dict:
        workers = [elastic_trainer(build(str(tmp_path), bf16=True), world_size=2)
                   for _ in range(world)]
        seen = []
        workers[0].parts.model.transformer.h[0].mlp.c_fc.register_forward_hook(
            lambda module, args, out: seen.append(out.dtype))
        for step in range(2):
            steppers = [w.stepper for w in workers]
            total = torch.stack([s.compute(step, s.my_chunks(r, world))
                                 for r, s in enumerate(steppers)]).sum(0)
            for s in steppers:
                s.apply(total.clone())
        assert seen and set(seen) == {torch.bfloat16}
        assert next(workers[0].parts.model.parameters()).dtype == torch.float32
        return workers[0].parts.model.state_dict()

    alone, three = train(1), train(3)
    assert all(torch.equal(alone[k], three[k]) for k in alone)


def test_evaluation_reports_the_eval_loss_and_leaves_training_as_it_was(tmp_path):
    """eval_strategy="steps": the eval data set's loss after every eval_steps-th step and the
    last; the same mean, weighted by batch size, as Trainer.evaluate; the same model as a run
    without evaluation."""
    evaluated = build(str(tmp_path), eval_strategy="steps", eval_steps=2, max_steps=3)
    plain = build(str(tmp_path), max_steps=3)
    runs = [elastic_trainer(trainer) for trainer in (evaluated, plain)]
    for run in runs:
        run.fit()
    assert [v["step"] for v in runs[0].validations] == [2, 3]
    assert all(v["val_loss"] > 0 for v in runs[0].validations)
    assert runs[1].validations == []
    state, unevaluated = evaluated.model.state_dict(), plain.model.state_dict()
    assert all(torch.equal(state[k], unevaluated[k]) for k in state)
    evaluated.model.eval()
    with torch.no_grad():
        torch.manual_seed(1), random.seed(1)  # the collator's draws: the same in both
        ours = EvalLoss(evaluated, torch.device("cpu"))(evaluated.model)["loss"]
    torch.manual_seed(1), random.seed(1)
    assert ours == pytest.approx(evaluated.evaluate()["eval_loss"], rel=1e-5)

"""The online gradient noise scale of the elastic runtime (TrainConfig.noise_scale).

In-process tests drive ``ChunkStepper`` directly (simulated workers, as in test_stepper.py); the
end-to-end tests run the real CLI and read ``metrics.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from conftest import read_jsonl, run_cli
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.runs.checkpoint_file import dumps, loads, read_checkpoint, save_checkpoint
from dyntrain.elastic.state import TrainingParts, capture_state, restore_state
from dyntrain.elastic.step.noise import noise_estimates
from dyntrain.elastic.step.row import metric, noise_fields
from dyntrain.elastic.step.stepper import TAIL, ChunkStepper, StepResult
from dyntrain.elastic.trainer import ElasticTrainer
from dyntrain.errors import ConfigError
from dyntrain.workloads import digits
from test_stepper import BNDropNet

CPU = torch.device("cpu")
N, D = 1024, 16


# ---- a problem whose per-example gradients are known in closed form -------------------------

def regression_data(seed: int = 0) -> tuple[TensorDataset, torch.Tensor]:
    """Linear-regression data and a weight vector at distance 0.5 from the optimum, where
    B_simple is about 66: between the chunk size and the global batch."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=gen)
    w_star = torch.randn(D, generator=gen)
    y = x @ w_star + torch.randn(N, generator=gen)
    offset = torch.randn(D, generator=gen)
    return TensorDataset(x, y), w_star + 0.5 * offset / offset.norm()


def squared_error(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return 0.5 * (model(x).squeeze(-1) - y).pow(2).mean()


def regression_parts(w: torch.Tensor, lr: float = 0.0, scaler: bool = False) -> TrainingParts:
    model = nn.Linear(D, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(w)
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaler else None
    return TrainingParts(model, torch.optim.SGD(model.parameters(), lr=lr), None, grad_scaler)


def per_example_grads(ds: TensorDataset, w: torch.Tensor) -> torch.Tensor:
    """g_i = x_i (x_i . w - y_i), the gradient of 0.5 (x_i . w - y_i)^2, in float64."""
    x, y = (t.double() for t in ds.tensors)
    return x * (x @ w.double() - y)[:, None]


# ---- a general model: BatchNorm, dropout, a parameter without gradient ----------------------

SmallNet = BNDropNet  # BatchNorm, dropout and a parameter that never gets a gradient


def cross_entropy(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def small_dataset() -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(200, 6, generator=gen)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


def small_parts(scaler: bool = False) -> TrainingParts:
    torch.manual_seed(0)
    model = SmallNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaler else None
    return TrainingParts(model, opt, sched, grad_scaler)


def noise_config(**kw) -> TrainConfig:
    return TrainConfig(**{"global_batch": 40, "chunk_size": 5, "noise_scale": True,
                          "noise_every": 1, **kw})


def run_steps(config: TrainConfig, worlds: list[int], scaler: bool = False):
    """Train with world size worlds[i] at step i (one replica per simulated worker, the others
    catching up by state transfer); returns replica 0's stepper and the per-step results."""
    replicas = [small_parts(scaler) for _ in range(max(worlds))]
    ds = small_dataset()
    steppers = [ChunkStepper(config, r, ds, cross_entropy, CPU) for r in replicas]
    results = []
    for step, world in enumerate(worlds):
        flats = [steppers[r].compute(step, steppers[r].my_chunks(r, world)) for r in range(world)]
        total = torch.stack(flats).sum(0)
        results.append([steppers[r].apply(total.clone()) for r in range(world)][0])
        payload = dumps(capture_state(replicas[0], step + 1, steppers[0].steps_per_epoch))
        for r in range(world, len(replicas)):
            restore_state(replicas[r], loads(payload))
    return steppers[0], results


# ---- (a) exact answers ------------------------------------------------------------------------

def test_one_step_matches_per_example_gradients():
    """The raw estimates of a step are the A.1 estimators of that step's chunk and batch means."""
    ds, w = regression_data()
    config = TrainConfig(global_batch=128, chunk_size=8, noise_scale=True, noise_every=1)
    stepper = ChunkStepper(config, regression_parts(w), ds, squared_error, CPU)
    g = per_example_grads(ds, w)
    for step in range(3):
        idx = stepper.batch_indices(step)
        small = float(g[idx].view(16, 8, D).mean(1).pow(2).sum(1).mean())
        big = float(g[idx].mean(0).pow(2).sum())
        g2, trace = noise_estimates(small, 8, big, 128, population=N)
        result = stepper.apply(stepper.compute(step, stepper.my_chunks(0, 1)))
        assert result.noise.g2 == pytest.approx(g2, rel=1e-5)
        assert result.noise.trace_sigma == pytest.approx(trace, rel=1e-5)
        assert result.noise.b_simple == pytest.approx(trace / g2, rel=1e-4)
    assert stepper.noise.steps == 3


def test_smoothed_estimates_converge_to_the_full_data_set_values():
    """lr = 0 keeps the parameters still, so |G|^2 and tr(Sigma) are fixed and known."""
    ds, w = regression_data()
    g = per_example_grads(ds, w)
    mean = g.mean(0)
    g2_true = float(mean.pow(2).sum())
    # Batches come from epoch permutations (no replacement): trace_sigma then estimates the
    # covariance with denominator N - 1, and population=N makes g2 unbiased (elastic/step/noise.py).
    trace_true = float((g - mean).pow(2).sum(1).mean()) * N / (N - 1)
    config = TrainConfig(global_batch=128, chunk_size=8, epochs=200, noise_scale=True,
                         noise_ema=0.995, noise_every=1)
    stepper = ChunkStepper(config, regression_parts(w), ds, squared_error, CPU)
    chunks = stepper.my_chunks(0, 1)
    for step in range(800):
        result = stepper.apply(stepper.compute(step, chunks))
    tracker = stepper.noise
    assert torch.equal(stepper.parts.model.weight.detach()[0], w)  # nothing moved
    # Measured with seed 0: |G|^2 off by 0.4%, tr(Sigma) by 0.4%, B_simple by 0.9%; over seeds
    # 0-6 at most 2.0%, 0.4% and 1.9%.
    assert tracker.g2_ema == pytest.approx(g2_true, rel=0.05)
    assert tracker.trace_ema == pytest.approx(trace_true, rel=0.05)
    assert tracker.b_simple == pytest.approx(trace_true / g2_true, rel=0.07)
    assert result.noise.b_simple_ema == tracker.b_simple
    assert result.noise.g2_ema == tracker.g2_ema


def test_loss_scaling_is_undone():
    """With a GradScaler the buffer holds scaled gradients; the estimates must not see it."""
    ds, w = regression_data()
    config = TrainConfig(global_batch=128, chunk_size=8, noise_scale=True, noise_every=1)
    plain = ChunkStepper(config, regression_parts(w), ds, squared_error, CPU)
    scaled = ChunkStepper(config, regression_parts(w, scaler=True), ds, squared_error, CPU)
    for step in range(3):
        a = plain.apply(plain.compute(step, plain.my_chunks(0, 1))).noise
        b = scaled.apply(scaled.compute(step, scaled.my_chunks(0, 1))).noise
        assert b.g2 == pytest.approx(a.g2, rel=1e-5)
        assert b.trace_sigma == pytest.approx(a.trace_sigma, rel=1e-5)


def test_overflow_step_is_left_out():
    """A non-finite gradient (a loss-scaler overflow, which the scaler skips) feeds nothing."""
    ds, w = regression_data()
    config = TrainConfig(global_batch=128, chunk_size=8, noise_scale=True, noise_every=1)
    stepper = ChunkStepper(config, regression_parts(w, scaler=True), ds, squared_error, CPU)
    stepper.apply(stepper.compute(0, stepper.my_chunks(0, 1)))
    before = stepper.noise.state_dict()
    flat = stepper.compute(1, stepper.my_chunks(0, 1))
    flat[0] = math.inf
    result = stepper.apply(flat)
    assert result.noise is None
    assert stepper.noise.state_dict() == before
    assert torch.equal(stepper.parts.model.weight.detach()[0], w)  # the scaler skipped it too


# ---- (b) independent of the world size --------------------------------------------------------

def test_same_estimates_bitwise_on_one_two_or_three_workers():
    """Exact reduction: the same gradient and the same chunk norms in any world size."""
    config = noise_config()
    one, one_results = run_steps(config, [1] * 6)
    two, two_results = run_steps(config, [2] * 6)
    mixed, mixed_results = run_steps(config, [1, 2, 3, 2, 1, 3])
    assert [r.noise for r in one_results] == [r.noise for r in two_results]
    assert [r.noise for r in one_results] == [r.noise for r in mixed_results]
    assert one.noise.state_dict() == two.noise.state_dict() == mixed.noise.state_dict()
    assert one.noise.steps == 6


def test_same_estimates_with_float32_reduction():
    """Float32 reduction: the gradient sum depends on the grouping, so only close."""
    config = noise_config(exact_reduction=False)
    (one, a), (three, b) = run_steps(config, [1] * 6), run_steps(config, [3] * 6)
    for x, y in zip(a, b, strict=True):
        for field in ("g2", "trace_sigma", "g2_ema", "trace_ema"):
            assert getattr(y.noise, field) == pytest.approx(getattr(x.noise, field), rel=1e-4)
    assert three.noise.b_simple == pytest.approx(one.noise.b_simple, rel=1e-4)


def test_each_worker_fills_its_own_chunk_slots():
    """One slot per chunk: a worker writes its chunks' norms and zeros elsewhere, so the
    all-reduce (here: a sum) yields every chunk's norm, exactly as one worker computes them."""
    config = noise_config()
    k = config.num_chunks
    ds = small_dataset()
    single = ChunkStepper(config, small_parts(), ds, cross_entropy, CPU)
    workers = [ChunkStepper(config, small_parts(), ds, cross_entropy, CPU) for _ in range(3)]
    whole = single.compute(0, single.my_chunks(0, 1))[-TAIL - k : -TAIL]
    assert bool((whole > 0).all())
    parts = [w.compute(0, w.my_chunks(r, 3)) for r, w in enumerate(workers)]
    for r, flat in enumerate(parts):
        slots = flat[-TAIL - k : -TAIL]
        mine = list(workers[r].my_chunks(r, 3))
        assert torch.equal(slots[mine], whole[mine])
        assert not slots[[c for c in range(k) if c not in mine]].any()
    assert torch.equal(sum(flat[-TAIL - k : -TAIL] for flat in parts), whole)
    # chunks given as a list or an iterator rather than a range land in the same slots
    for chunks in ([1, 4], iter([1, 4])):
        listed = workers[0].compute(0, chunks)[-TAIL - k : -TAIL]
        assert torch.equal(listed[[1, 4]], whole[[1, 4]]) and int((listed != 0).sum()) == 2


def test_grad_scaler_path_matches_across_world_sizes():
    config = noise_config()
    (one, a), (three, b) = run_steps(config, [1] * 4, True), run_steps(config, [3] * 4, True)
    assert [r.noise for r in a] == [r.noise for r in b]
    assert three.noise.b_simple == one.noise.b_simple


# ---- (c) off by default; on, it changes nothing else ------------------------------------------

def test_off_by_default_layout_and_results_unchanged():
    config = TrainConfig(global_batch=40, chunk_size=5)
    assert config.noise_scale is False and config.noise_ema == 0.95
    parts = small_parts()
    stepper = ChunkStepper(config, parts, small_dataset(), cross_entropy, CPU)
    assert stepper.noise is None and parts.noise is None
    flat = stepper.compute(0, stepper.my_chunks(0, 1))
    numel = sum(q.numel() for q in stepper.params)
    assert flat.numel() == numel + stepper.bn.width * config.num_chunks + TAIL
    stepper.set_flags(flat, reform=True, leave=False)
    result = stepper.apply(flat)
    assert result.noise is None and result.reform and result.leavers == 0
    assert "noise_scale" not in capture_state(parts, 1, stepper.steps_per_epoch)


@pytest.mark.parametrize("exact", [True, False])
def test_on_adds_chunk_slots_and_leaves_training_bitwise_unchanged(exact):
    off_cfg = TrainConfig(global_batch=40, chunk_size=5, exact_reduction=exact)
    on_cfg = noise_config(exact_reduction=exact)
    ds = small_dataset()
    off = ChunkStepper(off_cfg, small_parts(), ds, cross_entropy, CPU)
    on = ChunkStepper(on_cfg, small_parts(), ds, cross_entropy, CPU)
    for step in range(4):
        a, b = off.compute(step, off.my_chunks(0, 1)), on.compute(step, on.my_chunks(0, 1))
        k = on_cfg.num_chunks
        assert b.numel() == a.numel() + k and b.dtype == a.dtype
        # everything but the chunk-norm slots is bitwise the same, in the same places
        assert torch.equal(torch.cat([b[: -TAIL - k], b[-TAIL:]]), a)
        for flat in (a, b):
            off.set_flags(flat, reform=step == 3, leave=step == 3)
        ra, rb = off.apply(a), on.apply(b)
        assert (ra.loss, ra.reform, ra.leavers) == (rb.loss, rb.reform, rb.leavers)
        assert rb.reform == rb.leavers == (step == 3)
        assert ra.noise is None and rb.noise is not None
    for (name, x), y in zip(off.parts.model.state_dict().items(),
                            on.parts.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


# ---- (e) the tracker's state travels with the training state ----------------------------------

def test_tracker_state_travels_to_a_joiner():
    """A replica restored from another's state after step 3 continues the same moving average."""
    config = noise_config()
    ds = small_dataset()
    a_parts, b_parts = small_parts(), small_parts()
    a = ChunkStepper(config, a_parts, ds, cross_entropy, CPU)
    b = ChunkStepper(config, b_parts, ds, cross_entropy, CPU)
    for step in range(3):
        a.apply(a.compute(step, a.my_chunks(0, 1)))
    state = capture_state(a_parts, 3, a.steps_per_epoch)
    assert state["noise_scale"]["steps"] == 3
    assert restore_state(b_parts, loads(dumps(state))) == 3
    assert b.noise.state_dict() == a.noise.state_dict()
    for step in range(3, 6):
        ra = a.apply(a.compute(step, a.my_chunks(0, 1)))
        rb = b.apply(b.compute(step, b.my_chunks(0, 1)))
        assert ra.noise == rb.noise
    assert b.noise.steps == 6


def test_tracker_state_survives_a_checkpoint(tmp_path):
    config = noise_config()
    ds = small_dataset()
    parts = small_parts()
    stepper = ChunkStepper(config, parts, ds, cross_entropy, CPU)
    for step in range(4):
        stepper.apply(stepper.compute(step, stepper.my_chunks(0, 1)))
    path = save_checkpoint(tmp_path, 4, capture_state(parts, 4, stepper.steps_per_epoch))
    resumed_parts = small_parts()
    resumed = ChunkStepper(config, resumed_parts, ds, cross_entropy, CPU)
    assert restore_state(resumed_parts, read_checkpoint(path)) == 4
    assert resumed.noise.state_dict() == stepper.noise.state_dict()
    assert resumed.noise.b_simple == stepper.noise.b_simple


def test_state_without_matching_tracker_restarts_the_average(caplog):
    """An old checkpoint (no tracker state) or one taken with another EMA factor: start over."""
    ds = small_dataset()
    plain_parts = small_parts()
    plain = ChunkStepper(TrainConfig(global_batch=40, chunk_size=5), plain_parts, ds,
                         cross_entropy, CPU)
    plain.apply(plain.compute(0, plain.my_chunks(0, 1)))
    old_state = capture_state(plain_parts, 1, plain.steps_per_epoch)

    parts = small_parts()
    stepper = ChunkStepper(noise_config(), parts, ds, cross_entropy, CPU)
    stepper.apply(stepper.compute(0, stepper.my_chunks(0, 1)))
    assert stepper.noise.steps == 1
    restore_state(parts, old_state)
    assert stepper.noise.steps == 0 and stepper.noise.b_simple is None

    other_parts = small_parts()
    other = ChunkStepper(noise_config(noise_ema=0.5), other_parts, ds, cross_entropy, CPU)
    other.apply(other.compute(0, other.my_chunks(0, 1)))
    stepper.apply(stepper.compute(1, stepper.my_chunks(0, 1)))
    with caplog.at_level(logging.WARNING, logger="dyntrain.state"):
        restore_state(parts, capture_state(other_parts, 1, other.steps_per_epoch))
    assert stepper.noise.steps == 0
    assert "restarting the moving averages" in caplog.text


# ---- (f) configuration -----------------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    {"noise_ema": 1.0}, {"noise_ema": -0.1}, {"noise_ema": math.nan},
    {"noise_scale": True, "global_batch": 8, "chunk_size": 8},
])
def test_bad_noise_settings_raise(kw):
    with pytest.raises(ConfigError):
        TrainConfig(**{"global_batch": 32, "chunk_size": 8, **kw})


def test_noise_settings_that_are_fine():
    TrainConfig(global_batch=8, chunk_size=8)  # one chunk is fine while the noise scale is off
    TrainConfig(global_batch=8, chunk_size=4, noise_scale=True, noise_ema=0.0)


def test_fingerprint_unchanged_for_configs_without_the_noise_scale():
    """Old settings keep their fingerprint; turning the feature on or changing its EMA counts."""
    base = TrainConfig(global_batch=32, chunk_size=8)
    later = ("noise_scale", "noise_ema", "noise_every", "grad_clip_norm", "overlap", "exact_ring",
             "balance", "bucket_mb", "shard_level", "shard_redundancy")
    values = {k: v for k, v in asdict(base).items() if k not in later}
    legacy = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]
    assert base.fingerprint() == legacy
    on = TrainConfig(global_batch=32, chunk_size=8, noise_scale=True, noise_every=1)
    on_ema = TrainConfig(global_batch=32, chunk_size=8, noise_scale=True, noise_ema=0.9)
    on_every = TrainConfig(global_batch=32, chunk_size=8, noise_scale=True, noise_every=2)
    assert len({base.fingerprint(), on.fingerprint(), on_ema.fingerprint(),
                on_every.fingerprint()}) == 4


# ---- the trainer's metrics fields ------------------------------------------------------------

def test_trainer_alone_keeps_the_estimates_and_formats_metrics(monkeypatch):
    monkeypatch.delenv("DYNTRAIN_COORDINATOR", raising=False)
    monkeypatch.delenv("DYNTRAIN_OUT", raising=False)
    ds, w = regression_data()
    parts = regression_parts(w, lr=0.01)
    config = TrainConfig(global_batch=128, chunk_size=8, max_steps=5, noise_scale=True,
                         noise_every=1)
    trainer = ElasticTrainer(config, parts.model, parts.optimizer, ds, squared_error,
                             device="cpu")
    trainer.fit()
    assert trainer.step == 5 and trainer.stepper.noise.steps == 5
    assert trainer.last_result.noise.b_simple_ema == trainer.stepper.noise.b_simple
    fields = noise_fields(trainer.stepper.noise, trainer.last_result)
    assert set(fields) == {"b_simple", "b_simple_raw", "g2", "trace_sigma"}
    assert fields["b_simple"] == pytest.approx(trainer.stepper.noise.b_simple, rel=1e-5)
    assert fields["g2"] == pytest.approx(trainer.stepper.noise.g2_ema, rel=1e-5)
    json.dumps(fields, allow_nan=False)
    # an overflow step (no estimates): the smoothed values stay, the raw one is null
    skipped = noise_fields(trainer.stepper.noise, StepResult(loss=1.0, reform=False, leavers=0))
    assert skipped["b_simple_raw"] is None and skipped["b_simple"] == fields["b_simple"]


def test_trainer_metrics_without_the_noise_scale_are_unchanged(monkeypatch):
    monkeypatch.delenv("DYNTRAIN_COORDINATOR", raising=False)
    ds, w = regression_data()
    parts = regression_parts(w)
    config = TrainConfig(global_batch=128, chunk_size=8, max_steps=1)
    trainer = ElasticTrainer(config, parts.model, parts.optimizer, ds, squared_error,
                             device="cpu")
    trainer.fit()
    assert trainer.last_result.noise is None
    assert noise_fields(trainer.stepper.noise, trainer.last_result) == {}


@pytest.mark.parametrize("value,expected", [(None, None), (math.nan, None), (math.inf, None),
                                            (123.456789, 123.457), (1.23456789e-7, 1.23457e-7)])
def test_metric_values_are_short_and_json_safe(value, expected):
    assert metric(value) == expected


# ---- the digits workload's flags --------------------------------------------------------------

def test_digits_flags_default_to_the_old_behaviour():
    args = digits.build_parser().parse_args([])
    assert (args.model, args.optimizer, args.lr_schedule) == ("cnn", "nesterov", "cosine")
    assert args.noise_scale is False and args.noise_ema == 0.95


def test_digits_runs_alone_with_the_new_flags(monkeypatch, capsys):
    monkeypatch.delenv("DYNTRAIN_COORDINATOR", raising=False)
    monkeypatch.delenv("DYNTRAIN_OUT", raising=False)
    threads = torch.get_num_threads()
    try:
        digits.main(["--model", "mlp", "--optimizer", "sgd", "--lr-schedule", "constant",
                     "--noise-scale", "--max-steps", "4", "--global-batch", "32",
                     "--chunk-size", "8"])
    finally:
        torch.set_num_threads(threads)
    assert "validation accuracy" in capsys.readouterr().out


def test_digits_rejects_noise_scale_with_one_chunk(capsys):
    with pytest.raises(SystemExit) as exc:
        digits.main(["--noise-scale", "--global-batch", "8", "--chunk-size", "8"])
    assert exc.value.code == 2
    assert "noise_scale needs at least two chunks" in capsys.readouterr().err


# ---- end to end: the real CLI, real workers -------------------------------------------------

WORKLOAD = ["-m", "dyntrain.workloads.digits", "--model", "mlp", "--noise-scale",
            "--global-batch", "32", "--chunk-size", "4", "--max-steps", "80",
            "--checkpoint-every", "10"]
NOISE_FIELDS = ("b_simple", "b_simple_raw", "g2", "trace_sigma")


def last_rows(out: Path) -> dict[int, dict]:
    """The last metrics row of each step (a resumed run reports the redone steps again)."""
    return {row["step"]: row for row in read_jsonl(out / "metrics.jsonl")}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("noise") / "static"
    run_cli(["run", "--workers", "2:2", "--quiet", "--out", out, *WORKLOAD], check=True)
    return last_rows(out)


def assert_same_noise(rows: dict[int, dict], reference: dict[int, dict]) -> None:
    assert sorted(rows) == sorted(reference) == list(range(1, 81))
    for step, ref in reference.items():
        for field in ("b_simple", "g2", "trace_sigma"):
            got = rows[step][field]
            assert (got is None) == (ref[field] is None), (step, field)
            if got is not None:
                assert got == pytest.approx(ref[field], rel=1e-4), (step, field)


@pytest.mark.slow
def test_cli_run_logs_b_simple(reference_run):
    rows = reference_run
    assert all(set(NOISE_FIELDS) <= set(r) for r in rows.values())
    assert {r["world_size"] for r in rows.values()} == {2}
    late = [rows[s] for s in range(10, 81)]  # after a warm-up of the moving averages
    assert all(r["b_simple"] is not None and math.isfinite(r["b_simple"]) and r["b_simple"] > 0
               for r in late), [r["b_simple"] for r in late]
    assert all(r["g2"] > 0 and r["trace_sigma"] > 0 for r in late)
    # the raw per-step ratio scatters much more than the smoothed one
    # measured every 4th step (the default noise_every): raw values only there
    raw = [r["b_simple_raw"] for r in late if r["b_simple_raw"] is not None]
    assert len(raw) > len(late) // 8
    assert all((r["step"] - 1) % 4 == 0 for r in late if r["b_simple_raw"] is not None)


@pytest.mark.slow
def test_noise_scale_continues_across_join_and_leader_leave(tmp_path, reference_run):
    """The joiner gets the tracker with the state; once the leader leaves it reports the same
    moving averages as a run that never changed size (a restarted EMA would differ)."""
    out = tmp_path / "elastic"
    run_cli(["run", "--workers", "1:2", "--nproc", "1", "--quiet", "--out", out,
             "--events", "step=5:join=1,step=30:leave=rank:0", *WORKLOAD,
             "--step-delay", "0.02"], check=True)
    events = [e["event"] for e in read_jsonl(out / "events.jsonl")]
    assert events == ["start", "join", "leave"], events
    rows = last_rows(out)
    sizes = [rows[s]["world_size"] for s in sorted(rows)]
    assert sizes[0] == 1 and 2 in sizes and sizes[-1] == 1
    assert_same_noise(rows, reference_run)


@pytest.mark.slow
def test_noise_scale_continues_after_a_resume(tmp_path, reference_run):
    out = tmp_path / "resumed"
    proc = run_cli(["run", "--workers", "1", "--quiet", "--out", out,
                    "--events", "step=45:kill=all", *WORKLOAD, "--step-delay", "0.01"])
    assert proc.returncode == 1, proc.stdout[-2000:]
    run_cli(["run", "--workers", "1", "--quiet", "--out", out, *WORKLOAD], check=True)
    resume = [e for e in read_jsonl(out / "events.jsonl") if e["event"] == "resume"]
    assert resume and 0 < resume[-1]["start_step"] < 80
    assert_same_noise(last_rows(out), reference_run)


def test_tracker_state_is_plain_values():
    """The tracker's part of the state is plain floats and ints: weights-only loadable."""
    parts = small_parts()
    stepper = ChunkStepper(noise_config(), parts, small_dataset(), cross_entropy, CPU)
    stepper.apply(stepper.compute(0, stepper.my_chunks(0, 1)))
    state = loads(dumps(capture_state(parts, 1, stepper.steps_per_epoch)))
    assert json.loads(json.dumps(state["noise_scale"])) == stepper.noise.state_dict()


def test_noise_every_measures_only_every_kth_step_and_keeps_training_unchanged():
    """With noise_every=3 the tracker updates at steps 0, 3, 6 only, from the same numbers as a
    tracker that measures every step, and the parameters are bitwise those of a run without it."""
    ds, w = regression_data()
    every, sparse, off = (TrainConfig(global_batch=128, chunk_size=8, noise_scale=on,
                                      noise_every=k)
                          for on, k in ((True, 1), (True, 3), (False, 1)))
    steppers = []
    for config in (every, sparse, off):
        parts = regression_parts(w, lr=0.01)
        stepper = ChunkStepper(config, parts, ds, squared_error, CPU)
        raws = []
        for step in range(7):
            result = stepper.apply(stepper.compute(step, stepper.my_chunks(0, 1)))
            raws.append(None if result.noise is None else result.noise.g2)
        steppers.append((stepper, parts, raws))
    (s1, p1, r1), (s3, p3, r3), (_, p0, _) = steppers
    assert s3.noise.steps == 3 and s1.noise.steps == 7
    assert [r is not None for r in r3] == [True, False, False, True, False, False, True]
    assert [r3[i] for i in (0, 3, 6)] == [r1[i] for i in (0, 3, 6)]
    for a, b in zip(p3.model.parameters(), p0.model.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="noise_every"):
        TrainConfig(global_batch=8, chunk_size=4, noise_scale=True, noise_every=0)

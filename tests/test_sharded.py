"""ZeRO-1 (``TrainConfig.shard_level`` 1): the optimizer state sharded by whole tensors with
redundancy, re-sharded in place through joins, a kill and a leave, bitwise the unsharded static
run; a crash with redundancy 1 falls back to the newest checkpoint and says so, a graceful
leave with redundancy 1 hands the leaver's shard over and needs none; optimizers that
cannot be sharded exactly are refused. ZeRO-2 and ZeRO-3 (levels 2 and 3, the reduced gradients
and the parameters sharded too): the same runs, clipping by the global norm included (the noise
scale and a loss scaler are refused there). Every run clips in every step (a max norm under the
gradient's norm), so a clipping norm that differed anywhere would show in the bits."""

import re
import sys

import pytest
import torch

from conftest import SCRIPTS, read_jsonl, run_cli, run_held, shared_static_run, static_run
from dyntrain.elastic import protocol as p
from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.runs.checkpoints import latest_valid_checkpoint, list_checkpoints
from dyntrain.elastic.runs.storage import open_store
from dyntrain.elastic.sharding.owners import ShardLevel
from dyntrain.elastic.sharding.strategy import (
    GradientSharding,
    OptimizerSharding,
    ParameterSharding,
    Replicated,
    sharding_for,
)
from dyntrain.elastic.sharding.zero import OptimizerShards, check_shardable, without_tensor_state
from dyntrain.elastic.state import TrainingParts
from dyntrain.elastic.trainer import ElasticTrainer
from dyntrain.elastic.worker.writer import RunWriter
from dyntrain.errors import ConfigError
from dyntrain.recipes import LARS
from test_elastic_e2e import assert_exactly_once, max_param_diff, world_sizes
from test_gpt_workload import SMALL, static_small

#: the GPT workload's default --grad-clip, which SMALL's runs clip by in every step (their norms
#: are 1.8-4.3): the clip coefficient is in every step's bits
MAX_NORM = 1.0


def _static_run(out, argv):
    """The unsharded reference: the workload alone (``conftest.static_run``)."""
    return static_run(out, "-m", "dyntrain.workloads.gpt", *argv)


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    return static_small(tmp_path_factory)  # clipped: MAX_NORM


def _same_final(a, b) -> None:
    x = torch.load(a / "final.pt", weights_only=True)
    y = torch.load(b / "final.pt", weights_only=True)
    assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


@pytest.mark.slow
def test_a_sharded_elastic_run_is_bitwise_the_unsharded_static_run(tmp_path, static):
    _joins_kill_leave(tmp_path, static, SMALL, "1")


@pytest.mark.slow
def test_gradients_sharded_too_the_run_is_still_bitwise_the_static_run(tmp_path, static):
    _joins_kill_leave(tmp_path, static, SMALL, "2")


def _joins_kill_leave(tmp_path, static, argv, level):
    elastic = tmp_path / "elastic"
    # 1 -> 3 (joins) -> 2 (SIGKILL: r = 2, nothing lost) -> 1 (rank 0 leaves)
    proc = run_cli(["run", "--workers", "1:3", "--nproc", "1", "--out", elastic, "--events",
                    "step=2:join=2,step=5:kill=1,step=8:leave=rank:0", "-m",
                    "dyntrain.workloads.gpt", *argv, "--shard", level, "--step-delay", "0.15"],
                   check=True)
    assert "event(s) never fired" not in proc.stdout
    assert world_sizes(elastic)[:4] == [1, 3, 2, 1], proc.stdout
    assert "checkpoint" not in " ".join(
        line for line in proc.stdout.splitlines() if "generation" in line and "from step" in line)
    assert "lost the optimizer state" not in proc.stdout + proc.stderr
    _same_final(static, elastic)
    assert (elastic / "result.json").read_text() == (static / "result.json").read_text()
    _same_clipping(static, elastic)
    # the checkpoints hold the whole optimizer state, as an unsharded run's do: resumable at
    # any level (the static run resumes from the sharded run's last checkpoint to the same end)
    step, _, state = latest_valid_checkpoint(open_store(str(elastic), "out"))
    ref_step, _, ref = latest_valid_checkpoint(open_store(str(static), "out"))
    assert step == ref_step == 20
    assert list(state["optimizer"]["state"]) == list(ref["optimizer"]["state"])
    for k, v in ref["optimizer"]["state"].items():
        assert all(torch.equal(v[key], state["optimizer"]["state"][k][key]) for key in v)


def _same_clipping(static, elastic) -> None:
    """Every step of the static run clipped, and every step the elastic run wrote a row for
    took the same global norm, to the bit."""
    norms = {r["step"]: r["grad_norm"] for r in read_jsonl(static / "metrics.jsonl")
             if "grad_norm" in r}
    assert len(norms) == 20 and min(norms.values()) > MAX_NORM, norms
    rows = [r for r in read_jsonl(elastic / "metrics.jsonl") if "grad_norm" in r]
    assert len(rows) >= 15 and all(r["grad_norm"] == norms[r["step"]] for r in rows), rows


@pytest.mark.slow
def test_parameters_sharded_too_the_run_is_still_bitwise_the_static_run(tmp_path, static):
    _joins_kill_leave(tmp_path, static, SMALL, "3")


@pytest.mark.slow
def test_with_redundancy_1_a_leaver_hands_its_shard_over_and_a_crash_resumes_from_a_checkpoint(
        tmp_path, static):
    _leave_then_kill_without_a_copy(tmp_path, static, SMALL, "1", "rank:1")


@pytest.mark.slow
def test_gradients_sharded_with_redundancy_1_a_leaver_hands_over_and_a_crash_resumes(
        tmp_path, static):
    _leave_then_kill_without_a_copy(tmp_path, static, SMALL, "2", "rank:2")


@pytest.mark.slow
def test_parameters_sharded_with_redundancy_1_the_leader_hands_over_and_a_crash_resumes(
        tmp_path, static):
    _leave_then_kill_without_a_copy(tmp_path, static, SMALL, "3", "rank:0")


def _leave_then_kill_without_a_copy(tmp_path, static, argv, level, who):
    """``r = 1``, 1 -> 3 (joins) -> 2 (a graceful leave) -> 1 (a SIGKILL). The leaver's tensors
    are in no other member, so it hands them over before it goes: the run goes on without a
    checkpoint. The killed member's tensors are lost: the survivor says so and resumes from the
    newest checkpoint (in DCP format, every member wrote its share). Either way the model ends
    as the static run's."""
    elastic = tmp_path / "elastic"
    proc = run_cli(["run", "--workers", "1:3", "--nproc", "1", "--out", elastic, "--events",
                    f"step=2:join=2,step=6:leave={who},step=10:kill=1", "-m",
                    "dyntrain.workloads.gpt", *argv, "--shard", level, "--shard-redundancy", "1",
                    "--step-delay", "0.15"], check=True)
    out = proc.stdout + proc.stderr
    assert "event(s) never fired" not in proc.stdout
    assert world_sizes(elastic)[:3] == [1, 3, 2], out
    events = read_jsonl(elastic / "events.jsonl")
    kinds = [e["event"] for e in events]
    before_kill = kinds[:kinds.index("crash")]
    # the leave: handed over, nothing lost, no checkpoint read
    assert "leave" in before_kill and "resume" not in before_kill, events
    assert [(e["world_before"], e["world_after"]) for e in events
            if e["event"] == "leave"] == [(3, 2)], events
    assert out.count("lost the optimizer state of") == 1, out
    lines = proc.stdout.splitlines()
    lost = next(i for i, line in enumerate(lines) if "lost the optimizer state of" in line)
    assert "checkpoint" not in " ".join(
        line for line in lines[:lost] if "generation" in line and "from step" in line)
    # the kill: lost, said, resumed from the newest checkpoint
    assert "(shard_redundancy 1)" in out, out
    found = re.search(r"resuming from the newest checkpoint \(step (\d+)\)", out)
    assert found and int(found[1]) % 4 == 0, out
    assert f"from step {found[1]} (checkpoint" in out, out
    # from a sharded checkpoint in DCP format, which every member wrote its share of
    assert re.search(rf"from step {found[1]} \(checkpoint \S*ckpt-0*{found[1]}\.dcp", out), out
    assert any(e["event"] == "crash" and "lost the optimizer state" in e.get("reason", "")
               for e in events), events
    assert any(e["event"] == "resume" and e["start_step"] == int(found[1]) for e in events)
    _same_final(static, elastic)
    assert (elastic / "result.json").read_text() == (static / "result.json").read_text()


@pytest.mark.slow
def test_random_strikes_end_like_the_unsharded_static_run(tmp_path, static):
    """Hangs, joins, kills and leaves at the worst moments (``--chaos``): whatever they hit
    (a hand-over, a re-sharding, a parameter broadcast), the model is the static run's."""
    _chaos(tmp_path, static, "1")


def _chaos(tmp_path, static, level) -> None:
    """``--chaos 11:5`` at ``level``; slow chunks (0.5 s more each) until three strikes were
    made, so that the job lasts long enough for them even on a quiet machine, then full speed."""
    elastic, hold = tmp_path / "chaos", tmp_path / "hold"

    def strikes() -> int:
        return len(read_jsonl(elastic / "chaos.jsonl")) if (elastic / "chaos.jsonl").exists() \
            else 0

    proc = run_held(tmp_path / "launcher.log", [
        "--workers", "1:3", "--nproc", "2", "--failure-timeout", "2", "--out", elastic,
        "--chaos", "11:5", SCRIPTS / "gpt_held.py", hold, *SMALL, "--shard", level], hold,
        lambda: strikes() >= 3, "three strikes")
    assert proc.returncode == 0, proc.stdout[-3000:]
    _same_final(static, elastic)
    assert strikes() >= 2, proc.stdout[-3000:]


@pytest.mark.slow
def test_parameters_sharded_random_strikes_end_like_the_static_run(tmp_path, static):
    """``--chaos`` at level 3: a strike in a unit's gather, a phantom round or the whole-model
    gathers of the re-sharding and the checkpoints still ends with the static run's model."""
    _chaos(tmp_path, static, "3")


def test_optimizers_that_cannot_be_sharded_exactly_are_refused():
    model = torch.nn.Linear(3, 2)
    for ok in (torch.optim.SGD(model.parameters(), lr=0.1),
               torch.optim.AdamW(model.parameters()), LARS(model.parameters(), lr=0.1)):
        check_shardable(ok)
    with pytest.raises(ConfigError, match="optimizer LBFGS cannot be sharded exactly; "
                                          "shardable: SGD, Adam, AdamW, LARS"):
        check_shardable(torch.optim.LBFGS(model.parameters()))
    with pytest.raises(ConfigError, match="shard_level must be 0, 1, 2 or 3, got 4"):
        TrainConfig(global_batch=4, chunk_size=2, shard_level=4)


def test_what_reads_the_whole_reduced_gradient_is_refused_at_level_2():
    base = {"global_batch": 4, "chunk_size": 2, "shard_level": 2}
    TrainConfig(**base)
    for level in (2, 3):  # clipping by the global norm is not: its norm comes in the tail
        assert TrainConfig(**{**base, "shard_level": level}, grad_clip_norm=1.0).grad_clip_norm
    for extra, reason in (({"noise_scale": True}, "noise_scale is not supported with "
                           "shard_level 2"),
                          ({"exact_ring": False}, "shard_level 2 needs exact_reduction and "
                           "exact_ring")):
        with pytest.raises(ConfigError, match=re.escape(reason)):
            TrainConfig(**base, **extra)
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ConfigError, match="a loss scaler is not supported with shard_level 2"):
        sharding_for(TrainConfig(**base), model, torch.optim.AdamW(model.parameters()),
                     list(model.parameters()), [], torch.amp.GradScaler("cpu"))
    assert sharding_for(TrainConfig(**{**base, "shard_level": 1}), model,
                        torch.optim.AdamW(model.parameters()), list(model.parameters()), [],
                        torch.amp.GradScaler("cpu")).level == 1



def test_each_level_is_chosen_once_as_its_strategy():
    """``sharding_for`` turns the level into the object the trainer and the stepper ask: what it
    reduces chunk by chunk, what it hands over, what a checkpoint of it holds."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    params = list(model.parameters())
    state = {"optimizer": {"state": {0: {"exp_avg": torch.ones(1)}}, "param_groups": []},
             "step": 3}
    kinds = []
    for level in range(4):
        config = TrainConfig(global_batch=4, chunk_size=2, shard_level=level)
        sharding = sharding_for(config, model, torch.optim.AdamW(params), params, [])
        kinds.append((type(sharding), sharding.level, sharding.shares_checkpoints,
                      sharding.handover_state(state)["optimizer"]["state"] == {},
                      sharding.settle_interrupted(),
                      sharding.lay_out([7, 8, 9, 10], 0, 1) == [7, 8, 9, 10]))
    assert kinds == [
        (Replicated, ShardLevel.NONE, False, False, 0, True),
        (OptimizerSharding, ShardLevel.OPTIMIZER, True, True, 0, True),
        (GradientSharding, ShardLevel.GRADIENTS, True, True, 0, False),
        (ParameterSharding, ShardLevel.PARAMETERS, True, True, 0, False)]


def test_the_writer_checkpoints_as_the_strategy_says(tmp_path):
    """Unsharded, the worker's own clock decides a checkpoint by time and a worker leaving
    between generations keeps its state; sharded, the leader asks in the step's tail, only an
    agreed checkpoint by time is written, and a leaver holds only a share (nothing written)."""
    model = torch.nn.Linear(3, 2)
    parts = TrainingParts(model, torch.optim.AdamW(model.parameters()))
    config = TrainConfig(global_batch=4, chunk_size=2, checkpoint_every_seconds=1e-9,
                         shard_level=1)
    writers = {}
    for name, sharding in (("replicated", Replicated(parts.optimizer)),
                           ("sharded", sharding_for(config, model, parts.optimizer,
                                                    list(model.parameters()), []))):
        store = open_store(str(tmp_path / name), "out")
        writer = writers[name] = RunWriter(store, config, parts, 10, sharding)
        writer.maybe_checkpoint(1)  # by time: due by the clock, not agreed
        writer.maybe_checkpoint(2, agreed=True)
        writer.keep_before_leaving(3)
        writers[name] = (writer.asks_checkpoint(True), writer.asks_checkpoint(False),
                         [step for step, _ in list_checkpoints(store)])
    assert writers == {"replicated": (False, False, [1, 2, 3]),
                       "sharded": (True, False, [2])}

@pytest.mark.slow
def test_the_gpt_workload_at_level_3_clips_by_default(tmp_path, static):
    """The README's command: ``--shard 3`` with the workload's default clipping (1.0), two
    workers, the model of the unsharded static run with the same clipping (the module's
    shared one: no static run of its own)."""
    elastic = tmp_path / "elastic"
    run_cli(["run", "--workers", "1:4", "--nproc", "2", "--out", elastic, "-m",
             "dyntrain.workloads.gpt", *SMALL, "--shard", "3"], check=True)
    _same_final(static, elastic)
    rows = [r for r in read_jsonl(elastic / "metrics.jsonl") if "grad_norm" in r]
    assert len(rows) == 20 and rows[0]["world_size"] == 2, rows
    _same_clipping(static, elastic)


def test_a_script_with_a_refused_optimizer_exits_with_one_line(monkeypatch, capsys):
    """The trainer installs dyntrain's hook before it refuses the optimizer: the interpreter
    hands the uncaught error to ``sys.excepthook``, which says it in one line and exits
    non-zero (in-process: a script's interpreter calls the same hook; the scripts of
    ``test_cli`` show the hook's one line end to end)."""
    monkeypatch.delenv("DYNTRAIN_COORDINATOR", raising=False)
    monkeypatch.delenv("DYNTRAIN_OUT", raising=False)
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    model = torch.nn.Linear(3, 2)
    data = torch.utils.data.TensorDataset(torch.zeros(8, 3))
    with pytest.raises(ConfigError) as refused:
        ElasticTrainer(TrainConfig(global_batch=4, chunk_size=2, shard_level=1), model,
                       torch.optim.Adagrad(model.parameters()), data, lambda m, b: 0)
    with pytest.raises(SystemExit) as exited:
        sys.excepthook(refused.type, refused.value, refused.tb)
    assert exited.value.code not in (0, None)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "optimizer Adagrad cannot be sharded exactly" in lines[0], lines
    assert lines[0].startswith("dyntrain: error: ")


def test_settings_that_do_not_change_the_result_keep_the_fingerprint():
    base = TrainConfig(global_batch=4, chunk_size=2)
    assert TrainConfig(global_batch=4, chunk_size=2, shard_level=0,
                       shard_redundancy=2).fingerprint() == base.fingerprint()
    assert TrainConfig(global_batch=4, chunk_size=2, shard_level=1).fingerprint() != \
        base.fingerprint()


def test_a_world_of_one_owns_everything_and_moves_nothing():
    """The re-sharding of a lone member (no process group): it holds every tensor already."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.Adam(model.parameters())
    params = list(model.parameters())
    shards = OptimizerShards(opt, params, [n for n, _ in model.named_parameters()], 2)
    group, gen = Group(None, 0, 1, torch.device("cpu")), p.Generation(0, ("a",), 0)
    assert shards.reshard(group, gen, "a", lambda: False) == []
    assert shards.owned == set(range(len(params)))
    # a receiver of the hand-over holds nothing: with no other member, everything is lost
    joined = p.Generation(1, ("a",), 0, source="a", receivers=("a",))
    assert shards.reshard(group, joined, "a", lambda: False) == [
        n for n, _ in model.named_parameters()]
    state = {"optimizer": {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": []},
             "step": 3}
    assert without_tensor_state(state)["optimizer"] == {"state": {}, "param_groups": []}
    assert state["optimizer"]["state"]  # the original is left alone


def test_a_resume_loads_only_the_optimizer_state_a_member_will_own():
    """``checkpoint_keys``: of a checkpoint's keys, each of three members keeps the optimizer
    state of the tensors the generation's plan gives it, and everything else; together they
    hold every tensor's state ``r`` times, none of them the whole of it."""
    from dyntrain.elastic.sharding.owners import plan_ownership

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(4)])  # 8 tensors
    names = [n for n, _ in model.named_parameters()]
    gen = p.Generation(2, ("a", "b", "c"), 8, checkpoint="/x/checkpoints/ckpt-000000008.dcp",
                       probes=("10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"))
    keys = ["step", "model.0.weight", "optimizer.param_groups.0.lr",
            *[f"optimizer.state.{i}.{k}" for i in range(8) for k in ("step", "exp_avg")]]
    kept = {}
    for member in gen.members:
        shards = OptimizerShards(torch.optim.Adam(model.parameters()), list(model.parameters()),
                                 names, 2)
        keep = shards.checkpoint_keys(gen, member)
        assert all(keep(k) for k in keys[:3])
        kept[member] = {int(k.split(".")[2]) for k in keys[3:] if keep(k)}
    plan = plan_ownership([(n, 144 if n.endswith("weight") else 24) for n in names],
                          gen.members, 2, 1)
    assert kept == {m: set(plan.owned_by(m)) for m in gen.members}
    assert all(sum(t in held for held in kept.values()) == 2 for t in range(8))
    assert all(len(held) < 8 for held in kept.values())


@pytest.mark.parametrize("capturable", [False, True])
def test_received_optimizer_state_goes_to_its_parameters_device(capturable):
    """A re-sharding's small tensors arrive on the CPU (in the pickled header): each goes to
    its parameter's device, but for a ``step`` the optimizer keeps on the CPU (torch's rule:
    on the device when capturable). A GPU run failed in AdamW's step on a joiner without it;
    here the "meta" device stands in for a GPU."""
    params = [torch.nn.Parameter(torch.empty(3, device="meta"))]
    shards = OptimizerShards(torch.optim.AdamW(params, capturable=capturable), params, ["w"], 1)
    state = {"step": torch.tensor(3.0), "exp_avg": torch.ones(3), "exp_avg_sq": torch.ones(3)}
    for copy in (False, True):
        shards._load(0, dict(state), copy=copy)
        got = shards.optimizer.state[params[0]]
        assert got["exp_avg"].device.type == got["exp_avg_sq"].device.type == "meta"
        assert got["step"].device.type == ("meta" if capturable else "cpu")
        if not capturable:
            assert (got["step"] is state["step"]) is not copy  # copied only when asked


SHORT_LEDGER = ("--epochs", "10")  # 60 steps: the kill at step 20 leaves 40 at world 2


@pytest.fixture(scope="module")
def static_short_ledger(tmp_path_factory):
    """The ledger workload's 60 steps (``--epochs 10``) trained alone, made once per session."""
    return shared_static_run(tmp_path_factory, "ledger-10-epochs", SCRIPTS / "ledger_train.py",
                             *SHORT_LEDGER)


@pytest.mark.slow
@pytest.mark.parametrize("level", ["2", "3"])
def test_a_kill_in_the_middle_of_a_sharded_step_leaves_batchnorm_as_it_was(
        tmp_path, static_short_ledger, level):
    """At levels 2-3 the members sum the gradient inside the chunk loop, so a SIGKILL abandons
    the survivors' step halfway, after a forward. Their BatchNorm buffers must be as the step
    found them: they were left updated by that forward (one batch counted twice, NaN running
    statistics: a model unlike the static run's; the GPT has no BatchNorm). The ledger
    workload has one; its samples count exactly once."""
    out = tmp_path / "run"
    proc = run_cli(["run", "--workers", "1:3", "--nproc", "3", "--out", out, "--events",
                    "step=20:kill=1", SCRIPTS / "ledger_train.py", *SHORT_LEDGER,
                    "--shard", level], check=True)
    assert "event(s) never fired" not in proc.stdout
    # bitwise, the integer buffers (BatchNorm's batch counts) included; NaN fails
    assert max_param_diff(static_short_ledger, out) == 0.0
    assert_exactly_once(out, epochs=10)


@pytest.mark.parametrize("members", [("a", "b"), ("a", "b", "c")])
def test_a_world_of_at_most_r_sends_no_parameter_after_a_step(members):
    """With ``r = 2`` every member of a world of two owns every tensor and steps it to the same
    bits: nothing is sent after a step (and levels 2-3 sum the gradient as level 1 does); in a
    world of three each member gets the tensors it does not own from their primaries."""
    from test_gradshard import _run_members

    def body(group):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(6, 6) for _ in range(3)])
        shards = OptimizerShards(torch.optim.Adam(model.parameters()), list(model.parameters()),
                                 [n for n, _ in model.named_parameters()], 2, 2)
        shards.reshard(group, p.Generation(0, members, 0), members[group.rank], lambda: False)
        shards.after_step(group, lambda: False)
        return shards.replicated, sorted(k for k in group.buffers if k.startswith("zero1/"))

    for replicated, sent in _run_members(len(members), body):
        assert replicated == (len(members) == 2)
        assert (sent == []) == replicated, sent

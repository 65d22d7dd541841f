"""Sharded checkpoints in torch's Distributed Checkpoint format (``dcpckpt``): at shard levels
1-3 every member writes its shard in parallel and the leader commits the folder; the newest
complete one resumes a run at another world size and level (0 and 3 from a level-2 run),
bitwise the unsharded static run; torch's own ``dcp_to_torch_save`` reads it to the run's
tensors; a damaged or uncommitted newest one is skipped; old ones are pruned. Checkpoints by
time (``checkpoint_every_seconds``) are agreed in the step (the leader's clock): every member
writes its shard of the same steps."""

import shutil

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from conftest import run_cli
from dyntrain.elastic.runs.checkpoints import latest_valid_checkpoint
from dyntrain.elastic.runs.dcp import read_dcp, split_writes
from dyntrain.elastic.runs.storage import open_store
from test_gpt_workload import SMALL, static_small
from test_sharded import _same_final, _static_run

DCP_FILES = {".metadata", "__0_0.distcp", "__1_0.distcp", "dyntrain.commit"}


@pytest.fixture(scope="module")
def static(tmp_path_factory):
    """The unsharded static run (one process, level 0), with full-format checkpoints."""
    return static_small(tmp_path_factory)


@pytest.fixture(scope="module")
def level2(tmp_path_factory):
    """A level-2 run of two workers to its end: checkpoints every 4 steps, 3 kept."""
    out = tmp_path_factory.mktemp("level2") / "run"
    run_cli(["run", "--workers", "2", "--nproc", "2", "--out", out, "-m",
             "dyntrain.workloads.gpt", *SMALL, "--shard", "2"], check=True)
    return out


def _resumable_at(run, to, step: int):
    """A copy of the run folder ``run`` whose newest checkpoint is ``step``'s."""
    shutil.copytree(run, to)
    for later in to.glob("checkpoints/ckpt-*.dcp"):
        if int(later.name[5:14]) > step:
            shutil.rmtree(later)
    (to / "final.pt").unlink()
    return to


@pytest.mark.slow
def test_every_member_writes_its_shard_and_old_checkpoints_are_pruned(level2, static):
    _same_final(static, level2)
    folder = level2 / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == [
        "ckpt-000000012.dcp", "ckpt-000000016.dcp", "ckpt-000000020.dcp"]  # no staging left
    for ckpt in folder.iterdir():
        assert {p.name for p in ckpt.iterdir()} == DCP_FILES, ckpt
        # both members wrote about half of the tensors (r = 2: each owns every tensor)
        sizes = [(ckpt / n).stat().st_size for n in ("__0_0.distcp", "__1_0.distcp")]
        assert min(sizes) > 0.4 * sum(sizes), sizes


@pytest.mark.slow
def test_torch_reads_the_checkpoint_to_the_runs_tensors(level2, static, tmp_path):
    dcp_to_torch_save(level2 / "checkpoints" / "ckpt-000000020.dcp", tmp_path / "whole.pt")
    got = torch.load(tmp_path / "whole.pt", weights_only=False)
    step, _, ref = latest_valid_checkpoint(open_store(str(static), "out"))  # full format
    assert step == 20 and got["step"] == 20
    assert got["model"].keys() == ref["model"].keys()
    assert all(torch.equal(got["model"][k], v) for k, v in ref["model"].items())
    states = got["optimizer"]["state"]
    assert sorted(map(int, states)) == sorted(ref["optimizer"]["state"])
    for k, v in ref["optimizer"]["state"].items():
        assert v.keys() == states[str(k)].keys()
        assert all(torch.equal(v[key], states[str(k)][key]) for key in v)
    assert got["optimizer"]["param_groups"] == ref["optimizer"]["param_groups"]
    assert {"format", "epoch", "step_in_epoch", "rng", "lr_scheduler"} <= got.keys()


@pytest.mark.slow
def test_a_level_2_checkpoint_resumes_unsharded_alone_bitwise(level2, static, tmp_path):
    run = _resumable_at(level2, tmp_path / "run", 12)
    _static_run(run, SMALL)  # level 0, one process: resumes from the folder's newest checkpoint
    _same_final(static, run)


@pytest.mark.slow
def test_a_level_2_checkpoint_resumes_at_level_3_on_three_workers_bitwise(
        level2, static, tmp_path):
    run = _resumable_at(level2, tmp_path / "run", 12)
    proc = run_cli(["run", "--workers", "3", "--nproc", "3", "--out", run, "-m",
                    "dyntrain.workloads.gpt", *SMALL, "--shard", "3"], check=True)
    assert "from step 12" in proc.stdout + proc.stderr, proc.stdout
    _same_final(static, run)
    names = {p.name for p in (run / "checkpoints" / "ckpt-000000020.dcp").iterdir()}
    assert names == DCP_FILES | {"__2_0.distcp"}


@pytest.mark.slow
def test_a_member_reads_only_the_keys_it_keeps(level2):
    """What a resuming member loads of a checkpoint (``keep``): here the optimizer state of
    the even tensors only, with everything else, bitwise what the whole read holds."""
    folder = level2 / "checkpoints" / "ckpt-000000020.dcp"
    whole = read_dcp(folder)
    part = read_dcp(folder, keep=lambda key: not key.startswith("optimizer.state.")
                    or int(key.split(".")[2]) % 2 == 0)
    assert list(part["optimizer"]["state"]) == [i for i in whole["optimizer"]["state"]
                                                if i % 2 == 0]
    for i, state in part["optimizer"]["state"].items():
        assert all(torch.equal(v, whole["optimizer"]["state"][i][k]) for k, v in state.items())
    assert part["model"].keys() == whole["model"].keys()
    assert all(torch.equal(v, whole["model"][k]) for k, v in part["model"].items())
    assert part["optimizer"]["param_groups"] == whole["optimizer"]["param_groups"]
    assert part["step"] == whole["step"] == 20 and part["rng"].keys() == whole["rng"].keys()


@pytest.mark.slow
def test_a_damaged_or_uncommitted_newest_checkpoint_is_skipped(level2, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(level2, run)
    folder = run / "checkpoints"
    (folder / "ckpt-000000020.dcp" / "dyntrain.commit").unlink()  # as if never committed
    data = folder / "ckpt-000000016.dcp" / "__1_0.distcp"
    data.write_bytes(data.read_bytes()[:-100])
    skipped = []
    step, where, state = latest_valid_checkpoint(
        open_store(str(run), "out"), on_skip=lambda w, why: skipped.append((w, why)))
    assert step == 12 and state["step"] == 12 and where.endswith("ckpt-000000012.dcp")
    assert [why for _, why in skipped] == [
        "no commit record: not completely written",
        f"file __1_0.distcp has {data.stat().st_size} of {data.stat().st_size + 100} bytes"]


def test_each_tensor_is_written_once_by_one_of_its_owners_balanced_by_bytes():
    owners = [(0, 1), (0, 1), (1, 2), (0,), (2, 0), (1, 2)]
    nbytes = [400, 400, 300, 100, 300, 100]
    split = split_writes(owners, nbytes, 3)
    assert sorted(t for ts in split for t in ts) == list(range(6))
    assert all(any(t in split[r] for r in owners[t]) for t in range(6))  # by an owner
    assert [sum(nbytes[t] for t in ts) for ts in split] == [500, 500, 600]
    # every owner of everything (r = N): the writes still spread
    assert split_writes([(0, 1)] * 4, [8, 8, 8, 8], 2) == [[0, 2], [1, 3]]


@pytest.mark.slow
def test_checkpoints_by_time_are_agreed_and_written_by_every_member(static, tmp_path):
    """Level 2 on three workers, checkpoints every 0.6 s and not by steps (``--checkpoint-every``
    past the run): the leader's clock decides after which steps, the step's tail tells every
    member, and each of those checkpoints holds all three members' shards."""
    out = tmp_path / "run"
    run_cli(["run", "--workers", "3", "--nproc", "3", "--out", out, "-m",
             "dyntrain.workloads.gpt", *SMALL, "--shard", "2", "--checkpoint-every", "1000",
             "--checkpoint-seconds", "0.6", "--step-delay", "0.1"], check=True)
    _same_final(static, out)
    folder = out / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    assert all(n.startswith("ckpt-") and n.endswith(".dcp") for n in names), names  # no staging
    steps = [int(n[5:14]) for n in names]
    assert len(steps) == 3 and steps[-1] == 20 and min(steps) < 20, steps  # by time: 3 kept
    files = DCP_FILES | {"__2_0.distcp"}
    for ckpt in folder.iterdir():
        assert {p.name for p in ckpt.iterdir()} == files, ckpt
    run = _resumable_at(out, tmp_path / "resumed", steps[0])
    _static_run(run, SMALL)  # resumes from a checkpoint made by time, alone and unsharded
    _same_final(static, run)


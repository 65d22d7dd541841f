"""Re-sharding's point-to-point moves (``dyntrain.elastic.sharding.moves``) on real gloo groups: a
join moves exactly the state of the tensors the plans' diff gives the joiner, to the joiner alone,
bit for bit, and no parameter (every member holds them already); a member whose parameters
are stale (a torn step) gets them all again; and a transfer of a generation given up midway
installs nothing, while the late sends of a cut-off peer fail on the severed group."""

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

from dyntrain.elastic import protocol as p
from dyntrain.elastic.collective.comm import Aborted, CollectiveFailed, create_group
from dyntrain.elastic.sharding.moves import send_moves
from dyntrain.elastic.sharding.owners import Move, ShardPlan, diff_plans, plan_ownership
from dyntrain.elastic.sharding.zero import OptimizerShards
from test_gradshard import _run_members

MEMBERS = ("a", "b", "c")


def _model() -> nn.Module:
    # large tensors travel as raw data, small ones in the pair's header
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(200, 100), nn.Linear(100, 100), nn.Linear(100, 300),
                         nn.Linear(300, 3))


def _stepped(model: nn.Module) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 200)).square().sum().backward()
    opt.step()
    return opt


def _state_bytes(state: dict) -> int:
    return sum(v.numel() * v.element_size() for v in state.values()
               if isinstance(v, torch.Tensor))


@pytest.mark.parametrize("stale", [False, True])
def test_a_join_moves_exactly_the_planned_state_to_the_joiner(stale):
    reference = _model()
    initial = {k: v.clone() for k, v in reference.state_dict().items()}
    ref_opt = _stepped(reference)
    ref_params = [q.detach().clone() for q in reference.parameters()]
    ref_state = [ref_opt.state[q] for q in reference.parameters()]
    names = [n for n, _ in reference.named_parameters()]

    def body(group):
        me = MEMBERS[group.rank]
        model = _model()  # (members are threads: the global generator is shared)
        model.load_state_dict(initial)
        params = list(model.parameters())
        shards = OptimizerShards(_stepped(model), params, names, 2)
        if stale and me == "b":  # a torn step: b's parameters may be old
            shards.params_stale = True
            with torch.no_grad():
                params[0].add_(1.0)
        joined = p.Generation(1, MEMBERS, 0, source="a", receivers=("c",))
        assert shards.reshard(group, joined, me, lambda: False) == []
        return (shards.stats, set(shards.held), shards.plan, shards.params_stale,
                [q.detach().clone() for q in params],
                {t: dict(shards.optimizer.state[params[t]]) for t in shards.held})

    got = dict(zip(MEMBERS, _run_members(3, body), strict=True))
    specs = got["a"][2].tensors
    held = ShardPlan(got["a"][2].level, 2, MEMBERS, specs,
                     tuple(("a", "b") for _ in specs))
    plan = plan_ownership(specs, MEMBERS, 2, 1, held)
    moves = diff_plans(held, plan).moves
    assert plan == got["a"][2] and {m.target for m in moves} == {"c"}
    needed = sum(_state_bytes(ref_state[m.tensor]) for m in moves)
    assert needed > 0
    stats = {m: got[m][0] for m in MEMBERS}
    assert stats["c"].state_received_bytes == needed  # the joiner: exactly its share
    assert stats["a"].state_received_bytes == stats["b"].state_received_bytes == 0
    assert stats["a"].state_sent_bytes + stats["b"].state_sent_bytes == needed
    assert got["c"][1] == {m.tensor for m in moves}
    for m in MEMBERS:
        _, held_now, _, still_stale, values, states = got[m]
        assert not still_stale
        # no parameter is sent unless a member's are stale; then every member gets those of
        # the tensors whose first holder is another member (a is every tensor's)
        assert (stats[m].params_received_bytes > 0) == (stale and m != "a")
        assert all(torch.equal(a, b) for a, b in zip(values, ref_params, strict=True)), m
        for t in held_now:
            assert states[t].keys() == ref_state[t].keys()
            assert all(torch.equal(states[t][k], ref_state[t][k]) for k in states[t]), (m, t)


def test_a_transfer_given_up_midway_installs_nothing_and_late_sends_fail():
    """The target gives the generation up while it waits (its source is frozen), severs the
    group; then the source comes back and sends: nothing arrives, nothing was installed."""
    store = dist.HashStore()
    gave_up, outcome = threading.Event(), {}
    tensor = torch.arange(40000, dtype=torch.float32)
    move = [Move(0, "w", tensor.numel() * 4, "a", "b")]

    def member(rank: int) -> None:
        group = create_group(store, 0, rank, 2, "gloo", torch.device("cpu"),
                             timedelta(seconds=60), lambda: False)
        try:
            if rank == 1:
                waited = []

                def should_abort() -> bool:
                    waited.append(1)
                    return len(waited) > 3

                try:
                    outcome["target"] = send_moves(group, ("a", "b"), move, "b",
                                                   lambda t: ({}, None), should_abort)
                except Aborted:
                    outcome["target"] = "aborted"
                group.close(abandoned=True)
                gave_up.set()
            else:
                assert gave_up.wait(60)
                try:
                    send_moves(group, ("a", "b"), move, "a",
                               lambda t: ({"exp_avg": tensor}, None), lambda: False)
                    outcome["source"] = "sent"
                except CollectiveFailed:
                    outcome["source"] = "failed"
                group.close(abandoned=True)
        except Exception as exc:  # reported on the test's thread
            outcome[f"error {rank}"] = repr(exc)

    threads = [threading.Thread(target=member, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert outcome == {"target": "aborted", "source": "failed"}, outcome

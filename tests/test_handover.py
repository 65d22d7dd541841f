"""A graceful leaver's hand-over (``OptimizerShards.hand_over``) on a real gloo group of three
with ``r = 1``: after a step, every tensor that only leavers hold reaches a member that stays,
its optimizer state (and at level 3 its parameter) bit for bit the unsharded step's; a tensor
that a staying member holds does not move (nothing moves after a checkpoint's gather when the
leader stays), nor does anything when every member leaves."""

import pytest
import torch

from dyntrain.elastic import protocol as p
from dyntrain.elastic.sharding.parameters import ParamUnits
from dyntrain.elastic.sharding.zero import OptimizerShards
from test_gradshard import _run_members
from test_paramshard import Tiny, _loss

MEMBERS = ("a", "b", "c")


def _never() -> bool:
    return False


def _unsharded_step(initial: dict) -> tuple[list[torch.Tensor], list[dict]]:
    """The parameters and the per-tensor AdamW state after one unsharded step."""
    model = Tiny()
    model.load_state_dict(initial)
    opt = torch.optim.AdamW(model.parameters())
    _loss(model, 0).backward()
    opt.step()
    return ([q.detach().clone() for q in model.parameters()],
            [{k: v.clone() for k, v in opt.state[q].items()} for q in model.parameters()])


@pytest.mark.parametrize("level", [1, 3])
@pytest.mark.parametrize(("leaving", "checkpoint"), [
    (("b",), False),  # a member leaves
    (("a",), True),  # the leader leaves after a checkpoint's gather: it holds every tensor
    (("b", "c"), True),  # two leave, the leader (holding everything) stays: nothing moves
    (("a", "c"), False),  # two leave
    (MEMBERS, False),  # all leave: nothing moves
])
def test_the_tensors_only_leavers_hold_reach_a_member_that_stays(level, leaving, checkpoint):
    torch.manual_seed(0)
    initial = Tiny().state_dict()
    params_ref, state_ref = _unsharded_step(initial)

    def body(group):
        me = MEMBERS[group.rank]
        model = Tiny()
        model.load_state_dict(initial)
        params = list(model.parameters())
        names = [n for n, _ in model.named_parameters()]
        shards = OptimizerShards(torch.optim.AdamW(params), params, names, 1, level)
        if level == 3:
            shards.units = ParamUnits(model, params, names, shards)
        assert shards.reshard(group, p.Generation(0, MEMBERS, 0), me, _never) == []
        _loss(model, 0).backward()  # every member's gradient is the whole reduced one
        shards.before_step()
        shards.optimizer.step()
        shards.after_step(group, _never)
        if checkpoint:
            shards.after_applied(group, True, False, _never)
        before = set(shards.held)
        shards.hand_over(group, me, me in leaving, len(leaving), _never)
        present = shards.units.present if shards.units is not None else set(range(len(params)))
        return (before, set(shards.held),
                {t: {k: v.clone() for k, v in shards.optimizer.state[params[t]].items()}
                 for t in shards.held},
                {t: params[t].detach().clone() for t in shards.held if t in present})

    got = dict(zip(MEMBERS, _run_members(3, body), strict=True))
    count = len(params_ref)
    stayers = [m for m in MEMBERS if m not in leaving]
    if not stayers:  # nothing moved
        assert all(before == after for before, after, _, _ in got.values())
        return
    assert set().union(*(got[m][1] for m in stayers)) == set(range(count))
    held_by_stayers = set().union(*(got[m][0] for m in stayers))
    for m in stayers:
        before, after, states, values = got[m]
        assert after >= before
        # a member that stays receives only what no staying member held
        assert not (after - before) & set().union(*(got[o][0] for o in stayers if o != m))
        assert (after - before) <= set(range(count)) - held_by_stayers
        for t in after:
            assert states[t].keys() == state_ref[t].keys()
            assert all(torch.equal(states[t][k], state_ref[t][k]) for k in states[t])
            assert torch.equal(values[t], params_ref[t])
    if held_by_stayers == set(range(count)):
        assert all(got[m][0] == got[m][1] for m in MEMBERS)  # nothing moved
    for m in leaving:  # a leaver keeps what it held (it exits next)
        assert got[m][1] == got[m][0]

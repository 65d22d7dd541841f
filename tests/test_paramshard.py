"""ZeRO-3's parameters (``dyntrain.elastic.sharding.parameters``) on a real gloo group of three:
between uses a member holds only its owned tensors' parameters (the others' storage is freed), a
unit's gathered parameters are its primary's bits, the other blocks stay freed while a block
computes, a chunk's gradients are the unsharded model's bit for bit, a member without a chunk joins
the busiest member's gathers, and a model that uses a unit out of the fixed order is refused."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dyntrain.elastic import protocol as p
from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.sharding.parameters import ParamUnits, check_level_3
from dyntrain.elastic.sharding.zero import OptimizerShards, shards_for
from dyntrain.errors import ConfigError
from test_gradshard import _run_members


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.up = nn.Linear(width, 3 * width)
        self.down = nn.Linear(3 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.ln(x))))


class Tiny(nn.Module):
    """A root unit (a tied embedding, a final norm) around three blocks, as the GPT."""

    def __init__(self, twice: bool = False) -> None:
        super().__init__()
        self.emb = nn.Embedding(13, 8)
        self.blocks = nn.ModuleList(Block(8) for _ in range(3))
        self.ln = nn.LayerNorm(8)
        self.twice = twice

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx)
        for block in self.blocks:
            x = block(x)
        if self.twice:  # a unit used again: out of the fixed order
            x = self.blocks[0](x)
        return F.linear(self.ln(x), self.emb.weight)


def _model() -> Tiny:
    torch.manual_seed(0)
    return Tiny()


def _loss(model: nn.Module, chunk: int) -> torch.Tensor:
    idx = torch.randint(0, 13, (4, 6), generator=torch.Generator().manual_seed(chunk))
    return F.cross_entropy(model(idx).flatten(0, 1), idx.roll(1, 1).flatten())


def _level_3(model: nn.Module):
    params = list(model.parameters())
    names = [n for n, _ in model.named_parameters()]
    shards = OptimizerShards(torch.optim.AdamW(params), params, names, 1, 3)
    shards.units = ParamUnits(model, params, names, shards)
    return params, shards, shards.units


@pytest.mark.parametrize("chunks", [(1, 1, 1), (2, 1, 0)])
def test_members_hold_their_own_parameters_and_gather_the_owners_bits(chunks):
    reference = _model()
    initial = reference.state_dict()  # (members are threads: the global generator is shared)
    whole = [q.detach().clone() for q in reference.parameters()]
    grads = {}
    for rank, count in enumerate(chunks):  # each member's chunks, unsharded
        for c in range(count):
            reference.zero_grad()
            _loss(reference, 10 * rank + c).backward()
            grads[rank, c] = [q.grad.clone() for q in reference.parameters()]

    def body(group: Group):
        model = Tiny()
        model.load_state_dict(initial)
        params, shards, units = _level_3(model)
        members = ("a", "b", "c")
        assert shards.reshard(group, p.Generation(0, members, 0), members[group.rank],
                              lambda: False) == []
        assert shards.held == set(range(len(params)))  # the old copies, until a step
        shards.after_step(group, lambda: False)  # level 3: drops them, sends nothing
        held = set(shards.held)
        assert held == shards.owned and 0 < len(held) < len(params)  # r = 1: a third or so
        seen = []  # what a unit's forward reads, right after its gather
        extra = []  # per gather of a block: the non-held tensors allocated besides the root's

        def look(module, args):
            seen.append([q.detach().clone() for q in module.parameters()])
            extra.append(units.present - held - root)

        def look_back(module, grad_output):
            extra.append(units.present - held - root)

        root = set(units.units[0].tensors)
        assert units.units[0].name == "" and len(units.units) == 4
        for block in model.blocks:
            block.register_forward_pre_hook(look)
            block.register_full_backward_pre_hook(look_back)
        units.begin(group, lambda: False)
        freed = [units.params[t].untyped_storage().nbytes() for t in range(len(params))]
        between = units.present_bytes()
        got = []
        for c in range(max(chunks)):
            if c < chunks[group.rank]:
                model.zero_grad()
                with units.round():
                    _loss(model, 10 * group.rank + c).backward()
                got.append([q.grad.clone() for q in params])
            else:
                units.phantom()
        after = [units.params[t].untyped_storage().nbytes() for t in range(len(params))]
        units.whole()
        zeros = all(not q.any() for t, q in enumerate(params) if t not in held)
        shards.after_applied(group, False, True, lambda: False)  # a validation: the whole model
        # forward: only the block being gathered; backward: it and at most the one after it
        # (whose parameters are freed as their gradients land)
        blocks = [set(u.tensors) for u in units.units[1:]]
        for c in range(chunks[group.rank]):
            at = extra[6 * c : 6 * c + 6]
            assert all(at[k] <= blocks[k] for k in range(3)), at
            assert all(at[5 - k] <= blocks[k] | blocks[k + 1] for k in range(2)), at
            assert at[3] <= blocks[2], at
        return (held, freed, after, between, seen, got, zeros,
                [q.detach().clone() for q in params])

    for rank, (held, freed, after, between, seen, got, zeros, final) in enumerate(
            _run_members(3, body)):
        sizes = [q.numel() * q.element_size() for q in whole]
        for t, size in enumerate(sizes):  # between uses: the held parameters only
            assert freed[t] == after[t] == (size if t in held else 0), (rank, t)
        assert between == sum(sizes[t] for t in held)
        blocks = [list(b.parameters()) for b in reference.blocks] * chunks[rank]
        assert len(seen) == len(blocks)
        for gathered, expected in zip(seen, blocks, strict=True):  # the owners' bits
            assert all(torch.equal(a, b) for a, b in zip(gathered, expected, strict=True))
        for c, chunk_grads in enumerate(got):  # the unsharded model's gradients, bit for bit
            assert all(torch.equal(a, b) for a, b in zip(chunk_grads, grads[rank, c],
                                                         strict=True)), (rank, c)
        assert zeros
        assert all(torch.equal(a, b) for a, b in zip(final, whole, strict=True))


def test_a_unit_used_out_of_the_fixed_order_is_refused():
    torch.manual_seed(0)
    model = Tiny(twice=True)
    _, shards, units = _level_3(model)
    shards.owner_ranks = [(0,)] * len(units.params)
    units.begin(Group(None, 0, 1, torch.device("cpu")), lambda: False)
    with pytest.raises(ConfigError, match=r"shard_level 3 gathers the units in a fixed order "
                                          r"\(forward: blocks.0, blocks.1, blocks.2; "
                                          r".*unit blocks.0 ran its forward out of it"):
        with units.round():
            _loss(model, 0)


def test_parameters_that_cannot_be_freed_one_by_one_are_refused():
    flat = torch.zeros(10)
    with pytest.raises(ConfigError, match="a contiguous storage of its own"):
        check_level_3([nn.Parameter(flat[:5]), nn.Parameter(flat[5:])])
    check_level_3(list(nn.Linear(3, 2).parameters()))


def test_level_3_refuses_what_level_2_refuses_and_builds_its_units():
    base = {"global_batch": 4, "chunk_size": 2, "shard_level": 3}
    assert TrainConfig(**base, grad_clip_norm=1.0).grad_clip_norm == 1.0  # (gradnorm: exact)
    for extra, reason in (({"noise_scale": True}, "noise_scale is not supported with "
                           "shard_level 3"),
                          ({"exact_ring": False}, "shard_level 3 needs exact_reduction")):
        with pytest.raises(ConfigError, match=reason):
            TrainConfig(**base, **extra)
    model = _model()
    params = list(model.parameters())
    with pytest.raises(ConfigError, match="a loss scaler is not supported with shard_level 3"):
        shards_for(TrainConfig(**base), model, torch.optim.AdamW(params), params,
                   torch.amp.GradScaler("cpu"))
    units = shards_for(TrainConfig(**base), model, torch.optim.AdamW(params), params).units
    assert [u.name for u in units.units] == ["", "blocks.0", "blocks.1", "blocks.2"]
    assert units.schedule == [("root", 0), ("forward", 1), ("forward", 2), ("forward", 3),
                              ("backward", 3), ("backward", 2), ("backward", 1)]

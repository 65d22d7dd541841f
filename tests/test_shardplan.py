"""The sharding ownership plan: whole tensors, r distinct owners, balanced and stable."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dyntrain.elastic.sharding.owners import (
    ShardLevel,
    ShardPlan,
    TensorSpec,
    diff_plans,
    group_units,
    plan_ownership,
)

# a model's tensor sizes in bytes: many small (norms, biases) and a few large (matrices)
SIZES = st.lists(st.one_of(st.integers(0, 64), st.integers(1, 4000)), min_size=1, max_size=60)
# membership changes: join, a graceful leave of the i-th member, a crash of the i-th member
CHANGES = st.lists(st.tuples(st.sampled_from(["join", "leave", "crash"]), st.integers(0, 99)),
                   min_size=1, max_size=8)


def tensors_of(sizes):
    return [TensorSpec(f"t{i}", n) for i, n in enumerate(sizes)]


def members_of(n, first=0):
    return [f"w{i}" for i in range(first, first + n)]


def assert_valid(plan: ShardPlan) -> None:
    copies = min(plan.redundancy, len(plan.members))
    assert plan.copies == copies
    for owners in plan.owners:
        assert len(owners) == copies and len(set(owners)) == copies
        assert set(owners) <= set(plan.members)
    largest = max(t.nbytes for t in plan.tensors)
    assert max(plan.loads().values()) <= plan.share() + largest


def gpt_like(layers=4, d=64):
    """Parameter names and float32 bytes of a small GPT."""
    specs = [("tok.weight", 256 * d * 4), ("pos", 128 * d * 4)]
    for b in range(layers):
        specs += [(f"blocks.{b}.ln1.weight", d * 4), (f"blocks.{b}.ln1.bias", d * 4),
                  (f"blocks.{b}.attn.qkv.weight", 3 * d * d * 4),
                  (f"blocks.{b}.attn.proj.weight", d * d * 4),
                  (f"blocks.{b}.ln2.weight", d * 4), (f"blocks.{b}.ln2.bias", d * 4),
                  (f"blocks.{b}.mlp.up.weight", 4 * d * d * 4),
                  (f"blocks.{b}.mlp.down.weight", 4 * d * d * 4)]
    return [*specs, ("ln_f.weight", d * 4), ("ln_f.bias", d * 4)]


@settings(max_examples=150, deadline=None)
@given(SIZES, st.integers(1, 9), st.integers(1, 4), st.sampled_from(list(ShardLevel)[1:]))
def test_every_tensor_has_r_distinct_owners_and_the_loads_are_balanced(sizes, n, r, level):
    plan = plan_ownership(tensors_of(sizes), members_of(n), r, level)
    assert_valid(plan)
    assert sum(plan.loads().values()) == plan.copies * sum(sizes)
    assert plan == plan_ownership(tensors_of(sizes), members_of(n), r, level)  # deterministic


@settings(max_examples=150, deadline=None)
@given(SIZES, st.integers(1, 6), st.integers(1, 3), CHANGES)
def test_plans_stay_valid_through_any_history_and_diffs_say_what_moves(sizes, n, r, changes):
    members, fresh = members_of(n), 100
    plan = plan_ownership(tensors_of(sizes), members, r, ShardLevel.GRADIENTS)
    for kind, pick in changes:
        if kind == "join" or len(members) == 1:
            new, senders = [*members, f"w{fresh}"], members
            fresh += 1
        else:
            gone = members[pick % len(members)]
            new = [m for m in members if m != gone]
            senders = members if kind == "leave" else new
        after = plan_ownership(tensors_of(sizes), new, r, ShardLevel.GRADIENTS, previous=plan)
        assert_valid(after)
        diff = diff_plans(plan, after, senders)
        for i, owners in enumerate(after.owners):
            kept = [m for m in owners if m in plan.owners[i]]
            got = [m.target for m in diff.moves if m.tensor == i]
            assert sorted(kept + got) == sorted(owners)
        # a crash of fewer than r members loses nothing: every copy has a holder to send it;
        # with one copy the crashed member's tensors come from a checkpoint
        crashed = set(plan.members) - set(senders)
        assert {m.tensor for m in diff.lost} == set(plan.lost(crashed))
        assert not diff.lost or plan.copies == 1
        for move in diff.moves:
            assert move.source is None or (move.source in plan.owners[move.tensor]
                                           and move.source in senders)
        assert diff.bytes_moved + sum(m.nbytes for m in diff.lost) == sum(
            diff.received_by(m) for m in after.members)
        plan, members = after, new


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=24, max_size=120), st.integers(2, 7),
       st.integers(1, 3), st.integers(0, 99), st.booleans())
def test_a_join_or_a_leave_moves_about_r_over_n_of_the_bytes_plus_a_tensor(sizes, n, r, pick,
                                                                          join):
    """The bound holds for models whose largest tensor is at most a quarter of a member's share
    (a model with few, huge tensors cannot be balanced and stable at once)."""
    tensors, members = tensors_of(sizes), members_of(n)
    before = plan_ownership(tensors, members, r, ShardLevel.OPTIMIZER)
    if join:
        after = plan_ownership(tensors, [*members, "new"], r, ShardLevel.OPTIMIZER,
                               previous=before)
    else:
        gone = members[pick % n]
        after = plan_ownership(tensors, [m for m in members if m != gone], r,
                               ShardLevel.OPTIMIZER, previous=before)
    small = min(len(before.members), len(after.members))
    copies, largest = max(before.copies, after.copies), max(sizes)
    assume(4 * largest <= copies * sum(sizes) / max(len(before.members), len(after.members)))
    assert diff_plans(before, after).bytes_moved <= copies * sum(sizes) / small + 2 * largest


@settings(max_examples=150, deadline=None)
@given(SIZES, st.integers(2, 8), st.integers(2, 4), st.data())
def test_a_crash_of_fewer_than_r_members_leaves_every_tensor_a_holder(sizes, n, r, data):
    plan = plan_ownership(tensors_of(sizes), members_of(n), r, ShardLevel.PARAMETERS)
    crashed = data.draw(st.sets(st.sampled_from(plan.members), max_size=plan.copies - 1))
    assert plan.lost(crashed) == []
    survivors = [m for m in plan.members if m not in crashed]
    if survivors:
        after = plan_ownership(plan.tensors, survivors, r, ShardLevel.PARAMETERS, previous=plan)
        assert diff_plans(plan, after, senders=survivors).lost == ()


def assert_domains_kept_apart(plan: ShardPlan, domains: dict[str, str]) -> None:
    """Every tensor's owners span as many failure domains as there can be."""
    spread = min(plan.copies, len({domains[m] for m in plan.members}))
    for owners in plan.owners:
        assert len({domains[m] for m in owners}) == spread, (owners, domains)


# members on hosts: (host of each member), as a history of joins, leaves and crashes would have
HOSTS = st.lists(st.integers(0, 3), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(SIZES, HOSTS, st.integers(1, 3), CHANGES, st.integers(0, 3))
def test_a_tensors_copies_are_on_different_hosts_through_any_history(sizes, hosts, r, changes,
                                                                     joiner_host):
    """Failure domains (the hosts): a tensor's owners span ``min(r, N, hosts)`` hosts, from
    scratch and through joins (on any host), leaves and crashes; so losing a whole host loses
    no tensor while ``r >= 2`` and two hosts remain."""
    members = [f"w{i}" for i in range(len(hosts))]
    domains = {m: f"h{h}" for m, h in zip(members, hosts, strict=True)}
    plan = plan_ownership(tensors_of(sizes), members, r, ShardLevel.OPTIMIZER, domains=domains)
    assert_domains_kept_apart(plan, domains)
    for step, (kind, pick) in enumerate(changes):
        if kind == "join" or len(members) == 1:
            new = f"j{step}"
            domains[new] = f"h{(joiner_host + pick) % 4}"
            members = [*members, new]
        else:
            members = [m for m in members if m != members[pick % len(members)]]
        after = plan_ownership(tensors_of(sizes), members, r, ShardLevel.OPTIMIZER,
                               previous=plan, domains=domains)
        copies = min(r, len(members))
        for owners in after.owners:
            assert len(owners) == copies == len(set(owners))
        assert_domains_kept_apart(after, domains)
        if r >= 2 and len({domains[m] for m in members}) >= 2:
            for host in {domains[m] for m in members}:
                assert after.lost([m for m in members if domains[m] == host]) == []
        plan = after


@settings(max_examples=100, deadline=None)
@given(SIZES, st.integers(1, 8), st.integers(1, 3))
def test_one_failure_domain_or_none_plans_as_without_domains(sizes, n, r):
    """Every member on one host (or each its own domain) gives today's plan exactly."""
    tensors, members = tensors_of(sizes), members_of(n)
    plain = plan_ownership(tensors, members, r, ShardLevel.OPTIMIZER)
    assert plan_ownership(tensors, members, r, ShardLevel.OPTIMIZER,
                          domains=dict.fromkeys(members, "host")) == plain
    assert plan_ownership(tensors, members, r, ShardLevel.OPTIMIZER,
                          domains={m: m for m in members}) == plain


def test_two_hosts_of_two_members_hold_one_copy_each_and_stay_balanced():
    members = ["a0", "a1", "b0", "b1"]
    domains = {"a0": "A", "a1": "A", "b0": "B", "b1": "B"}
    tensors = [TensorSpec(name, n) for name, n in gpt_like()]
    plain = plan_ownership(tensors, members, 2, ShardLevel.OPTIMIZER)
    assert plain.lost(["b0", "b1"])  # without domains some tensor lives on host B only
    plan = plan_ownership(tensors, members, 2, ShardLevel.OPTIMIZER, domains=domains)
    assert plan.lost(["a0", "a1"]) == [] and plan.lost(["b0", "b1"]) == []
    assert_valid(plan)  # balanced as well: every host holds one copy of everything


def test_a_gpt_on_four_members_with_two_copies_and_a_join():
    specs = gpt_like()
    total = sum(n for _, n in specs)
    plan = plan_ownership(specs, members_of(4), 2, ShardLevel.OPTIMIZER)
    assert_valid(plan)
    # every member holds about half the model (2 copies over 4 members), none much more
    largest = max(n for _, n in specs)
    assert all(abs(load - total / 2) <= largest for load in plan.loads().values())
    joined = plan_ownership(specs, [*members_of(4), "w9"], 2, ShardLevel.OPTIMIZER,
                            previous=plan)
    diff = diff_plans(plan, joined)
    assert {m.target for m in diff.moves} == {"w9"}  # only the joiner receives
    assert diff.received_by("w9") == joined.load("w9")
    assert abs(diff.bytes_moved - 2 * total / 5) <= largest
    # each copy the joiner takes is one an old owner gives up
    assert sorted(t for t, _ in diff.dropped) == sorted(m.tensor for m in diff.moves)
    assert all(m in plan.owners[t] and m not in joined.owners[t] for t, m in diff.dropped)


def test_a_crash_with_one_copy_loses_the_crashed_members_tensors_to_the_checkpoint():
    specs = gpt_like(layers=2)
    plan = plan_ownership(specs, members_of(3), 1, ShardLevel.GRADIENTS)
    survivors = members_of(2)
    after = plan_ownership(specs, survivors, 1, ShardLevel.GRADIENTS, previous=plan)
    diff = diff_plans(plan, after, senders=survivors)
    assert plan.lost(["w2"]) == plan.owned_by("w2") != []
    assert sorted(m.tensor for m in diff.lost) == plan.owned_by("w2")
    assert diff.bytes_moved == 0  # nothing else moves: the survivors keep what they own
    assert all(after.owners[i] == plan.owners[i] for i in plan.owned_by("w0"))


def test_with_sharding_off_every_member_owns_everything_and_a_joiner_receives_it_all():
    specs = gpt_like(layers=1)
    plan = plan_ownership(specs, members_of(2), 2, ShardLevel.NONE)
    assert all(owners == ("w0", "w1") for owners in plan.owners)
    joined = plan_ownership(specs, members_of(3), 2, ShardLevel.NONE, previous=plan)
    diff = diff_plans(plan, joined)
    assert diff.received_by("w2") == sum(n for _, n in specs) == diff.bytes_moved
    # the sending is spread over the holders
    assert abs(diff.sent_by("w0") - diff.sent_by("w1")) <= max(n for _, n in specs)


def test_fewer_members_than_copies_give_every_tensor_every_member():
    plan = plan_ownership(gpt_like(layers=1), ["a"], 2, ShardLevel.OPTIMIZER)
    assert plan.copies == 1 and all(o == ("a",) for o in plan.owners)
    grown = plan_ownership(plan.tensors, ["a", "b", "c"], 2, ShardLevel.OPTIMIZER,
                           previous=plan)
    assert all(len(o) == 2 for o in grown.owners)


@pytest.mark.parametrize("args, message", [
    (([("a", 1)], [], 1), "at least one member"),
    (([("a", 1)], ["x", "x"], 1), "unique"),
    (([("a", 1), ("a", 2)], ["x"], 1), "names must be unique"),
    (([("a", 1)], ["x"], 0), "redundancy"),
    (([("a", -1)], ["x"], 1), "negative"),
])
def test_bad_arguments_are_refused_in_one_line(args, message):
    with pytest.raises(ValueError, match=message):
        plan_ownership(*args, ShardLevel.OPTIMIZER)


def test_a_previous_plan_of_another_model_or_level_is_refused():
    plan = plan_ownership([("a", 1)], ["x"], 1, ShardLevel.OPTIMIZER)
    with pytest.raises(ValueError, match="plan from scratch"):
        plan_ownership([("b", 1)], ["x"], 1, ShardLevel.OPTIMIZER, previous=plan)
    with pytest.raises(ValueError, match="plan from scratch"):
        plan_ownership([("a", 1)], ["x"], 1, ShardLevel.PARAMETERS, previous=plan)
    other = plan_ownership([("a", 1)], ["x"], 1, ShardLevel.PARAMETERS)
    with pytest.raises(ValueError, match="cannot be compared"):
        diff_plans(plan, other)


def test_units_are_the_numbered_blocks_with_the_rest_in_the_root_unit():
    names = [name for name, _ in gpt_like(layers=3)]
    units = group_units(names)
    assert [u.name for u in units] == ["", "blocks.0", "blocks.1", "blocks.2"]
    assert [names[i] for i in units[0].tensors] == ["tok.weight", "pos", "ln_f.weight",
                                                    "ln_f.bias"]
    assert all(names[i].startswith(u.name + ".") for u in units[1:] for i in u.tensors)
    assert sorted(i for u in units for i in u.tensors) == list(range(len(names)))


def test_units_by_explicit_prefixes_take_the_longest_match():
    names = ["emb.w", "enc.0.w", "enc.0.sub.w", "head.w"]
    units = group_units(names, ["enc.0", "enc.0.sub", "head"])
    assert [(u.name, u.tensors) for u in units] == [
        ("", (0,)), ("enc.0", (1,)), ("enc.0.sub", (2,)), ("head", (3,))]
    with pytest.raises(ValueError, match="no tensor falls under unit 'dec'"):
        group_units(names, ["dec"])
    with pytest.raises(ValueError, match="unique"):
        group_units(["a", "a"])

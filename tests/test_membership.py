"""next_generation: who takes part next, from which step, and where the state comes from."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dyntrain.elastic.membership.members import next_generation
from dyntrain.elastic.protocol import Generation

POOL = [f"w{i}" for i in range(10)]


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    previous = draw(st.lists(st.sampled_from(POOL), unique=True, max_size=6))
    ready_workers = draw(st.lists(st.sampled_from(POOL), unique=True, max_size=8))
    ready = {w: draw(st.one_of(st.none(), st.integers(0, 6))) for w in ready_workers}
    joiners = draw(st.lists(st.sampled_from(POOL), unique=True, max_size=6))
    min_workers = draw(st.integers(1, 6))
    max_workers = draw(st.integers(1, 8))
    checkpoint = draw(st.one_of(st.none(), st.tuples(st.integers(0, 20), st.just("ckpt/x.pt"))))
    number = draw(st.integers(0, 50))
    return dict(
        number=number,
        previous_members=previous,
        ready=ready,
        joiners=joiners,
        min_workers=min_workers,
        max_workers=max_workers,
        checkpoint=checkpoint,
    )


def _is_subsequence(sub: list[str], seq: list[str]) -> bool:
    it = iter(seq)
    return all(x in it for x in sub)


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_next_generation_properties(s: dict) -> None:
    gen = next_generation(**s)
    previous, ready, joiners = s["previous_members"], s["ready"], s["joiners"]
    min_w, max_w = s["min_workers"], s["max_workers"]
    available = set(ready) | set(joiners)
    admissible = min(len(available), max_w)

    # None iff fewer than min_workers can be admitted (or nobody at all)
    if admissible < min_w or admissible == 0:
        assert gen is None
        return
    assert gen is not None
    assert gen.number == s["number"]
    members = list(gen.members)

    # unique, at most max, nobody from outside, and as many as there is room for
    assert len(set(members)) == len(members)
    assert len(members) <= max_w
    assert set(members) <= available
    assert len(members) == admissible

    # survivors (previous members still around) keep their relative order, come first, and are
    # never displaced by a joiner
    survivors = [w for w in previous if w in ready]
    kept = [w for w in members if w in survivors]
    assert kept == [w for w in survivors if w in members]
    assert _is_subsequence(kept, survivors)
    assert members[: len(kept)] == kept
    # joiners are admitted in arrival order, earlier ones first, after everyone already around
    candidates = [w for w in joiners if w not in survivors]
    admitted = [w for w in members if w in candidates]
    assert admitted == candidates[: len(admitted)]
    if admitted:
        assert all(w in members for w in survivors)
        first_joiner = members.index(admitted[0])
        assert members[first_joiner:] == admitted
    if len(survivors) <= max_w:
        assert kept == survivors

    steps = {w: ready.get(w) for w in members}
    holders = [w for w in members if steps[w] is not None]
    if holders:
        best = max(steps[w] for w in holders)
        assert gen.start_step == best
        assert gen.source in members
        assert steps[gen.source] == best
        assert gen.receivers == tuple(w for w in members if steps[w] != best)
        assert gen.source not in gen.receivers
        assert gen.checkpoint is None
        assert not gen.fresh
    elif s["checkpoint"] is not None:
        step, path = s["checkpoint"]
        assert gen.start_step == step
        assert gen.checkpoint == path
        assert gen.source is None
        assert gen.receivers == ()
        assert not gen.fresh
    else:
        assert gen.fresh
        assert gen.start_step == 0
        assert gen.source == members[0]
        assert gen.receivers == tuple(members[1:])
        assert gen.checkpoint is None

    # the generation survives the JSON round trip unchanged
    assert Generation.from_json(gen.to_json()) == gen


def test_survivor_state_is_preferred_and_stale_members_receive() -> None:
    gen = next_generation(
        3,
        previous_members=["a", "b", "c"],
        ready={"c": 7, "a": 6, "b": 7},
        joiners=["d"],
        min_workers=1,
        max_workers=8,
        checkpoint=(2, "ckpt"),
    )
    assert gen == Generation(
        3, ("a", "b", "c", "d"), 7, source="b", receivers=("a", "d"), checkpoint=None
    )
    assert gen.world_size == 4
    assert gen.rank_of("d") == 3


def test_dead_member_dropped_and_joiners_capped() -> None:
    gen = next_generation(
        1,
        previous_members=["a", "b", "c"],
        ready={"a": 4, "c": 4},
        joiners=["x", "y", "z"],
        min_workers=2,
        max_workers=4,
        checkpoint=None,
    )
    assert gen.members == ("a", "c", "x", "y")
    assert gen.start_step == 4
    assert gen.source == "a"
    assert gen.receivers == ("x", "y")


def test_too_few_workers_gives_none() -> None:
    assert next_generation(2, ["a", "b"], {"a": 3}, [], 2, 4, None) is None
    assert next_generation(0, [], {}, [], 1, 4, None) is None
    assert next_generation(0, [], {}, ["a"], 2, 4, None) is None


def test_resume_from_checkpoint_when_nobody_holds_state() -> None:
    gen = next_generation(0, [], {}, ["a", "b"], 1, 4, (12, "run/ckpt-12.pt"))
    assert gen == Generation(0, ("a", "b"), 12, checkpoint="run/ckpt-12.pt")


def test_fresh_start() -> None:
    gen = next_generation(0, [], {}, ["a", "b", "c"], 2, 2, None)
    assert gen == Generation(0, ("a", "b"), 0, source="a", receivers=("b",), fresh=True)


def test_none_step_member_receives() -> None:
    gen = next_generation(5, ["a", "b"], {"a": None, "b": 0}, [], 1, 4, None)
    assert gen.start_step == 0
    assert gen.source == "b"
    assert gen.receivers == ("a",)


def test_generation_json_round_trip() -> None:
    gens = [
        Generation(4, ("w1", "w0", "w7"), 19, source="w0", receivers=("w7",)),
        Generation(0, ("a",), 0, source="a", fresh=True),
        Generation(2, ("a", "b"), 10, checkpoint="/tmp/ckpt-10.pt"),
        Generation(9, (), 0),
    ]
    for gen in gens:
        text = gen.to_json()
        back = Generation.from_json(text)
        assert back == gen
        assert isinstance(back.members, tuple) and isinstance(back.receivers, tuple)
        assert Generation.from_json(text.encode()) == gen

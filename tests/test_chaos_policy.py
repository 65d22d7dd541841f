"""The chaos policy alone: what it strikes, when, and that the job can always finish."""

from dataclasses import replace

import pytest

from dyntrain.errors import ConfigError
from dyntrain.launch.chaos import Chaos, Situation, parse_chaos


def test_parse_chaos():
    assert parse_chaos("7:100") == (7, 100, ())
    assert parse_chaos("7:2:sender,receiver") == (7, 2, ("sender", "receiver"))
    for bad in ("7", "7:0", "x:3", ":3", "7:-1"):
        with pytest.raises(ConfigError, match="SEED:N"):
            parse_chaos(bad)
    with pytest.raises(ConfigError, match="unknown aim 'sendr'"):
        parse_chaos("7:2:sendr")


def simulate(seed: int, count: int, ticks: int = 20000, aims: tuple[str, ...] = ()) -> list:
    """Drive the policy against a toy world that follows its strikes."""
    chaos = Chaos(seed, count, max_workers=3, aims=aims, mean_gap=0.2, aim_timeout=1.0)
    live, known, n, strikes = ["w0", "w1"], ["w0", "w1"], 2, []
    for tick in range(ticks):
        now = tick * 0.01
        members = tuple(known[:3])
        handing = tick % 50 < 5  # now and then a generation hands state to a joiner
        s = Situation(now, members, tuple(live), tuple(w for w in known if w in live),
                      reforming=tick % 40 < 4,
                      sender=members[0] if handing and members else None,
                      receivers=members[1:] if handing else (),
                      checkpointing=tick % 70 < 3, leader=members[0] if members else None)
        for strike in chaos.strikes(s):
            strikes.append((now, strike, len(live)))
            if strike.action == "join":
                new = [f"w{n + i}" for i in range(strike.count)]
                n += strike.count
                live += new
                known += new  # (in the real launcher they say hello a little later)
            else:
                live = [w for w in live if w not in strike.targets]
                known = [w for w in known if w not in strike.targets]
        if chaos.left == 0:
            return strikes
    raise AssertionError(f"only {len(strikes)} of {count} strikes in {ticks} ticks")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_every_strike_is_made_and_targets_a_live_worker(seed):
    strikes = simulate(seed, 60)
    assert len(strikes) == 60
    aims = {s.aim for _, s, _ in strikes}
    assert {"sender", "receiver", "checkpoint", "burst"} <= aims | {"refill"}
    for _, strike, _ in strikes:
        assert strike.action in ("join", "leave", "kill", "hang")
        assert (strike.count >= 1) == (strike.action == "join")


def test_strikes_come_without_waiting_and_some_at_once():
    times = [t for t, _, _ in simulate(5, 60)]
    assert len(set(times)) < len(times)  # bursts: several strikes in one tick
    assert min(b - a for a, b in zip(times, times[1:], strict=False)) < 0.05


def test_the_last_strike_never_removes_the_last_worker():
    for seed in range(20):
        now, last, live_before = simulate(seed, 8)[-1]
        assert last.action == "join" or live_before > 1


def test_same_seed_same_strikes():
    assert simulate(11, 30) == simulate(11, 30)


def test_chosen_aims_are_waited_for_and_hit_only_their_target():
    for aim, who in (("sender", lambda s: [s.sender]), ("receiver", lambda s: list(s.receivers))):
        chaos = Chaos(3, 2, max_workers=3, aims=(aim,), mean_gap=0.1, aim_timeout=0.5)
        quiet = Situation(0.0, ("w0", "w1"), ("w0", "w1"), ("w0", "w1"))
        for tick in range(500):  # far past aim_timeout: nothing else is struck meanwhile
            assert chaos.strikes(replace(quiet, now=tick * 0.01)) == []
        handing = replace(quiet, now=5.0, sender="w0", receivers=("w1",))
        strikes = chaos.strikes(handing)
        assert [(s.action, s.aim) for s in strikes] == [("kill", aim)]
        assert list(strikes[0].targets) == who(handing)

"""The typed protocol: every message kind survives its trip through the store's JSON, and what
is not a message the protocol knows is refused with an error that names what was wrong."""

from __future__ import annotations

import json

import pytest

from dyntrain.elastic import protocol as p
from dyntrain.elastic.protocol import Unreachable

GEN = p.Generation(3, ("a", "b"), 12, source="a", receivers=("b",), probes=("h:1", "h:2"))

EVERY_KIND = [
    p.Hello("fp", {"global_batch": 8}, host="h", pid=7, address="10.0.0.1", probe="10.0.0.1:9"),
    p.Reattach(p.Hello("fp"), p.Position(p.WorkerState.RUNNING, GEN, 12)),
    p.Reattach(p.Hello("fp"), p.Position()),
    p.Ready(3, 12),
    p.Ready(3, None, p.ReadyReason.ERROR, error="Connection reset by peer"),
    p.Ready(3, 12, p.ReadyReason.UNREACHABLE,
            unreachable=(Unreachable("b", "127.0.1.1:9", "Connection refused"),)),
    p.Left(3, None),
    p.Metrics(({"gen": 3, "step": 13, "loss": 0.5}, {"gen": 3, "step": 14}), replay=True),
    p.Checkpoint(None, 12, "s3://bucket/run/checkpoints/ckpt-12"),
    p.Done(3, 100),
    p.Result(3, {"accuracy": 0.97, "gen": "a user's own field"}),
    p.Error("ValueError: bad batch"),
]


@pytest.mark.parametrize("message", EVERY_KIND, ids=lambda m: type(m).__name__)
def test_every_kind_decodes_to_what_was_encoded(message):
    assert p.decode(p.encode("w1", message), "w1") == message


def test_there_is_one_message_class_per_kind():
    assert sorted(p.MESSAGES) == ["checkpoint", "done", "error", "hello", "left", "metrics",
                                  "ready", "reattach", "result"]
    assert {type(m) for m in EVERY_KIND} == set(p.MESSAGES.values())


def raw(kind: str, worker: str = "w1", **fields) -> str:
    return json.dumps({"kind": kind, "worker": worker, **fields})


@pytest.mark.parametrize("text,error", [
    ("{not json", "not JSON: '{not json'"),
    ("[1, 2]", "not a JSON object: '[1, 2]'"),
    (raw("hullo", fingerprint="fp"), "unknown message kind 'hullo'"),
    (json.dumps({"worker": "w1"}), "unknown message kind None"),
    (raw("done", worker="w2", gen=1, step=3),
     "a 'done' message naming worker 'w2' in the inbox of 'w1'"),
    (raw("done", gen=1), "malformed 'done' message: step: missing"),
    (raw("done", gen=1, step="3"), "malformed 'done' message: step: expected an integer, got '3'"),
    (raw("done", gen=1, step=True),
     "malformed 'done' message: step: expected an integer, got True"),
    (raw("done", gen=1, step=3, extra=1), "malformed 'done' message: extra: unknown field"),
    (raw("ready", gen=1, step=3, reason="bored"),
     "malformed 'ready' message: reason: expected one of boundary, abort, unreachable, error, "
     "got 'bored'"),
    (raw("ready", gen=1, step=3, reason="unreachable", unreachable=[{"worker": "b"}]),
     "malformed 'ready' message: unreachable[0].endpoint: missing"),
    (raw("reattach", hello={"fingerprint": "fp"}, position={"state": "lost"}),
     "malformed 'reattach' message: position.state: expected one of joining, running, waiting, "
     "done, got 'lost'"),
    (raw("reattach", hello={"fingerprint": "fp"},
         position={"generation": {"number": 1, "members": "ab", "start_step": 0}}),
     "malformed 'reattach' message: position.generation.members: expected a list, got 'ab'"),
    (raw("metrics", rows=[{"gen": 1}]), "rows[0].step: expected an integer, got None"),
    (raw("metrics", rows={"step": 1}), "malformed 'metrics' message: rows: expected a list"),
    (raw("result", gen=1, values=[1]), "malformed 'result' message: values: expected an object"),
])
def test_what_is_not_a_known_message_is_refused_naming_what_is_wrong(text, error):
    with pytest.raises(p.ProtocolError) as refused:
        p.decode(text, "w1")
    assert str(refused.value).startswith(error)


def test_replies_and_job_states_keep_their_words_on_the_store():
    assert p.Reply(p.ReplyKind.LEAVE).encode() == "leave"
    assert p.Reply(p.ReplyKind.DEAD, "no heartbeat for 3 s").encode() == \
        "dead:no heartbeat for 3 s"
    assert p.Reply.decode(b"reject:its peers: a:1") == \
        p.Reply(p.ReplyKind.REJECT, "its peers: a:1")
    assert p.JobVerdict.decode(b"failed:the group: never") == \
        p.JobVerdict(p.JobState.FAILED, "the group: never")
    assert str(p.JobVerdict(p.JobState.DONE)) == "done"
    with pytest.raises(p.ProtocolError, match="unknown reply 'goodbye'"):
        p.Reply.decode("goodbye")
    with pytest.raises(p.ProtocolError, match="unknown job state 'paused'"):
        p.JobVerdict.decode("paused")
    assert [w.value for w in p.Control] == ["run", "reform", "drain", "abort"]


def test_a_generation_round_trips_and_a_malformed_one_is_named():
    assert p.Generation.from_json(GEN.to_json()) == GEN
    old = json.dumps({"number": 0, "members": ["a"], "start_step": 0, "source": "a",
                      "receivers": [], "checkpoint": None, "fresh": True})
    assert p.Generation.from_json(old).probes == ()  # written before probes existed
    with pytest.raises(p.ProtocolError, match="generation.start_step: missing"):
        p.Generation.from_json(json.dumps({"number": 0, "members": ["a"]}))


def test_a_members_failure_domain_is_the_host_it_advertises():
    gen = p.Generation(4, ("a", "b", "c", "d", "e"), 0,
                       probes=("10.0.0.1:5001", "10.0.0.1:5002", "10.0.0.2:5001", "", "[::1]:7"))
    assert gen.failure_domains() == {"a": "10.0.0.1", "b": "10.0.0.1", "c": "10.0.0.2",
                                     "d": "worker d", "e": "[::1]"}
    assert p.Generation(1, ("a",), 0).failure_domains() == {"a": "worker a"}  # no probes

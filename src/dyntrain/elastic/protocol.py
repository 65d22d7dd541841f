"""What workers and the coordinator say to each other through the TCPStore: keys, typed
messages, control words, replies and states.

Workers -> coordinator: each worker appends messages to its own inbox (``inbox/<id>/<k>``, then
bumps ``inbox/<id>/n``), announces itself once on the ``roster`` list (then bumps ``roster/n``,
so that the coordinator polls one number, not the list) and bumps ``hb/<id>`` as a heartbeat.
A message is one dataclass per kind (``Hello``, ``Reattach``, ``Ready``, ``Left``, ``Metrics``,
``Checkpoint``, ``Done``, ``Result``, ``Error``), written by ``encode`` and read by ``decode``,
which refuses an unknown kind or a malformed field with a ``ProtocolError`` naming it.
Coordinator -> workers: ``gen/latest`` and ``gen/<n>`` (the ``Generation`` n),
``ctl/<n>/<id>`` (a ``Control`` word), ``reply/<id>`` (a ``Reply``: leave, a rejection, or the
fence of a worker declared dead) and ``job/state`` (a ``JobVerdict``). A worker whose coordinator
was restarted (a new store) first sends ``Reattach``: where it stands (a ``Position``).

Messages that act for a generation (``Ready``, ``Left``, metrics rows, ``Checkpoint``,
``Done``, ``Result``) carry its number (``gen``); the coordinator refuses those of a generation
that is over and every message of a worker it declared dead.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import ClassVar

from dyntrain.elastic.admission import CanaryDigest
from dyntrain.elastic.wire import WireError, from_wire, to_wire
from dyntrain.errors import DyntrainError

# The environment of a worker process (set by the launcher or the service; torch-free, so the
# service can set it without importing torch).
ENV_COORDINATOR = "DYNTRAIN_COORDINATOR"
ENV_WORKER_ID = "DYNTRAIN_WORKER_ID"
ENV_OUT = "DYNTRAIN_OUT"
ENV_CONNECT_TIMEOUT = "DYNTRAIN_CONNECT_TIMEOUT"
# Seconds a worker that lost its coordinator trains on and waits for it to come back (a
# restarted service); 0, the default outside the service, ends the worker at once.
ENV_REATTACH = "DYNTRAIN_REATTACH_SECONDS"
# The command line (JSON list) that starts this worker again as a new process: set by
# ``dyntrain worker``, so that a worker declared dead re-joins as a new member.
ENV_WORKER_ARGV = "DYNTRAIN_WORKER_ARGV"
# The address a worker binds and gives its peers, or the interface to take it from (set by
# ``dyntrain worker --advertise-address/--iface``); by default the one it reaches the
# coordinator from (``dyntrain.elastic.worker.address``).
ENV_ADVERTISE = "DYNTRAIN_ADVERTISE_ADDRESS"
ENV_IFACE = "DYNTRAIN_IFACE"
#: a job's coordinator secret: every key of its store lives under it, so a client without it
#: (anyone who can reach the port) can neither read the job's keys nor post to its inboxes
ENV_SECRET = "DYNTRAIN_COORDINATOR_SECRET"

#: seconds without a heartbeat (sent every 0.5 s) before a worker is declared lost: a partitioned
#: or frozen host is found this fast. A live worker would have to miss six beats in a row to be
#: evicted by mistake; a silence longer than half of it is logged as a near miss, so that a
#: machine that needs more says so (``--failure-timeout`` raises it)
FAILURE_TIMEOUT = 3.0

ROSTER = "roster"
ROSTER_COUNT = "roster/n"  # bumped after each roster entry: one number to poll, not the list
GEN_LATEST = "gen/latest"
JOB_STATE = "job/state"
JOB_INFO = "job/info"  # {"out_dir": run folder, "job": who hosts it (same across restarts)}


def gen_key(number: int) -> str:
    return f"gen/{number}"


def ctl_key(number: int, worker: str) -> str:
    return f"ctl/{number}/{worker}"


def inbox_key(worker: str, seq: int) -> str:
    return f"inbox/{worker}/{seq}"


def inbox_count_key(worker: str) -> str:
    return f"inbox/{worker}/n"


def heartbeat_key(worker: str) -> str:
    return f"hb/{worker}"


def reply_key(worker: str) -> str:
    return f"reply/{worker}"


class ProtocolError(DyntrainError):
    """A message or store value that is not one the protocol knows (says what was wrong)."""


# ---- states and words ---------------------------------------------------------------------------


class WorkerState(enum.StrEnum):
    """Where a worker stands in its job (it says so when it re-attaches)."""

    JOINING = "joining"  # said hello, never took part in a generation
    RUNNING = "running"  # trains in a generation
    WAITING = "waiting"  # left a generation, waits for the next one
    DONE = "done"  # the leader that finished the job


class Control(enum.StrEnum):
    """The coordinator's word to a member of a generation (``ctl/<n>/<id>``)."""

    RUN = "run"
    REFORM = "reform"  # re-form after the current step (joiners wait)
    DRAIN = "drain"  # finish the current step and leave
    ABORT = "abort"  # stop now: a member died or the generation was abandoned



class ReplyKind(enum.StrEnum):
    """What ``reply/<id>`` tells one worker, outside any generation."""

    LEAVE = "leave"  # stop waiting for a generation and leave
    REJECT = "reject"  # it never takes part (settings differ, its peers cannot reach it)
    DEAD = "dead"  # declared dead (a lost heartbeat, an exit): its id is fenced for good


@dataclass(frozen=True)
class Reply:
    """The coordinator's reply to one worker: ``leave``, ``reject:<why>`` or ``dead:<why>``."""

    kind: ReplyKind
    reason: str = ""

    def encode(self) -> str:
        return self.kind.value if self.kind is ReplyKind.LEAVE else f"{self.kind}:{self.reason}"

    @classmethod
    def decode(cls, text: str | bytes) -> Reply:
        text = text.decode() if isinstance(text, bytes) else text
        word, _, reason = text.partition(":")
        try:
            return cls(ReplyKind(word), reason)
        except ValueError:
            raise ProtocolError(f"unknown reply {text[:60]!r}") from None



class JobState(enum.StrEnum):
    """The job as its coordinator records it in ``job/state``."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class JobVerdict:
    """``job/state``: the coordinator's word on the whole job, which every worker obeys:
    ``running``, ``done`` or ``failed:<why>``. (Not the service's ``JobStatus``, a job's place
    in its queue's lifecycle.)"""

    state: JobState
    reason: str = ""

    def encode(self) -> str:
        return f"failed:{self.reason}" if self.state is JobState.FAILED else self.state.value

    @classmethod
    def decode(cls, text: str | bytes) -> JobVerdict:
        text = text.decode() if isinstance(text, bytes) else text
        word, _, reason = text.partition(":")
        try:
            return cls(JobState(word), reason)
        except ValueError:
            raise ProtocolError(f"unknown job state {text[:60]!r}") from None

    def __str__(self) -> str:
        return self.encode()


# ---- generations --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unreachable:
    """A peer that a member could not connect to, at the address the peer advertised."""

    worker: str
    endpoint: str
    error: str

    def to_dict(self) -> dict:
        return {"worker": self.worker, "endpoint": self.endpoint, "error": self.error}


@dataclass(frozen=True)
class Generation:
    """One membership of the job: who takes part, from which step, and where state comes from.

    ``source`` is the member whose state everyone adopts (``receivers`` get it by broadcast);
    ``checkpoint`` is set instead when no member holds state and the job resumes from disk;
    ``fresh`` marks a brand-new run whose rank-0 initial state is broadcast to all.
    ``probes``: each member's probe endpoint ("address:port",
    ``dyntrain.elastic.collective.reach``), in the order of ``members`` ("" for one that did not
    give one).
    """

    number: int
    members: tuple[str, ...]
    start_step: int
    source: str | None = None
    receivers: tuple[str, ...] = ()
    checkpoint: str | None = None
    fresh: bool = False
    probes: tuple[str, ...] = ()

    def rank_of(self, worker: str) -> int:
        return self.members.index(worker)

    @property
    def world_size(self) -> int:
        return len(self.members)

    def to_json(self) -> str:
        return json.dumps(to_wire(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Generation:
        try:
            return from_wire(cls, json.loads(text), "generation")
        except (ValueError, WireError) as exc:
            raise ProtocolError(f"malformed generation: {exc}") from None

    def failure_domains(self) -> dict[str, str]:
        """Each member's failure domain: the host address of its probe endpoint (members on
        one host fail together when the host goes); a member without one is a domain of its
        own. The same on every member (from this message alone)."""
        probes = dict(zip(self.members, self.probes, strict=False))
        return {w: probes.get(w, "").rpartition(":")[0] or f"worker {w}" for w in self.members}

    def peer_probes(self, worker: str) -> dict[str, str]:
        """The other members' probe endpoints (those that gave one)."""
        return {w: e for w, e in zip(self.members, self.probes, strict=False)
                if w != worker and e}


# ---- messages: worker -> coordinator ------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """A message from a worker to the coordinator; each kind is a subclass (``MESSAGES``)."""

    kind: ClassVar[str]


@dataclass(frozen=True)
class Hello(Message):
    """A worker asks to join: its settings (the job's must match), what it computes with and
    the proof that it computes the job's bits, and how to reach it."""

    kind: ClassVar[str] = "hello"
    fingerprint: str
    config: dict = field(default_factory=dict)  # the numbers a refusal shows
    host: str = ""
    pid: int = 0
    address: str = ""  # what its process groups bind (dyntrain.elastic.worker.address)
    probe: str = ""  # "address:port" of its probe listener (dyntrain.elastic.collective.reach)
    numerics: dict = field(default_factory=dict)  # dyntrain.elastic.numerics.observe()
    canary: CanaryDigest = field(default_factory=CanaryDigest)  # dyntrain.elastic.step.canary


@dataclass(frozen=True)
class Position:
    """Where a worker stands: its state, the last generation it took part in and the last step
    it applied (None: it holds no state)."""

    state: WorkerState = WorkerState.JOINING
    generation: Generation | None = None
    step: int | None = None


@dataclass(frozen=True)
class Reattach(Message):
    """The first message to a restarted coordinator: the worker's hello and where it stands."""

    kind: ClassVar[str] = "reattach"
    hello: Hello
    position: Position


class ReadyReason(enum.StrEnum):
    """Why a member left its generation and is ready for the next one."""

    BOUNDARY = "boundary"  # the members agreed, through a step's sum, to re-form after it
    ABORT = "abort"  # the coordinator aborted the generation
    UNREACHABLE = "unreachable"  # it cannot reach a peer (``Ready.unreachable`` says which)
    ERROR = "error"  # a collective failed under it (``Ready.error`` says how)


@dataclass(frozen=True)
class Ready(Message):
    """A member left generation ``gen`` holding the state of ``step`` (None: no state)."""

    kind: ClassVar[str] = "ready"
    gen: int
    step: int | None
    reason: ReadyReason = ReadyReason.BOUNDARY
    error: str = ""
    unreachable: tuple[Unreachable, ...] = ()

    def describe(self) -> str:
        """The reason as one string (``error: <what failed>`` for an error)."""
        if self.reason is ReadyReason.ERROR:
            return f"{self.reason}: {self.error}"
        return self.reason.value


@dataclass(frozen=True)
class Left(Message):
    """The worker left the job after ``step``, from generation ``gen`` (the last it knew)."""

    kind: ClassVar[str] = "left"
    gen: int
    step: int | None


@dataclass(frozen=True)
class Metrics(Message):
    """The leader's ``metrics.jsonl`` rows, each with its ``step`` and ``gen``; ``replay``:
    re-sent after a re-attach (the coordinator keeps those above the last step it recorded)."""

    kind: ClassVar[str] = "metrics"
    rows: tuple[dict, ...]
    replay: bool = False

    def __post_init__(self) -> None:
        for i, row in enumerate(self.rows):
            step = row.get("step")
            if not isinstance(step, int) or isinstance(step, bool):
                raise ProtocolError(f"rows[{i}].step: expected an integer, got {step!r}")


@dataclass(frozen=True)
class Checkpoint(Message):
    """A checkpoint of ``step`` was written to ``path``; ``gen`` None: between generations.
    With ``error``: it was not written (one line, the cause), and the training goes on."""

    kind: ClassVar[str] = "checkpoint"
    gen: int | None
    step: int
    path: str
    error: str = ""


@dataclass(frozen=True)
class Done(Message):
    """The leader of generation ``gen`` applied the last step and wrote the final model."""

    kind: ClassVar[str] = "done"
    gen: int
    step: int


@dataclass(frozen=True)
class Result(Message):
    """What the training script reported (``ElasticTrainer.report``)."""

    kind: ClassVar[str] = "result"
    gen: int
    values: dict


@dataclass(frozen=True)
class Error(Message):
    """The worker raised an exception (it exits by itself): ``message`` is its first line."""

    kind: ClassVar[str] = "error"
    message: str


MESSAGES: dict[str, type[Message]] = {
    cls.kind: cls for cls in (Hello, Reattach, Ready, Left, Metrics, Checkpoint, Done, Result,
                              Error)}


def encode(worker: str, message: Message) -> str:
    """The JSON text of ``message`` from ``worker``, for its inbox."""
    return json.dumps({"kind": message.kind, "worker": worker, **to_wire(message)})


def decode(raw: str | bytes, worker: str) -> Message:
    """The message in ``raw``, read from ``worker``'s inbox; raises ``ProtocolError`` saying
    what is wrong (not JSON, an unknown kind, another worker's name, a missing or malformed
    field)."""
    try:
        data = json.loads(raw)
    except ValueError:
        raise ProtocolError(f"not JSON: {_head(raw)}") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"not a JSON object: {_head(raw)}")
    kind = data.pop("kind", None)
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message kind {kind!r}")
    sender = data.pop("worker", None)
    if sender != worker:
        raise ProtocolError(f"a {kind!r} message naming worker {sender!r} in the inbox of "
                            f"{worker!r}")
    try:
        return from_wire(cls, data)
    except WireError as exc:
        raise ProtocolError(f"malformed {kind!r} message: {exc}") from None


def _head(raw: str | bytes) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return repr(text[:60])


"""The worker's side of the protocol: say hello, heartbeat, read control keys, await generations."""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.collective.reach import ProbeListener
from dyntrain.elastic.runs.coordinator_file import read_coordinator_file
from dyntrain.elastic.worker.address import advertise_address
from dyntrain.elastic.worker.connect import connect_store, parse_address, sever
from dyntrain.elastic.worker.succession import Succession, Takeover
from dyntrain.errors import DyntrainError

POLL_SECONDS = 0.005


class JobOver(Exception):
    """The job finished (or failed) while this worker was not a member. ``at_join``: it had
    already ended at this worker's first look (it came too late to take part)."""

    def __init__(self, status: p.JobVerdict, at_join: bool = False) -> None:
        super().__init__(str(status))
        self.status = status
        self.at_join = at_join


class CoordinatorGone(DyntrainError):
    """The coordinator was lost and did not come back within the re-attach bound."""


class Fenced(DyntrainError):
    """The coordinator declared this worker dead (it was frozen or cut off meanwhile): its id
    and the generation it was in are over; nothing it sends under that id counts."""


class WorkerChannel:
    """One worker's connection to its job's coordinator.

    Nothing on the training step's critical path waits for the store: messages go out through a
    sender thread (consecutive metrics rows packed into one message), and the control key of
    the current generation is polled by a watcher thread that also sends the heartbeat.

    With ``reattach_seconds`` > 0 (or a job of ``--takeover``) a lost coordinator is not the
    end: the worker keeps its generation's group (which does not need the store) and trains on,
    while the watcher reconnects - to the same address, to the one the host recorded in the run
    folder's ``coordinator.json``, or to a successor's (``succession``, which also hosts one
    when this worker is due) - and checks that the store belongs to the same job
    (``job/info``). Then the sender first delivers a ``Reattach`` message (``position()``: the
    worker's ``Position``, its state, generation and applied step), then every message that was
    not delivered. Whatever needs the coordinator meanwhile (a new generation, the final flush)
    waits for it. After ``reattach_seconds`` without it, ``CoordinatorGone`` is raised.

    ``advertise`` is the address the worker's process groups bind and its peers connect to
    (``dyntrain.elastic.worker.address.advertise_address``: by default the local address of its
    route to the coordinator; ``advertise_address``/``iface`` override it); peers check that they
    reach it through its ``probe`` listener before a group forms
    (``dyntrain.elastic.collective.reach``).
    """

    def __init__(self, address: str, worker_id: str | None = None, connect_timeout: float = 30.0,
                 heartbeat_interval: float = 0.5, watch_interval: float = 0.02,
                 reattach_seconds: float = 0.0,
                 position: Callable[[], p.Position] = p.Position,
                 advertise: str | None = None, iface: str | None = None) -> None:
        self.address = address
        self.worker = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.connect_timeout = connect_timeout
        self.position = position
        self.succession = Succession(None, {}, self.worker, position)  # (job/info says)
        self._connect(address, connect_timeout)
        self.advertise = advertise_address(parse_address(address), advertise, iface)
        self.probe = ProbeListener(self.advertise)
        info = self.job_info()
        self.job, self.run_dir = info.get("job"), info.get("out_dir")
        self.succession = Succession(Takeover.from_info(info), info, self.worker, position)
        self.reattach_seconds = reattach_seconds or self.succession.within
        self.lost: str | None = None
        self._lost_at = 0.0
        self._epoch = 0  # bumped at each reconnection: a failure on an older store is old news
        self.gave_up = False
        self.reattached = 0  # how many times this worker re-attached to a restarted coordinator
        self._online = threading.Event()
        self._online.set()
        self._hello: p.Hello | None = None
        self._reattach_due = False
        self._seen_running = False  # the job was running at one of this worker's looks
        self._seq = 0
        # Rows the coordinator may not have read when it died; replayed after a re-attach (the
        # coordinator keeps those above the last step it recorded).
        self._recent_rows: deque[dict] = deque(maxlen=32)
        self._outbox: queue.Queue[p.Message] = queue.Queue()
        self._stop = threading.Event()
        self._watched: int | None = None
        # the watched generation, its control word and when it was read
        self._ctl: tuple[int, p.Control, float] = (-1, p.Control.RUN, 0.0)
        threading.Thread(target=self._send_loop, daemon=True, name="dyntrain-sender").start()
        self._watcher = threading.Thread(target=self._watch_loop, daemon=True,
                                         args=(heartbeat_interval, watch_interval),
                                         name="dyntrain-watcher")
        self._watcher.start()
        if self.succession.takeover is not None:
            threading.Thread(target=self._guard_loop, daemon=True, name="dyntrain-guard",
                             args=(self.succession.silence_bound,)).start()

    def _connect(self, address: str, timeout: float) -> None:
        # Each thread gets its own connection; group creation blocks on keys in another thread.
        stores = [connect_store(address, timeout) for _ in range(3)]
        self.store, self._send_store, self._watch_store = stores
        self.address = address
        self._answered = time.monotonic()  # the watcher's last answer from this store

    def group_store(self) -> dist.TCPStore:
        """A connection of its own for one generation's process group. A creation that was
        abandoned (a peer died while the group formed) stays blocked on its peer's key until
        its timeout; on a shared connection it would block the next generation's creation."""
        return connect_store(self.address, self.connect_timeout)

    # ---- losing and finding the coordinator ---------------------------------------------------

    def _on_lost(self, exc: BaseException, epoch: int) -> None:
        if self.lost is None and epoch == self._epoch:
            self.lost = f"lost the coordinator at {self.address}: {str(exc).splitlines()[0]}"
            self._lost_at = time.monotonic()
            if self.reattach_seconds:
                self._online.clear()

    def _reconnect(self) -> bool:
        """Find the coordinator again (bounded); False once the bound has passed."""
        deadline = self._lost_at + self.reattach_seconds
        while not self._stop.is_set():
            self.succession.poll(self.address, time.monotonic() - self._lost_at)
            for address in self._candidates():
                try:
                    left = max(0.2, min(2.0, deadline - time.monotonic()))
                    probe = connect_store(address, left)
                    if not probe.check([p.JOB_INFO]) or \
                            json.loads(probe.get(p.JOB_INFO)).get("job") != self.job:
                        continue  # someone else's store on that port
                    self._connect(address, left)
                    count = p.inbox_count_key(self.worker)
                    seq = int(self.store.get(count)) if self.store.check([count]) else None
                except Exception:
                    continue
                # the same coordinator (a passing failure) still holds our inbox; a restarted
                # one does not and first needs to hear where we stand
                self._seq, self._reattach_due = (0, True) if seq is None else (seq, False)
                self.reattached += seq is None
                self._epoch += 1
                self.lost = None
                self._online.set()
                return True
            if time.monotonic() >= deadline:
                self.lost = (f"{self.lost}; it did not come back within "
                             f"{self.reattach_seconds:g} s")
                self.gave_up = True
                self._online.set()  # wake up whoever waits: they raise CoordinatorGone
                return False
            self._stop.wait(0.2)
        return False

    def _candidates(self) -> list[str]:
        """The address the host recorded in the run folder (it may have moved), then the old one."""
        record = read_coordinator_file(self.run_dir) if self.run_dir else {}
        found = [record["address"]] if record.get("job") == self.job and "address" in record \
            else []
        more = [self.address, *self.succession.addresses(self.address)]
        return found + [a for a in dict.fromkeys(more) if a not in found]

    def _wait_online(self, should_stop=lambda: False) -> None:
        """Block while the coordinator is away; raise CoordinatorGone once it is given up."""
        while not self._online.wait(0.05) and not should_stop():
            pass
        self._check_gone()

    def _check_gone(self) -> None:
        if self.gave_up:
            raise CoordinatorGone(self.lost)
        if self.lost and not self.reattach_seconds:
            raise DyntrainError(self.lost)

    # ---- background threads -------------------------------------------------------------------

    def _watch_loop(self, heartbeat_interval: float, interval: float) -> None:
        last_beat = 0.0
        while not self._stop.is_set():
            epoch = self._epoch
            if self.lost and self.reattach_seconds:  # another thread saw the store fail
                if not self._reconnect():
                    return
                continue
            try:
                now = time.monotonic()
                if now - last_beat >= heartbeat_interval:
                    self._watch_store.add(p.heartbeat_key(self.worker), 1)
                    last_beat = now
                gen = self._watched
                if gen is not None:
                    key = p.ctl_key(gen, self.worker)
                    # a re-attached store holds no key until the coordinator has read our report
                    value = (p.Control(self._watch_store.get(key).decode())
                             if self._watch_store.check([key]) else self._ctl_value(gen))
                    self._ctl = (gen, value, time.monotonic())
                self._answered = time.monotonic()
            except Exception as exc:
                self._on_lost(exc, epoch)
                if not self.reattach_seconds:
                    return
                continue
            self._stop.wait(interval)

    def _guard_loop(self, bound: float) -> None:
        """(``--takeover``) A coordinator's host that is cut off leaves its connections open
        and silent, and a store call on them never returns. Once the watcher has had no answer
        for ``bound`` seconds, they are cut (``connect.sever``): every blocked call fails, and
        the worker looks for its coordinator again, or for a successor."""
        while not self._stop.wait(0.2):
            if self.lost is None and time.monotonic() - self._answered > bound:
                sever(self.address)
                self._answered = time.monotonic()  # once per silence

    def _ctl_value(self, generation: int) -> p.Control:
        gen, value, _ = self._ctl
        return value if gen == generation else p.Control.RUN

    def _send_loop(self) -> None:
        backlog: list[tuple[p.Message, int]] = []  # packed message, how many sends it carries
        while True:
            fresh = []
            if not backlog and not self._reattach_due:
                try:  # (a timeout: a re-attach is reported even when nothing else is queued)
                    fresh.append(self._outbox.get(timeout=0.05))
                except queue.Empty:
                    continue
            while not self._outbox.empty():
                fresh.append(self._outbox.get_nowait())
            backlog += _pack_metrics(fresh)
            self._online.wait()
            epoch = self._epoch
            try:
                if self._reattach_due:
                    self._deliver(p.Reattach(self._hello, self.position()))
                    if self._recent_rows:
                        self._deliver(p.Metrics(tuple(self._recent_rows), replay=True))
                    self._send_store.append(p.ROSTER, self.worker + " ")
                    self._send_store.add(p.ROSTER_COUNT, 1)
                    self._reattach_due = False
                while backlog:
                    msg, n = backlog[0]
                    self._deliver(msg)
                    backlog.pop(0)
                    for _ in range(n):
                        self._outbox.task_done()
            except Exception as exc:
                self._on_lost(exc, epoch)
                if not self.reattach_seconds or self.gave_up:
                    for _, n in backlog:  # nobody will read them
                        for _ in range(n):
                            self._outbox.task_done()
                    backlog = []
                else:
                    self._stop.wait(0.05)  # the watcher reconnects

    def _deliver(self, msg: p.Message) -> None:
        self._send_store.multi_set(
            [p.inbox_key(self.worker, self._seq), p.inbox_count_key(self.worker)],
            [p.encode(self.worker, msg), str(self._seq + 1)])
        self._seq += 1
        if isinstance(msg, p.Metrics):
            self._recent_rows.extend(msg.rows)

    # ---- API ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Deliver what is queued and end the watcher. The watcher polls the store all the time
        and must be gone before the process exits: a thread inside a store call when the
        interpreter finalises makes the process abort (``terminate called without an active
        exception``). The sender stays for ``report``; once flushed it waits in Python."""
        self.flush(timeout=max(10.0, self.reattach_seconds))
        self._stop.set()
        self._watcher.join(self.connect_timeout)  # a store call gives up within its timeout
        self.probe.close()

    def send(self, msg: p.Message) -> None:
        """Queue a message for this worker's inbox (in order; see ``flush``)."""
        self._outbox.put(msg)

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every queued message reached the store (before exiting, say); while the
        coordinator is away and may come back, that includes waiting for it."""
        deadline = time.monotonic() + timeout
        while self._outbox.unfinished_tasks and time.monotonic() < deadline and not (
                self.gave_up or (self.lost and not self.reattach_seconds)):
            time.sleep(0.002)

    def watch(self, generation: int) -> None:
        """Poll this generation's control key in the background from now on."""
        self._watched = generation

    def ctl(self, generation: int) -> p.Control:
        """The control word for this worker in ``generation`` (run/reform/drain/abort).

        While the coordinator is away it is the last word read: the generation trains on."""
        self._check_gone()
        gen, value, when = self._ctl
        if gen == generation and time.monotonic() - when < 0.5:
            return value
        if not self._online.is_set():
            return self._ctl_value(generation)
        epoch = self._epoch
        try:
            key = p.ctl_key(generation, self.worker)
            return p.Control(self.store.get(key).decode()) if self.store.check([key]) \
                else self._ctl_value(generation)
        except Exception as exc:
            self._on_lost(exc, epoch)
            self._check_gone()
            return self._ctl_value(generation)

    def confirm(self, generation: int | None) -> bool | None:
        """Whether the coordinator still counts this worker as a member of ``generation`` (None:
        only whether it was not declared dead), read from the store now rather than from the
        watcher's copy: for writes that a worker of an abandoned generation must not make.
        None while that cannot be known (the coordinator is away, or re-attached and has not
        taken this worker's generation back yet)."""
        self._check_gone()
        if not self._online.is_set():
            return None
        epoch = self._epoch
        try:
            reply = p.reply_key(self.worker)
            if self.store.check([reply]) and \
                    p.Reply.decode(self.store.get(reply)).kind is p.ReplyKind.DEAD:
                return False
            if generation is None:
                return True
            key = p.ctl_key(generation, self.worker)
            if not self.store.check([key]):
                return None
            return p.Control(self.store.get(key).decode()) is not p.Control.ABORT
        except Exception as exc:
            self._on_lost(exc, epoch)
            self._check_gone()
            return None

    def hello(self, fingerprint: str, config: dict, numerics: dict,
              canary: p.CanaryDigest) -> None:
        self._hello = p.Hello(fingerprint, config, host=socket.gethostname(), pid=os.getpid(),
                              address=self.advertise, probe=self.probe.endpoint,
                              numerics=numerics, canary=canary)
        self.send(self._hello)
        self.flush()  # the roster entry must not overtake the hello message
        while True:
            epoch = self._epoch
            try:
                self.store.append(p.ROSTER, self.worker + " ")
                self.store.add(p.ROSTER_COUNT, 1)
                return
            except Exception as exc:  # the coordinator went away between the hello and here:
                self._on_lost(exc, epoch)  # its reason, not the store's traceback
                self._check_gone()
                self._wait_online()  # back (then enter the roster again), or CoordinatorGone

    def job_state(self) -> p.JobVerdict:
        return p.JobVerdict.decode(self.store.get(p.JOB_STATE))

    def wait_generation(self, after: int, should_stop) -> p.Generation | None:
        """Block until a generation numbered above ``after`` includes this worker.

        Returns None when ``should_stop()`` turns true or the coordinator tells this worker to
        leave; raises JobOver when the job ends, Fenced when the coordinator declared this
        worker dead, and DyntrainError when it rejects this worker or is lost
        (CoordinatorGone: and did not come back in time).
        """
        scanned = after
        while True:
            self._wait_online(should_stop)
            if not self._online.is_set():
                return None  # asked to stop while the coordinator is away
            epoch = self._epoch
            try:
                found = self._scan(scanned)
            except (DyntrainError, JobOver):
                raise
            except Exception as exc:
                self._on_lost(exc, epoch)
                self._check_gone()
                continue
            if isinstance(found, p.Generation):
                return found
            if found is None or should_stop():  # None: told to leave (drained while its
                return None                      # generation was being torn down)
            scanned = found
            time.sleep(POLL_SECONDS)

    def _scan(self, scanned: int) -> p.Generation | int | None:
        """One look at the store: a generation with this worker, the number seen, or None when
        this worker is told to leave."""
        if self.store.check([p.reply_key(self.worker)]):
            reply = p.Reply.decode(self.store.get(p.reply_key(self.worker)))
            if reply.kind is p.ReplyKind.LEAVE:
                return None
            if reply.kind is p.ReplyKind.DEAD:
                raise Fenced(f"declared dead ({reply.reason})")
            raise DyntrainError(f"the coordinator rejected this worker: {reply.reason}")
        status = self.job_state()
        if status.state is not p.JobState.RUNNING:
            raise JobOver(status, at_join=not self._seen_running)
        self._seen_running = True
        latest = int(self.store.get(p.GEN_LATEST))
        for number in range(scanned + 1, latest + 1):
            key = p.gen_key(number)
            scanned = number
            if not self.store.check([key]):
                continue  # published by a coordinator that is gone: never formed here
            gen = p.Generation.from_json(self.store.get(key))
            if self.worker in gen.members:
                return gen
        return scanned

    def wait_job_state(self, wanted: p.JobState) -> None:
        """Wait (bounded like a flush) until the coordinator has recorded the job as ``wanted``;
        after a re-attach the report of our position says it again."""
        if not self.reattach_seconds:
            return
        deadline = time.monotonic() + max(10.0, self.reattach_seconds)
        while time.monotonic() < deadline and not self.gave_up:
            epoch = self._epoch
            try:
                if self._online.is_set() and self.job_state().state is wanted:
                    return
            except Exception as exc:
                self._on_lost(exc, epoch)
            time.sleep(0.02)

    def job_info(self) -> dict:
        if self.store.check([p.JOB_INFO]):
            return json.loads(self.store.get(p.JOB_INFO))
        return {}


def _pack_metrics(batch: list[p.Message]) -> list[tuple[p.Message, int]]:
    """Merge runs of consecutive metrics messages into one message carrying their rows; each
    packed message comes with the number of queued messages it carries."""
    packed: list[tuple[p.Message, int]] = []
    for msg in batch:
        if isinstance(msg, p.Metrics) and packed and isinstance(packed[-1][0], p.Metrics):
            last, n = packed[-1]
            packed[-1] = (p.Metrics(last.rows + msg.rows, last.replay), n + 1)
        else:
            packed.append((msg, 1))
    return packed

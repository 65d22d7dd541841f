"""The per-job coordinator: owns membership, forms generations, detects failures.

It runs on a stable host (the launcher, or the job service) next to the TCPStore server and is
driven one ``tick()`` at a time, with the clock and the output sink injected, so tests can step
it. It never touches training state: it only decides who takes part from which step.

When its host restarts (the service was killed), a new coordinator over a new store is rebuilt
from what the workers report (``expect_reattach``, ``reattach`` messages): the workers trained on
meanwhile, and the job goes on from the most advanced state any of them holds.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.formation import Formation
from dyntrain.elastic.membership import next_generation


class Phase(enum.Enum):
    WAITING = "waiting"  # no generation runs: starting, or fewer than min workers
    RUNNING = "running"
    REFORMING = "reforming"  # the current generation ends; waiting for every member to report
    DONE = "done"
    FAILED = "failed"

    def is_terminal(self) -> bool:
        return self in (Phase.DONE, Phase.FAILED)


class Sink(Protocol):
    """Where the coordinator reports what happens (files, terminal, a service's database)."""

    def event(self, record: dict) -> None: ...
    def metrics(self, record: dict) -> None: ...
    def log(self, line: str) -> None: ...
    def result(self, record: dict) -> None: ...


@dataclass
class WorkerInfo:
    host: str = ""
    pid: int = 0
    probe: str = ""  # "address:port" it advertised (dyntrain.elastic.reach)
    inbox_read: int = 0
    heartbeat: int = -1
    heartbeat_seen: float = 0.0
    alive: bool = True
    listed: bool = True  # on this store's roster (has an inbox); False: known from before a restart


@dataclass
class Change:
    """One membership change, from request to the first step completed in the new world."""

    kind: str  # start, join, leave, crash, resume, reattach
    workers: list[str]
    requested_at: float
    detected_at: float
    world_before: int
    fields: dict = field(default_factory=dict)


@dataclass
class CoordinatorConfig:
    min_workers: int
    max_workers: int
    expected_initial: int = 1
    settle_seconds: float = 2.0
    failure_timeout: float = 10.0


class Coordinator:
    """Membership state machine over a TCPStore; call ``tick()`` in a loop."""

    def __init__(
        self,
        store: dist.Store,
        config: CoordinatorConfig,
        sink: Sink,
        find_checkpoint: Callable[[], tuple[int, str] | None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store, self.config, self.sink, self.clock = store, config, sink, clock
        self.find_checkpoint = find_checkpoint
        self.phase = Phase.WAITING
        self.current: p.Generation | None = None
        self.workers: dict[str, WorkerInfo] = {}
        self.joiners: list[str] = []
        self.ready: dict[str, int | None] = {}
        self.gone: set[str] = set()  # left gracefully or dead; never admitted again
        self.dead: set[str] = set()  # declared dead (exit, exception, lost heartbeat)
        self.last_error: str | None = None
        self.errors: dict[str, str] = {}  # worker -> the exception it reported (it exits itself)
        self.fingerprint: str | None = None
        self.job_config: dict = {}
        self.highest_step = 0
        self.last_checkpoint: tuple[int, str] | None = None
        self.failure: str | None = None
        self._roster_len = 0
        self._roster_count = 0
        self._last_hello = 0.0
        self._hello_at: dict[str, float] = {}
        self._expected: set[str] = set()
        self._expect_deadline = 0.0
        self._draining: set[str] = set()  # asked to leave; never carried into a new generation
        self._requests: dict[str, float] = {}  # worker -> when a leave/kill was requested
        self._pending: list[Change] = []  # changes folded into the next generation
        self._awaiting_first_step: list[Change] = []
        self._reformed_at = 0.0
        self._awaited: set[str] = set()  # workers of a previous coordinator not heard from yet
        self._running: set[str] = set()  # re-attached while training in the current generation
        self._reattach: Change | None = None  # set while rebuilding after a restart
        self.formation = Formation()  # generations until their first step: retries, culprits
        self.started_at = clock()
        store.set(p.GEN_LATEST, "-1")
        store.add(p.ROSTER_COUNT, 0)  # exists from the start: polled with the other keys
        store.set(p.JOB_STATE, "running")

    # ---- inputs from the launcher -------------------------------------------------------------

    def expect_reattach(self, workers: list[str], highest_step: int) -> None:
        """Rebuild after the host restarted: ``workers`` were alive under the previous
        coordinator and will report where they stand (``reattach``). Nothing is formed or
        admitted until each has re-attached or is gone. ``highest_step``: the last step the
        previous coordinator recorded (so that no re-sent metrics row counts as recomputed)."""
        now = self.clock()
        self.highest_step = highest_step
        for worker in workers:
            self.workers.setdefault(worker, WorkerInfo(heartbeat_seen=now, listed=False))
            self._awaited.add(worker)
        self._reattach = Change("reattach", [], self.started_at, now, 0)

    def awaits(self, worker: str) -> bool:
        """True for a worker of the previous coordinator that has not re-attached yet."""
        return worker in self._awaited

    def note_request(self, worker: str, at: float | None = None) -> None:
        """Remember when a leave or kill of ``worker`` was requested (for latency records)."""
        self._requests[worker] = self.clock() if at is None else at

    def request_drain(self, worker: str) -> None:
        """Ask a member to finish its current step and leave (for workers without a signal)."""
        if self.current and worker in self.current.members and self.phase is Phase.RUNNING:
            self.note_request(worker)
            self._draining.add(worker)
            self.store.set(p.ctl_key(self.current.number, worker), p.CTL_DRAIN)

    def mark_dead(self, worker: str, reason: str) -> None:
        """A worker is gone without saying so (process exit, lost heartbeat)."""
        info = self.workers.get(worker)
        if info is None or not info.alive or worker in self.gone:
            return
        info.alive = False
        self.gone.add(worker)
        self.dead.add(worker)
        self.formation.gone(worker)
        # Fence it: should a hung worker wake up, it must not act as a member again.
        self.store.set(p.reply_key(worker), f"reject:it was declared dead ({reason})")
        now = self.clock()
        self.sink.log(f"worker {worker} lost: {reason}")
        if worker in self.joiners:
            self.joiners.remove(worker)
        self.ready.pop(worker, None)
        if self.current and worker in self.current.members and not self.phase.is_terminal():
            requested = self._requests.get(worker, now)
            crashes = [c for c in self._pending if c.kind == "crash"]
            if crashes:  # the same failure (or a survivor's report of it): one event
                change = crashes[0]
                change.workers.append(worker)
                change.requested_at = min(change.requested_at, requested)
                change.fields["reason"] = reason
            else:
                self._pending.append(Change("crash", [worker], requested, now,
                                            self.current.world_size, {"reason": reason}))
            self._end_generation(p.CTL_ABORT)

    def fail(self, message: str) -> None:
        self.phase = Phase.FAILED
        self.failure = message
        self.store.set(p.JOB_STATE, f"failed:{message}")

    # ---- the loop -------------------------------------------------------------------------------

    def tick(self) -> Phase:
        """Read what workers said, check heartbeats, and form a generation when one is due."""
        if self.phase.is_terminal():
            return self.phase
        self._poll_workers()
        if self._reattach is not None:
            self._settle_reattach()
            if self._reattach is not None or self.phase.is_terminal():
                return self.phase
        self._admit_joiners()
        if self.phase in (Phase.WAITING, Phase.REFORMING):
            self._maybe_form()
        return self.phase

    def drain(self) -> None:
        """Read what workers sent after the job ended (final results, last metrics)."""
        self._read_roster()
        for worker in list(self.workers):
            info = self.workers[worker]
            key = p.inbox_count_key(worker)
            if not self.store.check([key]):
                continue
            count = int(self.store.get(key))
            for seq in range(info.inbox_read, count):
                msg = p.Message.from_json(self.store.get(p.inbox_key(worker, seq)))
                if msg.kind in ("result", "metrics"):
                    self._handle(msg)
            info.inbox_read = count

    def settled(self) -> bool:
        """True when a generation runs and every change so far has completed a step in it."""
        return self.phase is Phase.RUNNING and not self._pending and not self._awaiting_first_step

    def live_workers(self) -> list[str]:
        return [w for w, info in self.workers.items() if info.alive and w not in self.gone]

    # ---- internals ------------------------------------------------------------------------------

    def _read_roster(self) -> None:
        if not self.store.check([p.ROSTER]):
            return
        names = self.store.get(p.ROSTER).decode().split()
        for worker in names[self._roster_len :]:
            info = self.workers.get(worker)
            if info is None or not info.listed:
                # polled from now on with the others (multi_get waits for missing keys)
                self.store.add(p.heartbeat_key(worker), 0)
                if info is None:
                    self.workers[worker] = WorkerInfo(heartbeat_seen=self.clock())
                info = self.workers[worker]
                info.listed = True
        self._roster_len = len(names)

    def _poll_workers(self) -> None:
        """One round trip for the roster count and every live worker's inbox count and
        heartbeat (the steady state's only store traffic), then new messages. Workers of a
        previous coordinator that have not re-attached yet have no keys here: they are only
        timed out."""
        while True:
            watched = [w for w in self.live_workers() if self.workers[w].listed]
            keys = [p.ROSTER_COUNT, *(p.inbox_count_key(w) for w in watched),
                    *(p.heartbeat_key(w) for w in watched)]
            values = self.store.multi_get(keys)
            if int(values[0]) == self._roster_count:
                break
            self._roster_count = int(values[0])
            self._read_roster()  # newcomers: poll again with them
        counts = dict(zip(watched, values[1 : len(watched) + 1], strict=True))
        now = self.clock()
        for worker, raw in zip(watched, values[len(watched) + 1 :], strict=True):
            info = self.workers[worker]
            if int(raw) != info.heartbeat:
                info.heartbeat, info.heartbeat_seen = int(raw), now
        for worker in watched:
            self._read_inbox(worker, int(counts[worker]))
            if self.phase.is_terminal():
                return
        for worker in self.live_workers():
            info = self.workers[worker]
            if info.alive and now - info.heartbeat_seen > self.config.failure_timeout:
                self.mark_dead(worker, f"no heartbeat for {self.config.failure_timeout:g} s")

    def _read_inbox(self, worker: str, count: int) -> None:
        info = self.workers[worker]
        if count <= info.inbox_read:
            return
        keys = [p.inbox_key(worker, seq) for seq in range(info.inbox_read, count)]
        for seq, raw in zip(range(info.inbox_read, count), self.store.multi_get(keys),
                            strict=True):
            self.store.delete_key(p.inbox_key(worker, seq))
            info.inbox_read = seq + 1
            self._handle(p.Message.from_json(raw))
            if self.phase.is_terminal():
                return

    def _handle(self, msg: p.Message) -> None:
        handler = getattr(self, f"_on_{msg.kind}", None)
        if handler is None:
            self.sink.log(f"ignored unknown message {msg.kind!r} from {msg.worker}")
            return
        handler(msg.worker, msg.fields)

    def _greet(self, worker: str, f: dict) -> bool:
        """Register a worker that said hello or re-attached; False if its settings differ."""
        info = self.workers.setdefault(worker, WorkerInfo())
        info.host, info.pid, info.heartbeat_seen = f.get("host", ""), f.get("pid", 0), self.clock()
        info.probe = f.get("probe", "")
        self._awaited.discard(worker)
        if self.fingerprint is None:
            self.fingerprint, self.job_config = f["fingerprint"], f.get("config", {})
        elif f["fingerprint"] != self.fingerprint:
            self.store.set(p.reply_key(worker), "reject:its training settings differ from the "
                           f"job's ({f.get('config')} vs {self.job_config})")
            info.alive = False
            self.gone.add(worker)
            self.sink.log(f"rejected worker {worker}: settings differ from the job's")
            return False
        return True

    def _on_hello(self, worker: str, f: dict) -> None:
        if self._greet(worker, f):
            self._join(worker)

    def _join(self, worker: str) -> None:
        info = self.workers[worker]
        self.joiners.append(worker)
        self._last_hello = self._hello_at[worker] = self.clock()
        self.sink.log(f"worker {worker} ({info.host} pid {info.pid}) wants to join")

    def _on_reattach(self, worker: str, f: dict) -> None:
        """A worker of the previous coordinator reports its state, generation and step."""
        if not self._greet(worker, f):
            return
        if self._reattach is None:  # not announced by the host: rebuild from the reports alone
            self._reattach = Change("reattach", [], self.started_at, self.clock(), 0)
        self._reattach.workers.append(worker)
        self.sink.log(f"worker {worker} re-attached: {f['state']} at step {f.get('step')}")
        if f["state"] == "done":
            self._on_done(worker, f)
            return
        gen = p.Generation.from_json(f["generation"]) if f.get("generation") else None
        if gen is None:
            self._join(worker)
            return
        if self.current is None or gen.number > self.current.number:
            self._adopt(gen)
        if f["state"] == "running" and gen.number == self.current.number:
            self._running.add(worker)
            fields = self._reattach.fields
            fields["start_step"] = max(fields.get("start_step", 0), f.get("step") or 0)
            return
        self.ready[worker] = f.get("step")
        if f["state"] == "running":  # still in an older generation: it must stop there
            self.store.set(p.ctl_key(gen.number, worker), p.CTL_ABORT)

    def _adopt(self, gen: p.Generation) -> None:
        """Take over the newest generation a re-attaching worker reports; it trains on."""
        now = self.clock()
        self.current, self.phase = gen, Phase.REFORMING
        self._reattach.world_before = gen.world_size
        for worker in gen.members:
            self.workers.setdefault(worker, WorkerInfo(heartbeat_seen=now, listed=False))
            self.store.set(p.ctl_key(gen.number, worker), p.CTL_RUN)

    def _settle_reattach(self) -> None:
        """Once every worker of the previous coordinator re-attached or is gone, go on: with the
        same generation if all its members still train in it, else with the next one."""
        if self._awaited - self.gone or self.phase.is_terminal():
            return
        change, self._reattach = self._reattach, None
        gen, now = self.current, self.clock()
        if gen is not None and all(w in self._running for w in gen.members):
            self.phase = Phase.RUNNING
            change.fields.update(generation=gen.number, reformed_at=now,
                                 world_after=gen.world_size, steps_redone=0, origin="members")
            self._awaiting_first_step.append(change)
        else:
            self._pending.append(change)
            if gen is not None:
                self._end_generation(p.CTL_ABORT)
            else:
                self.phase = Phase.WAITING
        self._running.clear()

    def expect_joiners(self, workers: list[str], within: float) -> None:
        """Admit these soon-to-arrive workers together: hold joins until all said hello (or
        ``within`` seconds passed), so that adding K workers re-forms the group once."""
        self._expected = set(workers)
        self._expect_deadline = self.clock() + within

    def _admit_joiners(self) -> None:
        if self.phase is not Phase.RUNNING or not self.joiners:
            return
        if self.current.world_size >= self.config.max_workers:
            return
        missing = [w for w in self._expected if w not in self._hello_at and w not in self.gone]
        if missing and self.clock() < self._expect_deadline:
            return
        self._expected = set()
        self._end_generation(p.CTL_REFORM)

    def _on_ready(self, worker: str, f: dict) -> None:
        self.formation.reported(worker, f["gen"], f)
        if self.current is None or f["gen"] != self.current.number:
            # a stale report from a generation that is already over: the worker is waiting anyway
            if worker not in self.joiners and worker not in self.gone and worker not in self.ready:
                self.ready[worker] = f.get("step")
            return
        self.ready[worker] = f.get("step")
        self._running.discard(worker)
        if self.phase is Phase.RUNNING and f.get("reason") == "boundary":
            # the members agreed (through the step's all-reduce) to re-form after this step
            self.phase = Phase.REFORMING
        elif self.phase is Phase.RUNNING:
            # a member left the generation on its own: a collective failed under it, or it
            # could not reach a peer (that one is removed once all have reported: _remove)
            now = self.clock()
            if f.get("reason") != "unreachable":
                self._pending.append(Change("crash", [], now, now, self.current.world_size,
                                            {"reason": f.get("reason", "")}))
            self._end_generation(p.CTL_ABORT)

    def _on_left(self, worker: str, f: dict) -> None:
        self.gone.add(worker)
        self.formation.gone(worker)
        self.ready.pop(worker, None)
        if worker in self.joiners:
            self.joiners.remove(worker)
        now = self.clock()
        if self.current and worker in self.current.members:
            change = Change("leave", [worker], self._requests.get(worker, now), now,
                            self.current.world_size, {"step": f.get("step")})
            self._pending.append(change)
            if f.get("gen") != self.current.number:
                # It left while waiting for this generation (told to leave before it found it):
                # the other members wait for it in the group's creation. Abort it.
                self._end_generation(p.CTL_ABORT)
            elif self.phase is Phase.RUNNING:
                self.phase = Phase.REFORMING
        self.sink.log(f"worker {worker} left after step {f.get('step')}")

    def _on_metrics(self, worker: str, f: dict) -> None:
        for row in f.get("rows", [f]):
            if not f.get("replay") or row["step"] > self.highest_step:  # replay: see channel
                self._on_metrics_row(row)

    def _on_metrics_row(self, f: dict) -> None:
        f["recomputed"] = f["step"] <= self.highest_step
        self.highest_step = max(self.highest_step, f["step"])
        f["time"] = f.get("time", self.clock())
        self.sink.metrics(f)
        if self.current is not None and f.get("gen") == self.current.number:
            self.formation.stepped(self.current.number)
            # (a re-attached generation's rows from while its coordinator was away come first)
            due = [c for c in self._awaiting_first_step
                   if c.kind != "reattach" or f["time"] >= c.fields["reformed_at"]]
            for change in due:
                change.fields["first_step_at"] = f["time"]
                if "state_sync_s" in f:  # the leader's time in this generation's hand-over
                    change.fields["state_sync_s"] = f["state_sync_s"]
                self._emit(change)
            self._awaiting_first_step = [c for c in self._awaiting_first_step if c not in due]

    def _on_checkpoint(self, worker: str, f: dict) -> None:
        self.last_checkpoint = (f["step"], f["path"])

    def _on_result(self, worker: str, f: dict) -> None:
        self.sink.result(f)

    def _on_done(self, worker: str, f: dict) -> None:
        self.phase = Phase.DONE
        self.store.set(p.JOB_STATE, "done")
        self.sink.log(f"job finished at step {f.get('step')}")

    def _on_error(self, worker: str, f: dict) -> None:
        # An exception is one worker's crash (a bad GPU, an OOM): the others carry on. A bug that
        # fails everywhere ends the job once every worker is gone; last_error then says why.
        self.last_error = f"{worker}: {f.get('message')}"
        self.errors[worker] = str(f.get("message"))
        self.mark_dead(worker, f"raised {f.get('message')}")

    def _end_generation(self, ctl: str) -> None:
        """Tell every member of the current generation to stop at the next boundary (or now)."""
        if self.phase is Phase.REFORMING and ctl != p.CTL_ABORT:
            return
        self.phase = Phase.REFORMING
        for worker in self.current.members:
            if worker in self.gone or (ctl == p.CTL_REFORM and worker in self._draining):
                continue  # a drained member leaves at the boundary (its leave flag re-forms)
            self.store.set(p.ctl_key(self.current.number, worker), ctl)

    def _accounted(self) -> bool:
        members = self.current.members if self.current else ()
        return all(w in self.ready or w in self.gone for w in members)

    def _maybe_form(self) -> None:
        if not self._accounted():
            return
        cfg, now = self.config, self.clock()
        if not self._formation_allows(now):
            return
        if self.current is None:
            enough = len(self.joiners) >= min(cfg.expected_initial, cfg.max_workers)
            settled = (len(self.joiners) >= cfg.min_workers
                       and now - self._last_hello >= cfg.settle_seconds)
            if not (enough or settled):
                return
        for worker in self._draining & set(self.ready):
            # drained, but the generation was aborted before its boundary: leave now
            self.store.set(p.reply_key(worker), "leave")
            self.ready.pop(worker)
        ready = {w: s for w, s in self.ready.items() if w not in self.gone}
        missing = [w for w in self._expected if w not in self._hello_at and w not in self.gone]
        if not ready and missing and now < self._expect_deadline:
            return  # nothing runs anyway: start the announced workers together
        if len(ready) + len(self.joiners) < cfg.min_workers:
            if self.phase is Phase.REFORMING:
                self.phase = Phase.WAITING
                self.sink.log(f"waiting for workers: {len(ready) + len(self.joiners)} available, "
                              f"need {cfg.min_workers}")
            return
        holders = [s for s in ready.values() if s is not None]
        checkpoint = None if holders else self.find_checkpoint()
        number = self.current.number + 1 if self.current else 0
        gen = next_generation(number, self.current.members if self.current else (), ready,
                              self.joiners, cfg.min_workers, cfg.max_workers, checkpoint)
        if gen is not None:  # enough workers were checked above
            self._publish(gen, now)

    def _formation_allows(self, now: float) -> bool:
        """Settle an ended generation that never stepped (remove whom its peers cannot reach,
        back off, give up); False while the next one must wait."""
        verdict = self.formation.conclude(now)
        for line in verdict.log:
            self.sink.log(line)
        for worker, why in verdict.remove.items():
            self._remove(worker, why)
        if verdict.fail:
            self.fail(verdict.fail)
            return False
        return now >= self.formation.not_before

    def _remove(self, worker: str, why: str) -> None:
        """Take a worker out of a generation that never stepped with it, and tell it why."""
        info = self.workers.get(worker)
        if info is None or worker in self.gone:
            return
        info.alive = False
        self.gone.add(worker)
        self.store.set(p.reply_key(worker), f"reject:{why}")
        self.sink.log(f"worker {worker} removed: {why}")
        self.ready.pop(worker, None)
        if worker in self.joiners:
            self.joiners.remove(worker)
        changes = self._pending + self._awaiting_first_step
        for change in changes:  # a join it was part of never happened for it
            if change.kind in ("join", "start") and worker in change.workers:
                change.workers.remove(worker)
        self._pending = [c for c in self._pending if c.workers or c.kind != "join"]
        self._awaiting_first_step = [c for c in self._awaiting_first_step
                                     if c.workers or c.kind != "join"]
        now = self.clock()
        self._pending.append(Change("removed", [worker], now, now,
                                    len(self.formation.trained), {"reason": why}))

    def _publish(self, gen: p.Generation, now: float) -> None:
        gen = replace(gen, probes=tuple(self.workers[w].probe if w in self.workers else ""
                                        for w in gen.members))
        self.formation.published(gen.number, gen.members, gen.probes)
        for worker in gen.members:
            self.store.set(p.ctl_key(gen.number, worker), p.CTL_RUN)
        self.store.set(p.gen_key(gen.number), gen.to_json())
        self.store.set(p.GEN_LATEST, str(gen.number))
        self.joiners = [w for w in self.joiners if w not in gen.members]
        self.ready = {w: s for w, s in self.ready.items() if w not in gen.members}
        if gen.checkpoint or gen.fresh:
            kind = "resume" if gen.checkpoint else "start"
            self._pending.append(Change(kind, list(gen.members), now, now, 0))
            self._expected = set()
        else:
            previous = self.current.members if self.current else ()
            admitted = [w for w in gen.members if w in self._hello_at and w not in previous]
            if admitted:
                asked = max(self._hello_at[w] for w in admitted)
                survivors = gen.world_size - len(admitted)
                self._pending.append(Change("join", admitted, asked, asked, survivors))
        redone = max(0, self.highest_step - gen.start_step) if self.current else 0
        # changes whose world never completed a step are reported with this one
        self._awaiting_first_step += self._pending
        origin = "checkpoint" if gen.checkpoint else "fresh" if gen.fresh else "members"
        for change in self._awaiting_first_step:
            change.fields.update(generation=gen.number, reformed_at=now, world_after=gen.world_size,
                                 start_step=gen.start_step, steps_redone=redone, origin=origin)
        self._pending = []
        self.current, self.phase = gen, Phase.RUNNING
        origin = (f"checkpoint {gen.checkpoint}" if gen.checkpoint
                  else "fresh start" if gen.fresh else f"state of {gen.source}")
        self.sink.log(f"generation {gen.number}: {gen.world_size} worker(s) {list(gen.members)} "
                      f"from step {gen.start_step} ({origin})")

    def _emit(self, change: Change) -> None:
        t0 = self.started_at
        record = {
            "event": change.kind,
            "workers": change.workers,
            "world_before": change.world_before,
            "requested_at": round(change.requested_at - t0, 4),
            "detected_at": round(change.detected_at - t0, 4),
            **{k: v for k, v in change.fields.items() if not k.endswith("_at")},
            "reformed_at": round(change.fields["reformed_at"] - t0, 4),
            "first_step_at": round(change.fields["first_step_at"] - t0, 4),
        }
        record["latency_s"] = round(change.fields["first_step_at"] - change.requested_at, 4)
        self.sink.event(record)

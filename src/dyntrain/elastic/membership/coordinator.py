"""The per-job coordinator: owns membership, forms generations, detects failures.

It runs on a stable host (the launcher, or the job service) next to the TCPStore server and is
driven one ``tick()`` at a time, with the clock and the output sink injected, so tests can step
it. It never touches training state: it only decides who takes part from which step.

The loop is thin: it reads the store (``intake.Intake`` over ``board.CoordinatorBoard``), hands
each typed message (``protocol``) to its handler, which updates the membership's named sets
(``members.Membership``) and the changes to report (``changes.ChangeLog``), and writes what
the pure decisions (``members.decide_forming``, ``formation.Formation``) say.

When its host restarts (the service was killed), a new coordinator over a new store is rebuilt
from what the workers report (``expect_reattach``, ``Reattach`` messages): the workers trained
on meanwhile, and the job goes on from the most advanced state any of them holds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.admission import Candidate, NumericsRecord, judge
from dyntrain.elastic.membership.board import CoordinatorBoard
from dyntrain.elastic.membership.changes import Change, ChangeLog, EventKind
from dyntrain.elastic.membership.formation import Formation
from dyntrain.elastic.membership.intake import Intake
from dyntrain.elastic.membership.members import CoordinatorConfig, Membership, decide_forming
from dyntrain.elastic.membership.phases import JobRecord, Phase, Sink

__all__ = ["REATTACH_WAIT", "Coordinator"]

#: seconds a worker of a previous coordinator has to re-attach (``expect_reattach``) when the
#: failure timeout is shorter
REATTACH_WAIT = 10.0


class Coordinator:
    """Membership state machine over a TCPStore; call ``tick()`` in a loop.

    Args:
        store: The job's TCPStore (the coordinator writes its initial keys at once).
        config: Worker counts and timeouts.
        sink: Where events, metrics rows, log lines and results go.
        find_checkpoint: Returns the newest valid checkpoint ``(step, where)``, or None; asked
            only when no worker holds state. It may raise (a run folder that cannot be read);
            the host then fails the job rather than start over.
        clock: Seconds (``time.time`` by default; a fake one in tests).
        numerics: The job's numerics as its run folder recorded them (a resumed run), or None:
            the first worker that runs ``config.numerics`` defines them.
    """

    def __init__(self, store: dist.Store, config: CoordinatorConfig, sink: Sink,
                 find_checkpoint: Callable[[], tuple[int, str] | None],
                 clock: Callable[[], float] = time.time,
                 numerics: NumericsRecord | None = None) -> None:
        self.config, self.sink, self.clock = config, sink, clock
        self.find_checkpoint = find_checkpoint
        self.phase = Phase.WAITING
        self.membership = Membership()
        self.changes = ChangeLog()
        self.formation = Formation()  # generations until their first step: retries, culprits
        self.job = JobRecord(numerics=numerics)
        self.started_at = clock()
        self.board = CoordinatorBoard(store)
        self.intake = Intake(self.board, self.membership, config, sink, clock)
        self._aborted: int | None = None  # the last generation whose members were told ABORT
        self._handlers: dict[type[p.Message], Callable] = {
            p.Hello: self._on_hello, p.Reattach: self._on_reattach, p.Ready: self._on_ready,
            p.Left: self._on_left, p.Metrics: self._on_metrics,
            p.Checkpoint: self._on_checkpoint, p.Done: self._on_done,
            p.Result: self._on_result, p.Error: self._on_error}

    # ---- what the hosts read ------------------------------------------------------------------

    @property
    def current(self) -> p.Generation | None:
        """The current (last published, or adopted) generation."""
        return self.membership.current

    @property
    def failure(self) -> str | None:
        return self.job.failure

    @property
    def job_config(self) -> dict:
        return self.job.config

    def settled(self) -> bool:
        """True when a generation runs and every change so far has completed a step in it."""
        return self.phase is Phase.RUNNING and self.changes.settled()

    def live_workers(self) -> list[str]:
        return self.membership.live()

    def awaits(self, worker: str) -> bool:
        """True for a worker of the previous coordinator that has not re-attached yet."""
        return worker in self.membership.awaited

    # ---- inputs from the host -----------------------------------------------------------------

    def expect_reattach(self, workers: list[str], highest_step: int) -> None:
        """Rebuild after the host restarted: ``workers`` were alive under the previous
        coordinator and will report where they stand (``Reattach``). Nothing is formed or
        admitted until each has re-attached or is gone. ``highest_step``: the last step the
        previous coordinator recorded (so that no re-sent metrics row counts as recomputed)."""
        now = self.clock()
        self.job.highest_step = highest_step
        self.membership.await_reattach(workers, now)
        self.changes.reattach = Change(EventKind.REATTACH, [], self.started_at, now, 0)

    def expect_joiners(self, workers: list[str], within: float,
                       requested_at: float | None = None) -> None:
        """Admit these soon-to-arrive workers together: hold joins until all said hello (or
        ``within`` seconds passed), so that adding K workers re-forms the group once. Their
        join's latency counts from ``requested_at`` (default: now), when they were asked for,
        not from their hello."""
        now = self.clock()
        self.membership.expected = set(workers)
        self.membership.expect_deadline = now + within
        for worker in workers:
            self.note_request(worker, now if requested_at is None else requested_at)

    def note_request(self, worker: str, at: float | None = None) -> None:
        """Remember when a leave or kill of ``worker`` was requested (for latency records)."""
        self.membership.requested[worker] = self.clock() if at is None else at

    def request_drain(self, worker: str) -> None:
        """Ask a member to finish its current step and leave (for workers without a signal)."""
        m = self.membership
        if m.in_current(worker) and self.phase is Phase.RUNNING:
            self.note_request(worker)
            m.draining.add(worker)
            self.board.tell(m.current.number, worker, p.Control.DRAIN)

    def release(self, worker: str) -> None:
        """Tell a worker that waits for a generation to leave instead."""
        self.board.reply(worker, p.Reply(p.ReplyKind.LEAVE))

    def mark_dead(self, worker: str, reason: str) -> None:
        """A worker is gone without saying so (process exit, lost heartbeat)."""
        m = self.membership
        if worker not in m.known or worker in m.gone:
            return
        # Fence it: should a hung or cut-off worker come back, it must not act as a member
        # again. It is told so (its generation is aborted, its id is dead) and whatever it
        # sends is refused (``_handle``).
        m.fence(worker)
        self.formation.gone(worker)
        self.board.reply(worker, p.Reply(p.ReplyKind.DEAD, reason))
        if m.in_current(worker):
            self.board.tell(m.current.number, worker, p.Control.ABORT)
        now = self.clock()
        self.sink.log(f"worker {worker} lost: {reason}")
        if m.in_current(worker) and not self.phase.is_terminal():
            self.changes.crash(worker, m.requested.get(worker, now), now,
                               m.current.world_size, reason)
            self._end_generation(p.Control.ABORT)

    def fail(self, message: str) -> None:
        self.phase = Phase.FAILED
        self.job.failure = message
        self.board.set_job(p.JobVerdict(p.JobState.FAILED, message))

    # ---- the loop -------------------------------------------------------------------------------

    def tick(self) -> Phase:
        """Read what workers said, check heartbeats, and form a generation when one is due."""
        if self.phase.is_terminal():
            return self.phase
        self._poll_workers()
        if self.changes.reattach is not None:
            self._settle_reattach()
            if self.changes.reattach is not None or self.phase.is_terminal():
                return self.phase
        if self.phase is Phase.RUNNING and \
                self.membership.admission_due(self.config.max_workers, self.clock()):
            self.membership.expected = set()
            self._end_generation(p.Control.REFORM)
        if self.phase in (Phase.WAITING, Phase.REFORMING):
            self._maybe_form()
        return self.phase

    def drain(self) -> None:
        """Read what workers sent after the job ended (final results, last metrics)."""
        for worker, msg in self.intake.leftovers():
            if isinstance(msg, (p.Result, p.Metrics)):
                self._handle(worker, msg)

    # ---- reading the store ----------------------------------------------------------------------

    def _poll_workers(self) -> None:
        """One poll of the store (``intake.Intake``), then every new message, in order; a
        live worker whose heartbeat stopped is declared dead."""
        m = self.membership
        now, counts = self.intake.poll()
        for worker, count in counts:
            for msg in self.intake.messages(worker, count):
                self._handle(worker, msg)
                if self.phase.is_terminal():
                    return
        for worker in m.live():
            limit = m.known[worker].overdue(now, self.config.failure_timeout, REATTACH_WAIT)
            if limit is not None:
                self.mark_dead(worker, f"no heartbeat for {limit:g} s")

    def _handle(self, worker: str, msg: p.Message) -> None:
        if worker in self.membership.dead:
            # fenced: a worker declared dead that came back (a frozen process, a partition
            # that healed) acts for a generation that was abandoned
            self.sink.log(f"refused {msg.kind!r} from {worker}: it was declared dead")
            return
        self._handlers[type(msg)](worker, msg)

    def _of_current(self, worker: str, kind: str, generation: int | None) -> bool:
        """Whether a message that acts for ``generation`` acts for the current one; a refusal
        is logged."""
        if self.membership.is_current(generation):
            return True
        now = self.current.number if self.current else None
        self.sink.log(f"refused {kind!r} from {worker}: it is for generation {generation}, "
                      f"the current one is {now}")
        return False

    # ---- the messages -----------------------------------------------------------------------

    def _greet(self, worker: str, hello: p.Hello) -> bool:
        """Register a worker that said hello or re-attached; False if its settings differ from
        the job's or it computes other bits (``admission.judge``)."""
        self.membership.greet(worker, hello, self.clock())
        if self.job.fingerprint is not None and hello.fingerprint != self.job.fingerprint:
            return self._reject(worker, "its training settings differ from the job's "
                                        f"({hello.config} vs {self.job.config})",
                                "settings differ from the job's")
        verdict = judge(self.config.numerics, self.job.numerics,
                        Candidate(worker, hello.host, hello.numerics, hello.canary),
                        self.job.highest_step, self.config.allow_mixed_numerics)
        if not verdict.admit:
            return self._reject(worker, verdict.reason, verdict.reason)
        if verdict.changed:
            self.job.numerics = verdict.record
            self.sink.numerics(verdict.record)
        if verdict.reason:  # admitted although it computes other bits: said, and recorded
            self.sink.log(verdict.reason)
        if self.job.fingerprint is None:
            self.job.fingerprint, self.job.config = hello.fingerprint, hello.config
        return True

    def _reject(self, worker: str, told: str, logged: str) -> bool:
        self.board.reply(worker, p.Reply(p.ReplyKind.REJECT, told))
        self.membership.gone.add(worker)
        self.sink.log(f"rejected worker {worker}: {logged}")
        return False

    def _on_hello(self, worker: str, msg: p.Hello) -> None:
        if self._greet(worker, msg):
            self._join(worker)

    def _join(self, worker: str) -> None:
        m = self.membership
        info = m.known[worker]
        m.joining.append(worker)
        m.last_hello = m.hello_at[worker] = self.clock()
        self.sink.log(f"worker {worker} ({info.host} pid {info.pid}) wants to join")

    def _on_reattach(self, worker: str, msg: p.Reattach) -> None:
        """A worker of the previous coordinator reports its state, generation and step."""
        if not self._greet(worker, msg.hello):
            return
        m, where = self.membership, msg.position
        if self.changes.reattach is None:  # not announced by the host: rebuild from reports
            self.changes.reattach = Change(EventKind.REATTACH, [], self.started_at,
                                           self.clock(), 0)
        self.changes.reattach.workers.append(worker)
        self.sink.log(f"worker {worker} re-attached: {where.state} at step {where.step}")
        if where.state is p.WorkerState.DONE:
            self._finish(where.step)
            return
        gen = where.generation
        if gen is None:
            self._join(worker)
            return
        if m.current is None or gen.number > m.current.number:
            # the newest generation a re-attaching worker reports: take it over, it trains on
            m.adopt(gen, self.clock())
            self.phase = Phase.REFORMING
            self.changes.reattach.world_before = gen.world_size
            self.board.tell_all(gen.number, list(gen.members), p.Control.RUN)
        if m.rejoined(worker, where):
            fields = self.changes.reattach.fields
            fields["start_step"] = max(fields.get("start_step", 0), where.step or 0)
        elif where.state is p.WorkerState.RUNNING:  # still in an older generation: stop there
            self.board.tell(gen.number, worker, p.Control.ABORT)

    def _settle_reattach(self) -> None:
        """Once every worker of the previous coordinator re-attached or is gone, go on: with the
        same generation if all its members still train in it, else with the next one."""
        m = self.membership
        if m.awaited - m.gone or self.phase.is_terminal():
            return
        change, self.changes.reattach = self.changes.reattach, None
        if m.survived():
            self.phase = Phase.RUNNING
            self.changes.went_on(change, m.current, self.clock())
        else:
            self.changes.add(change)
            if m.current is not None:
                self._end_generation(p.Control.ABORT)
            else:
                self.phase = Phase.WAITING
        m.still_running.clear()

    def _on_ready(self, worker: str, msg: p.Ready) -> None:
        m = self.membership
        self.formation.reported(worker, msg)
        if not m.reported(worker, msg):
            return  # a stale report from a generation that is over: the worker waits anyway
        if self.phase is Phase.RUNNING and msg.reason is p.ReadyReason.BOUNDARY:
            # the members agreed (through the step's all-reduce) to re-form after this step
            self.phase = Phase.REFORMING
        elif self.phase is Phase.RUNNING:
            # a member left the generation on its own: a collective failed under it, or it
            # could not reach a peer (that one is removed once all have reported: _remove)
            now = self.clock()
            if msg.reason is not p.ReadyReason.UNREACHABLE:
                self.changes.add(Change(EventKind.CRASH, [], now, now, m.current.world_size,
                                        {"reason": msg.describe()}))
            self._end_generation(p.Control.ABORT)

    def _on_left(self, worker: str, msg: p.Left) -> None:
        m = self.membership
        m.leave(worker)
        self.formation.gone(worker)
        now = self.clock()
        if m.in_current(worker):
            self.changes.add(Change(EventKind.LEAVE, [worker], m.requested.get(worker, now),
                                    now, m.current.world_size, {"step": msg.step}))
            if msg.gen != m.current.number:
                # It left while waiting for this generation (told to leave before it found it):
                # the other members wait for it in the group's creation. Abort it.
                self._end_generation(p.Control.ABORT)
            elif self.phase is Phase.RUNNING:
                self.phase = Phase.REFORMING
        self.sink.log(f"worker {worker} left after step {msg.step}")

    def _on_metrics(self, worker: str, msg: p.Metrics) -> None:
        for row in msg.rows:
            if msg.replay:  # re-sent after a re-attach: see channel
                if row["step"] > self.job.highest_step:
                    self._on_metrics_row(row)
            elif self._of_current(worker, p.Metrics.kind, row.get("gen")):
                self._on_metrics_row(row)

    def _on_metrics_row(self, row: dict) -> None:
        self.job.stepped(row, self.clock())
        self.sink.metrics(row)
        if self.membership.is_current(row.get("gen")):
            self.formation.stepped(self.current.number)
            # the leader's group connect and hand-over times come with its first step
            extra = {k: row[k] for k in ("state_sync_s", "group_connect_s") if k in row}
            for change in self.changes.stepped(row["time"], extra):
                self.sink.event(change.record(self.started_at))

    def _on_checkpoint(self, worker: str, msg: p.Checkpoint) -> None:
        # (no generation: written between generations, of the state the worker holds)
        if msg.gen is not None and not self._of_current(worker, msg.kind, msg.gen):
            return
        if msg.error:
            self.sink.log(f"{worker}: {msg.error}")
        else:
            self.job.last_checkpoint = (msg.step, msg.path)

    def _on_result(self, worker: str, msg: p.Result) -> None:
        if self._of_current(worker, msg.kind, msg.gen):
            self.sink.result(dict(msg.values))

    def _on_done(self, worker: str, msg: p.Done) -> None:
        if self._of_current(worker, msg.kind, msg.gen):
            self._finish(msg.step)

    def _finish(self, step: int | None) -> None:
        self.phase = Phase.DONE
        self.board.set_job(p.JobVerdict(p.JobState.DONE))
        self.sink.log(f"job finished at step {step}")

    def _on_error(self, worker: str, msg: p.Error) -> None:
        # An exception is one worker's crash (a bad GPU, an OOM): the others carry on. A bug that
        # fails everywhere ends the job once every worker is gone; last_error then says why.
        self.job.last_error = f"{worker}: {msg.message}"
        self.job.errors[worker] = msg.message
        self.mark_dead(worker, f"raised {msg.message}")

    # ---- generations ------------------------------------------------------------------------

    def _end_generation(self, word: p.Control) -> None:
        """Tell every member of the current generation to stop at the next boundary (or now)."""
        if self.phase is Phase.REFORMING and word is not p.Control.ABORT:
            return
        m = self.membership
        if self._aborted == m.current.number:
            return  # its members were told already (half of a large world lost at once)
        self.phase = Phase.REFORMING
        # a drained member leaves at the boundary (its leave flag re-forms)
        told = [w for w in m.current.members
                if w not in m.gone and not (word is p.Control.REFORM and w in m.draining)]
        self.board.tell_all(m.current.number, told, word)  # one round trip
        if word is p.Control.ABORT:
            self._aborted = m.current.number

    def _maybe_form(self) -> None:
        m = self.membership
        if not m.accounted():
            return
        now = self.clock()
        if not self._formation_allows(now):
            return
        forming = decide_forming(m, self.config, now, self.find_checkpoint)
        for worker in forming.release:
            # drained, but the generation was aborted before its boundary: leave now
            self.release(worker)
            m.ready.pop(worker)
        if forming.short is not None and self.phase is Phase.REFORMING:
            self.phase = Phase.WAITING
            self.sink.log(f"waiting for workers: {forming.short} available, "
                          f"need {self.config.min_workers}")
        if forming.generation is not None:
            self._publish(forming.generation, now)

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
        m = self.membership
        if worker not in m.known or worker in m.gone:
            return
        m.leave(worker)
        self.board.reply(worker, p.Reply(p.ReplyKind.REJECT, why))
        self.sink.log(f"worker {worker} removed: {why}")
        self.changes.removed(worker, self.clock(), len(self.formation.trained), why)

    def _publish(self, gen: p.Generation, now: float) -> None:
        m = self.membership
        gen = replace(gen, probes=tuple(m.known[w].probe if w in m.known else ""
                                        for w in gen.members))
        self.formation.published(gen.number, gen.members, gen.probes)
        self.board.publish(gen)
        redone = max(0, self.job.highest_step - gen.start_step) if m.current else 0
        admitted = m.install(gen)
        if gen.checkpoint or gen.fresh:
            kind = EventKind.RESUME if gen.checkpoint else EventKind.START
            self.changes.add(Change(kind, list(gen.members), now, now, 0))
            m.expected = set()
        elif admitted:
            # from the request that started them (an event, capacity that appeared), else from
            # their hello; a worker ready before a leave or crash this generation takes in (it
            # waited on standby), from that change's request; ``detected_at``: the last ready
            room = min((c.requested_at for c in self.changes.pending
                        if c.kind in (EventKind.LEAVE, EventKind.CRASH)), default=None)
            ready = max(m.hello_at[w] for w in admitted)
            asked = min(max(m.requested.pop(w, m.hello_at[w]), room)
                        if room is not None and m.hello_at[w] < room
                        else m.requested.pop(w, m.hello_at[w]) for w in admitted)
            self.changes.add(Change(EventKind.JOIN, admitted, asked,
                                    max(asked, ready), gen.world_size - len(admitted)))
        origin = "checkpoint" if gen.checkpoint else "fresh" if gen.fresh else "members"
        self.changes.published(gen, now, redone, origin)
        self.phase = Phase.RUNNING
        source = (f"checkpoint {gen.checkpoint}" if gen.checkpoint
                  else "fresh start" if gen.fresh else f"state of {gen.source}")
        self.sink.log(f"generation {gen.number}: {gen.world_size} worker(s) {list(gen.members)} "
                      f"from step {gen.start_step} ({source})")

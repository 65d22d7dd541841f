"""``dyntrain run``: host the coordinator, start local workers, inject events, report progress."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TextIO

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.membership.coordinator import Coordinator
from dyntrain.elastic.membership.members import CoordinatorConfig
from dyntrain.elastic.membership.phases import Phase
from dyntrain.elastic.numerics import NUMERICS_FILE, Numerics, host_refusal, merge_pin
from dyntrain.elastic.runs.checkpoints import latest_valid_checkpoint
from dyntrain.elastic.runs.folder import read_numerics
from dyntrain.elastic.runs.rows import EventKind, EventRow
from dyntrain.elastic.runs.storage import RunStore, StorageError, open_store
from dyntrain.elastic.worker.address import is_wildcard, machine_addresses
from dyntrain.elastic.worker.succession import Takeover
from dyntrain.errors import EXIT_FAILED, EXIT_USAGE, ConfigError, DyntrainError
from dyntrain.launch import forkserver
from dyntrain.launch.chaos import Chaos
from dyntrain.launch.chaos_driver import ChaosDriver
from dyntrain.launch.events import Event, EventSchedule, choose_targets
from dyntrain.launch.fit import (
    Machine,
    cores_note,
    join_fit,
    join_short_line,
    memory_refusal,
    nproc_refusal,
    peak_local_workers,
    peak_note,
)
from dyntrain.launch.interrupt import StopSignals, stop_workers
from dyntrain.launch.local import SIGNALS, LocalWorkers, start_fork_server
from dyntrain.launch.sink import FIRED_FILE, RunSink
from dyntrain.launch.successor import Superseded, claim
from dyntrain.procstat import memory_available_mib

TICK_SECONDS = 0.01
# A worker that reported an exception exits by itself, printing its traceback into its log;
# it is killed only if it is still there after this.
ERROR_EXIT_SECONDS = 10.0
# Workers started by one join event are admitted together if they all arrive within this.
JOIN_BATCH_SECONDS = 60.0


@dataclass
class RunOptions:
    command: list[str]  # SCRIPT ARGS... or -m MODULE ARGS...
    min_workers: int
    max_workers: int
    nproc: int
    out_dir: str | Path  # a local folder or an object-store URL
    # local workers kept ready beyond the job's members: each runs the script up to ``fit()``
    # and waits to take the place of a member that leaves or dies (joins where there is room)
    standby: int = 0
    events: list[Event] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 0
    failure_timeout: float = p.FAILURE_TIMEOUT
    settle_seconds: float = 2.0
    quiet: bool = False
    progress_every: float = 1.0
    grace_seconds: float = 30.0  # after Ctrl-C, before workers that did not stop are killed
    chaos: tuple[int, int, tuple[str, ...]] | None = None  # (seed, strikes, aims): launch.chaos
    # TensorBoard files in the run folder: True, False, or None (when tensorboard is installed)
    tensorboard: bool | None = None
    # the numerics the user asked for (``Numerics`` fields; the rest: the run folder's, else
    # the defaults), and whether a worker that computes other bits may join anyway
    numerics: dict = field(default_factory=dict)
    allow_mixed_numerics: bool = False
    # when this host is lost for good, a worker on another host hosts the coordinator
    # (``dyntrain.elastic.worker.succession``)
    takeover: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.min_workers <= self.max_workers:
            raise ConfigError(f"--workers MIN:MAX needs 1 <= MIN <= MAX, got "
                              f"{self.min_workers}:{self.max_workers}")
        if not 0 <= self.nproc:
            raise ConfigError(f"--nproc must be at least 0, got {self.nproc}")
        if not 0 <= self.standby <= self.max_workers:
            raise ConfigError(f"--standby must be between 0 and --workers MAX "
                              f"({self.max_workers}), got {self.standby}")
        refusal = nproc_refusal(self.nproc, self.max_workers)
        if refusal:
            raise ConfigError(refusal)
        if self.failure_timeout <= 0:
            raise ConfigError("--failure-timeout must be positive")
        if self.grace_seconds < 0:
            raise ConfigError("--grace-seconds must be at least 0")


def run_job(opts: RunOptions, stream: TextIO = sys.stdout) -> int:
    """Run one elastic job to the end; returns the process exit code."""
    store = open_store(opts.out_dir, "--out")
    store.check()
    logs = store.local / "logs" if store.local is not None else local_logs(store.location)
    recorded = read_numerics(store)
    numerics = merge_pin(opts.numerics, recorded.pinned if recorded else None, store.location)
    refusal = host_refusal(numerics, "this machine")
    if refusal and (opts.nproc or any(e.action == "join" for e in opts.events) or opts.chaos):
        raise DyntrainError(f"local workers cannot run: {refusal}")
    machine, forked = Machine.here(), forkserver.wanted()
    refusal = memory_refusal(opts.nproc + opts.standby, machine, forked)
    if refusal:
        raise DyntrainError(refusal)
    local = peak_local_workers(opts.nproc + opts.standby, opts.events)
    # before the store's server and anything else that starts a thread: forked from here
    server = start_fork_server(logs, numerics.env()) if forked else None
    try:
        tcp = dist.TCPStore(opts.host, opts.port, is_master=True, wait_for_workers=False,
                            timeout=timedelta(seconds=30))
    except Exception as exc:
        if server is not None:
            server.close()
        raise DyntrainError(f"cannot listen on {opts.host}:{opts.port}: "
                            f"{str(exc).splitlines()[0]}") from None
    # workers (local ones too) advertise the address they reach the coordinator from: with a
    # wildcard, one that other hosts can reach as well
    host = (machine_addresses() or ["127.0.0.1"])[0] if is_wildcard(opts.host) else opts.host
    address = f"{host}:{tcp.port}"
    out = str(store.local.resolve()) if store.local is not None else store.location
    info = {"out_dir": out, "numerics": numerics.to_json()}
    if opts.takeover:
        info.update(job=f"run-{secrets.token_hex(6)}", takeover=_takeover(opts).to_json())
        claim(store, address, info["job"], 0, "launcher")
    tcp.set(p.JOB_INFO, json.dumps(info))
    sink = RunSink(store, "?", stream, opts.quiet, opts.progress_every, opts.tensorboard)

    def find_checkpoint():
        found = latest_valid_checkpoint(store, on_skip=lambda where, why: sink.log(
            f"skipping checkpoint {where.rpartition('/')[2]}: {why}"))
        return (found[0], found[1]) if found else None

    coord = Coordinator(tcp, CoordinatorConfig(
        opts.min_workers, opts.max_workers, expected_initial=max(opts.nproc, 1),
        settle_seconds=opts.settle_seconds, failure_timeout=opts.failure_timeout,
        numerics=numerics, allow_mixed_numerics=opts.allow_mixed_numerics),
        sink, find_checkpoint, numerics=recorded)
    workers = LocalWorkers(opts.command, address, out, extra_env=numerics.env(),
                           fork_server=server or False, logs_dir=logs)
    if store.local is None:
        sink.log(f"run folder {store.location}; local workers' logs in {logs}")
    schedule = EventSchedule(opts.events)
    skipped = schedule.skip_fired(sink.fired_before())
    if skipped:
        sink.log(f"resuming: not firing again {len(skipped)} event(s) that an earlier launch "
                 f"fired ({FIRED_FILE}): {', '.join(e.text for e in skipped)}")
    join = f"dyntrain worker --coordinator {address} {' '.join(opts.command)}"
    sink.log(f"coordinator listening on {address}; join with: {join}")
    sink.log(_numerics_line(numerics, local, machine.cores))
    if opts.takeover and not is_wildcard(opts.host) and host.startswith("127."):
        sink.log(f"--takeover: only a worker on another host can host the coordinator should "
                 f"this one be lost, and none can join {address} (--host 0.0.0.0 lets them)")
    note = peak_note(opts.nproc + opts.standby, local, machine, forked)
    if note:
        sink.log(note)
    if opts.nproc == 0:  # said even with --quiet: nothing happens until someone runs it
        local = (" (it listens on 127.0.0.1: workers on this machine only; --host 0.0.0.0 "
                 "accepts other machines)" if opts.host in ("127.0.0.1", "localhost") else "")
        sink.announce(f"no local workers (--nproc 0): the job waits for workers to join; "
                      f"start each with: {join}{local}")
    scheduled = len(schedule.pending)
    chaos = None
    if opts.chaos is not None:
        chaos = ChaosDriver(Chaos(*opts.chaos[:2], max_workers=opts.max_workers,
                                  aims=opts.chaos[2]), coord, workers,
                            store, sink.log)
    with StopSignals() as signals:
        for _ in range(opts.nproc + opts.standby):
            workers.start()
        try:
            superseded = Superseded(store, info["job"]) if opts.takeover else None
            code = _loop(opts, coord, workers, schedule, sink, signals, chaos, superseded)
            if code is None:
                return _interrupted(opts, coord, workers, sink, signals)
            _report_unfired(schedule, scheduled, coord, sink)
            mixed = coord.job.numerics.mixed if coord.job.numerics else ()
            if mixed:  # said even with --quiet: the run's result is not what it promises
                sink.announce(f"not bitwise: {', '.join(f'{m.worker} on {m.host}' for m in mixed)}"
                              f" computed other bits from step {mixed[0].step} on "
                              f"(--allow-mixed-numerics; {NUMERICS_FILE} says what differed)")
            if chaos is not None:
                sink.log(f"chaos: {chaos.made} of {chaos.chaos.count} strikes made"
                         + ("" if chaos.made == chaos.chaos.count else
                            " (the job ended first: a longer run makes them all)"))
            return code
        finally:
            workers.stop_all(timeout=0.0 if coord.phase is Phase.FAILED else 20.0)
            workers.close()
            sink.close()
            if chaos is not None:
                chaos.close()
            if store.local is None:
                _upload_logs(store, logs, sink.announce)


def _takeover(opts: RunOptions) -> Takeover:
    """How the workers take the coordinator over: the first successor after two failure
    timeouts (at least 4 s) without it; each worker waits long enough for every successor."""
    after = max(2 * opts.failure_timeout, 4.0)
    return Takeover(after, after * (opts.max_workers + 1) + 60.0, {
        "min_workers": opts.min_workers, "max_workers": opts.max_workers,
        "settle_seconds": opts.settle_seconds, "failure_timeout": opts.failure_timeout,
        "allow_mixed_numerics": opts.allow_mixed_numerics})


def _numerics_line(numerics: Numerics, local: int, cores: int) -> str:
    """What every worker computes with, and whether the ``local`` workers share cores."""
    line = (f"numerics of each worker, whatever its host: {numerics.describe()} (recorded in "
            f"{NUMERICS_FILE}; --threads, --cpu-kernels, ... choose)")
    note = cores_note(local, numerics.threads, cores)
    return f"{line}; up to {note}" if note else line


def local_logs(location: str) -> Path:
    """Where the local workers of a run folder on an object store write their logs: a folder of
    this machine's temporary directory named after the URL (the same for a re-run)."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in location.split("://")[-1])
    digest = hashlib.sha256(location.encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"dyntrain-{os.getuid()}" / f"{name[-60:]}-{digest}"


def _upload_logs(store: RunStore, logs: Path, say) -> None:
    """Move the local workers' logs into the run folder's ``logs/`` (they end with the run);
    they stay here if they cannot be written there."""
    try:
        store.put_many({f"logs/{f.name}": f.read_bytes() for f in sorted(logs.glob("*.log"))})
    except (OSError, StorageError) as exc:
        say(f"the workers' logs stay in {logs}: {exc}")
        return
    shutil.rmtree(logs, ignore_errors=True)


def _interrupted(opts: RunOptions, coord: Coordinator, workers: LocalWorkers, sink: RunSink,
                 signals: StopSignals) -> int:
    """Stop every worker, keep what they sent, and say where a re-run resumes."""
    outcome = stop_workers(coord, workers, signals, opts.grace_seconds, sink.announce)
    workers.reap()
    coord.drain()  # the last steps' metrics rows, sent before the workers left
    step = sink.last_metrics["step"] if sink.last_metrics else 0
    ckpt = coord.find_checkpoint()
    done = f"{outcome.stopped} worker(s) stopped"
    if outcome.killed:
        done += f", {outcome.killed} killed ({outcome.why_killed})"
    if ckpt is None:
        resume = "no checkpoint was written yet: the same command starts from the beginning"
    else:
        redo = (f" (steps {ckpt[0] + 1}-{step} will be computed again)" if ckpt[0] < step
                else "")
        resume = (f"the newest checkpoint is at step {ckpt[0]}{redo}: run the same command "
                  "again to resume")
    sink.announce(f"interrupted at step {step}: {done}; {resume}")
    return 130


def _loop(opts, coord: Coordinator, workers: LocalWorkers, schedule: EventSchedule,
          sink: RunSink, signals: StopSignals, chaos: ChaosDriver | None = None,
          superseded: Superseded | None = None) -> int | None:
    """Run until the job ends (its exit code) or a stop signal arrives (None)."""
    last_fired: tuple[str, list[str]] | None = None
    startup_failure, startup_code = "", 0
    errored_at: dict[str, float] = {}
    while not signals.count:
        for worker_id, code in workers.reap():
            if code != 0 and worker_id not in coord.membership.known and code > 0:
                # it never reached the coordinator: its own error is the most useful thing to say
                said = workers.last_line(worker_id).removeprefix("dyntrain: error: ")
                startup_failure = (f"{said or f'exit code {code}'} "
                                   f"(see {workers.log_path(worker_id)})")
                startup_code = code
                sink.log(f"worker {worker_id} exited with code {code} before joining: "
                         f"{startup_failure}")
            elif code != 0:
                coord.mark_dead(worker_id, f"exit code {code}")
                if worker_id in coord.job.errors:
                    sink.log(f"worker {worker_id} exited with code {code}; its traceback is in "
                             f"{workers.log_path(worker_id)}")
        try:
            phase = coord.tick()
        except StorageError as exc:  # finding a checkpoint: never start over from step 0
            coord.fail(f"the run folder cannot be read: {exc}")
            phase = coord.phase
        now = time.monotonic()
        for worker_id in coord.membership.dead & set(workers.alive()):
            if worker_id in coord.job.errors and \
                    now - errored_at.setdefault(worker_id, now) < ERROR_EXIT_SECONDS:
                continue  # it is writing its traceback and exiting
            workers.signal(worker_id, "kill")  # declared dead (e.g. hung): make sure it is
        claim = superseded() if superseded is not None else None
        if claim:  # said even with --quiet: the job goes on elsewhere
            sink.announce(f"worker {claim.get('by')} hosts the job's coordinator at "
                          f"{claim.get('address')} (takeover {claim.get('epoch')}): this "
                          "launcher stops its workers and ends")
            coord.fail("taken over")
            return EXIT_FAILED
        if phase is Phase.DONE:
            workers.stop_all(timeout=30.0)
            coord.drain()
            sink.catch_up()
            return 0
        if phase is Phase.FAILED:
            sink.catch_up()
            sink.announce(f"job failed: {coord.failure}")  # said even with --quiet
            return EXIT_FAILED
        elapsed = time.time() - coord.started_at
        event = schedule.pop_next(coord.job.highest_step, elapsed) if _settled(coord, last_fired) \
            else None
        if event is not None:
            sink.fired(event, coord.job.highest_step)
            last_fired = (event.action, _fire(event, coord, workers, sink))
        if chaos is not None:
            chaos.tick()
        if opts.standby:
            _refill_standby(opts.standby, coord, workers, sink)
        # every local worker exited and was reaped above (so a startup failure is known), no
        # remote one is alive, and one ever started or joined (--nproc 0 waits for the first)
        if (not workers.workers and not coord.live_workers()
                and (workers.started or coord.membership.known)
                and not schedule.can_add_workers(coord.job.highest_step)
                and not (chaos is not None and chaos.pending)):
            ckpt = coord.find_checkpoint()
            hint = (f"; the newest checkpoint is at step {ckpt[0]}: run the same command again "
                    "to resume" if ckpt else "")
            last = ""
            if coord.job.last_error:
                culprit = list(coord.job.errors)[-1]
                log_file = workers.log_path(culprit)
                where = f"; its traceback: {log_file}" if log_file.is_file() else ""
                last = f" (last error: {coord.job.last_error}{where})"
            reason, code = f"every worker is gone{last}{hint}", EXIT_FAILED
            if startup_failure and coord.current is None:
                reason = f"no worker could start: {startup_failure}"
                # the script refused its input (a ConfigError, a run folder of other settings):
                # bad input, as `dyntrain` says of its own
                code = EXIT_USAGE if startup_code == EXIT_USAGE else EXIT_FAILED
            coord.fail(reason)
            sink.catch_up()
            sink.announce(f"job failed: {coord.failure}")  # said even with --quiet
            return code
        time.sleep(TICK_SECONDS)
    return None


def _refill_standby(count: int, coord: Coordinator, workers: LocalWorkers, sink: RunSink) -> None:
    """Keep ``count`` local workers beyond the current world's members: start one when fewer
    wait (one a tick; a worker still starting counts as waiting)."""
    if coord.current is None or coord.phase is not Phase.RUNNING:
        return
    members = set(coord.current.members)
    if sum(w not in members for w in workers.alive()) < count:
        sink.log(f"standby: started {workers.start()} (--standby {count}: it runs the script up "
                 "to fit() and waits to take a member's place)")


def _report_unfired(schedule: EventSchedule, scheduled: int, coord: Coordinator,
                    sink: RunSink) -> None:
    """Say which events never fired, and why the first of them did not."""
    pending = schedule.pending
    if not pending:
        return
    first, step = pending[0], coord.job.highest_step
    if first.trigger == "step" and first.at > step:
        why = f"the job ended at step {step}, before step {first.at:g}"
    elif first.trigger == "t" and first.at > coord.clock() - coord.started_at:
        why = f"the job ended before t={first.at:g} s"
    elif len(pending) < scheduled:
        why = (f"the job ended at step {step} while the event before it was still taking "
               "effect")
    else:
        why = f"the job ended at step {step}"
    sink.unfired([e.text for e in pending], f"{why}; a longer run lets them fire")


def _settled(coord: Coordinator, last: tuple[str, list[str]] | None) -> bool:
    """Events fire one at a time, each once the previous one has taken full effect."""
    if last is None:
        return coord.current is not None
    action, workers = last
    if action == "join":
        members = coord.current.members if coord.current else ()
        full = coord.current is not None and coord.current.world_size >= coord.config.max_workers
        placed = all(w in members or w in coord.membership.gone or full for w in workers)
        return placed and coord.settled()
    if not all(w in coord.membership.gone for w in workers):
        return False
    return coord.settled() or coord.phase is Phase.WAITING


def _fire(event: Event, coord: Coordinator, workers: LocalWorkers, sink: RunSink) -> list[str]:
    if event.action == "join":
        asked, wanted = coord.clock(), int(event.target)
        forked, available = workers.forks, memory_available_mib()
        started = [workers.start() for _ in range(join_fit(wanted, available, forked))]
        if len(started) < wanted:  # the wave starts what fits, and says so
            world = coord.current.world_size if coord.current else 0
            sink.unstarted(EventRow(
                EventKind.UNSTARTED, world_before=world, world_after=world,
                requested_at=round(asked - coord.started_at, 4),
                reason=join_short_line(wanted, len(started), available, forked),
                extra={"asked": wanted, "started": len(started)}), event.text)
        if started:
            coord.expect_joiners(started, within=JOIN_BATCH_SECONDS, requested_at=asked)
            sink.log(f"event {event.text}: started {', '.join(started)}")
        return started
    members = list(coord.current.members) if coord.current else []
    targets = choose_targets(event.target, members)
    if not targets:
        sink.log(f"event {event.text}: no such member among {members}; skipped")
        return []
    hit = []  # what the next event waits for: only workers this one reached
    for worker_id in targets:
        coord.note_request(worker_id)
        if not workers.signal(worker_id, event.action):
            if event.action == "leave":
                coord.request_drain(worker_id)
            else:
                sink.log(f"event {event.text}: {worker_id} is not a local process; not killed")
                continue
        hit.append(worker_id)
    if hit:
        sink.log(f"event {event.text}: {SIGNALS[event.action].name} to {', '.join(hit)}")
    return hit

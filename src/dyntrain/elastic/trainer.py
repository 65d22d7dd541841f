"""The step loop users call: join the job, take part in generations, leave or finish cleanly."""

from __future__ import annotations

import enum
import os
import signal
import socket
import sys
import time
from dataclasses import replace
from datetime import timedelta

import torch
from torch import nn
from torch.utils.data import Dataset

from dyntrain.elastic import protocol as p
from dyntrain.elastic.collective.comm import (
    Aborted,
    CollectiveFailed,
    Group,
    create_group,
    placement,
    run_abortable,
)
from dyntrain.elastic.collective.reach import probe_peers
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.numerics import apply, numerics_from_env, observe
from dyntrain.elastic.protocol import (
    ENV_ADVERTISE,
    ENV_CONNECT_TIMEOUT,
    ENV_COORDINATOR,
    ENV_IFACE,
    ENV_OUT,
    ENV_REATTACH,
    ENV_WORKER_ID,
)
from dyntrain.elastic.runs.checkpoints import latest_valid_checkpoint
from dyntrain.elastic.runs.folder import check_numerics_alone, check_run_folder, describe_setup
from dyntrain.elastic.runs.progress import AloneOutput
from dyntrain.elastic.runs.storage import RunStore, open_store
from dyntrain.elastic.sharding.strategy import Replicated, Sharding, sharding_for
from dyntrain.elastic.state import TrainingParts, restore_state
from dyntrain.elastic.step.balance import ChunkBalancer
from dyntrain.elastic.step.canary import job_canary
from dyntrain.elastic.step.row import StepRows
from dyntrain.elastic.step.sampler import BatchOrder
from dyntrain.elastic.step.stepper import ChunkStepper, LossFn, StepResult
from dyntrain.elastic.step.validation import Validation
from dyntrain.elastic.worker.channel import CoordinatorGone, Fenced, JobOver, WorkerChannel
from dyntrain.elastic.worker.handover import hand_over_state
from dyntrain.elastic.worker.rejoin import start_over
from dyntrain.elastic.worker.writer import RunWriter
from dyntrain.errors import DataError, DyntrainError, install_excepthook

END_POLL_SECONDS = 0.02  # how often a member that finished waits for the leader's end


class Outcome(enum.Enum):
    """How a worker's part in one generation ended."""

    DONE = "done"
    LEFT = "left"
    REFORM = "reform"


class ElasticTrainer:
    """Trains ``model`` on a fixed global batch while workers join, leave and crash.

    Inside a job started by ``dyntrain run`` (or joined with ``dyntrain worker``) the coordinator
    address comes from the environment. Without one, ``fit`` trains alone as a world of one, with
    exactly the same math: it prints a progress line every second and what ``report()`` gets;
    given an output folder (``out_dir``, or ``DYNTRAIN_OUT`` in the environment: a local folder
    or an object-store URL, ``dyntrain.elastic.runs.storage``) it also writes ``metrics.jsonl``,
    checkpoints, ``final.pt`` and ``result.json`` as ``dyntrain run`` does, and resumes from the
    folder's newest checkpoint. Either way, an output folder that holds a
    run started with other settings is refused (``dyntrain.elastic.runs.folder``).

    With ``TrainConfig.noise_scale`` on, the leader's row of ``metrics.jsonl`` for every step also
    holds the gradient noise scale: ``b_simple`` (smoothed; null while the smoothed |G|^2 is not
    positive), ``b_simple_raw`` (this step's own, very noisy, ratio), and the smoothed ``g2``
    (|G|^2) and ``trace_sigma`` (tr(Sigma)); ``last_result.noise`` and ``stepper.noise`` (the
    tracker) hold the values too.

    Every worker of a job must construct it with the same settings (``config``, the model's
    tensor names and shapes, the optimizer's and the LR scheduler's settings); a worker whose
    settings differ from the job's is refused. The model, optimizer and data set must be built
    the same way on every worker, seeded (``torch.manual_seed``) before the model is created, so
    that a world of one and a world of many start from the same weights.

    Args:
        config: What every worker agrees on: global batch, chunk size, epochs, checkpoints, ...
        model: Any ``nn.Module``. Its initial weights must be the same on every worker (seed
            before building it); BatchNorm running statistics are kept exact, other buffers
            that ``forward`` changes are not supported.
        optimizer: A ``torch.optim.Optimizer`` over ``model``'s parameters. It is stepped once
            per global batch; its state moves to joining workers and into checkpoints.
        dataset: A map-style ``Dataset`` of at least one global batch (a ``TensorDataset`` is
            sliced directly). Every worker must see the same samples in the same order.
        loss_fn: ``loss_fn(model, batch) -> Tensor``: the mean loss of one chunk (a batch of
            ``config.chunk_size`` samples as the data loader collates them).
        lr_scheduler: An LR scheduler stepped once per optimizer step, or None. Its state is
            saved and restored with the rest; with one, a run folder cannot be resumed with a
            different number of epochs.
        scaler: A ``torch.amp.GradScaler`` (or ``dyntrain.recipes.StaticLossScaler``) for mixed
            precision, or None.
        device: Where the model trains; default: ``cuda:LOCAL_RANK`` when the backend is
            ``nccl``, or ``auto`` and CUDA is available; else the CPU. The model must already
            be on it (each chunk is moved there).
        out_dir: The run folder: a local path or an fsspec URL (``s3://bucket/prefix``). Default:
            ``DYNTRAIN_OUT`` from the environment; inside a job, the job's run folder. A path
            that cannot be a folder raises at once, naming it.
        coordinator: ``HOST:PORT`` of the job's coordinator; default: ``DYNTRAIN_COORDINATOR``
            from the environment (set by ``dyntrain run`` / ``dyntrain worker``). Without one,
            ``fit`` trains alone as a world of one.
        worker_id: This worker's id in the job; default: ``DYNTRAIN_WORKER_ID``, else one is
            made from the host name and process id.
        collective_timeout: Seconds a collective may take before it counts as failed.
        loader: A ``dyntrain.data.LoaderConfig``: produce this worker's chunks in loader
            processes ahead of time. None loads in the training process.
        validation: A ``Validation``: evaluate the model (on the leader) every N steps or epochs
            and at the end, without changing training. None: no validation.
        tensorboard: Alone with an output folder: also write TensorBoard event files to its
            ``tensorboard/`` (``dyntrain.elastic.runs.tensorboard``). None: when the tensorboard
            package is installed; True without it raises ``MissingExtra``. Inside a job the
            launcher writes them (``dyntrain run --tensorboard/--no-tensorboard``).

    Raises:
        ConfigError: ``dataset`` is smaller than one global batch.
        DyntrainError: ``out_dir`` cannot be a run folder (one line, naming it).
    """

    def __init__(
        self,
        config: TrainConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: Dataset,
        loss_fn: LossFn,
        *,
        lr_scheduler=None,
        scaler=None,
        device: torch.device | str | None = None,
        out_dir: str | os.PathLike | None = None,
        coordinator: str | None = None,
        worker_id: str | None = None,
        collective_timeout: float = 300.0,
        loader=None,
        validation: Validation | None = None,
        tensorboard: bool | None = None,
    ) -> None:
        install_excepthook()  # a DyntrainError from here on is one line in a script
        self.coordinator = coordinator or os.environ.get(ENV_COORDINATOR)
        # the job's numerics (``dyntrain.elastic.numerics``), pinned by its launcher: what can
        # be set at run time is set again here, should the script have changed it. Alone, a
        # run pins nothing: it records what it computes with
        self.numerics = numerics_from_env() if self.coordinator else None
        if self.numerics is not None:
            apply(self.numerics)
        out = out_dir or os.environ.get(ENV_OUT)
        # a local folder exists from here on: one that cannot be is one line, naming its source
        self.store: RunStore | None = (open_store(out, "out_dir" if out_dir else ENV_OUT)
                                       if out else None)
        self.config = config
        self.device, self.backend = placement(config.backend, device)
        self.parts = TrainingParts(model, optimizer, lr_scheduler, scaler)
        self.stepper = ChunkStepper(config, self.parts, dataset, loss_fn, self.device)
        self.total_steps = config.total_steps(len(dataset))
        # what is reduced, stepped, gathered, checkpointed and moved: chosen once, here (and
        # refused here if the level cannot shard it). Alone, a world of one shards nothing
        sharding = sharding_for(config, model, optimizer, self.stepper.params,
                                self.stepper.buckets, scaler)
        self.sharding: Sharding = sharding if self.coordinator else Replicated(optimizer)
        self.stepper.sharding = self.sharding
        if loader is not None:  # a dyntrain.data.LoaderConfig: chunks from loader processes
            order = BatchOrder(config.seed, len(dataset), config.global_batch)
            self.stepper.loader = loader.build(dataset, order, config.chunk_size,
                                               self.total_steps, config.seed, self.device)
        self.rows = StepRows(config, model, self.total_steps, self.stepper.steps_per_epoch,
                             self.stepper.noise, validation)
        self.writer = RunWriter(self.store, config, self.parts, self.stepper.steps_per_epoch,
                                self.sharding)
        self.worker_id = worker_id or os.environ.get(ENV_WORKER_ID)
        self.collective_timeout = timedelta(seconds=collective_timeout)
        self.step = 0
        self.has_state = False
        self.generation: p.Generation | None = None
        self.rank = 0
        self._state = p.WorkerState.JOINING
        self._leave_requested = False
        self._channel: WorkerChannel | None = None
        self.last_result: StepResult | None = None  # of the last step this worker applied
        self._alone = AloneOutput(self.store, tensorboard=tensorboard)  # a world of one's output
        # the current generation's chunk plan: ``balancer.plan(step)`` for this step and the next
        self.balancer: ChunkBalancer | None = None
        # this generation's group connect and state hand-over, seconds (with its first step)
        self._formed: dict[str, float] = {}

    # ---- public --------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """The number of workers in the current generation (1 when training alone)."""
        return self.generation.world_size if self.generation else 1

    @property
    def validations(self) -> list[dict]:
        """This worker's validation results, each with its ``step``."""
        return self.rows.validations

    @property
    def is_leader(self) -> bool:
        """True on exactly one member of the final generation (rank 0)."""
        return self.rank == 0

    def fit(self) -> None:
        """Train to the end. A worker that leaves the job (preemption notice, drain, or not needed
        at the end) raises ``SystemExit(0)`` once its part is handed over. A worker that the
        coordinator declared dead while it was cut off starts over as a new worker, or exits
        (``dyntrain.elastic.worker.rejoin``). The loader processes (if any) stop when it returns."""
        fenced = None
        try:
            self._fit()
        except Fenced as exc:
            fenced = str(exc)
        finally:
            if self.stepper.loader is not None:
                self.stepper.loader.close()
        if fenced is not None:
            start_over(self.worker_id, fenced)

    def _fit(self) -> None:
        install_excepthook()
        if self.store is not None:
            self.store.check()
            check_run_folder(self.store, describe_setup(self.config, self.parts),
                             where="--out" if self.coordinator else "output folder")
        if self.coordinator is None:
            self._fit_alone()
            return
        timeout = float(os.environ.get(ENV_CONNECT_TIMEOUT, "30"))
        self._channel = WorkerChannel(
            self.coordinator, self.worker_id, connect_timeout=timeout,
            reattach_seconds=float(os.environ.get(ENV_REATTACH, "0")), position=self._position,
            advertise=os.environ.get(ENV_ADVERTISE), iface=os.environ.get(ENV_IFACE))
        self.worker_id = self._channel.worker
        self.writer.confirm_with(self._channel, self.worker_id)
        previous = signal.signal(signal.SIGTERM, self._on_sigterm)
        try:
            self._fit_elastic()
        except CoordinatorGone as exc:
            raise SystemExit(f"dyntrain: worker {self.worker_id}: {exc}") from None
        except (SystemExit, KeyboardInterrupt):
            raise
        except Exception as exc:
            # the runtime's own errors (job over, coordinator lost) are known to the launcher
            if not isinstance(exc, DyntrainError) or isinstance(exc, DataError):
                self._channel.send(p.Error(f"{type(exc).__name__}: {exc}".splitlines()[0]))
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._channel.close()

    def report(self, **values) -> None:
        """Record the run's final results (``result.json``, the terminal, the job's ``result``).

        Must be called after ``fit()`` has returned; only the leader's call counts (call it on
        every worker or only where ``is_leader`` is true). Alone, the values are printed as
        ``result: name=value ...`` and written to the output folder's ``result.json``.

        Args:
            **values: Numbers or strings (``train_accuracy=0.99``), JSON serialisable.
        """
        if self._channel is not None and self.is_leader:
            # fit() has returned and the process may exit right after this call: the message must
            # reach the store before (the sender thread dies with it); the launcher reads it then.
            self._channel.send(p.Result(self.generation.number, values))
            self._channel.flush()
        elif self._channel is None:
            self._alone.result(values)

    # ---- alone ---------------------------------------------------------------------------------

    def _fit_alone(self) -> None:
        out = self._alone
        group = Group(None, 0, 1, self.device)
        self.generation = p.Generation(0, ("local",), 0)
        self.has_state = True
        if self.store is not None:  # what it computes with, then resume as `dyntrain run` does
            check_numerics_alone(self.store, self.numerics, observe(self.device),
                                 job_canary(self.stepper), socket.gethostname())
            found = latest_valid_checkpoint(self.store, on_skip=lambda where, why: out.say(
                f"skipping checkpoint {where}: {why}"))
            if found is not None:
                self.step = restore_state(self.parts, found[2])
                out.say(f"resuming from step {self.step} ({found[1]})")
        last = time.perf_counter()
        try:
            while self.step < self.total_steps:
                red = self.stepper.start(self.step, self.stepper.my_chunks(0, 1), group)
                result = self.last_result = self.stepper.finish(red, False, False, lambda: False)
                self.step += 1
                self.writer.maybe_checkpoint(self.step, force=self.step == self.total_steps)
                now = time.perf_counter()
                out.metrics(self.rows.row(self.step, result, 1, now - last),
                            last=self.step == self.total_steps)
                last = time.perf_counter()  # validation time is not step time
        finally:
            out.close()
        self.writer.write_final()
        if self.store is not None:
            out.say(f"trained to step {self.step}; model in {self.store.where('final.pt')}")

    # ---- elastic -------------------------------------------------------------------------------

    def _position(self) -> p.Position:
        """Where this worker stands, for the report that re-attaches it to a restarted
        coordinator: its state, its last generation and the last step it applied."""
        joined = self._state is not p.WorkerState.JOINING and self.generation is not None
        return p.Position(self._state, self.generation if joined else None,
                          self.step if self.has_state else None)

    def _on_sigterm(self, signum, frame) -> None:
        # A preemption notice: finish the current step, hand over, leave.
        self._leave_requested = True

    def _fit_elastic(self) -> None:
        ch = self._channel
        ch.hello(self.config.fingerprint(), {
            "global_batch": self.config.global_batch, "chunk_size": self.config.chunk_size,
            "total_steps": self.total_steps, "seed": self.config.seed},
            observe(self.device), job_canary(self.stepper))
        after = -1
        while True:
            try:
                gen = ch.wait_generation(after, lambda: self._leave_requested)
            except JobOver as over:
                if over.status.state is p.JobState.DONE and over.at_join:
                    raise DyntrainError("the job had already finished when this worker joined "
                                        "it: it trained nothing") from None
                if over.status.state is p.JobState.DONE:
                    if after < 0:
                        print(f"dyntrain: worker {self.worker_id}: the job finished before "
                              "this worker was admitted", file=sys.stderr, flush=True)
                    raise SystemExit(0) from None
                raise DyntrainError(f"the job {over.status}") from None
            if gen is None:  # asked to leave while waiting for a generation
                if self.has_state:  # its peers may be leaving too: keep what it holds
                    self.writer.keep_before_leaving(self.step)
                ch.send(p.Left(after, self.step if self.has_state else None))
                raise SystemExit(0)
            after = gen.number
            outcome = self._run_generation(gen)
            if outcome is Outcome.REFORM:
                self._state = p.WorkerState.WAITING
            if outcome is Outcome.DONE:
                return
            if outcome is Outcome.LEFT:
                raise SystemExit(0)

    def _run_generation(self, gen: p.Generation) -> Outcome:
        self.generation, self.rank = gen, gen.rank_of(self.worker_id)
        self._state = p.WorkerState.RUNNING
        ch = self._channel
        ch.watch(gen.number)
        aborted = _AbortCheck(ch, gen.number)
        group = None
        clean = False  # every collective of the generation completed
        try:
            # peers that cannot reach each other are named before a group that cannot form
            peers = gen.peer_probes(self.worker_id)
            failed = run_abortable(lambda: probe_peers(peers), aborted) if peers else []
            if failed:
                ch.send(p.Ready(gen.number, self.step if self.has_state else None,
                                p.ReadyReason.UNREACHABLE, unreachable=tuple(failed)))
                return Outcome.REFORM
            # a connection per generation: see WorkerChannel.group_store
            store = run_abortable(ch.group_store, aborted) if gen.world_size > 1 else None
            began = time.perf_counter()
            group = create_group(store, gen.number, self.rank, gen.world_size, self.backend,
                                 self.device, self.collective_timeout, aborted, ch.advertise)
            self._formed = {"group_connect_s": round(time.perf_counter() - began, 4)}
            self.sharding.before_handover()
            self._sync_state(gen, group, aborted)
            lost = self.sharding.reshard(group, gen, self.worker_id, aborted, self.store)
            if lost is not None:  # said: resume from the newest checkpoint, nobody holds state
                clean = True  # the plan's all-reduce was the generation's last collective
                self.has_state = False
                ch.send(p.Ready(gen.number, None, p.ReadyReason.ERROR, error=lost))
                return Outcome.REFORM
            self.stepper.lay_out(self.rank, gen.world_size)
            outcome = self._train(gen, group, aborted)
            clean = True
            return outcome
        except (Aborted, CollectiveFailed) as exc:
            self.step += self.sharding.settle_interrupted()  # a torn step that counts
            step = self.step if self.has_state else None
            ch.send(p.Ready(gen.number, step, p.ReadyReason.ABORT) if isinstance(exc, Aborted)
                    else p.Ready(gen.number, step, p.ReadyReason.ERROR, error=str(exc)))
            return Outcome.REFORM
        finally:
            if group is not None:
                # an abandoned generation's group is severed: nothing a cut-off member sends
                # later can reach this worker (comm.Group.close)
                group.close(abandoned=not clean)

    def _sync_state(self, gen: p.Generation, group: Group, aborted) -> None:
        handed = hand_over_state(gen, group, self.parts, self.sharding, self.worker_id,
                                 self.step, self.stepper.steps_per_epoch, aborted)
        if handed is not None:
            self.step, self.has_state = handed.step, True
            if handed.seconds is not None:
                self._formed["state_sync_s"] = round(handed.seconds, 4)
        if self.step != gen.start_step:
            raise RuntimeError(f"worker {self.worker_id} holds step {self.step}, generation "
                               f"{gen.number} starts at {gen.start_step}")

    def _train(self, gen: p.Generation, group: Group, aborted) -> Outcome:
        ch, stepper = self._channel, self.stepper
        self.balancer = ChunkBalancer(self.config.num_chunks, gen.world_size, self.step,
                                      enabled=self.config.balance)
        last = time.perf_counter()
        while self.step < self.total_steps:
            plan, counts = self.balancer.plan(self.step), self.balancer.counts(self.step)
            chunks = plan[self.rank]
            began = time.perf_counter()
            red = stepper.start(self.step, chunks, group, max(map(len, plan)),
                                self.balancer.slots, aborted)
            own = self.balancer.measured(time.perf_counter() - began, len(chunks))
            word = ch.ctl(gen.number)
            if word is p.Control.ABORT:
                raise Aborted()
            leave = self._leave_requested or word is p.Control.DRAIN
            result = self.last_result = stepper.finish(  # (a checkpoint by time: leader's clock)
                red, reform=leave or word is p.Control.REFORM, leave=leave, should_abort=aborted,
                slot=(self.rank, own) if self.balancer.slots else None,
                checkpoint=self.writer.asks_checkpoint(self.is_leader))
            self.balancer.observe(self.step, result.slots)
            self.step += 1
            ending = result.leavers == gen.world_size or self.step == self.total_steps
            # every member writes its shard of a checkpoint (if shared); the leader validates
            self.writer.after_step(group, gen.number, self.step, ending or result.checkpoint,
                                   self.rows.validation_due(self.step), aborted)
            if self.is_leader:  # (before the step is reported: its checkpoint is on disk)
                self.writer.maybe_checkpoint(self.step, ending, gen.number, result.checkpoint)
                now = time.perf_counter()
                # the group connect's and state hand-over's times come with the first step
                formed, self._formed = self._formed, {}
                row = replace(self.rows.row(self.step, result, gen.world_size, now - last),
                              generation=gen.number, chunks=tuple(counts), **formed)
                ch.send(p.Metrics((row.to_json(),)))
                last = time.perf_counter()  # validation time is not step time
            if self.step == self.total_steps:
                break
            if result.reform:
                # what only leavers hold, to those that stay
                self.sharding.hand_over(group, self.worker_id, leave, result.leavers, aborted)
                if leave:
                    ch.send(p.Left(gen.number, self.step))
                    return Outcome.LEFT
                ch.send(p.Ready(gen.number, self.step, p.ReadyReason.BOUNDARY))
                return Outcome.REFORM
        if self.is_leader:
            if not self.writer.may_write(gen.number, wait=True):
                raise Aborted()  # the generation was abandoned: another one finishes the job
            self.writer.write_final()
            ch.send(p.Done(gen.number, self.step))
            self._state = p.WorkerState.DONE
            ch.wait_job_state(p.JobState.DONE)  # a coordinator restarted meanwhile learns it
            return Outcome.DONE
        return self._await_end(aborted)

    def _await_end(self, aborted) -> Outcome:
        """A member after the last step: the leader writes the final model and reports the end.
        Should the leader die first, the others hold the final state: the generation is aborted
        and the next one, formed around them, finishes the job."""
        while True:
            if aborted():
                raise Aborted()
            try:
                status = self._channel.job_state()
            except Exception:  # the coordinator is gone: nothing left to wait for
                return Outcome.DONE
            if status.state is not p.JobState.RUNNING:
                return Outcome.DONE
            time.sleep(END_POLL_SECONDS)


class _AbortCheck:
    """Asks the coordinator whether this generation was aborted (a peer died)."""

    def __init__(self, channel: WorkerChannel, generation: int) -> None:
        self.channel, self.generation = channel, generation

    def __call__(self) -> bool:
        return self.channel.ctl(self.generation) is p.Control.ABORT


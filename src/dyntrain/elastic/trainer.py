"""The step loop users call: join the job, take part in generations, leave or finish cleanly."""

from __future__ import annotations

import enum
import logging
import math
import os
import signal
import time
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

from dyntrain.elastic import protocol as p
from dyntrain.elastic.balance import ChunkBalancer
from dyntrain.elastic.channel import CoordinatorGone, JobOver, WorkerChannel
from dyntrain.elastic.checkpoint import (
    atomic_write_bytes,
    dumps,
    latest_valid_checkpoint,
    list_checkpoints,
    read_checkpoint,
    save_checkpoint,
)
from dyntrain.elastic.comm import Aborted, CollectiveFailed, Group, create_group, run_abortable
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.progress import AloneOutput
from dyntrain.elastic.protocol import (  # noqa: F401 (the trainer's environment, re-exported)
    ENV_ADVERTISE,
    ENV_CONNECT_TIMEOUT,
    ENV_COORDINATOR,
    ENV_IFACE,
    ENV_OUT,
    ENV_REATTACH,
    ENV_WORKER_ID,
)
from dyntrain.elastic.reach import probe_peers
from dyntrain.elastic.runfolder import check_run_folder, describe_setup
from dyntrain.elastic.sampler import BatchOrder
from dyntrain.elastic.state import TrainingParts, capture_state, restore_state
from dyntrain.elastic.stepper import ChunkStepper, LossFn, StepResult
from dyntrain.elastic.transfer import broadcast_state
from dyntrain.elastic.validation import Validation
from dyntrain.errors import DataError, DyntrainError, install_excepthook

log = logging.getLogger("dyntrain.trainer")

END_POLL_SECONDS = 0.02  # how often a member that finished waits for the leader's end


class Outcome(enum.Enum):
    DONE = "done"
    LEFT = "left"
    REFORM = "reform"


class ElasticTrainer:
    """Trains ``model`` on a fixed global batch while workers join, leave and crash.

    Inside a job started by ``dyntrain run`` (or joined with ``dyntrain worker``) the coordinator
    address comes from the environment. Without one, ``fit`` trains alone as a world of one, with
    exactly the same math: it prints a progress line every second and what ``report()`` gets;
    given an output folder (``out_dir``, or ``DYNTRAIN_OUT`` in the environment) it also writes
    ``metrics.jsonl``, checkpoints, ``final.pt`` and ``result.json`` as ``dyntrain run`` does,
    and resumes from the folder's newest checkpoint. Either way, an output folder that holds a
    run started with other settings is refused (``dyntrain.elastic.runfolder``).

    With ``TrainConfig.noise_scale`` on, the leader's row of ``metrics.jsonl`` for every step also
    holds the gradient noise scale: ``b_simple`` (smoothed; null while the smoothed |G|^2 is not
    positive), ``b_simple_raw`` (this step's own, very noisy, ratio), and the smoothed ``g2``
    (|G|^2) and ``trace_sigma`` (tr(Sigma)); ``last_result.noise`` and ``stepper.noise`` (the
    tracker) hold the values too.
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
    ) -> None:
        self.config = config
        self.device = torch.device(device) if device is not None else _default_device(config)
        self.backend = config.backend if config.backend != "auto" else (
            "nccl" if self.device.type == "cuda" else "gloo")
        self.parts = TrainingParts(model, optimizer, lr_scheduler, scaler)
        self.stepper = ChunkStepper(config, self.parts, dataset, loss_fn, self.device)
        self.total_steps = config.total_steps(len(dataset))
        if loader is not None:  # a dyntrain.data.LoaderConfig: chunks from loader processes
            order = BatchOrder(config.seed, len(dataset), config.global_batch)
            self.stepper.loader = loader.build(dataset, order, config.chunk_size,
                                               self.total_steps, config.seed, self.device)
        self.validation = validation
        self.validations: list[dict] = []  # this worker's validation results, with their step
        self.coordinator = coordinator or os.environ.get(ENV_COORDINATOR)
        self.worker_id = worker_id or os.environ.get(ENV_WORKER_ID)
        out = out_dir or os.environ.get(ENV_OUT)
        self.out_dir = Path(out) if out else None
        self.collective_timeout = timedelta(seconds=collective_timeout)
        self.step = 0
        self.has_state = False
        self.generation: p.Generation | None = None
        self.rank = 0
        self._state = "joining"  # then running / waiting (for a generation) / done (the leader)
        self._leave_requested = False
        self._channel: WorkerChannel | None = None
        self._last_checkpoint = time.monotonic()
        self.last_result: StepResult | None = None  # of the last step this worker applied
        self._alone = AloneOutput(self.out_dir)  # terminal and files of a world of one
        # the current generation's chunk plan: ``balancer.plan(step)`` for this step and the next
        self.balancer: ChunkBalancer | None = None
        self._state_sync_s: float | None = None  # this generation's state hand-over, seconds

    # ---- public --------------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return self.generation.world_size if self.generation else 1

    @property
    def is_leader(self) -> bool:
        """True on exactly one member of the final generation (rank 0)."""
        return self.rank == 0

    def fit(self) -> None:
        """Train to the end. A worker that leaves the job (preemption notice, drain, or not needed
        at the end) raises ``SystemExit(0)`` once its part is handed over. The loader processes
        (if any) stop when it returns."""
        try:
            self._fit()
        finally:
            if self.stepper.loader is not None:
                self.stepper.loader.close()

    def _fit(self) -> None:
        install_excepthook()
        if self.out_dir is not None:
            check_run_folder(self.out_dir, describe_setup(self.config, self.parts),
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
                self._channel.send("error",
                                   message=f"{type(exc).__name__}: {exc}".splitlines()[0])
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            self._channel.close()

    def report(self, **values) -> None:
        """Send final results (e.g. validation accuracy) to the launcher; the leader's count."""
        if self._channel is not None and self.is_leader:
            # fit() has returned and the process may exit right after this call: the message
            # must reach the store before (the sender thread dies with the process), and the
            # launcher reads it once this worker has exited.
            self._channel.send("result", **values)
            self._channel.flush()
        elif self._channel is None:
            self._alone.result(values)

    # ---- alone ---------------------------------------------------------------------------------

    def _fit_alone(self) -> None:
        out = self._alone
        group = Group(None, 0, 1, self.device)
        self.generation = p.Generation(0, ("local",), 0)
        self.has_state = True
        if self.out_dir is not None:  # resume, as `dyntrain run` does with the same --out
            found = latest_valid_checkpoint(self.out_dir / "checkpoints", on_skip=lambda path,
                                            why: out.say(f"skipping checkpoint {path}: {why}"))
            if found is not None:
                self.step = restore_state(self.parts, found[2])
                out.say(f"resuming from step {self.step} ({found[1]})")
        last = time.perf_counter()
        while self.step < self.total_steps:
            red = self.stepper.start(self.step, self.stepper.my_chunks(0, 1), group)
            result = self.last_result = self.stepper.finish(red, False, False, lambda: False)
            self.step += 1
            self._maybe_checkpoint(force=self.step == self.total_steps)
            now = time.perf_counter()
            out.metrics(self._metrics_row(result, 1, now - last),
                        last=self.step == self.total_steps)
            last = time.perf_counter()  # validation time is not step time
        self._write_final()
        if self.out_dir is not None:
            out.say(f"trained to step {self.step}; model in {self.out_dir / 'final.pt'}")

    # ---- elastic -------------------------------------------------------------------------------

    def _position(self) -> dict:
        """Where this worker stands, for the report that re-attaches it to a restarted
        coordinator: its state, its last generation and the last step it applied."""
        joined = self._state != "joining" and self.generation is not None
        return {"state": self._state, "generation": self.generation.to_json() if joined else None,
                "step": self.step if self.has_state else None}

    def _on_sigterm(self, signum, frame) -> None:
        # A preemption notice: finish the current step, hand over, leave.
        self._leave_requested = True

    def _fit_elastic(self) -> None:
        ch = self._channel
        ch.hello(self.config.fingerprint(), {
            "global_batch": self.config.global_batch, "chunk_size": self.config.chunk_size,
            "total_steps": self.total_steps, "seed": self.config.seed})
        after = -1
        while True:
            try:
                gen = ch.wait_generation(after, lambda: self._leave_requested)
            except JobOver as over:
                if over.state == "done":
                    raise SystemExit(0) from None
                raise DyntrainError(f"the job {over.state}") from None
            if gen is None:  # asked to leave while waiting for a generation
                # Its peers may be leaving too (Ctrl-C, a suspended job): keep the state it
                # holds unless a checkpoint already does.
                if self.has_state and self.step > self._newest_checkpoint_step():
                    self._maybe_checkpoint(force=True)
                ch.send("left", gen=after, step=self.step if self.has_state else None)
                raise SystemExit(0)
            after = gen.number
            outcome = self._run_generation(gen)
            if outcome is Outcome.REFORM:
                self._state = "waiting"
            if outcome is Outcome.DONE:
                return
            if outcome is Outcome.LEFT:
                raise SystemExit(0)

    def _run_generation(self, gen: p.Generation) -> Outcome:
        self.generation, self.rank = gen, gen.rank_of(self.worker_id)
        self._state = "running"
        ch = self._channel
        ch.watch(gen.number)
        aborted = _AbortCheck(ch, gen.number)
        group, stage = None, "group"
        try:
            # peers that cannot reach each other are named before a group that cannot form
            peers = gen.peer_probes(self.worker_id)
            failed = run_abortable(lambda: probe_peers(peers), aborted) if peers else []
            if failed:
                ch.send("ready", gen=gen.number, step=self.step if self.has_state else None,
                        reason="unreachable", unreachable=[f.to_dict() for f in failed])
                return Outcome.REFORM
            # a connection per generation: see WorkerChannel.group_store
            store = run_abortable(ch.group_store, aborted) if gen.world_size > 1 else None
            group = create_group(store, gen.number, self.rank, gen.world_size, self.backend,
                                 self.device, self.collective_timeout, aborted, ch.advertise)
            stage = "sync"
            self._sync_state(gen, group, aborted)
            stage = "train"
            return self._train(gen, group, aborted)
        except (Aborted, CollectiveFailed) as exc:
            reason = "abort" if isinstance(exc, Aborted) else f"error: {exc}"
            ch.send("ready", gen=gen.number, step=self.step if self.has_state else None,
                    reason=reason, stage=stage)
            return Outcome.REFORM
        finally:
            if group is not None:
                group.close()

    def _sync_state(self, gen: p.Generation, group: Group, aborted) -> None:
        if gen.checkpoint is not None:
            self.step = restore_state(self.parts, read_checkpoint(Path(gen.checkpoint)))
            self.has_state = True
        elif gen.receivers or gen.fresh:
            began = time.perf_counter()
            holders = [gen.rank_of(w) for w in gen.members if w not in gen.receivers]
            holding = self.worker_id not in gen.receivers
            state = (capture_state(self.parts, self.step, self.stepper.steps_per_epoch)
                     if holding else None)
            state = broadcast_state(group, state, gen.rank_of(gen.source), holders, aborted)
            if not holding:
                self.step = restore_state(self.parts, state)
            self.has_state = True
            self._state_sync_s = time.perf_counter() - began
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
                                self.balancer.slots)
            own = self.balancer.measured(time.perf_counter() - began, len(chunks))
            ctl = ch.ctl(gen.number)
            if ctl == p.CTL_ABORT:
                raise Aborted()
            leave = self._leave_requested or ctl == p.CTL_DRAIN
            result = self.last_result = stepper.finish(
                red, reform=leave or ctl == p.CTL_REFORM, leave=leave, should_abort=aborted,
                slot=(self.rank, own) if self.balancer.slots else None)
            self.balancer.observe(self.step, result.slots)
            self.step += 1
            if self.is_leader:
                # Checkpoint before reporting the step: a reported step's checkpoint is on disk.
                self._maybe_checkpoint(force=result.leavers == gen.world_size
                                       or self.step == self.total_steps)
                now = time.perf_counter()
                sync = {}
                if self._state_sync_s is not None:  # reported with the generation's first step
                    sync, self._state_sync_s = {"state_sync_s": round(self._state_sync_s, 4)}, None
                ch.send("metrics", gen=gen.number, chunks=counts, **sync,
                        **self._metrics_row(result, gen.world_size, now - last))
                last = time.perf_counter()  # validation time is not step time
            if self.step == self.total_steps:
                break
            if result.reform:
                if leave:
                    ch.send("left", gen=gen.number, step=self.step)
                    return Outcome.LEFT
                ch.send("ready", gen=gen.number, step=self.step, reason="boundary")
                return Outcome.REFORM
        if self.is_leader:
            self._write_final()
            ch.send("done", step=self.step)
            self._state = "done"
            ch.wait_job_state("done")  # a coordinator restarted meanwhile learns it from us
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
                state = self._channel.job_state()
            except Exception:  # the coordinator is gone: nothing left to wait for
                return Outcome.DONE
            if state != "running":
                return Outcome.DONE
            time.sleep(END_POLL_SECONDS)

    def _metrics_row(self, result: StepResult, world_size: int, seconds: float) -> dict:
        """The leader's row of ``metrics.jsonl`` for the step just applied (runs validation
        when it is due)."""
        extra = self._noise_metrics(result)
        if result.grad_norm is not None:
            extra["grad_norm"] = _metric(result.grad_norm)
        return dict(step=self.step, epoch=(self.step - 1) // self.stepper.steps_per_epoch,
                    world_size=world_size, total_steps=self.total_steps,
                    loss=round(result.loss, 6),
                    samples_per_s=round(self.config.global_batch / seconds, 1),
                    time=time.time(), **extra, **self._maybe_validate())

    def _noise_metrics(self, result: StepResult) -> dict:
        """The gradient noise scale fields of a metrics row (none when it is off)."""
        tracker = self.stepper.noise
        if tracker is None:
            return {}
        raw = result.noise.b_simple if result.noise is not None else None
        return {"b_simple": _metric(tracker.b_simple), "b_simple_raw": _metric(raw),
                "g2": _metric(tracker.g2_ema), "trace_sigma": _metric(tracker.trace_ema)}

    def _maybe_validate(self) -> dict:
        """Run the validation hook if it is due after this step; its ``val_*`` fields."""
        v = self.validation
        if v is None or not v.due(self.step, self.stepper.steps_per_epoch, self.total_steps):
            return {}
        fields = v.run(self.parts.model)
        self.validations.append({"step": self.step, **fields})
        log.info("validation after step %d: %s", self.step, fields)
        return fields

    # ---- files ---------------------------------------------------------------------------------

    def _maybe_checkpoint(self, force: bool = False) -> None:
        cfg = self.config
        due = force or (cfg.checkpoint_every_steps and self.step % cfg.checkpoint_every_steps == 0)
        due = due or (cfg.checkpoint_every_seconds is not None and
                      time.monotonic() - self._last_checkpoint >= cfg.checkpoint_every_seconds)
        if not due or self.out_dir is None:
            return
        state = capture_state(self.parts, self.step, self.stepper.steps_per_epoch)
        path = save_checkpoint(self.out_dir / "checkpoints", self.step, state,
                               keep=cfg.keep_checkpoints)
        self._last_checkpoint = time.monotonic()
        if self._channel is not None:
            self._channel.send("checkpoint", step=self.step, path=str(path))

    def _newest_checkpoint_step(self) -> int:
        if self.out_dir is None:
            return 0
        found = list_checkpoints(self.out_dir / "checkpoints")
        return found[-1][0] if found else 0

    def _write_final(self) -> None:
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.out_dir / "final.pt", dumps(self.parts.model.state_dict()))


class _AbortCheck:
    """Asks the coordinator whether this generation was aborted (a peer died)."""

    def __init__(self, channel: WorkerChannel, generation: int) -> None:
        self.channel, self.generation = channel, generation

    def __call__(self) -> bool:
        return self.channel.ctl(self.generation) == p.CTL_ABORT


def _metric(value: float | None) -> float | None:
    """Six significant digits, or None (JSON null) for a missing or non-finite value."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.6g}")


def _default_device(config: TrainConfig) -> torch.device:
    if config.backend == "nccl" or (config.backend == "auto" and torch.cuda.is_available()):
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % max(1, torch.cuda.device_count()))
    return torch.device("cpu")


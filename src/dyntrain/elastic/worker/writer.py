"""A worker's writes to the run folder: checkpoints when due and the final model, made only
while the coordinator confirms that the worker's generation still counts (see the fencing
section of docs/architecture/elastic.md). At shard levels 1-3 every member writes its shard of
a checkpoint in torch's DCP format (on an object store: into a local scratch folder, then
uploaded) and the leader commits it (``dcpckpt``, ``ckptstore``); at level 0 the leader writes
the whole state."""

from __future__ import annotations

import logging
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dyntrain.elastic import protocol as p
from dyntrain.elastic.collective.comm import Group
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.runs import dcp
from dyntrain.elastic.runs.checkpoint_file import dumps
from dyntrain.elastic.runs.checkpoints import (
    FOLDER,
    commit_sharded,
    dcp_files_folder,
    newest_step,
    save_checkpoint,
    upload_shard,
)
from dyntrain.elastic.runs.storage import RunStore, StorageError
from dyntrain.elastic.sharding.zero import checkpoint_due
from dyntrain.elastic.state import TrainingParts, capture_state
from dyntrain.elastic.worker.channel import WorkerChannel

log = logging.getLogger("dyntrain.trainer")

CONFIRM_POLL_SECONDS = 0.02  # how often a forced write asks again while nobody can answer


class RunWriter:
    """Writes checkpoints and ``final.pt`` for one worker.

    Args:
        store: The run folder, or None (nothing is written).
        config: When checkpoints are due and how many are kept.
        parts: What a checkpoint holds.
        steps_per_epoch: For the checkpoint's position in the epoch.
    """

    def __init__(self, store: RunStore | None, config: TrainConfig, parts: TrainingParts,
                 steps_per_epoch: int) -> None:
        self.store, self.config, self.parts = store, config, parts
        self.steps_per_epoch = steps_per_epoch
        self.channel: WorkerChannel | None = None  # in a job: see confirm_with
        self.worker: str | None = None
        self._last_checkpoint = time.monotonic()
        # the leader's DCP checkpoint to commit: (step, staging, reports, the object store's
        # folder of the members' files or None)
        self._staged: tuple[int, Path, list[bytes], str | None] | None = None

    def confirm_with(self, channel: WorkerChannel, worker: str) -> None:
        """In a job: from now on each write is confirmed with the coordinator through
        ``channel`` (which also carries the checkpoint reports); call once, before training."""
        self.channel, self.worker = channel, worker

    def time_due(self) -> bool:
        """Whether ``checkpoint_every_seconds`` have passed since this worker's last
        checkpoint, by its own clock."""
        every = self.config.checkpoint_every_seconds
        return every is not None and time.monotonic() - self._last_checkpoint >= every

    def maybe_checkpoint(self, step: int, force: bool = False, generation: int | None = None,
                         agreed: bool | None = None) -> None:
        """Write a checkpoint of ``step`` if one is due (or ``force``); in a job, only while
        the coordinator confirms that ``generation`` (None: the worker, between generations)
        still counts. ``agreed``: at sharding levels 1-3, whether the members agreed in the
        step's tail that one by time is due (the leader's clock); None: this worker's clock
        decides (``time_due``)."""
        cfg = self.config
        due = force or (cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0)
        due = due or (self.time_due() if agreed is None else agreed)
        staged, self._staged = self._staged, None
        try:
            self._checkpoint(step, force, generation, due, staged)
        finally:
            if staged is not None and self.store is not None and self.store.local is None:
                shutil.rmtree(staged[1], ignore_errors=True)  # the leader's scratch folder

    def _checkpoint(self, step: int, force: bool, generation: int | None, due: bool,
                    staged: tuple[int, Path, list[bytes], str | None] | None) -> None:
        cfg = self.config
        if not due or self.store is None or not self.may_write(generation, wait=force):
            return
        try:
            if staged is not None and staged[0] == step:  # every member wrote its shard
                where = commit_sharded(self.store, staged[1], step, staged[2],
                                       cfg.keep_checkpoints, staged[3])
            else:
                state = capture_state(self.parts, step, self.steps_per_epoch)
                where = save_checkpoint(self.store, step, state, keep=cfg.keep_checkpoints)
        except (OSError, StorageError) as exc:
            cause = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if force:  # the state to resume from (everyone leaves) or the last step's
                raise OSError(f"checkpoint of step {step} not written: {cause}") from exc
            self._not_written(step, generation, cause)
            return
        self._last_checkpoint = time.monotonic()
        if self.channel is not None:
            self.channel.send(p.Checkpoint(generation, step, where))

    def _not_written(self, step: int, generation: int | None, cause: str) -> None:
        """A periodic checkpoint failed (a full disk, a store that refused the upload): say so
        here and to the coordinator, and go on training; the next due checkpoint tries again
        (by time: a whole period later). Nothing was committed, so the newest checkpoint is
        still the one before."""
        self._last_checkpoint = time.monotonic()
        what = (f"checkpoint of step {step} not written ({cause}); training goes on, the next "
                "due checkpoint tries again")
        print(f"dyntrain: worker {self.worker or 'alone'}: {what}", file=sys.stderr, flush=True)
        if self.channel is not None:
            self.channel.send(p.Checkpoint(generation, step, "", error=what))

    def after_sharded_step(self, shards, group: Group, generation: int, step: int,
                           force: bool, validate: bool,
                           should_abort: Callable[[], bool]) -> None:
        """Every member, after an applied step at shard levels 1-3 (``shards``: its
        ``OptimizerShards``; ``force``: the last step, every member leaves after it, or the
        members agreed on a checkpoint by time (``StepResult.checkpoint``);
        ``validate``: the leader validates after it): when a checkpoint is due
        (``checkpoint_due``, as every member can tell), write this member's shard of it
        into the step's staging folder (on an object store: into a scratch folder of its own,
        then uploaded into the generation's folder of the step) and exchange the reports (the
        leader commits it in ``maybe_checkpoint``). Then the shards' own work after a step
        (``OptimizerShards.after_applied``)."""
        due = force or checkpoint_due(self.config, step, -1, False)
        sharded = due and self.store is not None
        if sharded:
            self._write_shard(shards, group, generation, step, should_abort)
        shards.after_applied(group, due and not sharded, validate, should_abort)

    def _write_shard(self, shards, group: Group, generation: int, step: int,
                     should_abort: Callable[[], bool]) -> None:
        local = self.store.local
        staging = (dcp.staging_folder(local / FOLDER, step, generation) if local is not None
                   else Path(tempfile.mkdtemp(prefix=f"dyntrain-dcp-{step:09d}-")))
        keep, folder = False, None
        try:
            if local is None:  # the leader names this write's folder
                token = group.broadcast_bytes(
                    secrets.token_hex(4).encode() if group.rank == 0 else None, 0, should_abort)
                folder = dcp_files_folder(step, generation, token.decode())
            state = capture_state(self.parts, step, self.steps_per_epoch)
            named = list(self.parts.model.named_parameters(remove_duplicate=False))
            names = [[n for n, q in named if q is param] for param in shards.params]
            mine = dcp.split_writes(shards.owner_ranks, [s.nbytes for s in shards.specs],
                                        group.size)[group.rank]
            part = dcp.member_part(state, shards.params, names, self.parts.optimizer, mine,
                                       group.rank == 0)
            report = dcp.write_part(staging, part, group.rank)
            if folder is not None:
                report = upload_shard(self.store, staging, folder, report)
            reports = dcp.exchange_reports(group, report, should_abort)
            if group.rank == 0:
                self._staged, keep = (step, staging, reports, folder), True
        finally:
            if local is None and not keep:  # uploaded, or the generation ended
                shutil.rmtree(staging, ignore_errors=True)

    def may_write(self, generation: int | None, wait: bool) -> bool:
        """Whether this worker may write the run folder for ``generation``: alone always; in a
        job unless the coordinator, asked now, says that the generation was abandoned or this
        worker declared dead (a worker cut off and back writes nothing). While the coordinator
        cannot say (it is away: a restarted service), a periodic write goes ahead as the
        training does - the worker presumes its generation goes on until it re-attaches - and
        a forced one (``wait``: the last step's, ``final.pt``) waits for the answer."""
        if self.channel is None:
            return True
        while (answer := self.channel.confirm(generation)) is None and wait:
            time.sleep(CONFIRM_POLL_SECONDS)
        if answer is False:
            log.warning("worker %s writes nothing more: generation %s was abandoned",
                        self.worker, generation)
        return answer is not False

    def newest_checkpoint_step(self) -> int:
        return 0 if self.store is None else newest_step(self.store)

    def write_final(self) -> None:
        """``final.pt``: the model's weights (the caller confirmed the generation counts)."""
        if self.store is not None:
            self.store.put("final.pt", dumps(self.parts.model.state_dict()))

"""A worker's writes to the run folder: checkpoints when due and the final model, made only
while the coordinator confirms that the worker's generation still counts (see the fencing
section of docs/architecture/elastic.md)."""

from __future__ import annotations

import logging
import time

from dyntrain.elastic import protocol as p
from dyntrain.elastic.channel import WorkerChannel
from dyntrain.elastic.checkpoint import dumps
from dyntrain.elastic.ckptstore import newest_step, save_checkpoint
from dyntrain.elastic.config import TrainConfig
from dyntrain.elastic.state import TrainingParts, capture_state
from dyntrain.elastic.storage import RunStore

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

    def confirm_with(self, channel: WorkerChannel, worker: str) -> None:
        """In a job: from now on each write is confirmed with the coordinator through
        ``channel`` (which also carries the checkpoint reports); call once, before training."""
        self.channel, self.worker = channel, worker

    def maybe_checkpoint(self, step: int, force: bool = False,
                         generation: int | None = None) -> None:
        """Write a checkpoint of ``step`` if one is due (or ``force``); in a job, only while
        the coordinator confirms that ``generation`` (None: the worker, between generations)
        still counts."""
        cfg = self.config
        due = force or (cfg.checkpoint_every_steps and step % cfg.checkpoint_every_steps == 0)
        due = due or (cfg.checkpoint_every_seconds is not None and
                      time.monotonic() - self._last_checkpoint >= cfg.checkpoint_every_seconds)
        if not due or self.store is None or not self.may_write(generation, wait=force):
            return
        state = capture_state(self.parts, step, self.steps_per_epoch)
        where = save_checkpoint(self.store, step, state, keep=cfg.keep_checkpoints)
        self._last_checkpoint = time.monotonic()
        if self.channel is not None:
            self.channel.send(p.Checkpoint(generation, step, where))

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

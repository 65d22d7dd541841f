"""The launcher's side of ``--chaos``: shows the policy what happens, carries out its strikes."""

from __future__ import annotations

import json
import os
import time

from dyntrain.elastic.membership.coordinator import Coordinator
from dyntrain.elastic.membership.phases import Phase
from dyntrain.elastic.runs.linefile import open_lines
from dyntrain.elastic.runs.storage import RunStore
from dyntrain.launch.chaos import Chaos, Situation, Strike
from dyntrain.launch.local import LocalWorkers

CHAOS_FILE = "chaos.jsonl"


class ChaosDriver:
    """One tick at a time: build the ``Situation``, make the strikes, log them to chaos.jsonl."""

    def __init__(self, chaos: Chaos, coord: Coordinator, workers: LocalWorkers, store: RunStore,
                 say) -> None:
        self.chaos, self.coord, self.workers, self.say = chaos, coord, workers, say
        # the `checkpoint` aim watches a local folder's temporary files (an object store's
        # uploads are not seen: that aim falls back to `any` after its timeout)
        self.checkpoints = store.local / "checkpoints" if store.local is not None else None
        self.log = open_lines(store, CHAOS_FILE, on_error=say)
        self.made = 0

    @property
    def pending(self) -> bool:
        return self.chaos.left > 0

    def tick(self) -> None:
        situation = self.situation()
        for strike in self.chaos.strikes(situation):
            self._strike(strike, situation)

    def situation(self) -> Situation:
        coord, sent = self.coord, {w: lw.signalled for w, lw in self.workers.workers.items()}
        # a worker already sent SIGKILL or SIGSTOP is not struck again (it has not been reaped
        # yet); one that was told to leave can still be killed, but not told again
        live = tuple(w for w in self.workers.alive()
                     if sent.get(w) not in ("kill", "hang") and w not in coord.membership.dead)
        gen = coord.current
        handing = (gen is not None and coord.phase is Phase.RUNNING and bool(gen.receivers)
                   and not coord.settled())
        return Situation(
            now=time.monotonic(), live=live,
            members=tuple(w for w in gen.members if sent.get(w) != "leave") if gen else (),
            known=tuple(w for w in live if w in coord.membership.known),
            reforming=coord.phase is Phase.REFORMING,
            sender=gen.source if handing else None,
            receivers=gen.receivers if handing else (),
            checkpointing=self._writing_checkpoint(),
            leader=gen.members[0] if gen else None)

    def _writing_checkpoint(self) -> bool:
        """A checkpoint is being written: its temporary file (``atomic_write_bytes``), or a
        sharded one's staging folder (``dcpckpt``), exists and changed within the last second
        (a killed writer leaves one behind)."""
        if self.checkpoints is None:
            return False
        now = time.time()
        try:
            with os.scandir(self.checkpoints) as entries:
                return any(e.name.startswith(".ckpt-") and e.name.endswith((".tmp", ".staging"))
                           and now - e.stat().st_mtime < 1.0 for e in entries)
        except OSError:
            return False

    def _strike(self, strike: Strike, s: Situation) -> None:
        self.made += 1
        targets: list[str] = list(strike.targets)
        if strike.action == "join":
            asked = self.coord.clock()
            targets = [self.workers.start() for _ in range(strike.count)]
            for worker in targets:
                self.coord.note_request(worker, asked)
        else:
            for worker in targets:
                self.coord.note_request(worker)
                self.workers.signal(worker, strike.action)
        what = {"sender": "the sender of a state hand-over",
                "receiver": "a receiver of a state hand-over",
                "checkpoint": "the leader while it writes a checkpoint",
                "reform": "during a re-formation", "burst": "several at once",
                "refill": "no worker left"}.get(strike.aim, "")
        self.say(f"chaos {self.made}/{self.chaos.count}: {strike.action} "
                 f"{', '.join(targets)}" + (f" ({what})" if what else ""))
        record = {"n": self.made, "action": strike.action, "workers": targets,
                  "aim": strike.aim, "time": time.time(), "phase": self.coord.phase.value,
                  "generation": self.coord.current.number if self.coord.current else None,
                  "step": self.coord.job.highest_step}
        self.log.write(json.dumps(record))

    def close(self) -> None:
        self.log.close()

"""A job's coordinator hosted by one of its workers after the launcher's host was lost for good.

``python -m dyntrain.launch.successor SPEC`` is started by a worker of a ``dyntrain run
--takeover`` job (``dyntrain.elastic.worker.succession``) in a session of its own. SPEC (JSON)
says which job (its ``job/info``), its ``Takeover``, which worker hosts it and on which host,
the old coordinator's port, the members of the last generation and those presumed lost with the
old host. It:

1. opens the run folder; when it cannot be read from this host (a local disk of the lost host:
   no numerics record there), it says so in one line and keeps what can be kept: the rows and
   files from now on go to the same path on this host;
2. listens on the old port on this host (else on a free one), claims the coordinator in the run
   folder's ``coordinator.json`` with the next epoch, and publishes ``job/info`` (with the
   takeover, so that the job may move again);
3. rebuilds the coordinator from the workers' own positions, as a restarted service does
   (``Coordinator.expect_reattach``): the last generation's members are awaited, those of the
   lost host are declared lost at once; the job goes on from the most advanced state any
   survivor holds, and no step is applied twice;
4. ticks it until the job is done or failed (every worker gone), writing ``metrics.jsonl``,
   ``events.jsonl`` and ``result.json`` as the launcher did; its lines go to its log.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta

import torch.distributed as dist

from dyntrain.elastic import protocol as p
from dyntrain.elastic.membership.coordinator import Coordinator
from dyntrain.elastic.membership.members import CoordinatorConfig
from dyntrain.elastic.membership.phases import Phase
from dyntrain.elastic.numerics import Numerics
from dyntrain.elastic.runs.checkpoints import latest_valid_checkpoint
from dyntrain.elastic.runs.coordinator_file import COORDINATOR_FILE, read_coordinator_file
from dyntrain.elastic.runs.folder import read_numerics
from dyntrain.elastic.runs.log import last_step
from dyntrain.elastic.runs.storage import RunStore, StorageError, open_store
from dyntrain.elastic.worker.connect import connect_store
from dyntrain.elastic.worker.succession import INFO_KEY, Takeover
from dyntrain.launch.sink import RunSink

TICK_SECONDS = 0.01


def reachable(store: RunStore) -> bool:
    """Whether the run folder is the job's, as this host sees it: it holds the numerics record
    that the first worker's hello wrote."""
    try:
        return read_numerics(store) is not None
    except (OSError, StorageError, ValueError):
        return False


def claim(store: RunStore, address: str, job: str, epoch: int, by: str) -> None:
    """Record in the run folder that the coordinator moved to ``address`` (epoch ``epoch``)."""
    store.put(COORDINATOR_FILE, (json.dumps({"address": address, "job": job, "epoch": epoch,
                                             "by": by}) + "\n").encode())


def _rival(store: RunStore, spec: dict, own: str, job: str | None, epoch: int) -> str | None:
    """Who hosts the job's coordinator already, if anyone: a successor before this one in
    rank order whose address answers with the job, or another's claim of this epoch."""
    for address in spec.get("earlier", []):
        if address == own:  # (one on this host would hold the port: this one has it)
            continue
        try:
            info = json.loads(connect_store(address, 1.0).get(p.JOB_INFO))
        except Exception:  # not listening (yet), or not that job's
            continue
        if info.get("job") == job:
            return f"the successor at {address}"
    record = read_coordinator_file(store.location)
    if record.get("job") == job and record.get("epoch", 0) >= epoch and \
            record.get("by") != spec["by"]:
        return f"worker {record.get('by')} (the run folder's claim)"
    return None


class Superseded:
    """The launcher's side of a takeover: whether a successor has claimed the job's coordinator
    in the run folder (read at most once a second). A launcher whose host was cut off, not lost,
    and that finds its job taken over stops instead of training on beside the successor."""

    def __init__(self, store: RunStore, job: str, every: float = 1.0) -> None:
        self.store, self.job, self.every, self._next = store, job, every, 0.0

    def __call__(self) -> dict | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.every
        record = read_coordinator_file(self.store.location)
        return record if record.get("job") == self.job and record.get("epoch", 0) > 0 else None


def _listen(port: int) -> dist.TCPStore:
    """A TCPStore server on the old coordinator's port if it is free here, else a free one."""
    for candidate in dict.fromkeys((port, 0)):
        try:
            return dist.TCPStore("0.0.0.0", candidate, is_master=True, wait_for_workers=False,
                                 timeout=timedelta(seconds=30))
        except Exception:
            if candidate == 0:
                raise
    raise AssertionError("unreachable")


def host(spec: dict, stream=sys.stdout) -> int:
    """Host the job's coordinator until the job ends; its exit code."""
    info, by = dict(spec["info"]), spec["by"]
    old = Takeover(**spec["takeover"])
    takeover = Takeover(old.after, old.within, old.coordinator, old.epoch + 1)
    store = open_store(info["out_dir"])
    kept = reachable(store)
    sink = RunSink(store, "?", stream, quiet=False, every=5.0, tensorboard=False)
    if not kept:
        sink.announce(f"the run folder {info['out_dir']} cannot be read from {spec['host']} "
                      f"(it was on the lost host {spec['lost_host']}?): the job goes on, its "
                      "rows and files from now on are kept at that path on this host")
    tcp = _listen(int(spec["port"]))
    address = f"{spec['host']}:{tcp.port}"
    conf = takeover.coordinator
    numerics = Numerics.from_json(info["numerics"]) if info.get("numerics") else Numerics()

    def find_checkpoint():
        found = latest_valid_checkpoint(store)
        return (found[0], found[1]) if found else None

    coord = Coordinator(tcp, CoordinatorConfig(
        conf["min_workers"], conf["max_workers"], expected_initial=1,
        settle_seconds=conf["settle_seconds"], failure_timeout=conf["failure_timeout"],
        numerics=numerics, allow_mixed_numerics=conf["allow_mixed_numerics"]),
        sink, find_checkpoint, numerics=read_numerics(store) if kept else None)
    coord.expect_reattach(list(spec["expect"]), last_step(store) if kept else 0)
    for worker in spec["lost"]:
        coord.mark_dead(worker, f"lost with the coordinator's host {spec['lost_host']}")
    rival = _rival(store, spec, address, info.get("job"), takeover.epoch)
    if rival:  # before job/info: no worker has come to this one
        sink.announce(f"{rival} already hosts the job's coordinator: worker {by} yields")
        sink.close()
        return 0
    # last: a worker that finds job/info finds the coordinator ready for its report
    tcp.set(p.JOB_INFO, json.dumps({**info, INFO_KEY: takeover.to_json()}))
    try:
        claim(store, address, info.get("job"), takeover.epoch, by)
    except (OSError, StorageError) as exc:
        sink.log(f"cannot record the coordinator's address in the run folder: {exc}")
    sink.announce(f"worker {by} hosts the job's coordinator at {address} (takeover "
                  f"{takeover.epoch}: the coordinator's host {spec['lost_host']} was lost)")
    try:
        return _loop(coord, sink, conf["failure_timeout"])
    finally:
        sink.close()


def _loop(coord: Coordinator, sink: RunSink, failure_timeout: float) -> int:
    alone_since = None
    while True:
        try:
            phase = coord.tick()
        except StorageError as exc:
            coord.fail(f"the run folder cannot be read: {exc}")
            phase = coord.phase
        if phase is Phase.DONE:
            coord.drain()
            sink.catch_up()
            sink.announce("job done")
            return 0
        if phase is Phase.FAILED:
            sink.catch_up()
            sink.announce(f"job failed: {coord.failure}")
            return 1
        if coord.live_workers():
            alone_since = None
        elif alone_since is None:
            alone_since = time.monotonic()
        elif time.monotonic() - alone_since > 2 * failure_timeout:
            coord.fail("every worker is gone")
        time.sleep(TICK_SECONDS)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    return host(json.loads(args[0]))


if __name__ == "__main__":
    sys.exit(main())

"""The Ray executor: each worker is a process on a Ray node, run by one detached actor.

The actor (``ray_actor.WorkerProcess``) is named ``dyntrain:{job}:{attempt}:{worker}`` in this
service's namespace and requests the worker's CPUs, GPUs and memory plus one unit of its
compute environment's custom resource (``dyntrain_ce_<environment>``); it starts the command in
a session of its own, signals its process group, keeps its exit until the service has stored it
(``release``), and serves its output in pieces. Capacity is Ray nodes: an environment's slots
are what the live nodes carrying its resource offer (``slots``), so a node that joins is room to
grow and a node that dies is capacity taken away, its workers reported as ``lost``.

One thread per executor watches the workers: it holds one ``wait_exit`` call per actor (an
exit wakes it at once), copies new output from each actor into the worker's log file on this
host (where the controller reads it as for a local worker), and notices dead nodes. A worker's
exit is reported only after the rest of its output was copied.

A node cut off by the network is declared dead by Ray's health checks while its processes still
run; the actor there kills its command once it has been cut off from the cluster for
``fence_seconds`` (see ``ray_actor``), and the worker of a dead node (or of an actor that
died) is reported lost only ``fence_seconds + FENCE_MARGIN_S`` after that was seen: a plain job is
retried only once its first run is surely over, never beside it.

After a restart ``adopt`` finds an actor by the name in the stored handle, ``find`` by the
worker id, and ``sweep`` ends the actors in the namespace that nobody adopted; the namespace's
actors are looked up, listed and ended through ``ray_directory.ActorDirectory``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path

from dyntrain.service.core.executor import (
    SIGNALS,
    Executor,
    ExecutorError,
    StartError,
    WorkerExit,
    WorkerHandle,
    WorkerSpec,
    check_worker_id,
    exit_from_record,
    make_resources,
)
from dyntrain.service.core.model import Resources
from dyntrain.service.executors.ray_actor import WorkerProcess
from dyntrain.service.executors.ray_address import connect, coordinator_address, probe_cluster
from dyntrain.service.executors.ray_directory import ActorDirectory
from dyntrain.service.executors.ray_nodes import (
    actor_name,
    default_namespace,
    import_ray,
    main_actor_name,
    needs,
    node_slots,
    packed_on,
    resource_name,
)
from dyntrain.service.executors.ray_worker import RayWorker, first_line, mirror_output

WAIT_S = 20.0  # one wait_exit call blocks this long in the actor (a dead caller's call ends)
MIRROR_S = 0.25
NODES_S = 1.0  # how often the node list is read again
START_WAIT_S = 2.0  # how long start_many waits for the actors' replies before returning
FENCE_S = 10.0  # an actor cut off from the GCS this long kills its command
FENCE_MARGIN_S = 5.0  # + the actor's probe period and timeout, and scheduling delays


class RayExecutor(Executor):
    """Runs workers on the nodes of a Ray cluster; see the module docstring."""

    name = "ray"
    #: this process's connection was left by an executor that handed over to the next one
    inherited = False

    def __init__(self, state_dir: str | os.PathLike, address: str = "auto",
                 namespace: str | None = None, placement: str = "pack",
                 start_timeout: float = 120.0,
                 connect_timeout: float = 10.0, node_log_dir: str | None = None,
                 fence_seconds: float = FENCE_S) -> None:
        """``placement``: ``pack`` (a job's new workers prefer the nodes it already runs on) or
        ``spread`` (Ray's SPREAD). ``node_log_dir``: where the actors write output on their
        nodes. ``fence_seconds``: how long a worker's command outlives its node's cut from the
        cluster (see the module docstring; > 0). Job coordinators listen at the address the
        cluster sees for this host (``coordinator_address``)."""
        ray = self._ray = import_ray()
        if placement not in ("pack", "spread"):
            raise ExecutorError(f"placement must be pack or spread, got {placement!r}")
        if not fence_seconds > 0:
            raise ExecutorError(f"fence seconds must be > 0, got {fence_seconds}")
        self.fence_seconds = fence_seconds
        self.namespace = namespace or default_namespace(state_dir)
        self.placement, self.start_timeout = placement, start_timeout
        self._node_log_dir = node_log_dir or os.path.join(
            "/tmp", "dyntrain-ray", self.namespace)
        self._owns_ray = not ray.is_initialized() or RayExecutor.inherited
        RayExecutor.inherited = False
        if not ray.is_initialized():
            probe_cluster(address, connect_timeout)
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            connect(ray, address, self.namespace)
        self.coordinator_host = coordinator_address(ray.util.get_node_ip_address(),
                                                    ray.get_runtime_context().gcs_address)
        self._cls = ray.remote(WorkerProcess)
        self.actors = ActorDirectory(ray, self.namespace)
        self._workers: dict[str, RayWorker] = {}
        self._unreleased: dict[str, object] = {}  # reported, exit not yet stored: its actor
        self._nodes: list[dict] = []
        self._nodes_at = 0.0
        self._lock = threading.RLock()
        self._exited = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="dyntrain-ray")
        self._thread.start()

    # -- capacity ---------------------------------------------------------------------------

    def _alive_nodes(self) -> list[dict]:
        if time.monotonic() - self._nodes_at >= NODES_S:
            try:
                nodes = [n for n in self._ray.nodes() if n.get("Alive")]
            except Exception:  # the GCS is busy: keep the last view
                nodes = self._nodes
            with self._lock:
                self._nodes, self._nodes_at = nodes, time.monotonic()
                self._lose_dead_nodes()
        return self._nodes

    def _total(self, key: str) -> float:
        return sum(n["Resources"].get(key, 0.0) for n in self._alive_nodes())

    def capacity(self) -> Resources:
        return make_resources(self._total("CPU"), int(self._total("GPU")),
                              int(self._total("memory") // 2**20))

    def free(self) -> Resources:
        with self._lock:
            held = [w.spec.resources for w in self._workers.values()]
        total = self.capacity()
        return make_resources(max(0.0, total.cpus - sum(r.cpus for r in held)),
                              max(0, total.gpus - sum(r.gpus for r in held)),
                              max(0, total.memory_mib - sum(r.memory_mib for r in held)))

    def slots(self, environments: dict[str, Resources]) -> dict[str, int]:
        """What the live nodes offer, plus the slot each lost worker holds until it is reported
        (its node may still run it, cut off): the controller counts that worker as running, and
        must not stop another one to make room for it."""
        nodes = self._alive_nodes()
        alive, now = {n["NodeID"] for n in nodes}, time.monotonic()
        with self._lock:
            fenced = Counter(w.spec.environment for w in self._workers.values()
                             if w.exit is not None and now < w.report_at and w.node not in alive)
        return {name: sum(node_slots(n["Resources"], name, slot) for n in nodes)
                + fenced[name] for name, slot in environments.items()}

    # -- starting ---------------------------------------------------------------------------

    def start(self, spec: WorkerSpec) -> WorkerHandle:
        [result] = self.start_many([spec])
        if isinstance(result, ExecutorError):
            raise result
        return result

    def start_many(self, specs: list[WorkerSpec]) -> list[WorkerHandle | ExecutorError]:
        """Create every worker's actor and start the commands; wait for their replies together
        at most ``START_WAIT_S`` (the controller holds the service's lock meanwhile). A worker
        whose actor has not answered by then is started: the watcher takes its reply later
        (a command that cannot run, or no node within ``start_timeout``, is then its exit)."""
        ray = self._ray
        self._check_open()
        out: list[WorkerHandle | ExecutorError | None] = []
        pending: dict[int, tuple[WorkerSpec, object, object]] = {}
        for i, spec in enumerate(specs):
            try:
                actor = self._create(spec, {s.worker_id for s, _, _ in pending.values()})
            except ExecutorError as e:
                out.append(e)
                continue
            out.append(None)
            main = None if spec.main_worker is None else main_actor_name(spec)
            kernels = None if spec.cpu_kernels is None else spec.cpu_kernels.value
            pending[i] = (spec, actor, actor.start.remote(spec.worker_id, list(spec.argv),
                                                          dict(spec.env), spec.cwd, main,
                                                          self.namespace, kernels))
        refs = [ref for _, _, ref in pending.values()]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=START_WAIT_S)
        for i, (spec, actor, ref) in pending.items():
            out[i] = self._started(spec, actor, ref)
        return out

    def _create(self, spec: WorkerSpec, batch: set[str]):
        wid = spec.worker_id
        check_worker_id(wid)
        if not spec.argv or not all(isinstance(a, str) for a in spec.argv):
            raise ExecutorError(f"worker {wid}: argv must be a non-empty list of strings")
        with self._lock:
            if wid in self._workers or wid in self._unreleased or wid in batch:
                raise ExecutorError(f"worker {wid} already exists")
        r = spec.resources
        options = {"name": actor_name(spec), "namespace": self.namespace,
                   "lifetime": "detached", "max_restarts": 0, "max_concurrency": 8,
                   "num_cpus": r.cpus, "num_gpus": r.gpus, "memory": r.memory_mib * 2**20,
                   "scheduling_strategy": self._strategy(spec)}
        if spec.environment is not None:
            options["resources"] = {resource_name(spec.environment): 1}
        try:
            return self._cls.options(**options).remote(self._node_log_dir, self.fence_seconds,
                                                       self.start_timeout)
        except ValueError as exc:  # the name is taken
            raise ExecutorError(f"worker {wid}: {str(exc).splitlines()[0]}") from None

    def _strategy(self, spec: WorkerSpec):
        if self.placement == "spread":
            return "SPREAD"
        with self._lock:
            nodes = Counter(w.node for w in self._workers.values()
                            if w.spec.job_id == spec.job_id and w.node and w.exit is None)
        return packed_on(nodes.most_common(1)[0][0] if nodes else None)

    def _started(self, spec: WorkerSpec, actor, ref) -> WorkerHandle | ExecutorError:
        wid = spec.worker_id
        w = RayWorker(spec, WorkerHandle(wid, self.name, actor_name(spec)), actor, None,
                    starting=ref, start_by=time.monotonic() + self.start_timeout)
        if self._ray.wait([ref], timeout=0)[0]:
            error = self._on_start(w)
            if error is not None:
                return error
        with self._lock:
            self._workers[wid] = w
        return w.handle

    def _on_start(self, w: RayWorker) -> ExecutorError | None:
        """Take the reply of the worker's ``start`` call: its node, or why it did not start."""
        ray, wid, ref = self._ray, w.spec.worker_id, w.starting
        w.starting = None
        try:
            reply = ray.get(ref)
        except Exception as exc:
            error: ExecutorError = ExecutorError(
                f"worker {wid}: its Ray actor failed while starting: {first_line(exc)}")
        else:
            if "error" in reply:
                error = StartError(reply["error"])
            elif "lost" in reply:  # not the command's fault (its gang's main worker is gone)
                error = ExecutorError(f"worker {wid}: {reply['lost']}")
            else:
                w.node = reply.get("node")
                w.waiting = w.actor.wait_exit.remote(WAIT_S)
                return None
        self.actors.kill(w.actor)
        return error

    def _fail_start(self, w: RayWorker, error: ExecutorError) -> None:
        """A worker that did not start: its cause in its log (where the service reads a
        worker's error line), exit code 127 for a command that cannot run, else lost."""
        path = Path(w.spec.log_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(f"dyntrain: {error}\n")
        if isinstance(error, StartError):
            self._set_exit(w, WorkerExit(w.spec.worker_id, 127, None, f"not started: {error}",
                                         time.time()))
        else:
            self._lost(w, str(error))

    # -- watching ---------------------------------------------------------------------------

    def _watch(self) -> None:
        """The watcher thread: exits, output, dead nodes."""
        ray = self._ray
        while not self._stop.is_set():
            try:
                with self._lock:
                    live = [w for w in self._workers.values() if w.exit is None]
                now = time.monotonic()
                for w in live:
                    if w.starting is not None and now > w.start_by:
                        self.actors.kill(w.actor)
                        self._fail_start(w, ExecutorError(
                            f"worker {w.spec.worker_id}: no Ray node took it within "
                            f"{self.start_timeout:g} s (it needs {needs(w.spec)})"))
                    elif w.starting is None and w.waiting is None and now >= w.retry_at:
                        w.waiting = w.actor.wait_exit.remote(WAIT_S)
                live = [w for w in live if w.exit is None]
                refs = {w.starting or w.waiting: w for w in live
                        if (w.starting or w.waiting) is not None}
                if refs:
                    ready, rest = ray.wait(list(refs), num_returns=1, timeout=MIRROR_S)
                    if rest:
                        ready += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
                    for ref in ready:
                        w = refs[ref]
                        if w.starting is not None:
                            error = self._on_start(w)
                            if error is not None:
                                self._fail_start(w, error)
                        else:
                            self._on_wait(w, ref)
                else:
                    self._stop.wait(MIRROR_S)
                mirror_output(self._ray, [w for w in live if w.exit is None and w.starting is None])
                self._alive_nodes()
                self._wake_when_due()
            except Exception:  # a passing GCS hiccup must not end the watch
                logging.getLogger("dyntrain.service").exception("ray executor watch")
                self._stop.wait(MIRROR_S)

    def _on_wait(self, w: RayWorker, ref) -> None:
        ray = self._ray
        w.waiting = None
        try:
            record = ray.get(ref)
        except ray.exceptions.ActorUnavailableError:
            w.retry_at = time.monotonic() + 1.0  # its node may be coming back, or be declared dead
            return
        except Exception as exc:  # ActorDiedError: its node (or its process) is gone
            self._lost(w, f"its Ray actor died: {first_line(exc)}")
            return
        if record is None:
            return  # still running; asked again on the next round
        mirror_output(self._ray, [w], drain=True)
        self._set_recorded(w, record)

    def _set_recorded(self, w: RayWorker, record: dict) -> None:
        """The exit an actor recorded: lost when it killed the command for being cut off."""
        if record.get("lost"):
            self._lost(w, record["lost"], fenced=True)
        else:
            self._set_exit(w, exit_from_record(w.spec.worker_id, record))

    def _set_exit(self, w: RayWorker, exit_: WorkerExit) -> None:
        with self._lock:
            if w.exit is None:
                w.exit = exit_
        if time.monotonic() >= w.report_at:
            self._exited.set()

    def _lost(self, w: RayWorker, why: str, fenced: bool = False) -> None:
        """Capacity taken away. Unless its command is known to be dead (``fenced``), it is
        reported once its actor, if cut off rather than dead, has surely killed it."""
        if not fenced and w.exit is None:
            w.report_at = time.monotonic() + self.fence_seconds + FENCE_MARGIN_S
        self._set_exit(w, WorkerExit(w.spec.worker_id, None, None, f"lost: {why}", time.time(),
                                     lost=True))

    def _wake_when_due(self) -> None:
        """Wake ``wait`` for the lost workers whose fence has passed."""
        now = time.monotonic()
        with self._lock:
            if any(w.exit is not None and w.report_at and now >= w.report_at
                   for w in self._workers.values()):
                self._exited.set()

    def _lose_dead_nodes(self) -> None:
        alive = {n["NodeID"] for n in self._nodes}
        for w in self._workers.values():
            if w.exit is None and w.node is not None and w.node not in alive:
                self._lost(w, f"its Ray node {w.node[:12]} is gone")

    def poll(self) -> list[WorkerExit]:
        now = time.monotonic()
        with self._lock:
            self._exited.clear()
            out = []
            for wid, w in list(self._workers.items()):
                if w.exit is not None and now >= w.report_at:
                    out.append(w.exit)
                    del self._workers[wid]
                    self._unreleased[wid] = w.actor
            return out

    def wait(self, timeout: float) -> None:
        self._exited.wait(timeout)

    def alive(self, worker_id: str) -> bool:
        with self._lock:
            w = self._workers.get(worker_id)
            return w is not None and w.exit is None

    def signal(self, worker_id: str, sig: str) -> None:
        if sig not in SIGNALS:
            raise ExecutorError(f"unknown signal {sig!r}; use one of {', '.join(SIGNALS)}")
        with self._lock:
            w = self._workers.get(worker_id)
            if w is None:
                raise ExecutorError(f"unknown worker {worker_id} (never started, or its exit "
                                    "was reported already)")
            if w.exit is not None:
                return
        w.actor.signal.remote(sig)  # an actor that is gone: its exit is on its way

    def release(self, worker_ids: list[str]) -> None:
        for wid in worker_ids:
            actor = self._unreleased.pop(wid, None)
            if actor is not None:
                self.actors.discard(actor)

    # -- restart ----------------------------------------------------------------------------

    def adopt(self, handle: WorkerHandle, spec: WorkerSpec) -> bool:
        self._check_open()
        wid = handle.worker_id
        if handle.executor != self.name:
            raise ExecutorError(f"worker {wid} belongs to executor {handle.executor!r}, "
                                f"not {self.name!r}")
        check_worker_id(wid)
        with self._lock:
            known = self._workers.get(wid)
            if known is not None:
                return known.exit is None
        actor, status = self.actors.status(handle.ref)
        try:
            mirrored = os.path.getsize(spec.log_path)
        except OSError:
            mirrored = 0
        w = RayWorker(spec, handle, actor, None, mirrored)
        with self._lock:
            self._workers[wid] = w
        if actor is None or "running" not in status and "ended_at" not in status:
            self._lost(w, status if isinstance(status, str) else "its Ray actor never started")
            return False
        if "running" in status:
            w.waiting = actor.wait_exit.remote(WAIT_S)
            return True
        # ended meanwhile: its output first, then its exit
        mirror_output(self._ray, [w], drain=True)
        self._set_recorded(w, status)
        return False

    def find(self, worker_id: str) -> WorkerHandle | None:
        check_worker_id(worker_id)
        for name in self.actors.names():
            if name.rsplit(":", 1)[-1] != worker_id:
                continue
            actor, status = self.actors.status(name)
            if actor is not None and status.get("started") is False:
                self.actors.discard(actor)  # created, but its command never started
                return None
            return WorkerHandle(worker_id, self.name, name)
        return None

    def sweep(self) -> list[str]:
        with self._lock:
            owned = {w.handle.ref for w in self._workers.values()}
            owned |= {n for n in self._unreleased}
        ended = []
        for name in self.actors.names():
            wid = name.rsplit(":", 1)[-1]
            actor = None if name in owned or wid in owned else self.actors.get(name)
            if actor is not None:
                self.actors.discard(actor)
                ended.append(wid)
        return ended

    def shutdown(self) -> None:
        """Stop watching; the actors and their workers keep running."""
        owned = self._owns_ray
        self.hand_over()
        if owned:
            RayExecutor.inherited = False
            self._ray.shutdown()

    def hand_over(self) -> None:
        """Stop watching, staying connected: the next executor of this process (a replica's
        next term) uses the same driver, so a takeover does not wait for a new connection,
        and a replica that loses its term while cut off from the cluster (a partition) builds
        its next executor without reaching the cluster; that one disconnects at the end."""
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            self._workers.clear()
        self._owns_ray, owned = False, self._owns_ray
        RayExecutor.inherited = RayExecutor.inherited or owned

    def _check_open(self) -> None:
        if self._stop.is_set():
            raise ExecutorError("ray executor is shut down")

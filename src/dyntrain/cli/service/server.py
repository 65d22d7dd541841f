"""``dyntrain server``: the job service in the foreground."""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path

import click

from dyntrain.cli.service.common import one_line
from dyntrain.errors import DyntrainError
from dyntrain.mainexit import end_process
from dyntrain.service.core.model import DEFAULT_PORT


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise DyntrainError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise DyntrainError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(False)
    return sock


def _url_for(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@click.command()
@click.option("--state-dir", default=".dyntrain", show_default=True,
              type=click.Path(file_okay=False), help="Database, run folders and worker logs.")
@click.option("--db", "db_url", default=None,
              help="Database URL (sqlite:///... or postgresql+psycopg://...) "
                   "[default: sqlite in the state dir].")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --token.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int,
              help="Port to listen on (0: any free port).")
@click.option("--token", default=None, help="Token clients must send [default: $DYNTRAIN_TOKEN].")
@click.option("--grace-seconds", default=120.0, show_default=True, type=float,
              help="Seconds a preempted worker gets between SIGTERM and SIGKILL.")
@click.option("--reattach-seconds", default=300.0, show_default=True, type=float,
              help="Seconds elastic workers train on without the service, waiting for it to "
                   "restart and re-attach them (0: they stop; their job resumes from its "
                   "newest checkpoint).")
@click.option("--warm-workers", default=1, show_default=True, type=int,
              help="Python processes with torch imported kept ready to become workers (each "
                   "holds ~300 MiB; 0: every worker starts a new Python).")
@click.option("--aws-credentials", default=None, type=click.Path(dir_okay=False),
              help="AWS credentials file (INI: aws_access_key_id, aws_secret_access_key): the "
                   "AWS Batch and CloudWatch Logs endpoints then need requests signed with one "
                   "of its keys. Without it they answer loopback clients only.")
@click.option("--executor", default="local", show_default=True,
              type=click.Choice(["local", "ray"]),
              help="Where workers run: processes on this machine, or on the nodes of a Ray "
                   "cluster (needs the `dyntrain[ray]` extra).")
@click.option("--ray-address", default=None,
              help="The Ray cluster's GCS address HOST:PORT [default: $RAY_ADDRESS, else auto].")
@click.option("--ray-namespace", default=None,
              help="Ray namespace of this service's actors [default: one per state dir].")
@click.option("--ray-placement", default="pack", show_default=True,
              type=click.Choice(["pack", "spread"]),
              help="pack: a job's new workers prefer the nodes it already runs on; spread: "
                   "Ray's SPREAD.")
@click.option("--ray-fence-seconds", default=10.0, show_default=True, type=float,
              help="A worker on a Ray node cut off from the cluster (no connection to its GCS) "
                   "this long is killed there; a worker whose node Ray declared dead is "
                   "reported lost (and a plain job retried) this long + 5 s later, so that a "
                   "job never runs twice at once.")
@click.option("--coordinator-host", default=None,
              help="Address of this host that workers reach its job coordinators at [default: "
                   "127.0.0.1; with Ray, the address the cluster sees for this host].")
@click.option("--policy", default="fifo", show_default=True,
              type=click.Choice(["fifo", "fair", "goodput", "fairshare"]),
              help="How running elastic jobs share free slots: fifo (by priority, then first "
                   "in, first out, each to its max), fair (even shares), goodput (by each "
                   "job's measured speed-up, per dollar) or fairshare (the shares of fair-share "
                   "queues by weight, slots taken back by shrinking elastic jobs; goodput "
                   "within a share).")
@click.option("--replica", is_flag=True,
              help="One of several replicas on one PostgreSQL database (--db): every replica "
                   "answers every API, the one holding the controller's lease runs the "
                   "controller; the replicas share --state-dir (a shared file system).")
@click.option("--replica-name", default=None,
              help="This replica's name among the replicas [default: HOST:PORT].")
@click.option("--lease-ttl-seconds", default=5.0, show_default=True, type=float,
              help="With --replica: a leader that has not renewed its lease this long (by the "
                   "database's clock) is replaced.")
@click.option("--lease-renew-seconds", default=1.0, show_default=True, type=float,
              help="With --replica: how often the leader renews its lease.")
def server(state_dir, db_url, host, port, token, grace_seconds, reattach_seconds,
           warm_workers, aws_credentials, executor, ray_address, ray_namespace, ray_placement,
           ray_fence_seconds, coordinator_host, policy, replica, replica_name,
           lease_ttl_seconds, lease_renew_seconds):
    """Run the job service (REST API and scheduler) in the foreground; Ctrl-C stops it."""
    import uvicorn

    from dyntrain.service.assembly import LocalExecutorSetup, RayExecutorSetup, build_service
    from dyntrain.service.aws.sigv4 import load_credentials
    from dyntrain.service.engine.leadership import LeaseConfig
    from dyntrain.service.engine.service import ServiceConfig
    from dyntrain.service.engine.statelock import StateDirLock
    from dyntrain.service.server import create_server_app

    if not 0 <= port <= 65535:
        raise DyntrainError(f"--port must be 0-65535, got {port}")
    if grace_seconds < 0:
        raise DyntrainError(f"--grace-seconds must be >= 0, got {grace_seconds}")
    if reattach_seconds < 0:
        raise DyntrainError(f"--reattach-seconds must be >= 0, got {reattach_seconds}")
    if warm_workers < 0:
        raise DyntrainError(f"--warm-workers must be >= 0, got {warm_workers}")
    if not ray_fence_seconds > 0:
        raise DyntrainError(f"--ray-fence-seconds must be > 0, got {ray_fence_seconds}")
    token = token or os.environ.get("DYNTRAIN_TOKEN") or None
    aws_keys = load_credentials(aws_credentials) if aws_credentials else None
    config = ServiceConfig(Path(state_dir), db_url=db_url, host=host, port=port, token=token,
                           grace_seconds=grace_seconds, reattach_seconds=reattach_seconds,
                           policy=policy, replica=replica, replica_name=replica_name,
                           lease_ttl=lease_ttl_seconds, lease_renew=lease_renew_seconds)
    if replica:
        LeaseConfig(replica_name or "-", None, lease_ttl_seconds, lease_renew_seconds)  # checks
    setup = (RayExecutorSetup(address=ray_address or os.environ.get("RAY_ADDRESS") or "auto",
                              namespace=ray_namespace, placement=ray_placement,
                              fence_seconds=ray_fence_seconds, coordinator_host=coordinator_host)
             if executor == "ray" else
             LocalExecutorSetup(warm_workers=warm_workers, coordinator_host=coordinator_host))
    state_lock = None if replica else StateDirLock(config.state_dir)  # replicas: the lease
    try:  # before the port: a second server on this state dir is told who runs, not "in use"
        if state_lock is not None:
            state_lock.acquire()
    except OSError as e:
        raise DyntrainError(f"cannot use the state directory {state_dir}: "
                            f"{e.strerror or e}") from None
    try:
        sock = _bind(host, port)
    except BaseException:
        if state_lock is not None:
            state_lock.release()
        raise
    config.port = sock.getsockname()[1]
    try:
        try:
            if state_lock is not None:
                state_lock.record(_url_for(host, config.port))
            service = build_service(config, setup, state_lock)
        except DyntrainError:
            if state_lock is not None:
                state_lock.release()
            raise
        except Exception as e:  # a bad --db URL, an unreadable state dir, ...
            if state_lock is not None:
                state_lock.release()
            raise DyntrainError(f"cannot start the service: {one_line(e)[:300]}") from None
        try:
            app = create_server_app(service, aws_keys)
            userver = uvicorn.Server(uvicorn.Config(
                app, log_level="warning", access_log=False, timeout_graceful_shutdown=5))
            service.start()
            url = _url_for(host, config.port)
            click.echo(f"dyntrain service listening on {url} (state: {config.state_dir})")
            if replica:
                click.echo(f"replica {service.leadership.config.name}: leads while it holds "
                           f"the controller's lease (ttl {lease_ttl_seconds:g} s)")
            click.echo(f"dashboard: {url}/  metrics: {url}/metrics")
            levels = ", ".join(k.value for k in service.executor.kernel_levels())
            click.echo(f"the hosts run cpu kernels {levels or 'none'}; a job pinned to "
                       "another is refused")
            for note in service.recovered:
                click.echo(f"recovered: {note}")
            click.echo("Press Ctrl-C to stop.", err=True)
            _serve(userver, sock)
        finally:
            service.stop()
    finally:
        sock.close()
    click.echo("dyntrain service stopped")
    if threading.current_thread() is threading.main_thread():  # not a server run in a thread
        end_process(0)  # without the interpreter's teardown (dyntrain.mainexit)


def _serve(userver, sock: socket.socket) -> None:
    """Run uvicorn until SIGINT/SIGTERM; the signal stops it instead of killing the process."""
    if threading.current_thread() is not threading.main_thread():
        userver.run(sockets=[sock])
        return
    # uvicorn handles both signals while it serves and re-raises them once it has stopped;
    # these handlers catch the re-raised ones, so the service below still shuts down cleanly.
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda s, _f: caught.append(s))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        userver.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

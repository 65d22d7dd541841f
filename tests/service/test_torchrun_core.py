"""torchrun-compatible jobs without processes: the pure decisions (core/torchrun.py), the
restart's place in the attempt lifecycle, the store's launcher and the bad inputs refused."""

from __future__ import annotations

import pytest

from dyntrain.cli.main import main
from dyntrain.service.core.lifecycle import Ending, EndKind, after_ending
from dyntrain.service.core.model import (
    ElasticSettings,
    JobDefinitionSpec,
    Launcher,
    RetryStrategy,
    ValidationError,
    parse_launcher,
)
from dyntrain.service.core.torchrun import (
    ENV_NAMES,
    ExitAction,
    ExitDecision,
    after_worker_exit,
    restart_count,
    restart_for_resize,
    worker_env,
)
from dyntrain.service.store import Store


def test_each_rank_gets_torchruns_variables():
    env = worker_env(rank=2, world_size=4, master_addr="127.0.0.1", master_port=29500,
                     restart=3, run_id="job1", max_restarts=2)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
                                "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS")} == {
        "RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "3",
        "TORCHELASTIC_RUN_ID": "job1", "TORCHELASTIC_MAX_RESTARTS": "2"}
    assert env["GROUP_RANK"] == "0" and env["GROUP_WORLD_SIZE"] == "1"
    # no agent store: rank 0 hosts the store (env://); NCCL's error handling on, as torchrun's
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert set(env) == ENV_NAMES
    assert worker_env(rank=0, world_size=1, master_addr="h", master_port=1, restart=0,
                      run_id="j", max_restarts=0, nccl_async_error_handling="0")[
        "TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"
    with pytest.raises(ValueError):
        worker_env(rank=4, world_size=4, master_addr="h", master_port=1, restart=0,
                   run_id="j", max_restarts=0)
    with pytest.raises(ValueError):
        worker_env(rank=0, world_size=1, master_addr="h", master_port=0, restart=0,
                   run_id="j", max_restarts=0)


def test_the_restart_count_is_the_number_of_gangs_before():
    assert [restart_count(n) for n in (1, 2, 5)] == [0, 1, 4]
    with pytest.raises(ValueError):
        restart_count(0)


def test_a_resize_restarts_the_gang_and_no_change_does_not():
    assert restart_for_resize(2, grow=2) == "restart: 2 -> 4 workers (capacity added)"
    assert restart_for_resize(3, shrink=1) == "restart: 3 -> 2 workers (capacity taken back)"
    # a worker moved to another environment: still a restart (the gang is never changed in place)
    assert restart_for_resize(3, grow=1, shrink=1) == \
        "restart: 3 -> 3 workers (capacity taken back)"
    assert restart_for_resize(3) is None
    with pytest.raises(ValueError):
        restart_for_resize(2, grow=-1)


def test_a_killed_worker_restarts_the_gang_and_a_failed_one_fails_the_attempt():
    killed = after_worker_exit("w1", -9)
    assert killed.action is ExitAction.RESTART and killed.reason == \
        "restart: worker w1 died (signal 9)"
    assert after_worker_exit("w0", 0, lost=True).action is ExitAction.RESTART
    assert "unknown" in after_worker_exit("w0", None).reason
    failed = after_worker_exit("w2", 3)
    assert (failed.action, failed.reason) == (ExitAction.FAIL, "worker w2 failed (exit code 3)")
    # one done: the script finished, the gang is not resized while the others end
    assert after_worker_exit("w0", 0) == ExitDecision(ExitAction.FINISH, "finished")
    # once the gang is stopping (a restart under way), the others' exits change nothing
    assert after_worker_exit("w1", 1, stopping=True).action is ExitAction.CONTINUE
    assert after_worker_exit("w1", -15, stopping=True).action is ExitAction.CONTINUE


def test_a_restart_requeues_without_counting_an_attempt():
    outcome = after_ending("j", Ending(EndKind.RESTARTED, -15, "restart: 2 -> 4 workers "
                                       "(capacity added)"), RetryStrategy(1), 0)
    assert outcome.status.value == "RUNNABLE" and not outcome.counted
    assert outcome.attempts_used == 0 and outcome.reason.startswith("restart: 2 -> 4")
    assert not Ending(EndKind.RESTARTED).counts_as_retry
    # a user's terminate still beats it; it beats a timeout
    kinds = list(EndKind)
    assert kinds.index(EndKind.TIMED_OUT) < kinds.index(EndKind.RESTARTED) \
        < kinds.index(EndKind.PREEMPTED) < kinds.index(EndKind.TERMINATED)


def test_launcher_values_and_bad_ones():
    assert parse_launcher(None) is Launcher.DYNTRAIN
    assert parse_launcher("torchrun") is Launcher.TORCHRUN
    with pytest.raises(ValidationError, match="unknown launcher 'mpirun': use one of "
                                              "dyntrain, torchrun"):
        parse_launcher("mpirun")
    assert ElasticSettings(1, 2, "torchrun").launcher is Launcher.TORCHRUN


@pytest.fixture
def small_store(tmp_path) -> Store:
    from dyntrain.service.core.model import ComputeEnvironmentSpec, JobQueueSpec

    store = Store(f"sqlite:///{tmp_path / 'db.sqlite'}")
    store.create_all()
    store.environments.create_compute_environment(ComputeEnvironmentSpec("ce", max_slots=4,
                                                                         desired_slots=4))
    store.environments.create_job_queue(JobQueueSpec("q", 1, ("ce",)))
    return store


def test_the_store_keeps_the_launcher_and_refuses_it_without_workers(small_store):
    store = small_store
    job = store.jobs.submit(queue="q", command=["python", "t.py"], workers=(2, 8),
                       launcher="torchrun")
    again = store.jobs.get_job(job.id)
    assert again.torchrun and again.elastic == ElasticSettings(2, 8, Launcher.TORCHRUN)
    plain_elastic = store.jobs.submit(queue="q", command=["python", "t.py"], workers=(1, 2))
    assert not store.jobs.get_job(plain_elastic.id).torchrun
    assert store.jobs.get_job(plain_elastic.id).elastic.launcher is Launcher.DYNTRAIN
    with pytest.raises(ValidationError, match="launcher torchrun needs workers MIN:MAX"):
        store.jobs.submit(queue="q", command=["python", "t.py"], launcher="torchrun")
    with pytest.raises(ValidationError, match="unknown launcher"):
        store.jobs.submit(queue="q", command=["python", "t.py"], workers=(1, 2), launcher="mpi")
    # through a job definition: the job takes its launcher, or its own
    store.definitions.register_job_definition(JobDefinitionSpec(
        "ddp", ("python", "t.py"), elastic=ElasticSettings(2, 4, Launcher.TORCHRUN)))
    assert store.jobs.get_job(store.jobs.submit(queue="q", definition="ddp").id).torchrun
    store.definitions.register_job_definition(JobDefinitionSpec(
        "exact", ("python", "t.py"), elastic=ElasticSettings(1, 4)))
    assert store.jobs.get_job(store.jobs.submit(queue="q", definition="exact",
                                      launcher="torchrun").id).torchrun


def _cli(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    return exc.value.code, capsys.readouterr().err


def test_the_cli_refuses_bad_launcher_input_in_one_line(capsys):
    code, err = _cli(capsys, "submit", "--launcher", "torchrun", "--", "python", "t.py")
    assert (code, err) == (2, "dyntrain: error: --launcher torchrun needs --workers MIN:MAX\n")
    code, err = _cli(capsys, "submit", "--launcher", "mpirun", "--workers", "2:8", "--",
                     "python", "t.py")
    assert code == 2 and "mpirun" in err and len(err.splitlines()) == 1, err


def test_an_older_database_gets_the_launcher_columns(small_store):
    import sqlalchemy as sa

    store = small_store
    job = store.jobs.submit(queue="q", command=["python", "t.py"], workers=(1, 2))
    with store.engine.begin() as conn:
        for table in ("jobs", "job_definitions"):
            conn.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN launcher"))
    assert sorted(store.create_all()) == ["added column job_definitions.launcher",
                                          "added column jobs.launcher"]
    assert store.jobs.get_job(job.id).elastic == ElasticSettings(1, 2, Launcher.DYNTRAIN)


def test_aws_multinode_jobs_take_the_launcher_from_a_tag():
    from dyntrain.service.aws.errors import AwsError
    from dyntrain.service.aws.mapping import elastic_range

    tags = {"dyntrain:elastic": "2:4", "dyntrain:launcher": "torchrun"}
    assert elastic_range(tags, 4) == ElasticSettings(2, 4, Launcher.TORCHRUN)
    assert elastic_range({"dyntrain:elastic": "2"}, 4) == ElasticSettings(2, 4)
    with pytest.raises(AwsError, match="tag dyntrain:launcher needs the tag dyntrain:elastic"):
        elastic_range({"dyntrain:launcher": "torchrun"}, 4)
    with pytest.raises(AwsError, match="unknown launcher 'mpi'"):
        elastic_range({"dyntrain:elastic": "1:2", "dyntrain:launcher": "mpi"}, 4)


def test_a_restarted_attempt_ends_as_a_restart_unless_a_terminate_came_too():
    from dyntrain.service.core.executor import WorkerExit
    from dyntrain.service.engine.attempts import Attempt

    attempt = Attempt("j", 2, 0.0)
    attempt.claim(Ending(EndKind.RESTARTED))
    attempt.stop("restart: 2 -> 3 workers (capacity added)")
    attempt.last_exit = WorkerExit("j-a2-w0", None, 15, "killed by SIGTERM")
    ending = attempt.ending()
    assert (ending.kind, ending.reason) == (EndKind.RESTARTED,
                                            "restart: 2 -> 3 workers (capacity added)")
    attempt.claim(Ending(EndKind.TERMINATED, reason="terminated by user"))
    assert attempt.ending().kind is EndKind.TERMINATED


def test_status_says_a_job_runs_under_torchrun():
    from dyntrain.cli.service.output import workers_text

    job = {"current_workers": 2, "elastic": {"min_workers": 2, "max_workers": 8}}
    assert workers_text({**job, "launcher": "torchrun"}) == "2 (2-8, torchrun)"
    assert workers_text({**job, "launcher": "dyntrain"}) == "2 (2-8)"


def test_a_gang_on_several_hosts_is_told_its_main_node_and_each_worker_is_a_node_of_its_own():
    from dyntrain.service.executors.main_node import main_node_env

    env = worker_env(rank=2, world_size=3, master_addr="127.0.0.1", master_port=29500,
                     restart=1, run_id="j", max_restarts=0)
    out = main_node_env(env, "10.0.0.5", 41000, "eth1")
    assert out == {"MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "41000", "LOCAL_RANK": "0",
                   "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "2", "GROUP_WORLD_SIZE": "3",
                   "GLOO_SOCKET_IFNAME": "eth1"}
    # the job's own interface wins; without a route there is none to give
    assert "GLOO_SOCKET_IFNAME" not in main_node_env({**env, "GLOO_SOCKET_IFNAME": "ib0"},
                                                     "10.0.0.5", 41000, "eth1")
    assert "GLOO_SOCKET_IFNAME" not in main_node_env(env, "10.0.0.5", 41000, None)
    # a multi-node job is told only the address it was given a variable for
    aws = {"AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "127.0.0.1",
           "AWS_BATCH_JOB_NODE_INDEX": "1"}
    assert main_node_env(aws, "10.0.0.5", 41000, "eth1") == {
        "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS": "10.0.0.5"}


def test_the_interface_of_an_address_is_found_and_a_route_names_one():
    from dyntrain.elastic.worker.address import interface_of
    from dyntrain.service.executors.main_node import local_interface

    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.77") is None  # TEST-NET-1: on no interface here
    assert local_interface("127.0.0.1", 80) == "lo"

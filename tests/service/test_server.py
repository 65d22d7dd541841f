"""The service process: defaults, a controller loop that survives a failing step, and one
service per state directory."""


import pytest

from conftest import run_cli, start_server
from dyntrain.errors import DyntrainError
from dyntrain.service.assembly import build_service
from dyntrain.service.engine.service import ServiceConfig, is_loopback
from dyntrain.service.engine.statelock import StateDirLocked
from dyntrain.testing.wait import wait_until


def test_embedded_default_has_a_local_environment_and_queue(tmp_path):
    service = build_service(ServiceConfig(state_dir=tmp_path))
    try:
        ce = service.store.environments.get_compute_environment("local")
        assert ce.spec.desired_slots >= 1
        queue = service.store.environments.get_job_queue("default")
        assert queue.spec.compute_environments == ("local",)
    finally:
        service.stop()


def test_a_failing_step_is_recorded_and_the_loop_goes_on(tmp_path):
    service = build_service(ServiceConfig(state_dir=tmp_path))
    calls = []
    real_step = service.controller.step

    def flaky_step():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        real_step()

    service.controller.step = flaky_step
    service.start()
    try:
        wait_until(lambda: len(calls), "three controller passes", 60,
                   until=lambda passes: passes >= 3)
        errors = [e for e in service.store.logs.list_events() if e.kind == "controller.error"]
        assert errors and errors[0].payload["error"] == "RuntimeError: boom"
    finally:
        service.stop()


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True),
                                             ("::1", True), ("0.0.0.0", False),
                                             ("10.1.2.3", False), ("example.org", False)])
def test_non_loopback_needs_a_token(tmp_path, host, loopback):
    assert is_loopback(host) is loopback
    if loopback:
        ServiceConfig(state_dir=tmp_path, host=host)
    else:
        with pytest.raises(DyntrainError, match="without a token"):
            ServiceConfig(state_dir=tmp_path, host=host)
        ServiceConfig(state_dir=tmp_path, host=host, token="s3cret")


def test_a_second_service_on_a_state_directory_is_refused_until_the_first_is_gone(tmp_path):
    """`dyntrain server` twice on one state directory: the second says in one line which
    service runs there (pid, URL) and exits 2, whatever port it asked for; in process the same
    (StateDirLocked). SIGKILL the first: the kernel drops its lock, a new service starts."""
    state = tmp_path / "state"
    first, url = start_server(state, tmp_path / "first.log")
    try:
        second = run_cli(["server", "--port", "0", "--state-dir", state], timeout=120)
        assert second.returncode == 2, (second.stdout, second.stderr)
        assert second.stderr.count("\n") == 1 and "Traceback" not in second.stderr
        assert second.stderr.startswith(
            f"dyntrain: error: another dyntrain service (pid {first.pid}, {url}) runs on the "
            f"state directory {state}: stop it first"), second.stderr
        with pytest.raises(StateDirLocked, match=f"pid {first.pid}, {url}"):
            build_service(ServiceConfig(state_dir=state))
    finally:
        first.kill()  # a crash: no clean-up ran
        first.wait()
    build_service(ServiceConfig(state_dir=state)).stop()
    build_service(ServiceConfig(state_dir=state)).stop()  # stop() let go of it too

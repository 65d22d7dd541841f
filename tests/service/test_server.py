"""The service process: defaults, and a controller loop that survives a failing step."""

import time

import pytest

from dyntrain.errors import DyntrainError
from dyntrain.service.server import Service, ServiceConfig, is_loopback


def test_embedded_default_has_a_local_environment_and_queue(tmp_path):
    service = Service(ServiceConfig(state_dir=tmp_path))
    try:
        ce = service.store.get_compute_environment("local")
        assert ce.spec.desired_slots >= 1
        assert service.store.get_job_queue("default").spec.compute_environments == ("local",)
    finally:
        service.stop()


def test_a_failing_step_is_recorded_and_the_loop_goes_on(tmp_path):
    service = Service(ServiceConfig(state_dir=tmp_path))
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
        deadline = time.monotonic() + 60
        while len(calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(calls) >= 3
        errors = [e for e in service.store.list_events() if e.kind == "controller.error"]
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

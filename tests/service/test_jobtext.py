"""How a job record reads in the CLI, the dashboard and the demo: workers, attempts, results."""

from __future__ import annotations

from dyntrain.service.core.jobtext import (
    attempt_text,
    live_workers,
    result_text,
    short_worker,
)

JOB = "3a9436512c6e4f0f8b1d0e5a7c2b9d41"


def test_live_workers_leaves_out_those_told_to_leave():
    """A world of 2 with 4 workers on their way out reads as 2, not 6 (as the demo once said)."""
    job = {"workers": [
        {"compute_environment": "spot", "state": "RUNNING"},
        {"compute_environment": "reserved", "state": "RUNNING"},
        *({"compute_environment": "spot", "state": "LEAVING"} for _ in range(3)),
        {"compute_environment": "reserved", "state": "LEAVING"},
    ]}
    assert live_workers(job) == {"spot": 1, "reserved": 1}
    assert live_workers({"workers": []}) == {} and live_workers({}) == {}


def test_short_worker_drops_the_job_id_of_service_workers_only():
    assert short_worker(f"{JOB}-a1-w3") == "a1-w3"
    assert short_worker(f"{JOB}_7-a12-w0") == "a12-w0"  # an array child's
    assert short_worker("gpu-host-4242") == "gpu-host-4242"  # joined with `dyntrain worker`


def test_attempt_text_says_when_it_ran_and_how_it_ended():
    ended = {"attempt": 1, "started_at": 1.0e9, "stopped_at": 1.0e9 + 64.4, "exit_code": 0,
             "reason": "terminated by user"}
    text = attempt_text(ended)
    assert text.startswith("attempt 1: started 2001-09-")
    assert text.endswith(", ran 64 s, exit code 0: terminated by user")
    assert attempt_text({**ended, "reason": "exit code 0"}).endswith("ran 64 s, exit code 0")
    assert attempt_text({"attempt": 2, "started_at": 1.0e9, "stopped_at": None}).endswith(
        ", running")


def test_result_text():
    assert result_text({"val_accuracy": 0.97, "steps": 300}) == "val_accuracy=0.97, steps=300"
    assert result_text(None) == "" and result_text({}) == ""

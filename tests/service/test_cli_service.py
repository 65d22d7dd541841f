"""The service CLI end to end: a real `dyntrain server` process driven by `dyntrain` commands
(through the CLI's entry point in this process, ``dyntrain()``: no interpreter to start each)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import httpx
import pytest

from conftest import run_main, start_server, stop_server
from dyntrain.elastic.numerics import host_levels
from dyntrain.service.client import Client
from dyntrain.testing.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
DYNTRAIN = [sys.executable, "-m", "dyntrain.cli.main"]
PY = sys.executable


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"}
    env.pop("DYNTRAIN_URL", None)
    env.pop("DYNTRAIN_TOKEN", None)
    return env


@pytest.fixture(scope="module")
def service_dir(tmp_path_factory) -> Path:
    """The shared server's folder: its state and its log (``server.log``)."""
    return tmp_path_factory.mktemp("cli-service")


@pytest.fixture(scope="module")
def server(service_dir):
    """The module's `dyntrain server`: (its process, its URL)."""
    proc, url = start_server(service_dir / "state", service_dir / "server.log")
    yield proc, url
    rc = stop_server(proc)  # SIGTERM: a clean stop
    log = (service_dir / "server.log").read_text()
    assert rc == 0 and "dyntrain service stopped" in log and "Traceback" not in log, log[-3000:]


@pytest.fixture(scope="module")
def service(server) -> str:
    """The module's server's URL."""
    return server[1]


@pytest.fixture(autouse=True)
def cli_env(monkeypatch):
    """The environment ``_env()`` gives a command's process, for the commands run in this one."""
    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.delenv("DYNTRAIN_URL", raising=False)
    monkeypatch.delenv("DYNTRAIN_TOKEN", raising=False)


def _argv(args: tuple, url: str | None) -> list[str]:
    """``dyntrain ARGS``'s words, with ``--url URL`` after the command (and its subcommand,
    for the groups) unless ARGS give one."""
    if url is None or "--url" in args:
        return [*map(str, args)]
    cut = 2 if args[0] in ("ce", "queue", "jobdef", "policy") else 1
    return [*map(str, args[:cut]), "--url", url, *map(str, args[cut:])]


def cli(*args, url: str | None = None, timeout: float = 180, cwd=ROOT):
    """``dyntrain ARGS`` in a process of its own."""
    return subprocess.run([*DYNTRAIN, *_argv(args, url)], capture_output=True, text=True,
                          timeout=timeout, env=_env(), cwd=cwd)


def dyntrain(*args, url: str | None = None) -> subprocess.CompletedProcess:
    """``dyntrain ARGS`` through the CLI's entry point in this process."""
    return run_main(_argv(args, url))


def each(*calls: tuple, url: str | None = None) -> list:
    """Several independent commands, one after the other (``dyntrain()``)."""
    return [dyntrain(*args, url=url) for args in calls]


def ok(proc) -> str:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return proc.stdout


def assert_one_line_error(proc, *needles):
    assert proc.returncode not in (0, None), (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    err = proc.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("dyntrain: error:"), err
    for needle in needles:
        assert needle in err, err


def wait_status(url: str, job_id: str, statuses: set[str], timeout: float = 30) -> dict:
    """The job once its status is one of ``statuses``."""
    with Client(url) as client:
        return wait_until(lambda: client.get_job(job_id), f"job {job_id} to be {statuses}",
                          timeout, until=lambda job: job.get("status") in statuses)


# ---------------------------------------------------------------------------------- tests


def test_ce_create_and_update_say_how_many_slots_the_machine_holds(service):
    """A local environment that may offer more slots than the machine holds at once: created
    and updated with a note of how many fit; none once its slots fit."""
    cores = os.cpu_count()
    [created] = each(("ce", "create", "wide", "--slots", f"0:0:{cores + 3}", "--slot-cpus",
                          "1", "--slot-memory", "64"), url=service)
    assert ok(created).splitlines()[-1].startswith("note: this machine (cpus="), created.stdout
    assert f"holds {cores} of its {cores + 3} slots at once; slots beyond {cores} are never " \
        "filled" in created.stdout
    [updated] = each(("ce", "update", "wide", "--max", str(cores + 1)), url=service)
    assert f"holds {cores} of its {cores + 1} slots at once" in ok(updated), updated.stdout
    [fits] = each(("ce", "update", "wide", "--max", str(cores)), url=service)
    assert ok(fits).strip() == "updated compute environment wide"


def test_ce_queue_from_yaml_and_flags_and_trace(service, tmp_path):
    (tmp_path / "ce.yaml").write_text(
        "name: spotty\ncapacity_type: SPOT\nprice_per_slot_hour: 0.3\n"
        "slot: {cpus: 0.25, gpus: 0, memory_mib: 256}\n"
        "min_slots: 0\ndesired_slots: 0\nmax_slots: 2\n")
    for proc in each(
            ("ce", "create", "-f", tmp_path / "ce.yaml"),
            ("ce", "create", "flagged", "--type", "on_demand", "--price", "1.5", "--slots",
             "0:1:2", "--slot-cpus", "0.25", "--slot-memory", "512", "--slot-gpus", "0"),
            url=service):
        ok(proc)
    (tmp_path / "q.yaml").write_text("name: qy\npriority: 3\ncompute_environments: [spotty]\n")
    (tmp_path / "t.csv").write_text("offset_s,slots,price\n0,1,0.3\n30,2,0.4\n")
    created_qy, created_qf, updated, traced = each(
        ("queue", "create", "-f", tmp_path / "q.yaml"),
        ("queue", "create", "qf", "--priority", "5", "--ce", "flagged,spotty",
         "--preempt-plain-jobs"),
        ("ce", "update", "flagged", "--desired", "2", "--price", "0.5"),
        ("ce", "trace", "spotty", tmp_path / "t.csv", "--loop"),
        url=service)
    for proc in (created_qy, created_qf, updated):
        ok(proc)
    assert "2 rows" in ok(traced) and "looping" in traced.stdout
    with Client(service) as client:
        trace = client.get_compute_environment("spotty")["trace"]
        queues = {name: client.get_job_queue(name) for name in ("qf", "qy")}
    assert trace["loop"] is True and trace["csv"].startswith("offset_s,slots,price")
    assert queues["qf"]["preempt_plain_jobs"] is True  # dyntrain's own queue setting
    assert queues["qy"]["preempt_plain_jobs"] is False

    ce_list, queue_list = each(("ce", "list"), ("queue", "list"), url=service)
    out = ok(ce_list)
    assert re.search(r"spotty\s+SPOT\s+0\.3", out), out
    assert re.search(r"flagged\s+ON_DEMAND\s+0\.5\b.*0:2:2", out), out
    out = ok(queue_list)
    assert re.search(r"qf\s+5\s+flagged,spotty", out) and re.search(r"qy\s+3\s+spotty", out), out

    (tmp_path / "bad.csv").write_text("offset_s,slots\n0,-1\n")
    cleared, bad_trace, deleted = each(
        ("ce", "trace", "spotty", "--clear"), ("ce", "trace", "spotty", tmp_path / "bad.csv"),
        ("queue", "--url", service, "delete", "qy"),  # the group takes --url too
        url=service)
    ok(cleared)
    assert_one_line_error(bad_trace, "bad.csv:2")
    ok(deleted)
    with Client(service) as client:
        assert client.get_compute_environment("spotty")["trace"] is None
        assert "qy" not in [q["name"] for q in client.list_job_queues()]


def test_submit_wait_success_then_status_and_logs(service):
    proc = dyntrain("submit", "--name", "hello", "--wait", "--", PY, "-c",
               "print('hello from the job')", url=service)
    out = ok(proc)
    job_id = out.splitlines()[0].strip()
    assert "hello from the job" in out
    assert "SUCCEEDED" in proc.stderr

    table, details, log, follow, filtered = each(
        ("status",), ("status", job_id[:8]),  # a unique prefix will do
        ("logs", job_id), ("logs", "-f", job_id), ("status", "--status", "failed"), url=service)
    assert re.search(rf"{job_id[:8]}\s+hello\s+default\s+SUCCEEDED", ok(table)), table.stdout
    for needle in (job_id, "status:       SUCCEEDED", "attempts:     1", "preemptions:  0",
                   "by compute environment", "saving vs static on-demand"):
        assert needle in ok(details), details.stdout
    assert ok(log).strip() == "hello from the job"
    assert ok(follow).strip() == "hello from the job"
    assert job_id[:8] not in ok(filtered)


def test_submit_wait_failure_exits_1(service):
    proc = dyntrain("submit", "--wait", "--", PY, "-c",
               "import sys; print('about to fail'); sys.exit(3)", url=service)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "about to fail" in proc.stdout and "FAILED: exited with code 3" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_cancel_a_queued_job_and_terminate_a_running_one(service):
    with Client(service) as client:  # a queue with no capacity: its jobs wait
        client.create_compute_environment(name="empty", min_slots=0, desired_slots=0,
                                          max_slots=0)
        client.create_job_queue(name="stuck", compute_environments=["empty"])
    submitted = each(("submit", "--queue", "stuck", "--", PY, "-c", "pass"),
                         ("submit", "--", PY, "-c", "import time; time.sleep(60)"), url=service)
    queued, running = (ok(p).strip() for p in submitted)
    assert wait_status(service, queued, {"RUNNABLE"})["status"] == "RUNNABLE"
    assert wait_status(service, running, {"RUNNING"})["status"] == "RUNNING"

    details, table = each(("status", queued), ("status", "--queue", "stuck"), url=service)
    assert "status:       RUNNABLE" in ok(details) and "waiting" in details.stdout, details.stdout
    assert re.search(rf"{queued[:8]}\s+inline\s+stuck\s+RUNNABLE\s+0\s+waiting", ok(table)), \
        table.stdout

    cancelled, terminated, too_late = each(
        ("cancel", queued), ("terminate", running), ("cancel", running), url=service)
    ok(cancelled)
    ok(terminated)
    assert_one_line_error(too_late)
    assert wait_status(service, queued, {"FAILED"})["status"] == "FAILED"
    assert wait_status(service, running, {"FAILED"})["status"] == "FAILED"


def test_jobdef_register_and_submit_from_it(service, tmp_path):
    (tmp_path / "jd.yaml").write_text(
        f"name: greet\ncommand: [{PY!r}, -c, \"print('hi Ref::who')\"]\n"
        "parameters: {who: world}\n")
    ok(dyntrain("jobdef", "register", "-f", tmp_path / "jd.yaml", url=service))
    out = ok(dyntrain("jobdef", "register", "greet", "--attempts", "2", "--timeout", "60",
                      "--workers", "1:2", "--param", "who=there", "--", PY, "-c",
                      "print('hello Ref::who')", url=service))
    assert "greet:2" in out
    listed, shown, run = each(
        ("jobdef", "list"), ("jobdef", "show", "greet"),
        ("submit", "--definition", "greet:1", "--param", "who=cli", "--wait"), url=service)
    assert re.search(r"greet\s+2\s+ACTIVE\s+1-2", ok(listed)), listed.stdout
    assert "hello Ref::who" in ok(shown) and "attempts: 2" in shown.stdout, shown.stdout
    assert "hi cli" in ok(run)


def test_bad_inputs_are_one_line_errors(service, tmp_path):
    (tmp_path / "bad.yaml").write_text("name: x\nslot: {cpus: [\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    (tmp_path / "wrong.yaml").write_text("name: w\ncompute_environments: [no-such-ce]\n")
    port = re.search(r":(\d+)$", service).group(1)
    cases = [
        (("submit", "--queue", "nope", "--", "true"), ["nope"]),
        (("submit", "--workers", "3:1", "--", "true"), ["--workers", "1 <= MIN <= MAX"]),
        (("ce", "create", "-f", tmp_path / "bad.yaml"), ["bad.yaml", "invalid YAML"]),
        (("ce", "create", "-f", tmp_path / "missing.yaml"), ["missing.yaml"]),
        (("queue", "create", "-f", tmp_path / "list.yaml"), ["list.yaml", "mapping"]),
        (("queue", "create", "-f", tmp_path / "wrong.yaml"), ["wrong.yaml", "no-such-ce"]),
        (("status", "no-such-job"), ["no-such-job"]),
    ]
    for (_args, needles), proc in zip(cases, each(*(c[0] for c in cases), url=service),
                                     strict=True):
        assert_one_line_error(proc, *needles)

    unreachable = "http://127.0.0.1:1"
    status, busy, open_host, reattach, warm = each(
        ("status", "--url", unreachable),
        ("server", "--port", port, "--state-dir", tmp_path / "other"),
        ("server", "--host", "0.0.0.0", "--state-dir", tmp_path / "other"),
        ("server", "--reattach-seconds", "-1", "--state-dir", tmp_path / "other"),
        ("server", "--warm-workers", "-1", "--state-dir", tmp_path / "other"))
    assert_one_line_error(status, "cannot reach the dyntrain service at " + unreachable)
    assert_one_line_error(busy, f"127.0.0.1:{port}")
    assert_one_line_error(open_host, "token")
    assert_one_line_error(reattach, "--reattach-seconds must be >= 0")
    assert_one_line_error(warm, "--warm-workers must be >= 0")


def test_what_training_reported_is_in_the_log_status_api_and_dashboard(service):
    """`trainer.report()` of an elastic job (sent to its coordinator in the service) and of a
    plain job (training alone): `submit --wait` and `logs` print it, `status` and the job's
    record carry it, the dashboard shows it."""
    digits = (PY, "-m", "dyntrain.workloads.digits", "--max-steps", "12")
    with ThreadPoolExecutor(max_workers=1) as pool:  # the two jobs train at once
        started = pool.submit(cli, "submit", "--wait", "--", *digits, url=service)
        elastic = dyntrain("submit", "--workers", "1:1", "--wait", "--", *digits, url=service)
        alone = started.result()
    for proc in (elastic, alone):
        out = ok(proc)
        job_id = out.splitlines()[0].strip()
        line = re.search(r"^result: val_accuracy=0\.\d+, steps=12$", out, re.M)
        assert line, out
        log, details = each(("logs", job_id), ("status", job_id), url=service)
        assert line.group(0) in ok(log).splitlines(), log.stdout
        assert re.search(r"^result: +val_accuracy=0\.\d+, steps=12$", ok(details), re.M), \
            details.stdout
        with Client(service) as client:
            result = client.get_job(job_id)["result"]
        page = httpx.get(f"{service}/ui/jobs/{job_id}", timeout=30).text
        assert result["steps"] == 12 and 0 < result["val_accuracy"] <= 1, result
        assert re.search(r'id="result">val_accuracy=0\.\d+, steps=12<', page)


def test_logs_follow_ends_with_the_membership_changes_and_the_final_status(service):
    """`logs -f` of an elastic job: when it ends, its membership changes (as `events.jsonl`
    has them) and, last, its final status with the reason, on stderr; the log on stdout."""
    digits = (PY, "-m", "dyntrain.workloads.digits", "--max-steps", "6")
    job_id = ok(dyntrain("submit", "--workers", "1:1", "--", *digits, url=service)).strip()
    follow = dyntrain("logs", "-f", job_id, url=service)
    assert re.search(r"^result: val_accuracy=0\.\d+, steps=6$", ok(follow), re.M), follow.stdout
    with Client(service) as client:
        changes = [e["payload"] for e in client.events(job_id)
                   if e["kind"].startswith("membership.")]
        job = client.get_job(job_id)
    assert job["status"] == "SUCCEEDED" and changes, (job, changes)
    tag = f"[{job_id[:8]}]"
    said = follow.stderr.strip().splitlines()
    told = said.index(f"{tag} {len(changes)} membership change(s):")
    listed = said[told + 1:told + 1 + len(changes)]
    for line, change in zip(listed, changes, strict=True):
        assert line.startswith(f"{tag}   {change['event']} ") and \
            f"world {change.get('world_before')} -> {change['world_after']} (" in line, said
    assert said[-1].startswith(f"{tag} SUCCEEDED"), said
    assert len(said) == told + 1 + len(changes) + 1, said


def test_logs_of_a_retried_array_child_head_each_attempt(service):
    """`logs ARRAY:1` of a child that failed its first attempt and passed its second: a header
    before each attempt's lines says when it started and how it ended."""
    script = ("import os, sys; a = os.environ['AWS_BATCH_JOB_ATTEMPT']; "
              "i = os.environ['AWS_BATCH_JOB_ARRAY_INDEX']; print(f'child {i} attempt {a}'); "
              "sys.exit(3 if (i, a) == ('1', '1') else 0)")
    parent = ok(dyntrain("submit", "--array", "2", "--attempts", "2", "--wait", "--", PY, "-c",
                    script, url=service)).splitlines()[0].strip()
    log, followed = each(("logs", f"{parent}:1"), ("logs", "-f", f"{parent}_1"), url=service)
    lines = ok(log).splitlines()
    assert len(lines) == 4 and ok(followed).splitlines() == lines, (log.stdout, followed.stdout)
    assert re.fullmatch(r"=== attempt 1: started \S+ \S+, ran \d+ s, exit code 3: retrying "
                        r"after exited with code 3 \(attempt 1 of 2\).* ===", lines[0]), lines
    assert lines[1] == "child 1 attempt 1"
    assert re.fullmatch(r"=== attempt 2: started \S+ \S+, ran \d+ s, exit code 0 ===",
                        lines[2]), lines
    assert lines[3] == "child 1 attempt 2"


def test_a_follower_waits_out_a_service_that_does_not_answer(server, tmp_path):
    """`submit --wait` follows a job while its service stops answering for longer than one
    request may wait (SIGSTOP, as a starved or frozen host would): it says that it asks again,
    and once the service answers it follows the job to its end (exit 0, the whole log). A loaded
    CI run failed here when one slow answer ended the wait."""
    proc, url = server
    err = tmp_path / "submit.err"
    job = "print('first', flush=True); import time; time.sleep(3); print('last')"
    with open(err, "w") as sink:
        follower = subprocess.Popen(
            [*DYNTRAIN, "submit", "--url", url, "--wait", "--", PY, "-c", job],
            stdout=subprocess.PIPE, stderr=sink, text=True, env=_env(), cwd=ROOT)
    try:
        wait_until(lambda: "RUNNING" in err.read_text(), "the job running")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: "asking again" in err.read_text(),
                       "the follower saying that it asks again")
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        out, _ = follower.communicate(timeout=240)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    said = err.read_text()
    assert follower.returncode == 0, (out, said)
    assert "did not answer in time" in said and "the service answers again" in said, said
    assert out.split()[1:] == ["first", "last"], out


def test_a_job_the_machine_cannot_hold_now_waits_with_the_reason_everywhere(service,
                                                                            service_dir,
                                                                            tmp_path):
    """An environment declared twice this machine: the second job waits RUNNABLE, its reason
    the executor's, in the API, `dyntrain status`, the dashboard and AWS Batch's statusReason;
    its history stays empty while it waits, and it runs once the first job is done. (The
    server also says which cpu kernels this machine runs.)"""
    url = service
    levels = ", ".join(k.value for k in host_levels())
    assert f"the hosts run cpu kernels {levels}; a job pinned to another is refused" in (
        service_dir / "server.log").read_text()
    try:
        cpus = os.cpu_count() or 1
        gate = tmp_path / "gate"
        gate.touch()
        hold = f"import os, time\nwhile os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        whole = {"cpus": cpus, "gpus": 0, "memory_mib": 256}
        with Client(url) as client:
            client.create_compute_environment(name="big", slot=whole, min_slots=0,
                                              desired_slots=2, max_slots=2)
            client.create_job_queue(name="bq", compute_environments=["big"])
            first = client.submit(queue="bq", command=[PY, "-c", hold], resources=whole)["id"]
            wait_until(lambda: client.get_job(first)["status"] == "RUNNING", "the first job runs")
            second = client.submit(queue="bq", command=[PY, "-c", "print('held no more')"],
                                   resources=whole)["id"]
            # the reason is the refused start's; ``waiting`` the next scheduling pass's
            job = wait_until(lambda: (j := client.get_job(second))["status_reason"] and
                           j["status_reason"].startswith("waiting for room on the executor: ")
                           and j["waiting"] and j, "the second job to wait for room")
            assert (job["status"], job["attempts"], job["preemptions"]) == ("RUNNABLE", 0, 0)
            assert f"needs cpus={cpus} " in job["status_reason"], job
            assert job["waiting"]["reason"] == job["status_reason"], job
        reason = job["status_reason"]
        table, details = each(("status", "--queue", "bq"), ("status", second), url=url)
        assert f"waiting: #1 {reason}"[:100] in ok(table).replace("\n", " "), table.stdout
        assert "status:       RUNNABLE" in ok(details) and "needs cpus=" in details.stdout, \
            details.stdout
        page = httpx.get(f"{url}/ui/jobs/{second}", timeout=30).text
        assert "waiting for room on the executor" in page
        batch = boto3.client("batch", endpoint_url=url, region_name="eu-west-1",
                             aws_access_key_id="x", aws_secret_access_key="x")
        [described] = batch.describe_jobs(jobs=[second])["jobs"]
        assert (described["status"], described["statusReason"]) == ("RUNNABLE", reason)
        assert described.get("attempts", []) == []
        batch.close()
        gate.unlink()
        with Client(url) as client:
            done = client.wait(second, timeout=120)
            assert (done["status"], done["attempts"], done["preemptions"]) == ("SUCCEEDED", 1, 0)
    finally:
        gate.unlink(missing_ok=True)


def test_fair_share_policy_queue_submit_and_snapshot(service):
    """A fair-share policy by the CLI, a queue that uses it, jobs of two shares: the queue's
    snapshot lists them in the order they would start; bad input is one line."""
    for proc in each(("policy", "create", "teams", "--share", "blue=0.5", "--share", "red*"),
                         ("ce", "create", "fs-none", "--slots", "0:0:2"), url=service):
        ok(proc)
    ok(dyntrain("queue", "create", "fsq", "--ce", "fs-none", "--scheduling-policy", "teams",
           url=service))
    ids = {}
    for name, share in (("r1", "red1"), ("r2", "red1"), ("b1", "blue")):
        ids[name] = ok(dyntrain("submit", "-q", "fsq", "-n", name, "--share", share, "--", "true",
                           url=service)).strip()
    for job_id in ids.values():
        wait_status(service, job_id, {"RUNNABLE"})
    want = [ids["b1"], ids["r1"], ids["r2"]]  # blue first: weight 2 against red's 1
    snap = wait_until(lambda: ok(dyntrain("queue", "snapshot", "fsq", url=service)),
                      "the snapshot in fair-share order", 30,
                      until=lambda out: re.findall(r"^\s*\d+\s+([0-9a-f]{32})", out,
                                                   re.MULTILINE) == want)
    assert "teams" in ok(dyntrain("policy", "list", url=service)) and "blue" in snap
    no_share, in_use = each(("submit", "-q", "fsq", "--", "true"),
                                ("policy", "delete", "teams"), url=service)
    assert_one_line_error(no_share, "needs a shareIdentifier")
    assert_one_line_error(in_use, "is used by job queue(s) fsq")
    for job_id in ids.values():
        ok(dyntrain("cancel", job_id, url=service))

"""The dashboard's pages, the token rule in a browser's terms, and /metrics, in process.

One Service (with a token) over a store seeded by hand — an elastic job with its membership
events, metrics and a checkpoint in its run folder, an array job, jobs waiting for capacity —
and one real controller step (no controller loop, so nothing moves under the tests), behind a
real uvicorn server on 127.0.0.1. What needs a browser and a
real training job is in test_web_browser.py.
"""

from __future__ import annotations

import html
import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from dyntrain.elastic.runs.storage import LocalStore
from dyntrain.lab import Measurement, Study, Trial, write_study
from dyntrain.service.assembly import build_service
from dyntrain.service.core.fairshare import FairsharePolicy, ShareAttributes
from dyntrain.service.core.model import (
    CapacityType,
    ComputeEnvironmentSpec,
    JobQueueSpec,
    Resources,
    WorkerState,
)
from dyntrain.service.core.model import JobStatus as S
from dyntrain.service.core.records import WorkerRecord
from dyntrain.service.engine.service import ServiceConfig
from dyntrain.service.server import create_app
from dyntrain.service.web import auth
from dyntrain.service.web.capacity import CapacityHistory, Sample
from dyntrain.service.web.context import membership_change, world_timeline
from dyntrain.service.web.lab import sweep_root
from dyntrain.service.web.pages import build_router
from dyntrain.service.web.render import make_environment
from dyntrain.service.web.runfiles import read_rows, series, steps_per_second, tail_rows
from dyntrain.testing.wait import wait_until

TOKEN = "t0ken-for-tests"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
ACTION = {"X-Dyntrain-Dashboard": "1"}
SMALL = Resources(0.25, 0, 256)


def membership_event(kind, workers, before, after, t0, requested, first, **extra):
    return {"event": kind, "workers": workers, "world_before": before, "world_after": after,
            "requested_at": requested - t0, "detected_at": requested - t0 + 0.01,
            "reformed_at": first - t0 - 0.05, "first_step_at": first - t0,
            "latency_s": round(first - requested, 4), "steps_redone": extra.pop("redone", 0),
            "generation": extra.pop("generation", 0), "start_step": extra.pop("start", 0),
            **extra}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("web")
    service = build_service(ServiceConfig(state_dir=tmp / "state", token=TOKEN))
    store = service.store
    store.environments.create_compute_environment(ComputeEnvironmentSpec(
        "spot", CapacityType.SPOT, 0.35, SMALL, 0, 2, 4))
    store.environments.create_compute_environment(ComputeEnvironmentSpec(
        "od", CapacityType.ON_DEMAND, 1.0, SMALL, 0, 0, 2))
    store.environments.create_job_queue(JobQueueSpec("train", 10, ("spot",)))
    store.environments.create_job_queue(JobQueueSpec("wait", 5, ("od",)))
    store.policies.create("teams", FairsharePolicy(shares=(ShareAttributes("blue", 0.5),)))
    store.environments.create_job_queue(JobQueueSpec("shared", 1, ("od",),
                                                     scheduling_policy="teams",
                                                     preempt_plain_jobs=True))

    now = time.time()
    elastic = store.jobs.submit(
        queue="train",
        command=["python", "-m", "train"],
        name="elastic-run",
        resources=SMALL,
        workers=(1, 3),
    )
    assert store.jobs.transition(elastic.id, S.SUBMITTED, S.RUNNING, "training with 1 worker(s)",
                            started_at=now - 60)
    store.jobs.add_attempt(elastic.id, 1, now - 60)
    store.jobs.update_job(elastic.id, progress={"step": 30, "total_steps": 600, "world_size": 1,
                                           "loss": 0.0667, "samples_per_s": 100.0})
    t0 = now - 58
    w = [f"{elastic.id}-a1-w{i}" for i in range(2)]
    for kind, workers, before, after, requested, first, extra in [
            ("start", w[:1], 0, 1, t0, t0 + 2.0, {"start": 0}),
            ("join", w[1:], 1, 2, now - 40, now - 39.3, {"start": 12, "generation": 1}),
            ("crash", w[1:], 2, 1, now - 20, now - 9.5,
             {"start": 30, "generation": 2, "redone": 1, "reason": "no heartbeat for 10 s"})]:
        store.logs.add_event(elastic.id, f"membership.{kind}",
                        membership_event(kind, workers, before, after, t0, requested, first,
                                         **extra), at=first)
    store.logs.add_event(elastic.id, "coordinator", {"message": "generation 2: 1 worker(s)"})
    store.workers.add_worker(WorkerRecord(w[0], elastic.id, 1, "spot", "SPOT", 0.35, None,
                                  WorkerState.RUNNING, now - 59))
    store.workers.add_worker(WorkerRecord(w[1], elastic.id, 1, "spot", "SPOT", 0.35, None,
                                  WorkerState.EXITED, now - 41, leave_reason="lost: no heartbeat",
                                  exit_code=-9, stopped_at=now - 10))
    run = service.controller.run_dir(elastic.id)
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "ckpt-000000030.dtck").write_bytes(b"x" * 2048)
    rows = [{"step": s, "time": now - 50 + s, "world_size": 1 if s < 12 else 2,
             "loss": 2.0 / s, "samples_per_s": 100.0 * (1 if s < 12 else 2),
             "b_simple": 40.0 + s, "recomputed": False} for s in range(1, 31)]
    rows.insert(20, {**rows[19], "recomputed": True, "loss": 99.0})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    waiting = store.jobs.submit(queue="wait", command=["true"], name="waits-for-capacity",
                           resources=SMALL)
    to_cancel = store.jobs.submit(queue="wait", command=["true"], name="to-cancel", resources=SMALL)
    array = store.jobs.submit(queue="wait", command=["true"], name="shards", array_size=4,
                         resources=SMALL)
    # a lab sweep that ran as an array job: its plan names the sweep folder
    sweep = tmp / "sweep"
    for b, steps in [(8, 400), (32, 130), (128, 60)]:
        best = Trial("t0", b, {"learning_rate": 0.1}, [Measurement(steps, 0.02)])
        write_study(sweep, Study("digits", "mlp", "sgd", b, [best], "valid_error", 0.03))
    (sweep / ".plans").mkdir()
    store.jobs.submit(queue="wait", name="sweep-mlp", resources=SMALL,
                 command=["python", "-m", "dyntrain.lab.sweep",
                          str(sweep / ".plans" / "plan-1.json")])

    app = create_app(service)  # before the step: it hooks /metrics into the controller
    service.controller.step()  # one scheduling pass: waiting reasons, pass time, capacity
    for i, status in enumerate([S.SUCCEEDED, S.FAILED]):
        assert store.jobs.transition(f"{array.id}:{i}", S.RUNNABLE, status, f"set by the test {i}")
    store.jobs.add_attempt(f"{array.id}:1", 1, now - 30)
    store.jobs.finish_attempt(f"{array.id}:1", 1, 3, "exit code 3: ValueError: bad shard", now - 28)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the server to start", 30,
               unless=lambda: not thread.is_alive() and "its thread ended")
    port = server.servers[0].sockets[0].getsockname()[1]
    yield {"service": service, "url": f"http://127.0.0.1:{port}", "elastic": elastic.id,
           "waiting": waiting.id, "to_cancel": to_cancel.id, "array": array.id,
           "sweep": sweep, "now": now}
    server.should_exit = True
    thread.join(timeout=10)
    service.stop()


@pytest.fixture
def anon(seeded):
    with httpx.Client(base_url=seeded["url"], timeout=30) as client:
        yield client


@pytest.fixture
def browser(seeded):
    """A client that logged in through the login form (it holds the session cookie)."""
    with httpx.Client(base_url=seeded["url"], timeout=30) as client:
        r = client.post(auth.LOGIN_PATH, data={"token": TOKEN, "next": "/"},
                        follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"
        yield client


# ------------------------------------------------------------------------------- the token


def test_pages_need_the_token_and_redirect_to_the_login_page(anon):
    r = anon.get("/ui/jobs/x?child_status=RUNNING", follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login?next=%2Fui%2Fjobs%2Fx%3Fchild_status%3DRUNNING"
    # the login page and the static assets reveal nothing and need no token
    assert anon.get("/ui/login").status_code == 200
    assert anon.get("/ui/static/uPlot.iife.min.js").status_code == 200
    # what pages poll, /metrics and the API answer 401 with a one-line reason
    for path in ("/ui/part/overview", "/ui/data/capacity", "/metrics", "/jobs"):
        r = anon.get(path, follow_redirects=False)
        assert r.status_code == 401 and "needs a token" in r.json()["detail"], path
    # a client that sent a wrong token is told so, even for a page
    r = anon.get("/", headers={"Authorization": "Bearer nope"}, follow_redirects=False)
    assert r.status_code == 401 and r.json()["detail"].startswith("wrong token")


def test_login_refuses_a_wrong_token_and_sets_a_cookie_that_is_not_the_token(anon):
    r = anon.post(auth.LOGIN_PATH, data={"token": "wrong", "next": "/"}, follow_redirects=False)
    assert r.status_code == 401 and "wrong token" in r.text and "set-cookie" not in r.headers
    assert anon.get("/", follow_redirects=False).status_code == 303
    r = anon.post(auth.LOGIN_PATH, data={"token": TOKEN, "next": "//evil.example/x"},
                  follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"  # never off this service
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and TOKEN not in cookie
    assert anon.get("/", follow_redirects=False).status_code == 200
    # a forged cookie is no session
    anon.cookies.set(auth.COOKIE, "0" * 64)
    assert anon.get("/", follow_redirects=False).status_code == 303


def test_the_cookie_changes_state_only_with_the_dashboards_header(browser, seeded):
    job = seeded["to_cancel"]
    r = browser.post(f"/jobs/{job}/cancel", follow_redirects=False)
    assert r.status_code == 401  # a cross-site form could send the cookie, not the header
    assert seeded["service"].store.jobs.get_job(job).status is S.RUNNABLE
    r = browser.post(f"/jobs/{job}/cancel", headers=ACTION)
    assert r.status_code == 200 and r.json()["status"] == "FAILED"
    r = browser.post(f"/jobs/{job}/cancel", headers=ACTION)
    assert r.status_code == 409 and "already finished" in r.json()["detail"]


def test_dashboard_routes_stay_out_of_the_openapi_document_and_off_post_root(browser, seeded):
    paths = browser.get("/openapi.json").json()["paths"]
    assert "/" not in paths and "/metrics" not in paths
    assert not [p for p in paths if p.startswith("/ui")]
    # POST / belongs to another front end (CloudWatch Logs' wire protocol): GET only here
    router = build_router(seeded["service"], make_environment(), CapacityHistory())
    assert [r.methods for r in router.routes if r.path == "/"] == [{"GET"}]


# ------------------------------------------------------------------------------- pages


def test_overview_lists_environments_queues_and_jobs_with_why_they_wait(browser, seeded):
    page = browser.get("/").text
    for text in ("spot", "SPOT", "$0.35", "od", "train", "wait", "elastic-run",
                 "waits-for-capacity", "shards", "array of 4", "elastic 1–3"):
        assert text in page, text
    row = re.search(f'data-job="{seeded["waiting"]}".*?</tr>', page, re.S).group(0)
    assert "#1" in row and "RUNNABLE" in row  # queue position and reason from the scheduler
    assert re.search(r"<b class=\"in-use\">1</b> / <b class=\"available\">2</b>", page)
    shared = re.search(r"<strong>shared</strong>.*?</tr>", page, re.S).group(0)
    assert re.search(r"teams:\s+blue 0 \(×0.5\)", shared), shared  # its policy and shares
    assert "plain jobs may be preempted" in shared  # the queue lets fair share preempt them
    assert "plain jobs may be preempted" not in re.search(
        r"<strong>train</strong>.*?</tr>", page, re.S).group(0)

    only_running = browser.get("/?status=RUNNING").text
    assert "elastic-run" in only_running and "waits-for-capacity" not in only_running
    assert "waits-for-capacity" not in browser.get("/?queue=train").text
    found = browser.get("/?q=waits").text
    assert "waits-for-capacity" in found and "elastic-run" not in found
    bad = browser.get("/?status=SLEEPING")
    assert bad.status_code == 400 and "unknown status 'SLEEPING'" in html.unescape(bad.text)

    capacity = browser.get("/ui/data/capacity").json()  # sampled on the scheduling pass
    spot = next(e for e in capacity["environments"] if e["name"] == "spot")
    assert spot["available"][-1] == 2 and spot["in_use"][-1] == 1
    assert spot["capacity_type"] == "SPOT"
    parts = browser.get("/ui/part/overview?status=RUNNING").json()
    assert set(parts) == {"replicas", "environments", "queues", "jobs"}
    assert parts["replicas"].strip() == ""  # one service, no replicas to show
    assert "elastic-run" in parts["jobs"] and "waits-for-capacity" not in parts["jobs"]


def test_elastic_job_page_shows_changes_latencies_workers_checkpoints_and_cost(browser, seeded):
    page = browser.get(f"/ui/jobs/{seeded['elastic']}").text
    table = re.search(r'<table class="grid" id="membership">.*?</table>', page, re.S).group(0)
    kinds = re.findall(r'class="badge kind-(\w+)"', table)
    assert kinds == ["start", "join", "hang"]  # a lost heartbeat is a hang, not a crash
    assert "700 ms" in table and "10 s" in table and "no heartbeat for 10 s" in table
    assert "ckpt-000000030.dtck" in page and "2.0 KiB" in page
    assert "lost: no heartbeat" in page and "EXITED" in page  # workers, exited ones too
    assert "Static on-demand" in page and "Cost so far" in page
    attempts = re.search(r'<table class="grid" id="attempts">.*?</table>', page, re.S).group(0)
    assert re.search(r'<td class="num">1</td>', attempts) and "1 of 1 (running)" in page
    assert "step 30/600 · world 1 · loss 0.0667 · 100.0 samples/s" in page  # the last step
    assert 'data-elastic="yes"' in page and "Terminate" in page and ">Cancel<" not in page
    parts = browser.get(f"/ui/part/jobs/{seeded['elastic']}").json()
    assert "ckpt-000000030.dtck" in parts["checkpoints"] and "hang" in parts["membership"]


def test_series_are_incremental_leave_recomputed_steps_out_and_build_the_timeline(
        browser, seeded):
    url = f"/ui/data/jobs/{seeded['elastic']}/series"
    first = browser.get(url).json()
    assert first["rows"]["step"] == list(range(1, 31))  # the recomputed row is left out
    assert 99.0 not in first["rows"]["loss"] and first["rows"]["b_simple"][0] == 41.0
    assert [c["kind"] for c in first["changes"]] == ["start", "join", "hang"]
    assert first["timeline"]["world"] == [0, 1, 2, 1, 1]  # from each first step, until now
    # the speed-up chart: the median samples/s at each world size, and the model fitted to them
    assert first["speedup"]["points"] == {"w": [1, 2], "samples_per_s": [100.0, 200.0]}
    model = dict(zip(first["speedup"]["model"]["w"], first["speedup"]["model"]["samples_per_s"],
                     strict=True))
    assert model[1] == pytest.approx(100.0) and model[2] == pytest.approx(200.0)
    again = browser.get(url, params={"offset": first["offset"]}).json()
    assert again["rows"]["step"] == [] and again["offset"] == first["offset"]
    path = seeded["service"].controller.run_dir(seeded["elastic"]) / "metrics.jsonl"
    with open(path, "a") as f:
        f.write(json.dumps({"step": 31, "time": seeded["now"] - 19, "world_size": 1, "loss": 0.1,
                            "samples_per_s": 90.0}) + "\n" + '{"step": 32, "ti')  # torn line
    more = browser.get(url, params={"offset": first["offset"]}).json()
    assert more["rows"]["step"] == [31] and more["rows"]["b_simple"] == [None]


def test_array_page_summarises_children_by_state_and_drills_down(browser, seeded):
    array = seeded["array"]
    page = browser.get(f"/ui/jobs/{array}").text
    summary = re.search(r'id="array-summary".*?</div>', page, re.S).group(0)
    assert "1 SUCCEEDED" in summary and "1 FAILED" in summary and "2 RUNNABLE" in summary
    assert f'href="/ui/jobs/{array}:3"' in page
    failed = browser.get(f"/ui/jobs/{array}", params={"child_status": "failed"}).text
    children = re.search(r'id="children".*?</table>', failed, re.S).group(0)
    assert f"/ui/jobs/{array}:1" in children and f"/ui/jobs/{array}:0" not in children
    child = browser.get(f"/ui/jobs/{array}:1").text
    assert f'href="/ui/jobs/{array}"' in child and "set by the test 1" in child
    attempts = re.search(r'id="attempts".*?</table>', child, re.S).group(0)
    assert "ValueError: bad shard" in attempts and '<td class="num">3</td>' in attempts
    assert "· 2.0 s" in attempts  # how long it ran
    assert re.search(r"Wall time</dt><dd>[^<]* this job · ", child)  # not 'elastic'


def test_unknown_job_is_a_404_page(browser):
    r = browser.get("/ui/jobs/no-such-job")
    assert r.status_code == 404 and "unknown job 'no-such-job'" in html.unescape(r.text)
    assert browser.get("/ui/data/jobs/no-such-job/series").status_code == 404


def test_lab_page_reports_the_sweeps_the_service_ran(browser, seeded):
    page = browser.get("/ui/lab").text
    assert str(seeded["sweep"]) in page and "digits/mlp/sgd" in page
    assert 'data-chart="steps-vs-batch"' in page and "B<sub>crit</sub>" in page
    assert re.search(r"<td class=\"num\">128</td><td class=\"num\">60</td>", page)


def test_sweep_root_comes_from_the_jobs_command():
    from types import SimpleNamespace as NS
    assert sweep_root(NS(command=("py", "-m", "dyntrain.lab.sweep", "/r/.plans/p.json"))) == \
        Path("/r")
    assert sweep_root(NS(command=("py", "-m", "dyntrain.lab.sweepx", "/r/p.json"))) is None


# ------------------------------------------------------------------------------- /metrics


def test_metrics_in_prometheus_text_format(anon, seeded):
    r = anon.get("/metrics", headers=BEARER)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    assert all(name.startswith("dyntrain_") for name, _ in samples)
    assert samples[("dyntrain_jobs", (("queue", "train"), ("state", "RUNNING")))] == 1
    # an array job counts as its children (2 still RUNNABLE), its parent (RUNNABLE) does not
    runnable = seeded["service"].store.jobs.list_jobs(queue="wait", status="RUNNABLE", limit=100)
    assert any(j.id == seeded["array"] for j in runnable)
    assert samples[("dyntrain_jobs", (("queue", "wait"), ("state", "RUNNABLE")))] == len(
        runnable) - 1 >= 3
    spot = (("capacity_type", "SPOT"), ("compute_environment", "spot"))
    assert samples[("dyntrain_slots_in_use", spot)] == 1
    assert samples[("dyntrain_slots_available", spot)] == 2
    assert samples[("dyntrain_slots_max", spot)] == 4
    assert samples[("dyntrain_membership_changes_total", (("kind", "crash"),))] == 1
    job = (("job_id", seeded["elastic"]), ("job_name", "elastic-run"))
    assert samples[("dyntrain_elastic_steps_per_second", job)] == pytest.approx(1.0)
    assert samples[("dyntrain_elastic_world_size", job)] == 1
    assert samples[("dyntrain_scheduler_pass_seconds_count", ())] >= 1


# ------------------------------------------------------------------------------- pure parts


def test_read_rows_keeps_a_line_being_written_for_later(tmp_path):
    files, path = LocalStore(tmp_path), tmp_path / "metrics.jsonl"
    assert read_rows(files, 0) == ([], 0)
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n{"step": 3')
    rows, offset = read_rows(files, 0)
    assert rows == [{"step": 1}, {"step": 2}]
    assert offset == len('{"step": 1}\nnot json\n{"step": 2}\n')
    with open(path, "a") as f:
        f.write("}\n")
    assert read_rows(files, offset) == ([{"step": 3}], path.stat().st_size)
    assert tail_rows(files, 2) == [{"step": 2}, {"step": 3}]
    assert series([{"step": 1, "loss": 2.0}, {"step": 1, "recomputed": True}])["loss"] == [2.0]
    assert steps_per_second([{"step": 1, "time": 10.0}, {"step": 5, "time": 12.0}]) == 2.0
    assert steps_per_second([{"step": 1, "time": 10.0}]) is None


def test_capacity_history_keeps_change_points_and_aligns_environments():
    h = CapacityHistory(max_points=3)
    h.record("a", Sample(10.0, 2, 0, 2, 4))
    h.record("a", Sample(11.0, 2, 0, 2, 4))  # unchanged: not a point
    h.record("b", Sample(12.0, 1, 1, 1, 1))
    h.record("a", Sample(13.0, 3, 1, 3, 4))
    table = h.table(now=20.0)
    assert table["t"] == [10.0, 12.0, 13.0, 20.0]
    a, b = table["environments"]
    assert a == {"name": "a", "available": [2, 2, 3, 3], "in_use": [0, 0, 1, 1]}
    assert b["available"] == [None, 1, 1, 1]
    h.forget_except({"a"})
    assert [e["name"] for e in h.table(now=20.0)["environments"]] == ["a"]


def test_membership_change_times_are_absolute_and_the_timeline_ends_at_zero():
    t0 = 1000.0
    c = membership_change(1012.0, membership_event("leave", ["w1"], 3, 2, t0, 1010.0, 1012.0))
    assert (c.kind, c.requested_at, c.latency_s) == ("leave", 1010.0, 2.0)
    assert c.detect_s == pytest.approx(0.01) and c.reform_s == pytest.approx(1.95)
    from types import SimpleNamespace as NS
    job = NS(started_at=1000.0, stopped_at=1020.0)
    tl = world_timeline(job, [c], now=1030.0)
    assert tl == {"t": [1000.0, 1010.0, 1012.0, 1020.0], "world": [0, 3, 2, 0]}


def test_a_short_job_id_as_the_cli_prints_it_opens_the_job(browser, seeded):
    """Any unique prefix of a job id (the CLI's 8 characters), an array child's too, leads to
    the job's page; a prefix several jobs share is a 409 page naming them."""
    elastic, array = seeded["elastic"], seeded["array"]
    r = browser.get(f"/ui/jobs/{elastic[:8]}?child_page=0", follow_redirects=False)
    assert r.status_code == 307
    assert r.headers["location"] == f"/ui/jobs/{elastic}?child_page=0"
    page = browser.get(f"/ui/jobs/{elastic[:8]}", follow_redirects=True)
    assert page.status_code == 200 and f'<code class="id">{elastic}</code>' in page.text
    for child in (f"{array[:8]}:1", f"{array[:8]}_1"):
        r = browser.get(f"/ui/jobs/{child}", follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == f"/ui/jobs/{array}:1", child
    store = seeded["service"].store
    for suffix in ("1", "2"):  # two jobs whose ids share a prefix
        store.jobs.submit(queue="wait", command=["true"], job_id=f"samepre{suffix}",
                          resources=SMALL)
    r = browser.get("/ui/jobs/samepre")
    assert r.status_code == 409 and "is ambiguous" in html.unescape(r.text)
    assert 'href="/ui/jobs/samepre1"' in r.text and 'href="/ui/jobs/samepre2"' in r.text
    assert browser.get("/ui/jobs/samepre2").status_code == 200
    assert browser.get("/ui/jobs/zzzz").status_code == 404


def test_workers_told_to_leave_are_not_counted_as_the_jobs_workers(browser, seeded):
    """One worker trains, one was told to leave (it still finishes its step): the job has one
    worker now, and one on its way out, not two."""
    elastic = seeded["elastic"]
    seeded["service"].store.workers.add_worker(WorkerRecord(
        f"{elastic}-a1-w2", elastic, 1, "spot", "SPOT", 0.35, None, WorkerState.LEAVING,
        seeded["now"] - 5, leave_reason="shrink: capacity taken back", leave_at=seeded["now"]))
    page = browser.get(f"/ui/jobs/{elastic}").text
    assert '<b id="world-now">1</b> now (+1 leaving), elastic 1–3' in page

"""Run moto's AWS Batch test suite against dyntrain (``make moto-batch``).

moto's tests run in its server mode (``TEST_SERVER_MODE=true``): every boto3 client they make
goes to ``TEST_SERVER_MODE_ENDPOINT``, and each test starts with ``POST /moto-api/reset``. That
endpoint is a small router started here:

- requests signed for ``batch`` or ``logs`` (the SigV4 credential scope says which service)
  go to a real ``dyntrain server`` process;
- everything else (the EC2 VPC/subnet/security group and IAM role setup the tests make, STS,
  ECS) goes to an embedded moto server (``moto.server.ThreadedMotoServer``);
- ``/moto-api/reset`` resets moto and switches to a fresh dyntrain server (its own state
  folder; its embedded ``local`` environment and ``default`` queue removed, so it starts as
  empty as moto does). Fresh servers are started ahead of time, in the background.

It then runs pytest on the chosen test files and prints N passed of M with every failure's
reason, and writes them to ``report.json`` and ``report.md`` in the work folder.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import logging
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path

# moto's Batch test files that test AWS Batch's API, and those that do not (with why)
FILES = ["test_batch.py", "test_batch_compute_envs.py", "test_batch_job_queue.py",
         "test_batch_jobs.py", "test_batch_tags_job.py", "test_batch_tags_job_definition.py",
         "test_batch_tags_job_queue.py", "test_batch_task_definition.py",
         "test_batch_scheduling_policy.py", "test_batch_tags_scheduling_policy.py"]
LEFT_OUT = {
    "test_batch_cloudformation.py": "CloudFormation templates: moto's CloudFormation service",
    "test_batch_eks.py": "EKS job definitions and properties: not implemented",
    "test_server.py": "moto's own in-process server app",
    "test_utils.py": "moto's internal helpers (moto.batch.utils)",
}
# why each failure known to be left fails: the test (without its parameters) -> the reason
_ECS = ("AWS creates an ECS cluster per compute environment and the test looks it up in ECS "
        "(ecsClusterArn); dyntrain's workers are processes of its executor, there is no ECS "
        "cluster to find")
EXPLAINED = {
    "test_create_managed_compute_environment": _ECS,
    "test_create_managed_compute_environment_with_tags": _ECS,
    "test_create_unmanaged_compute_environment": _ECS,
    "test_create_fargate_managed_compute_environment": _ECS,
    "test_delete_unmanaged_compute_environment": _ECS,
    "test_delete_managed_compute_environment": _ECS,
    "test_create_managed_compute_environment_with_unknown_instance_type":
        "AWS checks instance types against EC2's catalogue; dyntrain models no EC2 instance "
        "types and records what it is given",
    "test_update_iam_role": "AWS checks a service role against IAM; dyntrain models no IAM "
                            "roles and records what it is given",
    "test_create_job_queue": "it names the scheduling policy 'policy_arn', which does not "
                             "exist; moto records any string, AWS and dyntrain refuse a queue "
                             "whose fair-share policy does not exist (jobs of a fair-share "
                             "queue are scheduled by it)",
    "test_list_jobs": "it calls ListJobs without jobStatus and expects every status; AWS's API "
                      "reference says only RUNNING jobs are returned then, as dyntrain does",
    "test_submit_job_array_size": "its last step lists the array's children without jobStatus "
                                  "and expects every status (its statusSummary counts pass); "
                                  "AWS's API reference says only RUNNING jobs are returned "
                                  "then, as dyntrain does",
}
_SCOPE = re.compile(r"Credential=[^/]+/\d{8}/[^/]+/([^/]+)/aws4_request")
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class DyntrainPool:
    """A current ``dyntrain server`` and ready spares; ``rotate()`` makes a spare current."""

    def __init__(self, dyntrain: str, work: Path, spares: int = 2) -> None:
        self.dyntrain, self.work = dyntrain, work
        self.ready: queue.Queue = queue.Queue()
        self.procs: list[subprocess.Popen] = []
        self.threads: list[threading.Thread] = []
        for _ in range(spares + 1):
            self._start_later()
        self.current = self._next()
        self.used = False  # whether the current server got a request since it became current

    def _start_later(self) -> None:
        n = len(self.threads) + 1

        def start() -> None:
            try:
                self.ready.put(self._start(n))
            except Exception as e:  # handed to whoever waits for this server
                self.ready.put(e)

        self.threads.append(threading.Thread(target=start, daemon=True))
        self.threads[-1].start()

    def _start(self, n: int) -> tuple[subprocess.Popen, str]:
        state, log = self.work / f"dyntrain-{n}", self.work / f"dyntrain-{n}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([self.dyntrain, "server", "--port", "0", "--state-dir",
                                     str(state), "--grace-seconds", "2"], stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"listening on (http://\S+)", log.read_text())
            if m:
                url = m.group(1)
                for path in ("/job-queues/default", "/compute-environments/local"):
                    urllib.request.urlopen(urllib.request.Request(url + path, method="DELETE"))
                return proc, url
            time.sleep(0.1)
        raise RuntimeError(f"dyntrain server {n} did not start:\n{log.read_text()[-2000:]}")

    def _next(self) -> tuple[subprocess.Popen, str]:
        got = self.ready.get(timeout=180)
        if isinstance(got, Exception):
            raise got
        return got

    def rotate(self) -> None:
        """A fresh server, unless the current one is still untouched."""
        if not self.used:
            return
        old, self.current, self.used = self.current, self._next(), False
        self._start_later()
        _stop(old[0])

    def close(self) -> None:
        for t in self.threads:
            t.join(timeout=180)
        for proc in self.procs:
            if proc.poll() is None:
                _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def make_router(pool: DyntrainPool, moto_url: str) -> http.server.ThreadingHTTPServer:
    class Router(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path.startswith("/moto-api/reset"):
                pool.rotate()
            scope = _SCOPE.search(self.headers.get("Authorization", ""))
            service = scope.group(1) if scope else ""
            if service in ("batch", "logs"):
                target, pool.used = pool.current[1], True
            else:
                target = moto_url
            host, port = target.removeprefix("http://").rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            conn.request(self.command, self.path, body=body, headers=dict(self.headers))
            answer = conn.getresponse()
            data = answer.read()
            self.send_response(answer.status)
            for k, v in answer.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            conn.close()

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward  # noqa: N815

        def log_message(self, *args) -> None:
            pass

    return http.server.ThreadingHTTPServer(("127.0.0.1", 0), Router)


def summarize(junit: Path, total_files: list[str]) -> dict:
    cases = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "failed" if tag != "skipped" else "skipped"
                text = (found.get("message") or found.text or "").strip()
                reason = " ".join(text.splitlines()[0].split())[:300] if text else ""
                break
        cases.append({"test": f"{case.get('classname', '').rsplit('.', 1)[-1]}::"
                              f"{case.get('name')}", "outcome": outcome, "reason": reason})
    passed = sum(c["outcome"] == "passed" for c in cases)
    return {"passed": passed, "total": len(cases), "files": total_files,
            "left_out": LEFT_OUT, "cases": cases}


def write_report(summary: dict, work: Path) -> str:
    lines = [f"moto {summary['moto']} Batch tests against dyntrain: "
             f"{summary['passed']} passed of {summary['total']}", ""]
    unexplained = 0
    for c in summary["cases"]:
        if c["outcome"] != "passed":
            lines.append(f"- {c['outcome'].upper()} {c['test']}: {c['reason']}")
            why = EXPLAINED.get(c["test"].split("::")[-1].split("[")[0])
            if c["outcome"] == "failed":
                unexplained += why is None
                lines.append(f"  - why: {why or 'NOT EXPLAINED: a failure to look into'}")
    lines += ["", f"{unexplained} failure(s) without an explanation."]
    lines += ["", "Files not run (they do not test AWS Batch's API):"]
    lines += [f"- {name}: {why}" for name, why in LEFT_OUT.items()]
    text = "\n".join(lines) + "\n"
    (work / "report.md").write_text(text)
    (work / "report.json").write_text(json.dumps(summary, indent=1))
    return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", required=True, type=Path, help="moto's unpacked tests/ folder")
    ap.add_argument("--dyntrain", required=True, help="the dyntrain executable")
    ap.add_argument("--work", required=True, type=Path, help="scratch folder (report here)")
    ap.add_argument("--moto-version", required=True)
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (e.g. -k NAME)")
    args = ap.parse_args()
    args.tests, args.work = args.tests.resolve(), args.work.resolve()
    args.dyntrain = str(Path(args.dyntrain).resolve())
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request

    shutil.rmtree(args.work / "servers", ignore_errors=True)
    (args.work / "servers").mkdir(parents=True)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    moto_url = "http://{}:{}".format(*moto.get_host_and_port())
    pool = DyntrainPool(args.dyntrain, args.work / "servers")
    router = make_router(pool, moto_url)
    threading.Thread(target=router.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{router.server_port}"
    env = {**os.environ, "TEST_SERVER_MODE": "true", "TEST_SERVER_MODE_ENDPOINT": endpoint,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1"}
    junit = args.work / "junit.xml"
    try:
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"--junitxml={junit}", "-o", "junit_family=xunit1",
                        *[str(args.tests / "test_batch" / f) for f in FILES],
                        *args.pytest_args], cwd=args.tests.parent, env=env, check=False)
    finally:
        router.shutdown()
        pool.close()
        moto.stop()
    summary = {"moto": args.moto_version, **summarize(junit, FILES)}
    print(write_report(summary, args.work))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Unmodified boto3 and the AWS CLI against a real `dyntrain server` process: every Batch and
CloudWatch Logs operation, pagination, errors as exceptions, retries, SigV4."""

from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import botocore.auth
import httpx
import pytest
import torch
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from conftest import SCRIPTS, start_server, stop_server
from dyntrain.service.aws.app import with_aws
from dyntrain.testing.wait import wait_until

REGION = "eu-west-1"
TERMINAL = ("SUCCEEDED", "FAILED")
KEY, SECRET = "AKIDCI", "s3cret"  # the server below requires requests signed with them


def clients(url: str, key: str = KEY, secret: str = SECRET, **config):
    kw = dict(endpoint_url=url, region_name=REGION, aws_access_key_id=key,
              aws_secret_access_key=secret, config=Config(**config) if config else None)
    return boto3.client("batch", **kw), boto3.client("logs", **kw)


def signed(method: str, url: str, body: bytes = b"", service: str = "batch",
           **headers: str) -> httpx.Response:
    """A raw request, signed as boto3 would sign it (to send what boto3 would refuse to)."""
    request = AWSRequest(method=method, url=url, data=body,
                         headers={k.replace("_", "-"): v for k, v in headers.items()})
    SigV4Auth(Credentials(KEY, SECRET), service, REGION).add_auth(request)
    return httpx.request(method, url, content=body, headers=dict(request.headers.items()))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("aws")


@pytest.fixture(scope="module")
def server(tmp):
    """`dyntrain server --aws-credentials FILE`: every call below is signed and verified."""
    (tmp / "credentials").write_text(
        f"[ci]\naws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n")
    proc, url = start_server(tmp / "state", tmp / "server.log",
                             "--aws-credentials", str(tmp / "credentials"))
    yield url
    rc = stop_server(proc)
    log = (tmp / "server.log").read_text()
    assert rc == 0 and "Traceback" not in log, log[-3000:]


@pytest.fixture(scope="module")
def batch(server):
    client = clients(server)[0]
    yield client
    client.close()  # no idle keep-alive connection holds up the server's shutdown


@pytest.fixture(scope="module")
def logs(server):
    client = clients(server)[1]
    yield client
    client.close()


def wait_for_status(batch, job_id: str, statuses=TERMINAL, timeout: float = 60) -> dict:
    """The job, as DescribeJobs gives it, once its status is one of ``statuses``."""
    return wait_until(lambda: batch.describe_jobs(jobs=[job_id])["jobs"][0],
                      f"job {job_id} to be one of {statuses}", timeout, 0.1,
                      until=lambda job: job["status"] in statuses)


def container_definition(batch, name: str, command: list[str], **kw) -> str:
    return batch.register_job_definition(
        jobDefinitionName=name, type="container",
        containerProperties={"image": "busybox", "vcpus": 1, "memory": 128, "command": command},
        **kw)["jobDefinitionArn"]


def test_environments_queues_definitions_and_tags(batch, server):
    batch.create_compute_environment(
        computeEnvironmentName="spot", type="MANAGED", serviceRole="arn:aws:iam::1:role/b",
        computeResources={"type": "SPOT", "minvCpus": 0, "desiredvCpus": 2, "maxvCpus": 4,
                          "instanceTypes": ["m5.large"], "subnets": ["subnet-1"],
                          "instanceRole": "ecsInstanceRole", "bidPercentage": 60},
        tags={"team": "ml"})
    fargate = batch.create_compute_environment(
        computeEnvironmentName="fargate", type="MANAGED",
        computeResources={"type": "FARGATE", "maxvCpus": 8, "subnets": ["subnet-1"]})
    batch.create_compute_environment(computeEnvironmentName="mine", type="UNMANAGED",
                                     unmanagedvCpus=3, state="DISABLED")
    envs = {e["computeEnvironmentName"]: e for e in batch.describe_compute_environments(
        computeEnvironments=["spot", fargate["computeEnvironmentArn"], "mine"]
    )["computeEnvironments"]}
    assert set(envs) == {"spot", "fargate", "mine"}
    spot = envs["spot"]
    assert (spot["type"], spot["state"], spot["status"], spot["tags"]) == (
        "MANAGED", "ENABLED", "VALID", {"team": "ml"})
    assert spot["computeResources"] == {
        "type": "SPOT", "minvCpus": 0, "desiredvCpus": 2, "maxvCpus": 4, "bidPercentage": 60,
        "instanceTypes": ["m5.large"], "subnets": ["subnet-1"],
        "instanceRole": "ecsInstanceRole"}
    assert envs["fargate"]["computeResources"]["desiredvCpus"] == 8  # offered up to max
    assert (envs["mine"]["type"], envs["mine"]["unmanagedvCpus"], envs["mine"]["state"]) == (
        "UNMANAGED", 3, "DISABLED")
    # one store: the native API sees the same environment, vCPUs as slots
    native = httpx.get(f"{server}/compute-environments/spot").json()
    assert (native["capacity_type"], native["desired_slots"], native["max_slots"]) == (
        "SPOT", 2, 4)
    batch.update_compute_environment(computeEnvironment="spot", state="DISABLED",
                                     computeResources={"desiredvCpus": 3})
    spot = batch.describe_compute_environments(computeEnvironments=["spot"])[
        "computeEnvironments"][0]
    assert (spot["state"], spot["computeResources"]["desiredvCpus"]) == ("DISABLED", 3)
    pages = list(batch.get_paginator("describe_compute_environments").paginate(
        PaginationConfig={"PageSize": 1}))
    names = [e["computeEnvironmentName"] for p in pages for e in p["computeEnvironments"]]
    assert len(pages) == len(names) and {"spot", "fargate", "mine", "local"} <= set(names)

    arn = batch.create_job_queue(
        jobQueueName="jq", priority=5, tags={"k": "v"},
        computeEnvironmentOrder=[{"order": 2, "computeEnvironment": "mine"},
                                 {"order": 1, "computeEnvironment": spot[
                                     "computeEnvironmentArn"]}])["jobQueueArn"]
    with pytest.raises(batch.exceptions.ClientException, match="^.*: Job queue jq already "
                                                               "exists$"):  # AWS's wording
        batch.create_job_queue(jobQueueName="jq", priority=1, computeEnvironmentOrder=[
            {"order": 1, "computeEnvironment": "mine"}])
    batch.update_job_queue(jobQueue=arn, priority=7, state="DISABLED")
    queue = batch.describe_job_queues(jobQueues=["jq"])["jobQueues"][0]
    assert (queue["priority"], queue["state"], queue["status"], queue["tags"]) == (
        7, "DISABLED", "VALID", {"k": "v"})
    assert [(o["order"], o["computeEnvironment"].rsplit("/", 1)[1])
            for o in queue["computeEnvironmentOrder"]] == [(1, "spot"), (2, "mine")]
    with pytest.raises(batch.exceptions.ClientException, match="used by job queue"):
        batch.delete_compute_environment(computeEnvironment="mine")

    first = container_definition(batch, "defn", ["echo", "1"])
    second = container_definition(batch, "defn", ["echo", "2"], retryStrategy={"attempts": 2},
                                  timeout={"attemptDurationSeconds": 60})
    assert first.endswith("job-definition/defn:1") and second.endswith("job-definition/defn:2")
    batch.deregister_job_definition(jobDefinition="defn:1")
    found = batch.describe_job_definitions(jobDefinitionName="defn")["jobDefinitions"]
    assert [(d["revision"], d["status"]) for d in found] == [(1, "INACTIVE"), (2, "ACTIVE")]
    (d2,) = batch.describe_job_definitions(jobDefinitions=[second])["jobDefinitions"]
    assert d2["containerProperties"]["command"] == ["echo", "2"]
    assert (d2["retryStrategy"], d2["timeout"], d2["type"]) == (
        {"attempts": 2}, {"attemptDurationSeconds": 60}, "container")
    assert [d["revision"] for d in batch.describe_job_definitions(
        jobDefinitionName="defn", status="ACTIVE")["jobDefinitions"]] == [2]

    for resource in (arn, second):
        batch.tag_resource(resourceArn=resource, tags={"a": "1", "b": "2"})
        batch.untag_resource(resourceArn=resource, tagKeys=["b"])
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {"k": "v", "a": "1"}
    assert batch.list_tags_for_resource(resourceArn=second)["tags"] == {"a": "1"}

    batch.delete_job_queue(jobQueue="jq")
    batch.delete_compute_environment(computeEnvironment="mine")
    assert "jq" not in {q["jobQueueName"] for q in batch.describe_job_queues()["jobQueues"]}


def test_a_job_runs_and_its_log_is_in_cloudwatch(batch, logs):
    container_definition(batch, "greeter", ["sh", "-c", "echo Ref::greeting $WHO; echo bye"],
                         parameters={"greeting": "hello"})
    started = time.time() * 1000
    job_id = batch.submit_job(
        jobName="greet", jobQueue="default", jobDefinition="greeter", parameters={
            "greeting": "hi"}, tags={"t": "1"},
        containerOverrides={"environment": [{"name": "WHO", "value": "you"}]})["jobId"]
    job = wait_for_status(batch, job_id)
    assert (job["status"], job["tags"], job["jobName"]) == ("SUCCEEDED", {"t": "1"}, "greet")
    assert started <= job["createdAt"] <= job["startedAt"] <= job["stoppedAt"] <= \
        time.time() * 1000
    stream = f"greeter/default/{job_id}"
    (attempt,) = job["attempts"]
    assert attempt["container"]["exitCode"] == 0 == job["container"]["exitCode"]
    assert attempt["container"]["logStreamName"] == job["container"]["logStreamName"] == stream
    assert job["container"]["command"] == ["sh", "-c", "echo hi $WHO; echo bye"]
    assert {"name": "WHO", "value": "you"} in job["container"]["environment"]
    assert job["jobDefinition"].endswith("job-definition/greeter:1")
    assert job["jobQueue"] == f"arn:aws:batch:{REGION}:123456789012:job-queue/default"

    # the stream, by its name and by the 2017 scripts' prefix <jobName>/<jobId>
    for prefix in (stream, f"greet/{job_id}", "greeter/"):
        found = logs.describe_log_streams(logGroupName="/aws/batch/job",
                                          logStreamNamePrefix=prefix)["logStreams"]
        assert [s["logStreamName"] for s in found] == [stream], prefix
    head = logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=stream,
                               startFromHead=True)
    assert [e["message"] for e in head["events"]] == ["hi you", "bye"]
    assert all(e["timestamp"] >= job["startedAt"] for e in head["events"])
    again = logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=stream,
                                nextToken=head["nextForwardToken"])
    assert again["events"] == [] and again["nextForwardToken"] == head["nextForwardToken"]
    tail = logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=stream, limit=1)
    assert [e["message"] for e in tail["events"]] == ["bye"]
    back = logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=stream,
                               nextToken=tail["nextBackwardToken"])
    assert [e["message"] for e in back["events"]] == ["hi you"]
    found = logs.filter_log_events(logGroupName="/aws/batch/job", logStreamNamePrefix=stream,
                                   filterPattern="bye", startTime=job["startedAt"])
    assert [(e["message"], e["logStreamName"]) for e in found["events"]] == [("bye", stream)]
    assert found["events"][0]["eventId"]
    groups = logs.describe_log_groups(logGroupNamePrefix="/aws/batch")["logGroups"]
    assert [g["logGroupName"] for g in groups] == ["/aws/batch/job"]


def test_arrays_dependencies_retries_and_timeouts(batch, logs):
    container_definition(batch, "child", ["sh", "-c", "echo $AWS_BATCH_JOB_ARRAY_INDEX"])
    first = batch.submit_job(jobName="a", jobQueue="default", jobDefinition="child",
                             arrayProperties={"size": 2})["jobId"]
    second = batch.submit_job(jobName="b", jobQueue="default", jobDefinition="child",
                              arrayProperties={"size": 2},
                              dependsOn=[{"jobId": first, "type": "N_TO_N"}])["jobId"]
    chain = batch.submit_job(jobName="c", jobQueue="default", jobDefinition="child",
                             arrayProperties={"size": 2},
                             dependsOn=[{"type": "SEQUENTIAL"}])["jobId"]
    after = batch.submit_job(jobName="d", jobQueue="default", jobDefinition="child",
                             dependsOn=[{"jobId": chain}])["jobId"]
    container_definition(batch, "failing", ["sh", "-c", "exit $CODE"],
                         retryStrategy={"attempts": 3, "evaluateOnExit": [
                             {"onExitCode": "3", "action": "exit"}]})
    gives_up = batch.submit_job(jobName="e", jobQueue="default", jobDefinition="failing",
                                containerOverrides={"environment": [
                                    {"name": "CODE", "value": "3"}]})["jobId"]
    retried = batch.submit_job(jobName="f", jobQueue="default", jobDefinition="failing",
                               retryStrategy={"attempts": 2},
                               containerOverrides={"environment": [
                                   {"name": "CODE", "value": "1"}]})["jobId"]
    slow = batch.submit_job(jobName="g", jobQueue="default", jobDefinition="child",
                            containerOverrides={"command": ["sleep", "30"]},
                            timeout={"attemptDurationSeconds": 1})["jobId"]
    done = {j: wait_for_status(batch, j) for j in (first, second, chain, after, gives_up, retried,
                                            slow)}
    for parent in (first, second, chain):
        assert done[parent]["status"] == "SUCCEEDED"
        assert done[parent]["arrayProperties"]["statusSummary"]["SUCCEEDED"] == 2
        assert done[parent]["attempts"] == []
    assert done[after]["dependsOn"] == [{"jobId": chain}]
    assert done[second]["dependsOn"] == [{"jobId": first, "type": "N_TO_N"}]
    children = batch.list_jobs(arrayJobId=second, jobStatus="SUCCEEDED")["jobSummaryList"]
    assert sorted(c["jobId"] for c in children) == [f"{second}:0", f"{second}:1"]
    kids = {i: batch.describe_jobs(jobs=[f"{p}:{i}" for p in (first, second, chain)])["jobs"]
            for i in (0, 1)}
    for i in (0, 1):
        assert kids[i][0]["arrayProperties"] == {"index": i}
        assert kids[i][0]["stoppedAt"] <= kids[i][1]["startedAt"]  # N_TO_N
    assert kids[0][2]["stoppedAt"] <= kids[1][2]["startedAt"]  # SEQUENTIAL
    stream = kids[1][0]["container"]["logStreamName"]
    assert stream == f"child/default/{first}.1"
    assert [e["message"] for e in logs.get_log_events(
        logGroupName="/aws/batch/job", logStreamName=stream)["events"]] == ["1"]
    # eight streams (six children, `after`, `g`): pages of two, in either order, interleaved
    pages = list(logs.get_paginator("describe_log_streams").paginate(
        logGroupName="/aws/batch/job", logStreamNamePrefix="child/", descending=True,
        PaginationConfig={"PageSize": 2}))
    names = [s["logStreamName"] for p in pages for s in p["logStreams"]]
    assert len(pages) == 4 and len(names) == 8 and names == sorted(names, reverse=True)
    events = [e for p in logs.get_paginator("filter_log_events").paginate(
        logGroupName="/aws/batch/job", logStreamNamePrefix="child/",
        PaginationConfig={"PageSize": 2}) for e in p["events"]]
    assert sorted(e["message"] for e in events if e["message"]) == ["0"] * 3 + ["1"] * 3
    assert [e["timestamp"] for e in events] == sorted(e["timestamp"] for e in events)
    assert len({e["eventId"] for e in events}) == len(events)
    assert (done[gives_up]["status"], len(done[gives_up]["attempts"])) == ("FAILED", 1)
    assert done[gives_up]["container"]["exitCode"] == 3
    assert (done[retried]["status"], len(done[retried]["attempts"])) == ("FAILED", 2)
    assert done[retried]["retryStrategy"] == {"attempts": 2}
    streams = [a["container"]["logStreamName"] for a in done[retried]["attempts"]]
    assert streams == [f"failing/default/{retried}", f"failing/default/{retried}.attempt2"]
    assert done[slow]["status"] == "FAILED" and "timeout" in done[slow]["statusReason"]


def test_listing_pages_filters_cancel_and_terminate(batch):
    batch.create_compute_environment(computeEnvironmentName="off", type="UNMANAGED",
                                     unmanagedvCpus=1, state="DISABLED")
    batch.create_job_queue(jobQueueName="held", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": "off"}])
    container_definition(batch, "idle", ["true"])
    ids = [batch.submit_job(jobName=f"wait-{i}", jobQueue="held",
                            jobDefinition="idle")["jobId"] for i in range(5)]
    other = batch.submit_job(jobName="other", jobQueue="held", jobDefinition="idle")["jobId"]
    for job_id in ids + [other]:
        wait_for_status(batch, job_id, ("RUNNABLE",))
    pages = list(batch.get_paginator("list_jobs").paginate(
        jobQueue="held", jobStatus="RUNNABLE", PaginationConfig={"PageSize": 2}))
    assert [len(p["jobSummaryList"]) for p in pages] == [2, 2, 2]
    assert [s["jobId"] for p in pages for s in p["jobSummaryList"]] == ids + [other]
    assert batch.list_jobs(jobQueue="held")["jobSummaryList"] == []  # RUNNING by default
    named = batch.list_jobs(jobQueue="held", filters=[{"name": "JOB_NAME",
                                                       "values": ["wait-*"]}])
    assert [s["jobId"] for s in named["jobSummaryList"]] == ids[::-1]  # newest first
    batch.cancel_job(jobId=ids[0], reason="not needed")
    batch.terminate_job(jobId=ids[1], reason="stop it")
    assert [(j["status"], j["statusReason"]) for j in batch.describe_jobs(
        jobs=ids[:2])["jobs"]] == [("FAILED", "not needed"), ("FAILED", "stop it")]
    batch.cancel_job(jobId="no-such-job", reason="x")  # succeeds and does nothing, as on AWS
    with pytest.raises(batch.exceptions.ClientException, match="reason must not be empty"):
        batch.terminate_job(jobId=ids[2], reason=" ")
    assert batch.describe_jobs(jobs=["no-such-job"])["jobs"] == []
    for job_id in ids[2:] + [other]:
        batch.terminate_job(jobId=job_id, reason="cleanup")


def test_multinode_job_sets_the_node_variables(batch, logs, tmp_path):
    # the main node's exit ends the others: it waits (bounded) until both have printed, as a
    # loaded machine may start them later than it
    batch.register_job_definition(
        jobDefinitionName="mnp", type="multinode", nodeProperties={
            "numNodes": 3, "mainNode": 0, "nodeRangeProperties": [{
                "targetNodes": "0:", "container": {"image": "x", "command": [
                    "sh", "-c", "echo node $AWS_BATCH_JOB_NODE_INDEX of "
                    "$AWS_BATCH_JOB_NUM_NODES main $AWS_BATCH_JOB_MAIN_NODE_INDEX at "
                    "$AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS; "
                    f"touch {tmp_path}/up-$AWS_BATCH_JOB_NODE_INDEX; "
                    "n=0; while [ $AWS_BATCH_JOB_NODE_INDEX = 0 ] && [ $n -lt 2400 ] && "
                    f"[ $(ls {tmp_path} | wc -l) -lt $AWS_BATCH_JOB_NUM_NODES ]; "
                    "do sleep 0.05; n=$((n+1)); done"]}}]})
    job_id = batch.submit_job(jobName="mnp", jobQueue="default", jobDefinition="mnp",
                              nodeOverrides={"numNodes": 2})["jobId"]
    job = wait_for_status(batch, job_id)
    assert job["status"] == "SUCCEEDED" and job["nodeProperties"]["numNodes"] == 2
    lines = {e["message"] for e in logs.get_log_events(
        logGroupName="/aws/batch/job", logStreamName=f"mnp/default/{job_id}")["events"]}
    assert lines == {"node 0 of 2 main 0 at 127.0.0.1", "node 1 of 2 main 0 at 127.0.0.1"}


def test_errors_come_in_aws_shapes(batch, logs, server):
    container_definition(batch, "valid", ["true"])
    with pytest.raises(batch.exceptions.ClientException, match="unknown job queue 'nope'"):
        batch.submit_job(jobName="x", jobQueue="nope", jobDefinition="valid")
    with pytest.raises(batch.exceptions.ClientException, match="must be MIN or MIN:MAX"):
        batch.register_job_definition(
            jobDefinitionName="bad", type="multinode", tags={"dyntrain:elastic": "two"},
            nodeProperties={"numNodes": 2, "mainNode": 0, "nodeRangeProperties": [
                {"targetNodes": "0:", "container": {"command": ["true"]}}]})
    with pytest.raises(batch.exceptions.ClientException, match="Instance role is required"):
        batch.create_compute_environment(computeEnvironmentName="x", type="MANAGED",
                                         computeResources={"type": "EC2", "maxvCpus": 1,
                                                           "minvCpus": 0, "subnets": ["s"]})
    with pytest.raises(batch.exceptions.ClientException,
                       match="^.*: state JUNK must be one of ENABLED [|] DISABLED$"):
        batch.create_job_queue(jobQueueName="x", priority=1, state="JUNK",
                               computeEnvironmentOrder=[{"order": 1,
                                                         "computeEnvironment": "local"}])
    with pytest.raises(ClientError, match="Member must have length less than or equal to 50"):
        batch.submit_job(jobName="x", jobQueue="default", jobDefinition="valid",
                         tags={f"k{i}": "v" for i in range(51)})
    with pytest.raises(logs.exceptions.ResourceNotFoundException):
        logs.get_log_events(logGroupName="/other", logStreamName="x/default/y")
    with pytest.raises(logs.exceptions.InvalidParameterException, match="nextToken"):
        logs.describe_log_streams(logGroupName="/aws/batch/job", nextToken="garbage")
    # what boto3 would refuse to send: the server checks the shapes itself
    r = signed("POST", f"{server}/v1/submitjob", b'{"jobQueue": 3}')
    assert (r.status_code, r.headers["x-amzn-errortype"]) == (400, "ClientException")
    assert "jobName" in r.json()["message"] and "detail" not in r.json()
    r = signed("POST", f"{server}/v1/submitjob", b"{not json")
    assert r.json()["__type"] == "ClientException" and "not JSON" in r.json()["message"]
    r = signed("POST", f"{server}/v1/nosuchthing", b"{}")
    assert r.headers["x-amzn-errortype"] == "UnknownOperationException"
    r = signed("POST", f"{server}/", b"[]", "logs", X_Amz_Target="Logs_20140328.GetLogEvents",
               Content_Type="application/x-amz-json-1.1")
    assert (r.status_code, r.json()["__type"]) == (400, "InvalidParameterException")
    # the native API keeps its own routes, errors and OpenAPI document
    dashboard = httpx.get(f"{server}/")  # GET / is the native side's (the dashboard)
    assert dashboard.status_code == 200 and "x-amzn-errortype" not in dashboard.headers
    assert not [p for p in httpx.get(f"{server}/openapi.json").json()["paths"]
                if p.startswith("/v1")]


class _FlakyProxy(http.server.BaseHTTPRequestHandler):
    """Forwards to the server; the first SubmitJob reaches it but its answer is lost (500)."""

    target = ""
    seen: list[tuple[str, str | None]] = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        # the Host header as signed: the server checks the signature the client made
        r = httpx.post(self.target + self.path, content=body, headers=dict(self.headers))
        self.seen.append((self.path, self.headers.get("amz-sdk-invocation-id")))
        first = [p for p, _ in self.seen].count("/v1/submitjob") == 1
        status, data = ((500, b'{"message": "lost"}') if self.path == "/v1/submitjob" and first
                        else (r.status_code, r.content))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 500:
            self.send_header("x-amzn-ErrorType", "ServerException")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_retried_submit_does_not_create_a_second_job(batch, server):
    container_definition(batch, "once", ["true"])
    _FlakyProxy.target = server
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FlakyProxy)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        flaky, _ = clients(f"http://127.0.0.1:{proxy.server_port}",
                           retries={"max_attempts": 3, "mode": "standard"})
        answer = flaky.submit_job(jobName="once", jobQueue="default", jobDefinition="once")
    finally:
        proxy.shutdown()
    assert answer["ResponseMetadata"]["RetryAttempts"] == 1
    tries = [token for path, token in _FlakyProxy.seen if path == "/v1/submitjob"]
    assert len(tries) == 2 and tries[0] == tries[1] is not None
    jobs = batch.list_jobs(jobQueue="default", filters=[{"name": "JOB_NAME",
                                                         "values": ["once"]}])
    assert [j["jobId"] for j in jobs["jobSummaryList"]] == [answer["jobId"]]


def test_the_aws_cli(server, batch, tmp_path):
    env = {**os.environ, "AWS_ENDPOINT_URL": server, "AWS_ACCESS_KEY_ID": KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": REGION,
           "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    aws = [str(Path(sys.executable).with_name("aws"))]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*aws, *args, "--output", "json"], capture_output=True,
                              text=True, env=env, timeout=60)

    container_definition(batch, "cli", ["false"])
    out = run("batch", "submit-job", "--job-name", "cli", "--job-queue", "default",
              "--job-definition", "cli", "--container-overrides",
              json.dumps({"command": ["echo", "from", "the", "cli"]}))
    assert out.returncode == 0, out.stderr
    job_id = json.loads(out.stdout)["jobId"]
    assert wait_for_status(batch, job_id)["status"] == "SUCCEEDED"
    out = run("logs", "get-log-events", "--log-group-name", "/aws/batch/job",
              "--log-stream-name", f"cli/default/{job_id}", "--start-from-head")
    assert [e["message"] for e in json.loads(out.stdout)["events"]] == ["from the cli"]
    out = run("batch", "submit-job", "--job-name", "cli", "--job-queue", "nope",
              "--job-definition", "cli")
    assert out.returncode != 0 and "ClientException" in out.stderr


def test_signatures_are_verified(server, batch, logs, monkeypatch):
    arn = batch.describe_job_queues(jobQueues=["default"])["jobQueues"][0]["jobQueueArn"]
    assert batch.list_tags_for_resource(resourceArn=arn)["tags"] == {}  # an ARN in the path
    for key, secret, code in (("AKIDCI", "wrong", "InvalidSignatureException"),
                              ("AKIDOTHER", SECRET, "UnrecognizedClientException")):
        with pytest.raises(ClientError) as err:
            clients(server, key, secret)[0].describe_job_queues()
        assert err.value.response["Error"]["Code"] == code
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    stale = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(minutes=10)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: stale)
    with pytest.raises(ClientError, match="Signature expired") as err:
        logs.describe_log_groups()
    assert err.value.response["Error"]["Code"] == "InvalidSignatureException"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    monkeypatch.undo()
    r = httpx.post(f"{server}/v1/describejobqueues", json={})
    assert (r.status_code, r.json()["__type"]) == (403, "MissingAuthenticationTokenException")
    assert httpx.get(f"{server}/health").status_code == 200  # the native API is not affected


def test_without_credentials_loopback_only_and_any_signature():
    async def native(scope, receive, send):
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    app = with_aws(native, ops=None)
    groups = {"X-Amz-Target": "Logs_20140328.DescribeLogGroups",
              "Authorization": "AWS4-HMAC-SHA256 Credential=x/20200101/r/logs/aws4_request, "
                               "SignedHeaders=host, Signature=" + "0" * 64}

    async def calls(client):
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://dyntrain") as c:
            return (await c.post("/v1/describejobqueues", json={}),
                    await c.post("/", json={}, headers=groups), await c.get("/"))

    batch, logs, other = asyncio.run(calls(("10.1.2.3", 999)))
    assert (batch.status_code, batch.headers["x-amzn-errortype"]) == (
        403, "AccessDeniedException")
    assert logs.json()["__type"] == "AccessDeniedException"
    assert other.status_code == 204  # not an AWS request: the native app's
    _, logs, _ = asyncio.run(calls(("127.0.0.1", 999)))
    assert logs.status_code == 200 and logs.json()["logGroups"][0]["logGroupName"] == \
        "/aws/batch/job"


# ------------------------------------------------------------------- training through the API

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "aws_batch_2017"
DIGITS = [sys.executable, "-m", "dyntrain.workloads.digits", "--epochs", "2"]
PROGRESS = re.compile(r"step (\d+)/44 workers (\d) loss [\d.]+ samples/s [\d.]+ "
                      r"validation-accuracy ([\d.]+)")


def _script(server: str, name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AWS_ENDPOINT_URL": server, "AWS_ACCESS_KEY_ID": KEY,
           "AWS_SECRET_ACCESS_KEY": SECRET, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                          text=True, env=env, timeout=240)


@pytest.fixture(scope="module")
def workflow_2017(server) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The 2017 article's two scripts (ported to Python 3), unchanged but for the endpoint:
    a digits training job as the command override."""
    create = _script(server, "create_batch_entities.py", "--subnets", "subnet-1",
                     "--security-groups", "sg-1", "--instance-role", "ecsInstanceRole",
                     "--service-role", "arn:aws:iam::123456789012:role/AWSBatchServiceRole",
                     "--image-id", "ami-1", "--key-pair", "key")
    command = " ".join([*DIGITS, "--log-every", "4", "--step-delay", "0.01"])
    submit = _script(server, "submit_job.py", "--name", "digits", "--command", command,
                     "--wait")
    return create, submit


@pytest.mark.slow
def test_the_2017_workflow_trains_digits(workflow_2017):
    create, submit = workflow_2017
    assert create.returncode == 0, create.stderr
    for line in ("Successfully created compute environment gpu",
                 "Successfully created job queue gpu_queue", "Created job definition mxnet"):
        assert line in create.stdout, create.stdout
    out = submit.stdout
    assert submit.returncode == 0, out + submit.stderr
    job_id = re.search(r"Submitted job \[digits - (\w+)\] to the job queue \[gpu_queue\]",
                       out).group(1)
    assert f"Job [digits - {job_id}] is RUNNING." in out
    assert f"Output [mxnet/default/{job_id}]" in out
    progress = PROGRESS.findall(out)
    assert len(progress) >= 3, out  # per-step lines, as they came
    assert float(progress[-1][2]) > 0.9  # validation accuracy
    assert out.rstrip().endswith(f"Job [digits - {job_id}] SUCCEEDED")


@pytest.mark.slow
def test_an_elastic_multinode_job_follows_capacity_and_ends_with_the_static_model(
        batch, logs, tmp, workflow_2017):
    hold = tmp / "digits-elastic.hold"
    batch.create_compute_environment(
        computeEnvironmentName="elastic-spot", type="MANAGED",
        computeResources={"type": "SPOT", "minvCpus": 0, "desiredvCpus": 2, "maxvCpus": 2,
                          "subnets": ["subnet-1"], "instanceRole": "ecsInstanceRole"})
    batch.create_job_queue(jobQueueName="elastic", priority=10, computeEnvironmentOrder=[
        {"order": 1, "computeEnvironment": "elastic-spot"}])
    batch.register_job_definition(
        jobDefinitionName="digits-elastic", type="multinode", tags={"dyntrain:elastic": "1:2"},
        nodeProperties={"numNodes": 2, "mainNode": 0, "nodeRangeProperties": [{
            "targetNodes": "0:", "container": {"image": "x", "command": [
                sys.executable, str(SCRIPTS / "digits_held.py"), str(hold), *DIGITS[3:],
                "--log-every", "2"]}}]})
    hold.touch()  # the job trains slowly until the test has seen every change of capacity
    job_id = batch.submit_job(jobName="digits-elastic", jobQueue="elastic",
                              jobDefinition="digits-elastic")["jobId"]
    stream = f"digits-elastic/default/{job_id}"
    sizes: list[int] = []  # world sizes it trained at, in order
    # on seeing world size N, set the desired vCPUs to M: capacity goes 2 -> 1 -> 2 (the job may
    # start at its minimum of one while the second worker is still starting on a loaded machine);
    # then the hold ends and the job finishes at full speed
    plan, done = [(2, 1), (1, 2), (2, None)], 0
    token = None

    def follow() -> tuple[dict, list[int]]:  # the job, and the sizes its log showed so far
        nonlocal token, done
        job = batch.describe_jobs(jobs=[job_id])["jobs"][0]
        if job["status"] == "RUNNING":
            page = logs.get_log_events(logGroupName="/aws/batch/job", logStreamName=stream,
                                       startFromHead=True, **({"nextToken": token} if token
                                                              else {}))
            token = page["nextForwardToken"]
            for event in page["events"]:
                m = PROGRESS.search(event["message"])
                if m and (not sizes or sizes[-1] != int(m.group(2))):
                    sizes.append(int(m.group(2)))
                    if done < len(plan) and sizes[-1] == plan[done][0]:
                        if plan[done][1] is not None:
                            batch.update_compute_environment(
                                computeEnvironment="elastic-spot",
                                computeResources={"desiredvCpus": plan[done][1]})
                        done += 1
                        if done == len(plan):
                            hold.unlink()
        return job, list(sizes)

    job, _ = wait_until(follow, "the job to end, following its log", 180, 0.2,
                        until=lambda seen: seen[0]["status"] in TERMINAL)
    assert job["status"] == "SUCCEEDED", job
    assert done == len(plan), sizes  # it trained at 2, shrank to 1, grew back to 2
    assert job["nodeProperties"]["numNodes"] == 2 and len(job["attempts"]) == 1
    static_id = re.search(r"Submitted job \[digits - (\w+)\]", workflow_2017[1].stdout).group(1)
    runs = tmp / "state" / "runs" / "jobs"
    elastic = torch.load(runs / job_id / "final.pt", weights_only=True)
    static = torch.load(runs / static_id / "final.pt", weights_only=True)
    assert elastic.keys() == static.keys()
    assert all(torch.equal(elastic[k], static[k]) for k in static)  # bitwise the same model


def test_fair_share_scheduling_policies_queues_and_snapshot(batch):
    """Create a fair-share policy, attach it to a queue, submit jobs of two shares: the
    queue's front interleaves the shares (by weight), priorities order a share's jobs."""
    arn = batch.create_scheduling_policy(
        name="teams", tags={"org": "ml"},
        fairsharePolicy={"shareDecaySeconds": 3600, "computeReservation": 10,
                         "shareDistribution": [{"shareIdentifier": "blue", "weightFactor": 0.5},
                                               {"shareIdentifier": "red*",
                                                "weightFactor": 1.0}]})["arn"]
    assert arn == f"arn:aws:batch:{REGION}:123456789012:scheduling-policy/teams"
    assert {"arn": arn} in batch.list_scheduling_policies()["schedulingPolicies"]
    [policy] = batch.describe_scheduling_policies(arns=[arn, arn + "x"])["schedulingPolicies"]
    assert policy == {"name": "teams", "arn": arn, "tags": {"org": "ml"}, "fairsharePolicy": {
        "shareDecaySeconds": 3600, "computeReservation": 10, "shareDistribution": [
            {"shareIdentifier": "blue", "weightFactor": 0.5},
            {"shareIdentifier": "red*", "weightFactor": 1.0}]}}
    batch.create_compute_environment(  # no slots: every job stays at the front of the queue
        computeEnvironmentName="fs-none", type="MANAGED",
        computeResources={"type": "FARGATE", "maxvCpus": 4, "desiredvCpus": 0,
                          "subnets": ["subnet-1"]})
    queue = batch.create_job_queue(
        jobQueueName="fsq", priority=1, schedulingPolicyArn=arn,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": "fs-none"}])["jobQueueArn"]
    assert batch.describe_job_queues(jobQueues=["fsq"])["jobQueues"][0][
        "schedulingPolicyArn"] == arn
    definition = container_definition(batch, "fs-def", ["true"], schedulingPriority=5)
    ids = {}
    for name, share, override in (("r1", "red1", None), ("r2", "red1", 9), ("r3", "red1", None),
                                  ("b1", "blue", None)):
        kw = {} if override is None else {"schedulingPriorityOverride": override}
        ids[name] = batch.submit_job(jobName=name, jobQueue=queue, jobDefinition=definition,
                                     shareIdentifier=share, **kw)["jobId"]
    for job_id in ids.values():
        wait_for_status(batch, job_id, ("RUNNABLE",))
    described = batch.describe_jobs(jobs=[ids["r2"]])["jobs"][0]
    assert (described["shareIdentifier"], described["schedulingPriority"]) == ("red1", 9)
    # blue (weight 2) first, then red's priority-9 job, then first in, first out
    want = [ids["b1"], ids["r2"], ids["r1"], ids["r3"]]
    snap = wait_until(lambda: batch.get_job_queue_snapshot(jobQueue="fsq"),
                      "the snapshot in fair-share order", 30, 0.1,
                      until=lambda s: [j["jobArn"].rsplit("/", 1)[1]
                                       for j in s["frontOfQueue"]["jobs"]] == want)
    assert all(j["earliestTimeAtPosition"] > 0 for j in snap["frontOfQueue"]["jobs"])
    assert snap["queueUtilization"]["fairshareUtilization"]["activeShareCount"] == 0

    def refused(call, *args, **kw) -> str:
        with pytest.raises(ClientError) as e:
            call(*args, **kw)
        assert e.value.response["Error"]["Code"] == "ClientException", e.value.response
        return e.value.response["Error"]["Message"]

    assert "needs a shareIdentifier" in refused(
        batch.submit_job, jobName="x", jobQueue=queue, jobDefinition=definition)
    assert "no fair share scheduling policy" in refused(
        batch.submit_job, jobName="x", jobQueue="default", jobDefinition=definition,
        shareIdentifier="blue")
    assert "schedulingPriorityOverride must be an integer between 0 and 9999" in refused(
        batch.submit_job, jobName="x", jobQueue=queue, jobDefinition=definition,
        shareIdentifier="blue", schedulingPriorityOverride=10000)
    assert "in use by job queue(s) fsq" in refused(batch.delete_scheduling_policy, arn=arn)
    assert "computeReservation must be between 0 and 99" in refused(
        batch.create_scheduling_policy, name="bad", fairsharePolicy={"computeReservation": 100})
    assert "weightFactor of share a must be between" in refused(
        batch.create_scheduling_policy, name="bad", fairsharePolicy={
            "shareDistribution": [{"shareIdentifier": "a", "weightFactor": 0}]})
    assert "overlaps" in refused(batch.create_scheduling_policy, name="bad", fairsharePolicy={
        "shareDistribution": [{"shareIdentifier": "a*"}, {"shareIdentifier": "ab"}]})
    assert "unknown scheduling policy nope" in refused(
        batch.create_job_queue, jobQueueName="fsq2", priority=1,
        schedulingPolicyArn=arn.replace("teams", "nope"),
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": "fs-none"}])
    assert "can only be given when it is created" in refused(
        batch.update_job_queue, jobQueue="default", schedulingPolicyArn=arn)
    batch.update_scheduling_policy(arn=arn, fairsharePolicy={"shareDecaySeconds": 60})
    assert batch.describe_scheduling_policies(arns=[arn])["schedulingPolicies"][0][
        "fairsharePolicy"] == {"shareDecaySeconds": 60, "computeReservation": 0,
                               "shareDistribution": []}
    for job_id in ids.values():
        batch.cancel_job(jobId=job_id, reason="done")
    batch.update_job_queue(jobQueue="fsq", state="DISABLED")
    wait_until(lambda: [j for j in ids.values()
                        if batch.describe_jobs(jobs=[j])["jobs"][0]["status"] != "FAILED"],
               "the jobs cancelled", 30, 0.1, until=lambda left: not left)
    batch.delete_job_queue(jobQueue="fsq")
    wait_until(lambda: "fsq" in {q["jobQueueName"] for q in batch.describe_job_queues()[
        "jobQueues"]}, "the queue gone", 30, 0.1, until=lambda there: not there)
    batch.delete_scheduling_policy(arn=arn)
    assert batch.describe_scheduling_policies(arns=[arn])["schedulingPolicies"] == []

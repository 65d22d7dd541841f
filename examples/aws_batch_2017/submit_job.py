"""Step 2 of the 2017 "Deep learning on AWS Batch" workflow, for Python 3 and boto3.

Submits a training job with a command override, then (with ``--wait``) polls ``describe_jobs``
every second. Once the job is RUNNING it finds the job's log stream the way the 2017 scripts
did, by the prefix ``<jobName>/<jobId>``, and prints the stream's events from the head (later
passes start after the last timestamp printed), following ``nextForwardToken`` until it stops
changing. It ends with ``Job [...] SUCCEEDED`` (or FAILED).

Nothing here names dyntrain: point boto3 at a server with ``AWS_ENDPOINT_URL`` (or at AWS with
nothing at all).
"""

import argparse
import sys
import time
from datetime import UTC, datetime

import boto3

REGION = "us-east-1"
LOG_GROUP = "/aws/batch/job"
SPINNER = "-/|\\"


def print_logs(logs, stream: str, start_time: int) -> int:
    """Print the stream's events at or after ``start_time`` (ms); the last timestamp seen."""
    request = {"logGroupName": LOG_GROUP, "logStreamName": stream, "startTime": start_time,
               "startFromHead": True}
    last = max(start_time - 1, 0)  # a pass that finds nothing new keeps the position
    while True:
        response = logs.get_log_events(**request)
        for event in response["events"]:
            last = event["timestamp"]
            when = datetime.fromtimestamp(last / 1000, UTC)
            print(f"[{when.isoformat(timespec='milliseconds')[:23]}Z] {event['message']}")
        token = response["nextForwardToken"]
        if not token or request.get("nextToken") == token:
            return last
        request["nextToken"] = token


def find_log_stream(logs, job_name: str, job_id: str) -> str:
    streams = logs.describe_log_streams(logGroupName=LOG_GROUP,
                                        logStreamNamePrefix=f"{job_name}/{job_id}")["logStreams"]
    return streams[0]["logStreamName"] if streams else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--name", default="train_rnn_mnist", help="job name")
    ap.add_argument("--job-queue", default="gpu_queue")
    ap.add_argument("--job-definition", default="mxnet")
    ap.add_argument("--command", default="python /mxnet/example/image-classification/"
                    "train_mnist.py --network lenet --gpus 0 --model-prefix /mnt/model/mnist")
    ap.add_argument("--wait", action="store_true", help="follow the job until it ends")
    args = ap.parse_args(argv)
    batch = boto3.client("batch", region_name=REGION)
    logs = boto3.client("logs", region_name=REGION)

    job_id = batch.submit_job(jobName=args.name, jobQueue=args.job_queue,
                              jobDefinition=args.job_definition,
                              containerOverrides={"command": args.command.split()})["jobId"]
    print(f"Submitted job [{args.name} - {job_id}] to the job queue [{args.job_queue}]")

    turn, running, start_time = 0, False, 0
    while args.wait:
        time.sleep(1)
        status = batch.describe_jobs(jobs=[job_id])["jobs"][0]["status"]
        if status in ("SUCCEEDED", "FAILED"):
            print("=" * 80)
            print(f"Job [{args.name} - {job_id}] {status}")
            return 0 if status == "SUCCEEDED" else 1
        if status == "RUNNING":
            stream = find_log_stream(logs, args.name, job_id)
            if stream and not running:
                running = True
                print(f"\rJob [{args.name} - {job_id}] is RUNNING.")
                print(f"Output [{stream}]:\n {'=' * 80}")
            if stream:
                start_time = print_logs(logs, stream, start_time) + 1
        else:
            print(f"\rJob [{args.name} - {job_id}] is {status:<9}... "
                  f"{SPINNER[turn % len(SPINNER)]}", end="", flush=True)
            turn += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

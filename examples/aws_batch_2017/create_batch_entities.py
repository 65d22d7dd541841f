"""Step 1 of the 2017 "Deep learning on AWS Batch" workflow, for Python 3 and boto3.

Creates what a GPU training job needs: a MANAGED compute environment of p2.xlarge instances
(4 vCPUs, 61,000 MiB each; min 4, desired 4, max 8 vCPUs), a job queue ``<environment>_queue``
over it, and the job definition ``mxnet`` (image ``mxnet/python:gpu``, privileged, the host's
NVIDIA driver mounted read-only). It waits, polling every second, until the environment and the
queue are VALID.

Nothing here names dyntrain: point boto3 at a server with ``AWS_ENDPOINT_URL`` (or at AWS with
nothing at all).
"""

import argparse
import sys
import time

import boto3

REGION = "us-east-1"
INSTANCE_TYPE, UNIT_VCPUS, UNIT_MEMORY = "p2.xlarge", 4, 61000
SPINNER = "-/|\\"


def wait_until_valid(describe, what: str) -> None:
    """Poll ``describe()`` every second until the resource is VALID (raise when INVALID)."""
    turn = 0
    while True:
        resource = describe()
        if resource["status"] == "VALID":
            print(f"\rSuccessfully created {what}")
            return
        if resource["status"] == "INVALID":
            raise SystemExit(f"Failed to create {what}: {resource.get('statusReason')}")
        print(f"\rCreating {what}... {SPINNER[turn % len(SPINNER)]}", end="", flush=True)
        turn += 1
        time.sleep(1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--compute-environment", default="gpu", help="compute environment name")
    ap.add_argument("--subnets", required=True, help="comma-separated subnet ids")
    ap.add_argument("--security-groups", required=True, help="comma-separated security groups")
    ap.add_argument("--instance-role", required=True)
    ap.add_argument("--service-role", required=True)
    ap.add_argument("--image-id", required=True, help="AMI with the NVIDIA driver")
    ap.add_argument("--key-pair", required=True, help="EC2 key pair")
    args = ap.parse_args(argv)
    batch = boto3.client("batch", region_name=REGION)

    name = args.compute_environment
    batch.create_compute_environment(
        computeEnvironmentName=name, type="MANAGED", serviceRole=args.service_role,
        computeResources={
            "type": "EC2", "imageId": args.image_id, "instanceTypes": [INSTANCE_TYPE],
            "minvCpus": UNIT_VCPUS, "desiredvCpus": UNIT_VCPUS, "maxvCpus": 2 * UNIT_VCPUS,
            "subnets": args.subnets.split(","), "securityGroupIds": args.security_groups.split(","),
            "ec2KeyPair": args.key_pair, "instanceRole": args.instance_role})
    wait_until_valid(lambda: batch.describe_compute_environments(
        computeEnvironments=[name])["computeEnvironments"][0], f"compute environment {name}")

    queue = f"{name}_queue"
    batch.create_job_queue(jobQueueName=queue, priority=0,
                           computeEnvironmentOrder=[{"order": 0, "computeEnvironment": name}])
    wait_until_valid(lambda: batch.describe_job_queues(jobQueues=[queue])["jobQueues"][0],
                     f"job queue {queue}")

    definition = batch.register_job_definition(
        jobDefinitionName="mxnet", type="container",
        containerProperties={
            "image": "mxnet/python:gpu", "vcpus": UNIT_VCPUS, "memory": UNIT_MEMORY,
            "privileged": True,
            "volumes": [{"name": "nvidia-driver-dir", "host": {
                "sourcePath": "/var/lib/nvidia-docker/volumes/nvidia_driver/latest"}}],
            "mountPoints": [{"sourceVolume": "nvidia-driver-dir",
                             "containerPath": "/usr/local/nvidia", "readOnly": True}]})
    print(f"Created job definition {definition['jobDefinitionName']}")
    print("Successfully created batch entities (compute environment, job queue, job definition)")


if __name__ == "__main__":
    sys.exit(main())

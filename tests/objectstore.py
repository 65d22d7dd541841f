"""An S3-compatible server for tests: moto's standalone server as its own process over HTTP.

Authentication is on (the first three requests create an IAM user with a key and an allow-all
policy; every later request must be signed with that key), so wrong credentials are refused as
AWS refuses them. Clients reach it by its endpoint through the standard settings
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``), as a user would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dyntrain.testing.wait import wait_until

REGION = "us-east-1"
# the settings of a user's shell that would send requests elsewhere or sign them differently
FOREIGN = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3",
           "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "FSSPEC_S3")


@dataclass
class S3Server:
    """A running moto server and the key it accepts."""

    endpoint: str
    key: str
    secret: str
    proc: subprocess.Popen
    log: Path
    buckets: list[str] = field(default_factory=list)

    def env(self, base: dict[str, str] | None = None, **overrides: str) -> dict[str, str]:
        """``base`` (default: this process's environment) set up to reach this server."""
        env = {k: v for k, v in (os.environ if base is None else base).items()
               if k not in FOREIGN}
        env.update(AWS_ENDPOINT_URL=self.endpoint, AWS_ACCESS_KEY_ID=self.key,
                   AWS_SECRET_ACCESS_KEY=self.secret, AWS_DEFAULT_REGION=REGION,
                   AWS_EC2_METADATA_DISABLED="true")
        env.update(overrides)
        return env

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=self.key, aws_secret_access_key=self.secret)

    def bucket(self, name: str) -> str:
        """Create bucket ``name``; returns it."""
        self.client().create_bucket(Bucket=name)
        self.buckets.append(name)
        return name

    def keys(self, bucket: str, prefix: str = "") -> dict[str, int]:
        """The objects under ``prefix`` as ``{key: size}``."""
        out = {}
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                            Prefix=prefix):
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def start_s3_server(log: Path, host: str = "127.0.0.1", popen=subprocess.Popen) -> S3Server:
    """Start ``moto_server`` on a free port of ``host`` and create the key that it accepts from
    then on.

    Args:
        log: where the server's output goes.
        host: the address it listens on.
        popen: starts it (``Host.popen`` of a test host: on that host's address).
    """
    exe = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or "moto_server"
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "3"}
    with open(log, "wb") as out:
        proc = popen([exe, "-H", host, "-p", "0"], stdout=out, stderr=subprocess.STDOUT,
                     stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        found = wait_until(lambda: proc.poll() is not None or re.search(
            rf"Running on http://{re.escape(host)}:(\d+)", log.read_text(errors="replace")),
            "moto_server to listen", 90)
        if proc.poll() is not None:
            raise RuntimeError(f"moto_server exited: {log.read_text(errors='replace')[-2000:]}")
        endpoint = f"http://{host}:{found.group(1)}"
        key, secret = _make_user(endpoint)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return S3Server(endpoint, key, secret, proc, log)


def _make_user(endpoint: str) -> tuple[str, str]:
    """The three requests made without authentication: a user, its key, an allow-all policy."""
    import boto3

    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION,
                       aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
    iam.create_user(UserName="dyntrain-tests")
    key = iam.create_access_key(UserName="dyntrain-tests")["AccessKey"]
    iam.put_user_policy(UserName="dyntrain-tests", PolicyName="all", PolicyDocument=json.dumps(
        {"Version": "2012-10-17",
         "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    return key["AccessKeyId"], key["SecretAccessKey"]

"""Who may call the AWS endpoints: Signature Version 4, verified with botocore's own signer.

The rule (the native API's token rule, in AWS's terms): with ``--aws-credentials FILE`` every
request must carry a valid signature by one of the file's keys; without it, requests from
loopback are accepted whatever they carry (boto3 always signs, with whatever keys it found) and
requests from anywhere else are refused. The file is an AWS shared-credentials file: one INI
section per key with ``aws_access_key_id`` and ``aws_secret_access_key``.

The server recomputes the signature the way the client did (``botocore.auth.SigV4Auth``) from
the request as received: method, raw path and query, the headers named in ``SignedHeaders``,
the body and the client's ``X-Amz-Date``, and refuses a date more than five minutes away from
its own clock (a replayed request), as AWS does.
"""

from __future__ import annotations

import configparser
import datetime as dt
import hashlib
import hmac
import re
from dataclasses import dataclass
from pathlib import Path

from botocore.auth import SIGV4_TIMESTAMP, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from dyntrain.errors import DyntrainError
from dyntrain.service.aws.errors import AwsError

MAX_SKEW = dt.timedelta(minutes=5)
_AUTH = re.compile(r"^AWS4-HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{8})/([^/,\s]+)/([^/,\s]+)"
                   r"/aws4_request,\s*SignedHeaders=([a-z0-9;_.-]+),\s*Signature=([0-9a-f]{64})$")


@dataclass(frozen=True)
class Scope:
    """What the ``Authorization`` header says about the request (region, service, key)."""

    access_key: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str


def load_credentials(path: str | Path) -> dict[str, str]:
    """Access key id -> secret, from an AWS shared-credentials (INI) file."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f)
    except OSError as e:
        raise DyntrainError(f"cannot read --aws-credentials {path}: {e.strerror or e}") from None
    except configparser.Error as e:
        raise DyntrainError(f"--aws-credentials {path} is not an AWS credentials file: "
                            f"{' '.join(str(e).split())}") from None
    keys = {}
    for name in parser.sections():
        section = parser[name]
        key, secret = section.get("aws_access_key_id"), section.get("aws_secret_access_key")
        if not key or not secret:
            raise DyntrainError(f"--aws-credentials {path}: section [{name}] needs "
                                "aws_access_key_id and aws_secret_access_key")
        keys[key.strip()] = secret.strip()
    if not keys:
        raise DyntrainError(f"--aws-credentials {path} holds no keys (expected sections with "
                            "aws_access_key_id and aws_secret_access_key)")
    return keys


def parse_authorization(header: str | None) -> Scope | None:
    """The parts of a SigV4 ``Authorization`` header, or None when it is not one."""
    m = _AUTH.match((header or "").strip())
    if m is None:
        return None
    key, date, region, service, signed, signature = m.groups()
    return Scope(key, date, region, service, tuple(signed.split(";")), signature)


class Verifier:
    """Checks requests against the configured keys (none: loopback only, unchecked)."""

    def __init__(self, keys: dict[str, str] | None = None, clock=None) -> None:
        self.keys = dict(keys or {})
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))

    def check(self, *, loopback: bool, method: str, raw_path: str, query: str,
              headers: dict[str, str], body: bytes) -> None:
        """Raise a 403 ``AwsError`` unless the rule above lets the request in.

        ``headers`` are the request's, names in lower case (repeated ones joined by ',')."""
        if not self.keys:
            if loopback:
                return
            raise AwsError("AccessDeniedException", "this dyntrain server accepts AWS requests "
                           "from other hosts only when started with --aws-credentials FILE", 403)
        scope = parse_authorization(headers.get("authorization"))
        if scope is None:
            raise AwsError("MissingAuthenticationTokenException",
                           "Missing Authentication Token: sign the request with AWS Signature "
                           "Version 4 (AWS4-HMAC-SHA256)", 403)
        secret = self.keys.get(scope.access_key)
        if secret is None:
            raise AwsError("UnrecognizedClientException",
                           f"The security token included in the request is invalid: unknown "
                           f"access key {scope.access_key}", 403)
        stamp = headers.get("x-amz-date", "")
        try:
            when = dt.datetime.strptime(stamp, SIGV4_TIMESTAMP).replace(tzinfo=dt.UTC)
        except ValueError:
            raise AwsError("IncompleteSignatureException",
                           "X-Amz-Date must be set (YYYYMMDDTHHMMSSZ) on a signed request",
                           403) from None
        now = self.clock()
        if abs(now - when) > MAX_SKEW:
            raise AwsError("InvalidSignatureException",
                           f"Signature expired: {stamp} is more than 5 minutes away from the "
                           f"server's time {now.strftime(SIGV4_TIMESTAMP)}", 403)
        if stamp[:8] != scope.date or "host" not in scope.signed_headers:
            raise AwsError("IncompleteSignatureException", "the credential scope's date must "
                           "be X-Amz-Date's and the host header must be signed", 403)
        if "x-amz-content-sha256" in headers and headers["x-amz-content-sha256"] != \
                hashlib.sha256(body).hexdigest():
            raise AwsError("InvalidSignatureException",
                           "X-Amz-Content-SHA256 does not match the body", 403)
        request = AWSRequest(method=method, url=f"http://{headers.get('host', '')}{raw_path}"
                             + (f"?{query}" if query else ""),
                             headers={h: headers.get(h, "") for h in scope.signed_headers},
                             data=body)
        request.context["timestamp"] = stamp
        signer = SigV4Auth(Credentials(scope.access_key, secret), scope.service, scope.region)
        expected = signer.signature(signer.string_to_sign(
            request, signer.canonical_request(request)), request)
        if not hmac.compare_digest(expected, scope.signature):
            raise AwsError("InvalidSignatureException",
                           "The request signature we calculated does not match the signature "
                           "you provided. Check your AWS Secret Access Key and signing method.",
                           403)

"""Errors in AWS's shapes, which boto3 turns into ``client.exceptions.<Code>``.

Both protocols get the code twice: in the ``x-amzn-ErrorType`` header (what botocore reads for
rest-json, Batch) and as ``__type`` in the body (json 1.1, CloudWatch Logs), with the message as
``message``.
"""

from __future__ import annotations

from starlette.responses import JSONResponse


class AwsError(Exception):
    """An answer in AWS's error shape: a code (e.g. ``ClientException``), a one-line message
    and an HTTP status."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.code, self.message, self.status = code, " ".join(str(message).split()), status

    def response(self, media_type: str, request_id: str) -> JSONResponse:
        return JSONResponse({"__type": self.code, "message": self.message},
                            status_code=self.status, media_type=media_type,
                            headers={"x-amzn-ErrorType": self.code,
                                     "x-amzn-RequestId": request_id})


def client_error(message: str) -> AwsError:
    """Batch's answer to a bad request (HTTP 400)."""
    return AwsError("ClientException", message)


def invalid_parameter(message: str) -> AwsError:
    """CloudWatch Logs' answer to a bad request (HTTP 400)."""
    return AwsError("InvalidParameterException", message)


def not_found(message: str) -> AwsError:
    """CloudWatch Logs: the group or stream does not exist (HTTP 400)."""
    return AwsError("ResourceNotFoundException", message)

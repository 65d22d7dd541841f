"""Server-side checks of a request against the operation's input shape in botocore's model.

botocore's ``ParamValidator`` (what boto3 runs before sending: required members, types, minimum
lengths) first; then what it leaves to the service: enum values (Batch answers
``<member> <value> must be one of A | B``) and maximum lengths (AWS's generic ``1 validation
error detected: ... Member must have length less than or equal to N``, code ``ValidationError``).
"""

from __future__ import annotations

from typing import Any

from botocore.model import Shape
from botocore.validate import ParamValidator

from dyntrain.service.aws.errors import AwsError


def check(shape: Shape, params: dict[str, Any], bad_request) -> None:
    report = ParamValidator().validate(params, shape)
    if report.has_errors():
        lines = report.generate_report().splitlines()
        raise bad_request("; ".join(line.strip() for line in lines if line.strip()))
    _walk(shape, params, "", bad_request)


def _walk(shape: Shape, value: Any, path: str, bad_request) -> None:
    if shape.type_name == "structure" and isinstance(value, dict):
        for name, member in shape.members.items():
            if name in value:
                _walk(member, value[name], f"{path}.{name}" if path else name, bad_request)
    elif shape.type_name in ("list", "map") and isinstance(value, list | dict):
        _max(shape, value, path)
        items = value.values() if isinstance(value, dict) else value
        inner = shape.value if shape.type_name == "map" else shape.member
        for i, item in enumerate(items):
            _walk(inner, item, f"{path}[{i}]" if isinstance(value, list) else path,
                  bad_request)
    elif shape.type_name == "string" and isinstance(value, str):
        _max(shape, value, path)
        allowed = shape.enum  # AWS takes some (evaluateOnExit's action) in any case
        if allowed and value.lower() not in {a.lower() for a in allowed}:
            raise bad_request(f"{path.rsplit('.', 1)[-1]} {value} must be one of "
                              f"{' | '.join(allowed)}")


def _max(shape: Shape, value: Any, path: str) -> None:
    most = shape.metadata.get("max")
    if most is not None and len(value) > most:
        shown = (value[:100] if isinstance(value, str)
                 else f"{type(value).__name__} of {len(value)} items")
        raise AwsError("ValidationError", f"1 validation error detected: Value '{shown}' at "
                       f"'{path}' failed to satisfy constraint: Member must have length less "
                       f"than or equal to {most}")

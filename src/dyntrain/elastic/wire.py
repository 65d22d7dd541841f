"""Typed dataclasses to JSON and back, refusing what does not fit with an error naming the field.

``to_wire`` turns a dataclass (nested dataclasses, enums, tuples, dicts, numbers, strings) into
plain JSON values; ``from_wire`` builds the dataclass from them, checking every field against
its annotation: a missing field, an unknown one or a value of the wrong type raises
``WireError`` with the field's path (``position.step: expected an integer or null, got 'x'``).
``dyntrain.elastic.protocol`` builds its messages on it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from typing import Any, TypeVar

from dyntrain.errors import DyntrainError

T = TypeVar("T")


class WireError(DyntrainError):
    """A JSON value does not fit the dataclass it should become."""


def to_wire(value: Any) -> Any:
    """Plain JSON values for ``value`` (dataclasses become objects, enums their values)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_wire(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [to_wire(v) for v in value]
    return value


def from_wire(cls: type[T], data: Any, where: str = "") -> T:
    """The ``cls`` dataclass from ``data`` (a JSON object); raises ``WireError``.

    Args:
        cls: A dataclass whose fields are annotated with the types ``to_wire`` produces.
        data: What ``json.loads`` returned.
        where: The path of ``data`` in the enclosing value, for error messages.
    """
    if not isinstance(data, dict):
        raise WireError(f"{where or cls.__name__}: expected an object, got {_show(data)}")
    hints = _hints(cls)
    unknown = sorted(set(data) - set(hints))
    if unknown:
        raise WireError(f"{_at(where, unknown[0])}: unknown field")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise WireError(f"{_at(where, f.name)}: missing")
            continue
        values[f.name] = _convert(hints[f.name], data[f.name], _at(where, f.name))
    return cls(**values)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return {name: hint for name, hint in typing.get_type_hints(cls).items()
            if name in {f.name for f in dataclasses.fields(cls)}}


def _convert(hint: Any, value: Any, where: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, where)
        raise TypeError(f"unsupported annotation {hint}")  # a programming error, not input
    if origin is tuple:
        if not isinstance(value, list):
            raise WireError(f"{where}: expected a list, got {_show(value)}")
        return tuple(_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise WireError(f"{where}: expected an object, got {_show(value)}")
        return value
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError:
            allowed = ", ".join(str(m.value) for m in hint)
            raise WireError(f"{where}: expected one of {allowed}, got {_show(value)}") from None
    if dataclasses.is_dataclass(hint):
        return from_wire(hint, value, where)
    if hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif hint is Any:
        return value
    else:
        raise TypeError(f"unsupported annotation {hint}")
    raise WireError(f"{where}: expected {_NAMES[hint]}, got {_show(value)}")


_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

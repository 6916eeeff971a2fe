"""``true``/``false`` where a spec wants a number: refused at the edge.

Pydantic's lax mode reads a boolean as the integer 1 or 0 (``num_nodes: true`` is one node), a
silent misreading of a typo or of a value meant for another key. Strict mode would also refuse
``"16"`` and enum names, so instead the user's data is walked once against the spec's field
annotations before validation: a boolean given for a field whose type admits ``int`` or
``float`` (or an integer ``Literal``) but not ``bool`` is an error naming the field. Nested
specs, ``dict[str, Spec]`` and lists are followed; a union of specs is followed into each member.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel


def boolean_for_number(cls: type[BaseModel], data: Any, path: str = "") -> str | None:
    """The first key path in ``data`` that gives a boolean for one of ``cls``'s number fields."""
    if not isinstance(data, Mapping):
        return None
    fields = {(f.alias or name): f for name, f in cls.model_fields.items()}
    for key, value in data.items():
        field = fields.get(key) if isinstance(key, str) else None
        if field is not None:
            found = _walk(field.annotation, value, f"{path}.{key}" if path else key)
            if found is not None:
                return found
    return None


def _members(annotation: Any) -> list[Any]:
    """The alternatives of a union (``X | None``, ``Optional``), Annotated metadata dropped."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return [m for a in get_args(annotation) for m in _members(a)]
    return [annotation]


def _wants_number(members: list[Any]) -> bool:
    if any(m is bool or m is Any or m is object for m in members):
        return False
    for m in members:
        if m is int or m is float:
            return True
        if get_origin(m) is Literal and any(type(a) in (int, float) for a in get_args(m)):
            return not any(isinstance(a, bool) for a in get_args(m))
    return False


def _walk(annotation: Any, value: Any, path: str) -> str | None:
    members = _members(annotation)
    if isinstance(value, bool):
        return path if _wants_number(members) else None
    for m in members:
        origin = get_origin(m)
        if isinstance(m, type) and issubclass(m, BaseModel) and isinstance(value, Mapping):
            found = boolean_for_number(m, value, path)
        elif origin in (dict, Mapping, typing.Mapping) and isinstance(value, Mapping):
            values = get_args(m)
            found = next((f for k, v in value.items() if values and (f := _walk(values[-1], v, f"{path}.{k}"))), None)
        elif origin in (list, tuple, set, frozenset) and isinstance(value, (list, tuple)):
            items = [a for a in get_args(m) if a is not Ellipsis]
            found = next((f for i, v in enumerate(value)
                          if items and (f := _walk(items[min(i, len(items) - 1)], v, f"{path}[{i}]"))), None)
        else:
            found = None
        if found is not None:
            return found
    return None

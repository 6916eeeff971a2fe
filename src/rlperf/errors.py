"""User-facing errors.

Every mistake a user can make (bad field, unknown name, infeasible plan) becomes a
``SpecError``: a ``ValueError`` whose message is one line naming the field and what is
allowed. The CLI prints that line and exits 2, never a traceback. Internal invariants are
plain ``assert``s.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError


class SpecError(ValueError):
    """A bad input, explained in one line (``field: problem; allowed: ...``)."""

    def __init__(self, field: str, problem: str, allowed: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.allowed = allowed
        msg = f"{field}: {problem}"
        if allowed:
            msg += f" (allowed: {allowed})"
        super().__init__(msg)


def unknown_name(field: str, name: str, known: Iterable[str]) -> SpecError:
    """An unknown catalog name, with the closest known names as suggestions."""
    known_list = sorted(known)
    close = difflib.get_close_matches(name, known_list, n=3, cutoff=0.4)
    if not close:
        lowered = name.lower()
        close = [k for k in known_list if lowered in k.lower()][:3]
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known_list[:12])}"
    return SpecError(field, f"unknown name {name!r}; {hint}")


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) if loc else "<root>"


def one_line(err: ValidationError, prefix: str = "") -> SpecError:
    """Turn pydantic's multi-line ValidationError into a one-line SpecError (first error)."""
    first = err.errors()[0]
    field = _loc(tuple(first.get("loc", ())))
    if prefix:
        field = f"{prefix}.{field}" if field != "<root>" else prefix
    problem = str(first.get("msg", "invalid value"))
    ctx = first.get("ctx") or {}
    allowed = None
    if "expected" in ctx:
        allowed = str(ctx["expected"])
    extra = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return SpecError(field, problem + extra, allowed)


M = TypeVar("M", bound=BaseModel)


def parse(cls: type[M], data: Mapping[str, Any], where: str = "") -> M:
    """Validate ``data`` into ``cls`` at the edge; raise a one-line SpecError on failure."""
    try:
        return cls.model_validate(dict(data))
    except ValidationError as err:
        raise one_line(err, where) from None

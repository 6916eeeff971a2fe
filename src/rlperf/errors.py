"""User-facing errors.

Every mistake a user can make (bad field, unknown name, infeasible plan) becomes a
``SpecError``: a ``ValueError`` whose message is one line naming the field and what is
allowed. The CLI prints that line and exits 2, never a traceback. Internal invariants are
plain ``assert``s.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError


class SpecError(ValueError):
    """A bad input, explained in one line (``[source:]field: problem; allowed: ...``).

    ``source`` is the file the value came from (set by :meth:`in_source` where the file is known).
    """

    def __init__(self, field: str, problem: str, allowed: str | None = None, source: str | None = None) -> None:
        self.field = field
        self.problem = _one(problem)
        self.allowed = _one(allowed) if allowed else None
        self.source = source
        msg = f"{field}: {self.problem}"
        if source:
            msg = f"{source}:{msg}"
        if self.allowed:
            msg += f"; allowed: {self.allowed}"
        super().__init__(msg)

    def in_source(self, source: str | Path) -> SpecError:
        """This error attributed to the file ``source`` (unchanged if it already names one)."""
        if self.source:
            return self
        return SpecError(self.field, self.problem, self.allowed, show_path(source))


def _one(text: str) -> str:
    """Text folded to one line (a message must never spill over several)."""
    return " ".join(str(text).split())


def show_path(path: str | Path, limit: int = 120) -> str:
    """A path as shown in a message: at most ``limit`` characters (the middle elided)."""
    s = str(path)
    if len(s) <= limit:
        return s
    half = (limit - 3) // 2
    return s[:half] + "..." + s[-half:]


def unknown_name(field: str, name: str, known: Iterable[str]) -> SpecError:
    """An unknown catalog name, with the closest known names as suggestions."""
    known_list = sorted(known)
    close = difflib.get_close_matches(name, known_list, n=3, cutoff=0.4)
    if not close:
        lowered = name.lower()
        close = [k for k in known_list if lowered in k.lower()][:3]
    hint = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(known_list[:12])}"
    return SpecError(field, f"unknown name {_short(name, 80)}; {hint}")


def _loc(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) if loc else "<root>"


def one_line(err: ValidationError, prefix: str = "") -> SpecError:
    """Turn pydantic's multi-line ValidationError into a one-line SpecError (first error)."""
    first = err.errors()[0]
    field = _loc(tuple(first.get("loc", ())))
    if prefix:
        field = f"{prefix}.{field}" if field != "<root>" else prefix
    problem = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    ctx = first.get("ctx") or {}
    cause = ctx.get("error")
    if isinstance(cause, SpecError):  # raised by a model validator: it names the field inside its model
        loc = _loc(tuple(first.get("loc", ())))
        parts = [p for p in (prefix, "" if loc == "<root>" else loc, cause.field) if p]
        return SpecError(".".join(parts), cause.problem, cause.allowed)
    allowed = None
    if "expected" in ctx:
        allowed = str(ctx["expected"])
    elif any(k in ctx for k in ("gt", "ge", "lt", "le")):
        lo = f"> {ctx['gt']}" if "gt" in ctx else (f">= {ctx['ge']}" if "ge" in ctx else "")
        hi = f"< {ctx['lt']}" if "lt" in ctx else (f"<= {ctx['le']}" if "le" in ctx else "")
        allowed = " and ".join(x for x in (lo, hi) if x)
    if "input" in first and not isinstance(first["input"], (dict, list)):
        problem = f"{problem} (got {_short(first['input'])})"
    extra = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return SpecError(field, problem + extra, allowed)


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


M = TypeVar("M", bound=BaseModel)


def parse(cls: type[M], data: Mapping[str, Any], where: str = "") -> M:
    """Validate ``data`` into ``cls`` at the edge; raise a one-line SpecError on failure."""
    from rlperf.inputs.booleans import boolean_for_number

    flagged = boolean_for_number(cls, data)
    if flagged is not None:
        raise SpecError(f"{where}.{flagged}" if where else flagged, "true/false given for a number", "a number")
    try:
        return cls.model_validate(dict(data))
    except ValidationError as err:
        raise one_line(err, where) from None

"""Machine code for the simulator's few scalar loops (numba, a pinned dependency).

:func:`jit` compiles a function on its first call and caches the machine code on disk next to
its module (the first run of a fresh install pays the compile, ~10 CPU-s for the rollout loop;
later processes load it; where no cache directory is writable, every process compiles). Without numba the function runs as plain Python, to the same result
(slower): the core imports without compiled extras.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency
    numba = None  # type: ignore[assignment]

F = TypeVar("F", bound=Callable[..., object])

COMPILED = numba is not None


def jit(f: F) -> F:
    """``f`` compiled on first call (integer division and modulo keep Python's semantics;
    float operations are IEEE, in source order, without fast-math)."""
    if numba is None:  # pragma: no cover
        return f
    try:
        return cast(F, numba.njit(cache=True, nogil=True, error_model="numpy")(f))
    except RuntimeError:  # pragma: no cover - no writable place for the cache: compile in every process
        return cast(F, numba.njit(nogil=True, error_model="numpy")(f))

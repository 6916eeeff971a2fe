"""Machine code for the simulator's few scalar loops: compiled at install, else by numba at run time.

A loop is a plain Python function on int64 / float64 arrays, marked :func:`loop` with its
numba signature (an entry point the simulator calls) or :func:`helper` (called only from
loops). Where its machine code comes from is decided once per process (:func:`implementation`):

1. ``aot``: the extension ``rlperf.stages._loops``, which ``setup.py`` compiles ahead of time
   with numba's ``pycc`` when the package is installed. It imports in milliseconds and needs
   no numba at run time: a planner question saves the 0.4 CPU-s of importing numba and the 0.3
   of loading its cached code (bench/bench_plan_questions.py). It is used only if it was built
   from the loops' current source (:func:`source_digest`, compared at first use): an edited
   loop falls back to 2 until the package is installed again (an install without the sources
   has nothing to compare: the extension is used).
2. ``jit``: numba compiles each loop on its first call and caches the machine code on disk next
   to its module (the first run pays the compile, ~10 CPU-s for the rollout loop; where no
   cache directory is writable, every process compiles). The extension missing or stale.
3. ``python``: plain Python, the same results, slower (numba missing).

``RLPERF_LOOPS`` (``aot``, ``jit`` or ``python``) asks for one; ``aot`` fails when the
extension is missing or stale. The three give the same results bit for bit: integer division
and modulo keep Python's semantics, float operations are IEEE in source order (no fast-math),
and tests/test_rollout_kernel.py and tests/test_stage_arrays.py compare the loops with the
Python definitions. ``setup.py`` imports this module with ``RLPERF_LOOPS=build``: loops stay
Python functions for ``pycc`` to export, helpers become numba functions it compiles with them.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar, cast

F = TypeVar("F", bound=Callable[..., object])

# The modules the extension is compiled from, in this directory, in digest order (setup.py
# exports every loop they mark).
LOOP_SOURCES = ("request_status.py", "packing_kernel.py", "rollout_loop.py")

# The implementations RLPERF_LOOPS may ask for ("build": setup.py's, not a user's).
_CHOICES = ("aot", "jit", "python", "build")

# Every loop's numba signature by name (names are the extension's exports: unique).
SIGNATURES: dict[str, str] = {}

_chosen: tuple[str, ModuleType | None] | None = None


def source_digest() -> int | None:
    """The first 60 bits of the SHA-256 of :data:`LOOP_SOURCES`' bytes, end to end (an int64
    the extension returns from its ``digest()`` when built from the same files); None where a
    source is not installed (byte code only: no source to be stale against)."""
    here = Path(__file__).parent
    h = hashlib.sha256()
    try:
        for name in LOOP_SOURCES:
            h.update((here / name).read_bytes())
    except OSError:
        return None
    return int(h.hexdigest()[:15], 16)


def implementation() -> str:
    """``aot``, ``jit``, ``python`` (or ``build`` inside setup.py): where the loops' code comes
    from in this process (module docstring)."""
    return _choose()[0]


def _choose() -> tuple[str, ModuleType | None]:
    """The implementation and its module (the extension or numba), decided on first use."""
    global _chosen
    if _chosen is None:
        _chosen = _decide(os.environ.get("RLPERF_LOOPS", ""))
    return _chosen


def _decide(wanted: str) -> tuple[str, ModuleType | None]:
    if wanted and wanted not in _CHOICES:
        raise RuntimeError(f"RLPERF_LOOPS={wanted!r}: allowed values are aot, jit, python")
    if wanted in ("", "aot"):
        ext = _extension()
        if ext is not None:
            return "aot", ext
        if wanted == "aot":
            raise RuntimeError("RLPERF_LOOPS=aot: the compiled loops (rlperf.stages._loops) are missing or were "
                               "built from other sources; install the package again (pip install -e .)")
    if wanted != "python":
        try:
            import numba
        except ImportError:  # pragma: no cover - numba is a dependency
            return "python", None
        return wanted or "jit", numba
    return "python", None


def _extension() -> ModuleType | None:
    """The extension when it is installed and was built from the current sources."""
    try:
        ext = importlib.import_module("rlperf.stages._loops")
    except ImportError:
        return None
    current = source_digest()
    return ext if current is None or ext.digest() == current else None


def loop(signature: str) -> Callable[[F], F]:
    """Mark an entry point compiled with ``signature`` (numba's notation; array arguments of any
    layout: ``i8[:]``, ``f8[:, :]``). Returns the extension's function, numba's, or ``f``."""

    def mark(f: F) -> F:
        name = f.__name__
        if name in SIGNATURES:
            raise ValueError(f"loop {name!r} is marked twice (the extension's exports need unique names)")
        SIGNATURES[name] = signature
        kind, module = _choose()
        if kind == "aot":
            assert module is not None
            return cast(F, getattr(module, name))
        if kind == "jit":
            return _numba_jit(module, f, cache=True)
        return f

    return mark


def helper(f: F) -> F:
    """Mark a function called only from loops: numba's (its code is compiled into theirs), or
    ``f`` where the loops are the extension's or plain Python."""
    kind, module = _choose()
    # setup.py's build compiles the helpers into the extension: no disk cache of their own
    return _numba_jit(module, f, cache=kind == "jit") if kind in ("jit", "build") else f


def _numba_jit(numba: ModuleType | None, f: F, cache: bool) -> F:
    assert numba is not None
    if not cache:
        return cast(F, numba.njit(nogil=True, error_model="numpy")(f))
    try:
        return cast(F, numba.njit(cache=True, nogil=True, error_model="numpy")(f))
    except RuntimeError:  # pragma: no cover - no writable place for the cache: compile in every process
        return cast(F, numba.njit(nogil=True, error_model="numpy")(f))


def compiled() -> bool:
    """True when the loops run as machine code (the extension or numba)."""
    return implementation() in ("aot", "jit")

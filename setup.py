"""Build the simulator's loops ahead of time: the extension ``rlperf.stages._loops``.

The metadata lives in pyproject.toml; this file adds one extension module, compiled by numba's
``pycc`` from the loops that :mod:`rlperf.stages.jit` marks in its ``LOOP_SOURCES``, each with
its signature, plus ``digest()``, the digest of those sources it was built from (the run time
uses the extension only when they still match). Why: importing numba and loading its cached
code costs 0.7 CPU-s per process, a quarter of a planner question (docs/benchmarks.md).

The loops' modules import nothing of rlperf but ``jit`` and ``request_status``, so they load
here without rlperf's dependencies: ``rlperf`` and ``rlperf.stages`` are bare packages over
src/ (their ``__init__`` does not run). Should the build fail (no C compiler, numba missing
with ``--no-build-isolation``), the install goes on without the extension and numba compiles
the loops at run time (the same results).
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

SRC = Path(__file__).parent / "src"


def loops_extension() -> Any:
    """pycc's extension for every marked loop, or None (numba missing)."""
    import importlib

    try:
        CC: Any = importlib.import_module("numba.pycc").CC  # untyped: Any
    except ImportError:
        print("rlperf: numba is not installed here; the loops are compiled at run time", file=sys.stderr)
        return None
    for name in ("rlperf", "rlperf.stages"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(SRC.joinpath(*name.split(".")))]
            sys.modules[name] = package
    os.environ["RLPERF_LOOPS"] = "build"
    jit = importlib.import_module("rlperf.stages.jit")
    modules = [importlib.import_module(f"rlperf.stages.{f.removesuffix('.py')}") for f in jit.LOOP_SOURCES]
    cc = CC("_loops", source_module=modules[-1])
    cc.verbose = False
    # pycc's default target: generic code for the build's architecture, so a wheel built here
    # runs on any CPU of it. Code for the host CPU measured the same (bench/bench_rollout_calls.py:
    # 1.32-1.49 against 1.27-1.40 CPU-s, the same results digest): the loops are branches,
    # heaps and integer bookkeeping, not wide arithmetic.
    exported = 0
    for module in modules:
        for name, signature in jit.SIGNATURES.items():
            f = getattr(module, name, None)
            if f is not None and getattr(f, "__module__", None) == module.__name__:
                cc.export(name, signature)(f)
                exported += 1
    assert exported == len(jit.SIGNATURES), (exported, sorted(jit.SIGNATURES))
    digest = jit.source_digest()
    assert digest is not None, "the loops' sources are needed to build them"
    namespace: dict[str, Any] = {}
    exec(f"def digest():\n    return {digest}\n", namespace)  # a constant, compiled in
    cc.export("digest", "i8()")(namespace["digest"])
    return cc.distutils_extension()


def tolerant(base: type[build_ext]) -> type[build_ext]:
    """``base`` that warns instead of failing when the extension does not build."""

    class TolerantBuildExt(base):  # type: ignore[misc]
        def build_extension(self, ext: Any) -> None:
            try:
                super().build_extension(ext)
            except Exception as e:  # any failure: the loops fall back to numba
                print(f"rlperf: the compiled loops were not built ({type(e).__name__}: {e}); "
                      "numba compiles them at run time", file=sys.stderr)

    return TolerantBuildExt


ext = loops_extension()
# pycc's extension replaces setuptools' build_ext with its own (which compiles the LLVM code
# first): read it after loops_extension().
import setuptools.command.build_ext as _build_ext_module  # noqa: E402

setup(
    ext_modules=[ext] if ext is not None else [],
    cmdclass={"build_ext": tolerant(_build_ext_module.build_ext)} if ext is not None else {},
)

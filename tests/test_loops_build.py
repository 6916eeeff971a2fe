"""The loops compiled at install (setup.py, rlperf.stages.jit): used when current, never stale.

The results of the loops are compared with the Python definitions elsewhere
(tests/test_rollout_kernel.py, tests/test_stage_arrays.py), with whichever implementation this
process uses; these tests check which one that is and how it is chosen."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest

from rlperf.stages import jit, packing_kernel, rollout_loop


def test_the_installed_package_runs_the_loops_compiled_at_install() -> None:
    """The README's install builds the extension from the current sources; a build that failed
    quietly (the install goes on without it) or a stale one would cost every process numba's
    import and cache load (0.7 CPU-s), so the suite fails on it."""
    ext = importlib.import_module("rlperf.stages._loops")
    assert ext.digest() == jit.source_digest()
    assert jit.implementation() == "aot"
    assert set(jit.SIGNATURES) == {"balance", "first_fit", "plan_to_idle_loop", "running_sums", "envelope_sums"}
    assert all(getattr(ext, name) is getattr(module, name) for module in (packing_kernel, rollout_loop)
               for name in jit.SIGNATURES if hasattr(module, name))


def test_a_stale_extension_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sources edited after the build: numba's run-time compile instead (or an error when the
    extension is asked for by name)."""
    monkeypatch.setattr(jit, "source_digest", lambda: -1)
    assert jit._decide("")[0] == "jit"
    with pytest.raises(RuntimeError, match=r"RLPERF_LOOPS=aot: .* install the package again"):
        jit._decide("aot")


def test_an_install_without_the_loops_sources_uses_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte code only: nothing to be stale against, and nothing numba could compile better."""
    monkeypatch.setattr(jit, "source_digest", lambda: None)
    assert jit._decide("")[0] == "aot"


def test_the_implementation_can_be_asked_for_and_a_wrong_name_says_what_is_allowed() -> None:
    assert jit._decide("python") == ("python", None)
    assert jit._decide("jit")[0] == "jit"
    with pytest.raises(RuntimeError, match=r"^RLPERF_LOOPS='fast': allowed values are aot, jit, python$"):
        jit._decide("fast")


def test_a_loop_name_is_marked_once() -> None:
    with pytest.raises(ValueError, match="'balance' is marked twice"):
        jit.loop("i8(i8)")(_named("balance"))


def _named(name: str) -> Callable[[], None]:
    def f() -> None: ...

    f.__name__ = name
    return f

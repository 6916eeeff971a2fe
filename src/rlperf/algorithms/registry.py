"""A registry of algorithms that rejects duplicates (one extension point, no magic)."""

from __future__ import annotations

from collections.abc import Callable

from rlperf.algorithms.spec import AlgorithmSpec
from rlperf.errors import SpecError, unknown_name

_REGISTRY: dict[str, AlgorithmSpec] = {}


def register_algorithm(build: Callable[[], AlgorithmSpec]) -> Callable[[], AlgorithmSpec]:
    spec = build()
    key = spec.name.lower()
    if key in _REGISTRY:
        raise SpecError("algorithm", f"{spec.name!r} is already registered")
    _REGISTRY[key] = spec
    return build


def _ensure_loaded() -> None:
    if not _REGISTRY:
        import rlperf.algorithms.catalog  # noqa: F401  (registers the built-in algorithms)


def get_algorithm(name: str) -> AlgorithmSpec:
    _ensure_loaded()
    key = name.lower().replace("_", "-")
    aliases = {"dr-grpo": "dr.grpo", "drgrpo": "dr.grpo", "reinforce++": "reinforce++", "rf++": "reinforce++"}
    key = aliases.get(key, key)
    if key not in _REGISTRY:
        raise unknown_name("algorithm", name, [s.name for s in _REGISTRY.values()])
    return _REGISTRY[key]


def list_algorithms() -> list[AlgorithmSpec]:
    _ensure_loaded()
    return list(_REGISTRY.values())

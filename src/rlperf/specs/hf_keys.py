"""Reading typed values out of a Hugging Face ``config.json`` dict.

Every problem is a one-line ``SpecError`` naming the config key (``model.config.<key>``).
"""

from __future__ import annotations

from typing import Any

from rlperf.errors import SpecError


def where(key: str) -> str:
    return f"model.config.{key}"


def req(cfg: dict[str, Any], key: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise SpecError(where(key), "missing from config.json")
    return cfg[key]


def as_int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(where(key), f"must be an integer, got {value!r}")
    if value < minimum:
        raise SpecError(where(key), f"must be >= {minimum}, got {value}")
    return value


def pos(cfg: dict[str, Any], key: str) -> int:
    """A required integer >= 1."""
    return as_int(key, req(cfg, key), 1)


def opt(cfg: dict[str, Any], key: str, default: int, minimum: int = 1) -> int:
    """An optional integer (absent or null -> ``default``)."""
    value = cfg.get(key)
    return default if value is None else as_int(key, value, minimum)


def flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    value = cfg.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SpecError(where(key), f"must be true or false, got {value!r}")
    return value



def fraction(cfg: dict[str, Any], key: str, default: float) -> float:
    """An optional number in (0, 1]."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise SpecError(where(key), f"must be a number in (0, 1], got {value!r}")
    return float(value)


def text(cfg: dict[str, Any], key: str, default: str) -> str:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, str) or not value:
        raise SpecError(where(key), f"must be a non-empty string, got {value!r}")
    return value

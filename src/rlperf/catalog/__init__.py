"""The model catalog: published Hugging Face ``config.json`` files shipped with the package.

``load_model`` accepts a catalog name (any case, with or without an ``org/`` prefix, or an alias
with the same shapes, e.g. ``DeepSeek-V3`` or ``Qwen/Qwen2.5-7B-Instruct``), a path to a
``config.json``, or a folder that holds one. Catalog specs are parsed once and cached.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from rlperf.errors import SpecError, show_path, unknown_name
from rlperf.specs.model import ModelSpec

MODELS_DIR = Path(__file__).parent / "models"

# Other published checkpoints with the same tensor shapes as a catalog entry (name -> entry).
ALIASES: dict[str, str] = {
    "DeepSeek-V3": "DeepSeek-R1",
    "DeepSeek-V3-0324": "DeepSeek-R1",
    "DeepSeek-V3-Base": "DeepSeek-R1",
    "DeepSeek-R1-0528": "DeepSeek-R1",
    "DeepSeek-R1-Zero": "DeepSeek-R1",
    "Meta-Llama-3.1-8B": "Llama-3.1-8B",
    "Meta-Llama-3.1-70B": "Llama-3.1-70B",
    "Meta-Llama-3.1-405B": "Llama-3.1-405B",
    "Mixtral-8x7B": "Mixtral-8x7B-v0.1",
    "Mixtral-8x7B-Instruct-v0.1": "Mixtral-8x7B-v0.1",
    "Qwen2.5-Math-7B-Instruct": "Qwen2.5-Math-7B",
    "Meta-Llama-3-8B": "Llama-3-8B",
    "Meta-Llama-3-70B": "Llama-3-70B",
    "deepseek-llm-7b-chat": "deepseek-llm-7b-base",
    "Qwen3-4B-Thinking-2507": "Qwen3-4B",
    "Qwen3-4B-Instruct-2507": "Qwen3-4B",
    "Qwen3-30B-A3B-Thinking-2507": "Qwen3-30B-A3B",
    "Qwen3-30B-A3B-Instruct-2507": "Qwen3-30B-A3B",
    "Qwen3-235B-A22B-Thinking-2507": "Qwen3-235B-A22B",
    "Qwen3-235B-A22B-Instruct-2507": "Qwen3-235B-A22B",
    "FsfairX-LLaMA3-RM-v0.1": "Llama-3-8B",
}
# Aliases whose config.json declares another context than their entry's (same shapes): the
# Qwen3 2507 releases position 262,144 tokens natively (their model cards: "Context Length:
# 262,144 natively"; config.json max_position_embeddings 262144), their base entries 40,960. The Qwen2.5
# Instruct releases of 1.5B and up ship max_position_embeddings 32768 with rope_scaling null
# (their model cards: "The current config.json is set for context length up to 32,768 tokens",
# YaRN to be added by hand beyond it), where the base checkpoints of those sizes declare 131,072.
ALIAS_POSITIONS: dict[str, int] = {
    "qwen3-4b-thinking-2507": 262_144,
    "qwen3-4b-instruct-2507": 262_144,
    "qwen3-30b-a3b-thinking-2507": 262_144,
    "qwen3-30b-a3b-instruct-2507": 262_144,
    "qwen3-235b-a22b-thinking-2507": 262_144,
    "qwen3-235b-a22b-instruct-2507": 262_144,
    "qwen2.5-1.5b-instruct": 32_768,
    "qwen2.5-7b-instruct": 32_768,
    "qwen2.5-14b-instruct": 32_768,
    "qwen2.5-32b-instruct": 32_768,
    "qwen2.5-72b-instruct": 32_768,
}
# Instruction-tuned, chat and base releases share shapes with the entry they are named after
# (Gemma names its instruction-tuned releases ``-it``, e.g. google/gemma-2-2b-it, which verl's
# examples train).
_VARIANT_SUFFIXES = ("-instruct", "-base", "-chat", "-it")


def list_models() -> list[str]:
    """Names of the catalog entries, sorted case-insensitively."""
    return sorted((p.stem for p in MODELS_DIR.glob("*.json")), key=str.lower)


def aliases_of(name: str) -> list[str]:
    """Aliases that resolve to the catalog entry ``name``."""
    return sorted(alias for alias, target in ALIASES.items() if target == name)


def resolve_name(name: str) -> str:
    """The catalog entry a name refers to; raises ``SpecError`` with suggestions if none."""
    entries = {n.lower(): n for n in list_models()}
    aliases = {a.lower(): t for a, t in ALIASES.items()}
    key = name.strip().rsplit("/", 1)[-1].lower()
    candidates = [key] + [key[: -len(s)] for s in _VARIANT_SUFFIXES if key.endswith(s)]
    for cand in candidates:
        if cand in entries:
            return entries[cand]
        if cand in aliases:
            return aliases[cand]
    raise unknown_name("model", name, list(entries.values()) + list(ALIASES))


def load_config(name: str) -> dict[str, Any]:
    """The published ``config.json`` of a catalog entry, as a fresh dict."""
    path = MODELS_DIR / f"{resolve_name(name)}.json"
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def load_model(name_or_path: str | Path) -> ModelSpec:
    """A ``ModelSpec`` from a catalog name or alias, a ``config.json`` path, or a folder."""
    text = str(name_or_path)
    path = Path(text).expanduser()
    try:
        is_file, is_dir = path.is_file() or (path / "config.json").is_file(), path.is_dir()
    except OSError:  # e.g. a name too long to be a path: not a file, so a catalog name
        is_file = is_dir = False
    if is_file:
        return ModelSpec.from_path(path)  # read each time: the file may have changed
    if isinstance(name_or_path, Path) or text.endswith(".json") or is_dir:
        raise SpecError("model", f"no config.json at {show_path(text)!r}")
    spec = _load_entry(resolve_name(text))
    positions = ALIAS_POSITIONS.get(text.strip().rsplit("/", 1)[-1].lower())
    return spec if positions is None else spec.model_copy(update={"max_position_embeddings": positions})


def model_ref_near(ref: str, base: Path) -> str:
    """``ref`` as written in a file in folder ``base``: a relative ``config.json`` path (or its
    folder) is read relative to ``base``, like any path in that file; names and other paths are
    left as they are."""
    path = Path(ref).expanduser()
    if path.is_absolute() or path.exists():
        return ref
    near = base / path
    if near.is_file() or (near / "config.json").is_file():
        return str(near)
    return ref


@cache
def _load_entry(entry: str) -> ModelSpec:
    return ModelSpec.from_hf_config(load_config(entry), name=entry)


__all__ = [
    "ALIASES",
    "MODELS_DIR",
    "aliases_of",
    "list_models",
    "load_config",
    "load_model",
    "model_ref_near",
    "resolve_name",
]

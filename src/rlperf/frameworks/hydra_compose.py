"""Hydra's ``defaults:`` list, composed the way Hydra composes it (Hydra docs, "The Defaults List").

verl's trainer configs are built from pieces: ``ppo_trainer.yaml`` lists
``actor@actor_rollout_ref.actor: dp_actor``, ``dp_actor.yaml`` lists ``../optim@optim: fsdp``
and ``actor``, and so on. For each entry of a file's ``defaults:`` list, in order:

- ``group@package: name`` loads ``<dir of the file>/<group>/<name>.yaml`` at ``package``,
  relative to the file's own package (``_global_`` is the root); without ``@package`` the
  package is the group's path (``a/b`` -> ``a.b``). A null option loads nothing.
- a plain string ``name`` (or ``name@package``) loads ``<dir>/<name>.yaml`` at the file's own
  package (or at ``package``).
- ``_self_`` is the file's own content; where the list does not name it, it comes last (the
  file overrides what it lists). ``override`` and ``optional`` prefixes are dropped.

A later piece is merged over an earlier one (mappings merge key by key, anything else
replaces). A file not found next to the including file is looked up in the
``hydra.searchpath`` folders (``file://a/b`` relative to any folder above the file).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlperf.errors import SpecError
from rlperf.frameworks.config_tree import load_yaml_tree

_DEPTH_LIMIT = 16


_FILES_LIMIT = 1_000  # files composed for one configuration (verl's own: ~20)


class _Budget:
    """Files left to compose: a defaults list that fans out (each file including the next one
    several times) would otherwise compose exponentially many files before the depth limit."""

    def __init__(self, files: int) -> None:
        self.left = files

    def spend(self, path: Path) -> None:
        self.left -= 1
        if self.left < 0:
            raise SpecError("defaults", f"{path}: composing more than {_FILES_LIMIT:,} files (defaults that fan out?)",
                            f"at most {_FILES_LIMIT:,} composed files")


def compose(path: str | Path) -> dict[str, Any]:
    """The configuration tree of a YAML file with its ``defaults:`` list composed."""
    p = Path(path)
    return _compose(p, load_yaml_tree(p), _searchpath(p, load_yaml_tree(p)), 0, _Budget(_FILES_LIMIT))


def _compose(path: Path, tree: Mapping[str, Any], search: list[Path], depth: int, budget: _Budget) -> dict[str, Any]:
    if depth > _DEPTH_LIMIT:
        raise SpecError("defaults", f"{path}: defaults nested deeper than {_DEPTH_LIMIT} (a cycle?)")
    budget.spend(path)
    own = {k: v for k, v in tree.items() if k not in ("defaults", "hydra")}
    entries = tree.get("defaults") or []
    if not isinstance(entries, list):
        raise SpecError("defaults", f"{path}: the defaults list must be a list")
    if "_self_" not in entries:
        entries = [*entries, "_self_"]
    out: dict[str, Any] = {}
    for entry in entries:
        if entry == "_self_":
            _merge(out, own)
            continue
        piece = _entry(path, entry, search)
        if piece is None:
            continue
        file, package = piece
        composed = _compose(file, load_yaml_tree(file), search, depth + 1, budget)
        _merge(out, _at(package, composed))
    return out


def _entry(path: Path, entry: Any, search: list[Path]) -> tuple[Path, str] | None:
    """The file an entry names and the package (relative to the including file's) it goes to."""
    if isinstance(entry, str):
        name, _, package = entry.partition("@")
        return _find(path.parent, name, search), package
    if not isinstance(entry, Mapping) or len(entry) != 1:
        raise SpecError("defaults", f"{path}: entry {entry!r} is not 'name' or 'group: option'")
    (key, option), = entry.items()
    if option is None:
        return None
    group, _, package = str(key).replace("override ", "").replace("optional ", "").strip().partition("@")
    if not package:
        package = group.strip("./").replace("/", ".")
    return _find(path.parent / group, str(option), search, group), package


def _find(folder: Path, name: str, search: list[Path], group: str = "") -> Path:
    file = name if name.endswith(".yaml") else f"{name}.yaml"
    candidates = [folder / file] + [root / group / file for root in search]
    for c in candidates:
        if c.is_file():
            return c
    raise SpecError("defaults", f"no config {file!r} for the defaults list (looked in {', '.join(str(c.parent) for c in candidates)})")


def _searchpath(path: Path, tree: Mapping[str, Any]) -> list[Path]:
    """``hydra.searchpath`` folders, each tried relative to every folder above ``path``."""
    hydra = tree.get("hydra") or {}
    entries = hydra.get("searchpath") or [] if isinstance(hydra, Mapping) else []
    out: list[Path] = []
    for entry in entries:
        rel = str(entry).removeprefix("file://").removeprefix("pkg://").replace(".", "/") if str(entry).startswith("pkg://") else str(entry).removeprefix("file://")
        out.extend(parent / rel for parent in path.resolve().parents if (parent / rel).is_dir())
    return out


def _at(package: str, tree: dict[str, Any]) -> dict[str, Any]:
    if package in ("", "_global_"):
        return tree
    for part in reversed(package.removeprefix("_global_.").split(".")):
        tree = {part: tree}
    return tree


def _merge(into: dict[str, Any], other: Mapping[str, Any]) -> None:
    for key, value in other.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = dict(value) if isinstance(value, Mapping) else value

"""Hierarchical configurations as flat dotted keys: loading, Hydra-style overrides, interpolation.

verl is configured with Hydra/OmegaConf: a YAML tree plus command-line overrides
``a.b.c=value`` (``+a.b=value`` adds a key, ``++a.b=value`` adds or replaces, ``~a.b`` deletes).
Values may refer to other keys: ``${a.b}``, ``${oc.select:a.b,default}`` and the relative
``${.sibling}``. This module flattens the tree to ``{"a.b.c": leaf}`` so every key can be
accounted for, applies overrides in order, and resolves those three interpolation forms (other
resolvers are left as written and the reader that needs the value reports it).

:class:`KeyReader` hands values to an importer and remembers which keys it read, so the keys it
never read can be listed as ignored, unsupported or unknown.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any


from rlperf.errors import SpecError
from rlperf.frameworks.report import KeyNote, Recorder, fmt_value

_REF = re.compile(r"\$\{([^${}]+)\}")


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted leaves of a nested mapping; an empty mapping is a leaf (``{}``)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def load_yaml_tree(path: str | Path) -> dict[str, Any]:
    from rlperf.errors import show_path
    from rlperf.inputs import load_yaml

    data = load_yaml(path, "config")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError("<root>", f"the document is a {type(data).__name__}", "a mapping", show_path(path))
    return data


def parse_value(text: str) -> Any:
    """A Hydra override value: YAML scalars and flow collections; anything else stays a string."""
    from rlperf.inputs import parse_yaml

    try:
        return parse_yaml(text, "override") if text.strip() else ""
    except SpecError:
        return text


def apply_overrides(flat: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """``flat`` with Hydra-style overrides applied in order."""
    out = dict(flat)
    for raw in overrides:
        item = raw.strip()
        if not item:
            continue
        if item.startswith("~"):
            key = item[1:].split("=", 1)[0]
            out = {k: v for k, v in out.items() if k != key and not k.startswith(key + ".")}
            continue
        if "=" not in item:
            raise SpecError("overrides", f"{raw!r} is not key=value", "key=value, +key=value, ++key=value, ~key")
        key, text = item.split("=", 1)
        key = key.lstrip("+")
        value = parse_value(text)
        old = out.get(key)
        if isinstance(value, Mapping) and value and isinstance(old, (bool, int, float, str)) and old != "":
            # A mapping for a number or a name: the value would vanish into sub-keys nobody reads.
            raise SpecError(key, f"a mapping {text!r} given for a single value (the config has {old!r})", "a value")
        inside = [k for k in out if k.startswith(key + ".")]
        if inside and not (isinstance(value, Mapping) and value):
            # Hydra refuses a value for a section; dropping its keys would fall back to defaults
            raise SpecError(key, f"a single value {text!r} given for a section of {len(inside)} keys",
                            f"{key}.<name>=value (a config-group choice such as critic=megatron_critic is not read)")
        out = {k: v for k, v in out.items() if not k.startswith(key + ".")}
        if isinstance(value, Mapping) and value:
            out.pop(key, None)
            out.update(flatten(value, key + "."))
        else:
            out[key] = value
    return out


def resolve_interpolations(flat: dict[str, Any]) -> dict[str, Any]:
    """Resolve ``${key}``, ``${oc.select:key,default}`` and ``${.sibling}`` (to a fixed point)."""
    out = dict(flat)
    for _ in range(16):  # chains of references are short; the bound stops cycles
        changed = False
        for key, value in out.items():
            if isinstance(value, str) and "${" in value:
                new = _substitute(key, value, out)
                if new != value:
                    out[key] = new
                    changed = True
        if not changed:
            break
    return out


def _lookup(here: str, ref: str, flat: Mapping[str, Any]) -> tuple[bool, Any]:
    if ref.startswith("."):
        parent = here.rsplit(".", 1)[0] if "." in here else ""
        ref = f"{parent}.{ref[1:]}" if parent else ref[1:]
    if ref in flat:
        return True, flat[ref]
    subtree = {k[len(ref) + 1 :]: v for k, v in flat.items() if k.startswith(ref + ".")}
    return (True, subtree) if subtree else (False, None)


def _resolve_one(here: str, expr: str, flat: Mapping[str, Any]) -> tuple[bool, Any]:
    if expr.startswith("oc.select:"):
        ref, _, default = expr[len("oc.select:") :].partition(",")
        found, value = _lookup(here, ref.strip(), flat)
        return (True, value) if found else (True, parse_value(default.strip()) if default else None)
    if ":" in expr:  # other resolvers (oc.env, eval, ...) are not evaluated
        return False, None
    return _lookup(here, expr.strip(), flat)


def _substitute(here: str, value: str, flat: Mapping[str, Any]) -> Any:
    whole = _REF.fullmatch(value)
    if whole:
        found, resolved = _resolve_one(here, whole.group(1), flat)
        if found and not (isinstance(resolved, str) and "${" in resolved):
            return resolved
        return value

    def repl(m: re.Match[str]) -> str:
        found, resolved = _resolve_one(here, m.group(1), flat)
        return fmt_value(resolved) if found and not isinstance(resolved, dict) else m.group(0)

    return _REF.sub(repl, value)


class KeyReader:
    """Reads keys for an importer; remembers what was read and which defaults were used."""

    def __init__(self, flat: dict[str, Any], rec: Recorder) -> None:
        self.flat = flat
        self.rec = rec
        self.read: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.flat

    def has_prefix(self, prefix: str) -> bool:
        return any(k == prefix or k.startswith(prefix + ".") for k in self.flat)

    def get(self, key: str, default: Any, note: str = "") -> Any:
        """The value of ``key``, or ``default`` (recorded as defaulted when not None)."""
        if key in self.flat:
            self.read.add(key)
            return self.flat[key]
        if default is not None:
            self.rec.default(key, default, note)
        return default

    def first(self, keys: Sequence[str], default: Any, note: str = "") -> tuple[str, Any]:
        """The first of ``keys`` present (for renamed keys), else ``default`` under ``keys[0]``."""
        for key in keys:
            if key in self.flat:
                self.read.add(key)
                return key, self.flat[key]
        if default is not None:
            self.rec.default(keys[0], default, note)
        return keys[0], default

    def touch(self, key: str) -> None:
        if key in self.flat:
            self.read.add(key)


def classify_rest(
    reader: KeyReader,
    ignored: Sequence[tuple[str, str]],
    unsupported: Sequence[tuple[str, str, tuple[Any, ...]]],
    unused_prefixes: Mapping[str, str],
) -> tuple[list[KeyNote], list[KeyNote]]:
    """Sort the keys the importer did not read into ignored and unknown; unsupported keys go to
    the recorder. ``unsupported`` entries carry the values that are harmless (the framework's
    default, or a value rlperf models anyway): such keys count as ignored."""
    ignored_out: list[KeyNote] = []
    unknown_out: list[KeyNote] = []
    for key in sorted(reader.flat):
        if key in reader.read or key in reader.rec.unsupported:
            continue
        value = reader.flat[key]
        shown = fmt_value(value)
        prefix_note = next((n for p, n in unused_prefixes.items() if key.startswith(p)), None)
        if prefix_note is not None:
            ignored_out.append(KeyNote(key, shown, prefix_note))
            continue
        hit = next((u for u in unsupported if fnmatch.fnmatchcase(key, u[0])), None)
        if hit is not None:
            if _harmless(value, hit[2]):
                ignored_out.append(KeyNote(key, shown, "at a value rlperf models as is"))
            else:
                reader.rec.unsupported_key(key, value, hit[1])
            continue
        note = next((n for pat, n in ignored if fnmatch.fnmatchcase(key, pat)), None)
        if note is not None:
            ignored_out.append(KeyNote(key, shown, note))
        else:
            unknown_out.append(KeyNote(key, shown))
    return ignored_out, unknown_out


def _harmless(value: Any, harmless: tuple[Any, ...]) -> bool:
    for h in harmless:
        if value == h or (isinstance(h, str) and str(value).lower() == h.lower()):
            return True
    return False

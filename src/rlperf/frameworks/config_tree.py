"""Hierarchical configurations as flat dotted keys: loading, Hydra-style overrides, interpolation.

verl is configured with Hydra/OmegaConf: a YAML tree plus command-line overrides
``a.b.c=value`` (``+a.b=value`` adds a key, ``++a.b=value`` adds or replaces, ``~a.b`` deletes).
Values may refer to other keys: ``${a.b}``, ``${oc.select:a.b,default}`` and the relative
``${.sibling}``; a key the configuration leaves out is looked up in the framework's defaults
(what its base YAML holds). ``${oc.env:NAME}`` and ``${oc.env:NAME,default}`` read an
environment variable as OmegaConf does (OmegaConf docs, "oc.env"): the variable's value when it
is set (the launch command's environment: ``--set`` and the script's exports, then this
process's), else the default (``str(default)``, ``null`` -> None); ``${oc.decode:text}`` parses
its text as a YAML scalar. This module flattens the tree to ``{"a.b.c": leaf}`` so every key
can be accounted for, applies overrides in order, and resolves those forms; a value that cannot
be resolved (an unset variable without a default, a key nobody sets, another resolver) is left
as written, and reading it is an error naming the key and why.

:class:`KeyReader` hands values to an importer and remembers which keys it read, so the keys it
never read can be listed as ignored, unsupported or unknown.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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


OVERRIDE_FORMS = "key=value, +key=value, ++key=value, ~key"


def check_override(raw: str, option: str = "overrides") -> None:
    """Refuse what is not a Hydra override (``OVERRIDE_FORMS``): no ``=``, or no key before it
    (``=5`` would set a key named ''). ``option`` is the name the user gave it under."""
    item = raw.strip()
    key = item[1:].split("=", 1)[0] if item.startswith("~") else item.split("=", 1)[0].lstrip("+")
    if not item.startswith("~") and "=" not in item:
        raise SpecError(option, f"{raw!r} is not key=value", OVERRIDE_FORMS)
    if not key.strip():
        raise SpecError(option, f"{raw!r} names no key", OVERRIDE_FORMS)


def apply_overrides(flat: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """``flat`` with Hydra-style overrides applied in order (an empty word, as ``""`` in a
    script, is none)."""
    out = dict(flat)
    for raw in overrides:
        item = raw.strip()
        if not item:
            continue
        check_override(raw)
        if item.startswith("~"):
            key = item[1:].split("=", 1)[0]
            out = {k: v for k, v in out.items() if k != key and not k.startswith(key + ".")}
            continue
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


@dataclass(frozen=True)
class Environment:
    """The environment ``${oc.env:NAME}`` reads: what the launch gives the trainer, then this
    process's (OmegaConf reads ``os.environ`` of the trainer's process)."""

    launch: Mapping[str, str] = field(default_factory=dict)
    """Variables the launch command sets: ``--set NAME=VALUE`` and a script's exports."""
    exported: frozenset[str] = frozenset()
    """The names of ``launch`` the script itself exports (the rest came from ``--set``)."""
    script_only: frozenset[str] = frozenset()
    """Variables the script sets without exporting them: the trainer does not see them."""
    process: Mapping[str, str] | None = None
    """This process's environment (None: ``os.environ``)."""
    unread: Mapping[str, str] = field(default_factory=dict)
    """``--set`` names the launch has not read yet -> why (a launch script's reading); an import
    whose config reads none of them through ``${oc.env:NAME}`` refuses them (they do nothing)."""

    def lookup(self, name: str) -> tuple[str | None, str]:
        """The variable's value (None when unset) and where it came from."""
        if name in self.launch:
            return self.launch[name], "exported by the script" if name in self.exported else "given with --set"
        process = os.environ if self.process is None else self.process
        if name in process:
            return process[name], "from this process's environment"
        return None, ""


@dataclass
class Resolution:
    """Resolved values, and what could not be resolved or came from the environment."""

    flat: dict[str, Any]
    unresolved: dict[str, str] = field(default_factory=dict)
    """key -> why its interpolation could not be resolved (an error when the key is read)."""
    env_reads: dict[str, str] = field(default_factory=dict)
    """``${oc.env:...}`` -> where its value came from (for the import's notes)."""
    env_names: set[str] = field(default_factory=set)
    """The variables ``${oc.env:NAME}`` read."""


def resolve_interpolations(
    flat: dict[str, Any], defaults: Mapping[str, Any] | None = None, env: Environment | None = None
) -> dict[str, Any]:
    """Resolve ``${key}``, ``${oc.select:key,default}``, ``${.sibling}``, ``${oc.env:...}`` and
    ``${oc.decode:...}`` (to a fixed point); see :func:`resolve`."""
    return resolve(flat, defaults, env).flat


def resolve(flat: dict[str, Any], defaults: Mapping[str, Any] | None = None, env: Environment | None = None) -> Resolution:
    """:func:`resolve_interpolations` with the reasons behind what stayed unresolved."""
    res = Resolution(dict(flat))
    scope = _Scope(res.flat, defaults or {}, env or Environment(), res)
    for _ in range(16):  # chains of references are short; the bound stops cycles
        changed = False
        for key, value in res.flat.items():
            if isinstance(value, str) and "${" in value:
                new = _substitute(key, value, scope)
                if new != value:
                    res.flat[key] = new
                    changed = True
        if not changed:
            break
    for key, value in res.flat.items():
        if isinstance(value, str) and "${" in value:
            why = scope.why(key, value)
            if why:
                res.unresolved[key] = why
    return res


@dataclass(frozen=True)
class _Scope:
    flat: dict[str, Any]
    defaults: Mapping[str, Any]
    env: Environment
    res: Resolution

    def lookup(self, here: str, ref: str) -> tuple[bool, Any]:
        if ref.startswith("."):
            parent = here.rsplit(".", 1)[0] if "." in here else ""
            ref = f"{parent}.{ref[1:]}" if parent else ref[1:]
        for tree in (self.flat, self.defaults):
            if ref in tree:
                return True, tree[ref]
            subtree = {k[len(ref) + 1 :]: v for k, v in tree.items() if k.startswith(ref + ".")}
            if subtree:
                return True, subtree
        return False, None

    def resolve_one(self, here: str, expr: str) -> tuple[bool, Any]:
        if expr.startswith("oc.select:"):
            ref, _, default = expr[len("oc.select:") :].partition(",")
            found, value = self.lookup(here, ref.strip())
            return (True, value) if found else (True, parse_value(default.strip()) if default else None)
        if expr.startswith("oc.env:"):
            name, comma, default = (part.strip() for part in expr[len("oc.env:") :].partition(","))
            value, source = self.env.lookup(name)
            self.res.env_names.add(name)
            if value is not None:
                self.res.env_reads[f"${{{expr}}}"] = f"{name}={value} ({source})"
                return True, value
            if not comma:
                return False, None
            text = _unquote(default)
            self.res.env_reads[f"${{{expr}}}"] = f"{text} (the default: {name} is not set)"
            return True, None if text == "null" else text
        if expr.startswith("oc.decode:"):
            text = expr[len("oc.decode:") :].strip()
            return True, parse_value(_unquote(text))
        if ":" in expr:  # other resolvers (eval, hydra, ...) are not evaluated
            return False, None
        return self.lookup(here, expr.strip())

    def why(self, key: str, value: str) -> str:
        """Why ``value`` (of ``key``) still holds an interpolation, or '' when it is not one."""
        for m in _REF.finditer(value):
            expr = m.group(1).strip()
            if expr.startswith("oc.env:"):
                name = expr[len("oc.env:") :].partition(",")[0].strip()
                hint = (f" (the script sets {name} without exporting it)" if name in self.env.script_only else "")
                return (f"${{{expr}}} reads the environment variable {name}, which is not set, and gives no "
                        f"default{hint}; allowed: --set {name}=VALUE, or a default: ${{oc.env:{name},VALUE}}")
            if ":" in expr:
                return f"{m.group(0)} uses a resolver rlperf does not run; allowed: the value itself as an override"
            found, target = self.lookup(key, expr)
            if not found:
                hint = (f" (a shell variable {expr} is not expanded inside single quotes)"
                        if expr in self.env.script_only or expr in self.env.launch else "")
                return f"{m.group(0)} refers to {expr}, which the configuration does not set{hint}; allowed: a key that is set, or the value itself"
            if isinstance(target, str) and "${" in target:
                return f"{m.group(0)} refers to {expr}, whose value {target!r} never resolves (a cycle?); allowed: the value itself"
        return ""


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _substitute(here: str, value: str, scope: _Scope) -> Any:
    whole = _REF.fullmatch(value)
    if whole:
        found, resolved = scope.resolve_one(here, whole.group(1))
        if found and not (isinstance(resolved, str) and "${" in resolved):
            return resolved
        return value

    def repl(m: re.Match[str]) -> str:
        found, resolved = scope.resolve_one(here, m.group(1))
        return fmt_value(resolved) if found and not isinstance(resolved, dict) else m.group(0)

    return _REF.sub(repl, value)


class KeyReader:
    """Reads keys for an importer; remembers what was read and which defaults were used."""

    def __init__(self, flat: dict[str, Any], rec: Recorder, unresolved: Mapping[str, str] | None = None) -> None:
        self.flat = flat
        self.rec = rec
        self.read: set[str] = set()
        self.unresolved = dict(unresolved or {})
        """key -> why its interpolation was not resolved: reading it is an error."""

    def _value(self, key: str) -> Any:
        self.read.add(key)
        why = self.unresolved.get(key)
        if why is not None:
            problem, _, allowed = why.partition("; allowed: ")
            raise SpecError(key, problem, allowed)
        return self.flat[key]

    def has(self, key: str) -> bool:
        return key in self.flat

    def has_prefix(self, prefix: str) -> bool:
        return any(k == prefix or k.startswith(prefix + ".") for k in self.flat)

    def get(self, key: str, default: Any, note: str = "") -> Any:
        """The value of ``key``, or ``default`` (recorded as defaulted when not None)."""
        if key in self.flat:
            return self._value(key)
        if default is not None:
            self.rec.default(key, default, note)
        return default

    def first(self, keys: Sequence[str], default: Any, note: str = "") -> tuple[str, Any]:
        """The first of ``keys`` present (for renamed keys), else ``default`` under ``keys[0]``."""
        for key in keys:
            if key in self.flat:
                return key, self._value(key)
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

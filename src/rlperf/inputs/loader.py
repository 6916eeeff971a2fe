"""Reading a user's file: path checks, size limit, safe YAML 1.2 and strict JSON.

A YAML document is composed into its node graph first and measured there: the graph shares
aliased nodes, so its *expanded* size (what a consumer walking the data would visit) is counted
with one memoized pass, linear in the file, and a "billion laughs" file is refused before any
consumer expands it. Scalars are resolved with the YAML 1.2 core schema, not PyYAML's YAML 1.1
defaults: ``1:30`` stays a string (YAML 1.1 reads 90), ``yes``/``on`` stay strings, ``010`` is
ten and ``1e3`` is a float.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any, ClassVar

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from rlperf.errors import SpecError, show_path

MAX_FILE_BYTES = 8 * 2**20  # configs, scenarios and profiles are kilobytes; 8 MiB is generous
MAX_DEPTH = 64  # nesting levels (real configs: < 10)
MAX_NODES = 200_000  # nodes after alias expansion (a verl ppo_trainer.yaml: ~1,000)


def check_path(path: str | Path, what: str = "file") -> Path:
    """``path`` if it names a readable regular file of at most MAX_FILE_BYTES, else a SpecError
    naming the file (``error: <file>:<what>: <problem>``)."""
    p = Path(path)
    shown = show_path(p)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise SpecError(what, "file not found", "an existing file", shown) from None
    except OSError as err:
        raise SpecError(what, f"cannot read ({err.strerror or type(err).__name__})", "a readable file", shown) from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError(what, "is a directory", "a regular file", shown)
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(what, "is not a regular file", "a regular file", shown)
    if st.st_size > MAX_FILE_BYTES:
        raise SpecError(what, f"{st.st_size:,} bytes", f"at most {MAX_FILE_BYTES:,} bytes", shown)
    return p


def read_text(path: str | Path, what: str = "file") -> str:
    """The UTF-8 text of a checked file (see :func:`check_path`)."""
    p = check_path(path, what)
    shown = show_path(p)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise SpecError(what, f"cannot read ({err.strerror or type(err).__name__})", "a readable file", shown) from None
    if len(data) > MAX_FILE_BYTES:  # grew since the check
        raise SpecError(what, f"over {MAX_FILE_BYTES:,} bytes", f"at most {MAX_FILE_BYTES:,} bytes", shown)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(what, f"not UTF-8 text (byte {err.start})", "UTF-8 text", shown) from None


def load_yaml(path: str | Path, what: str = "file") -> Any:
    """The data of a YAML file, read under the limits above; errors name the file."""
    text = read_text(path, what)
    return parse_yaml(text, show_path(path))


def load_json(path: str | Path, what: str = "file") -> Any:
    """The data of a JSON file, read under the limits above; errors name the file."""
    text = read_text(path, what)
    return parse_json(text, show_path(path))


# ----------------------------------------------------------------------------- YAML 1.2 core


class _Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no type hints here
    """SafeLoader with YAML 1.2 core-schema scalars and duplicate keys refused."""

    yaml_implicit_resolvers: ClassVar[dict[Any, Any]] = {}  # only the YAML 1.2 core resolvers below

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                dup = key in seen
            except TypeError:  # an unhashable key: the base class reports it
                break
            if dup:
                raise SpecError(f"line {key_node.start_mark.line + 1}", f"duplicate key {_show_key(key)}", "each key once")
            seen.add(key)
        mapping: dict[Any, Any] = super().construct_mapping(node, deep=deep)
        return mapping


def _show_key(key: Any) -> str:
    text = repr(key)
    return text if len(text) <= 40 else text[:37] + "..."


_INT = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")


def _construct_int(loader: _Loader, node: Node) -> int:
    value = str(loader.construct_scalar(node))
    if value.startswith(("0o", "0x")):
        return int(value, 0)
    return int(value, 10)


def _construct_float(loader: _Loader, node: Node) -> float:
    value = str(loader.construct_scalar(node)).lower()
    if value.endswith(".inf"):
        return -math.inf if value.startswith("-") else math.inf
    if value == ".nan":
        return math.nan
    return float(value)


def _construct_bool(loader: _Loader, node: Node) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"


_Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+.0123456789"))
_Loader.add_implicit_resolver("tag:yaml.org,2002:null", re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])
_Loader.add_implicit_resolver("tag:yaml.org,2002:merge", re.compile(r"^(?:<<)$"), ["<"])
_Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_Loader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


def _measure(root: Node) -> None:
    """Refuse a node graph deeper than MAX_DEPTH or larger than MAX_NODES once expanded.

    Aliases make the graph a DAG (or a cycle): sizes are memoized per node, so the expanded size
    is computed in one pass however large it is; a node met again on the current path is a cycle.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    # Iterative post-order walk (a recursive one would itself overflow on a deep file).
    stack: list[tuple[Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if depth[key] > MAX_DEPTH:
                raise SpecError("<root>", f"nesting deeper than {MAX_DEPTH} levels (line {node.start_mark.line + 1})",
                                f"at most {MAX_DEPTH} levels")
            if size[key] > MAX_NODES:
                raise SpecError("<root>", f"more than {MAX_NODES:,} values once aliases are expanded",
                                f"at most {MAX_NODES:,} values (aliases counted expanded)")
            continue
        if key in size:
            continue
        if key in on_path:
            raise SpecError("<root>", f"recursive alias (line {node.start_mark.line + 1})", "acyclic data")
        on_path.add(key)
        stack.append((node, True))
        for kid in _children(node):
            if id(kid) not in size:
                stack.append((kid, False))


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    assert isinstance(node, ScalarNode)
    return []


def parse_yaml(text: str, source: str = "<text>") -> Any:
    """The data of one YAML document (YAML 1.2 core scalars, limits above); SpecError naming ``source``."""
    if len(text) > MAX_FILE_BYTES:
        raise SpecError("<root>", f"{len(text):,} characters", f"at most {MAX_FILE_BYTES:,}", source)
    try:
        loader = _Loader(text)  # checks the characters first (a control character is a ReaderError)
    except yaml.YAMLError as err:
        raise SpecError("<root>", f"not valid YAML: {' '.join(str(err).split())[:200]}", source=source) from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _measure(node)
        return loader.construct_document(node)
    except SpecError as err:
        raise err.in_source(source) from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "<root>"
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(where, f"not valid YAML: {problem}", source=source) from None
    except RecursionError:
        raise SpecError("<root>", "nesting too deep to read", f"at most {MAX_DEPTH} levels", source) from None
    except (ValueError, OverflowError) as err:  # e.g. a scalar tagged !!int that is not a number
        raise SpecError("<root>", f"not valid YAML: {err}", source=source) from None
    finally:
        loader.dispose()


# ----------------------------------------------------------------------------- JSON


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise SpecError(str(k)[:40], "duplicate key", "each key once")
        out[k] = v
    return out


def _no_constant(name: str) -> Any:
    raise SpecError("<root>", f"{name} is not a JSON number", "finite numbers")


def parse_json(text: str, source: str = "<text>") -> Any:
    """The data of a JSON text: duplicate keys, NaN/Infinity and deep nesting refused."""
    if len(text) > MAX_FILE_BYTES:
        raise SpecError("<root>", f"{len(text):,} characters", f"at most {MAX_FILE_BYTES:,}", source)
    try:
        data = json.loads(text, object_pairs_hook=_pairs, parse_constant=_no_constant)
    except SpecError as err:
        raise err.in_source(source) from None
    except json.JSONDecodeError as err:
        raise SpecError(f"line {err.lineno}", f"not valid JSON: {err.msg}", source=source) from None
    except RecursionError:
        raise SpecError("<root>", "nesting too deep to read", f"at most {MAX_DEPTH} levels", source) from None
    if _depth(data) > MAX_DEPTH:
        raise SpecError("<root>", f"nesting deeper than {MAX_DEPTH} levels", f"at most {MAX_DEPTH} levels", source)
    return data


def _depth(data: Any) -> int:
    deepest = 0
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        item, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, d + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, d + 1) for v in item)
    return deepest

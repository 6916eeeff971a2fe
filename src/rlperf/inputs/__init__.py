"""One input layer: every file rlperf reads goes through :func:`read_text`, :func:`load_yaml` or
:func:`load_json`, and every number a user can set is checked against a physical range
(:mod:`rlperf.inputs.ranges`).

Limits (why: a copied file may be hostile or simply wrong; each limit turns a hang, a crash or a
silent misreading into one line naming the file):

- the path must name a regular file of at most :data:`MAX_FILE_BYTES` bytes, UTF-8 text;
- YAML is read with YAML 1.2 core scalars (``1:30`` is a string, ``010`` is ten, ``yes`` is a
  string), safe tags only, duplicate keys refused, nesting at most :data:`MAX_DEPTH` levels and
  at most :data:`MAX_NODES` nodes after alias expansion (a "billion laughs" file is refused
  before it is expanded);
- JSON likewise: duplicate keys, ``NaN``/``Infinity`` and deep nesting are refused.

Errors are :class:`rlperf.errors.SpecError` with the file as source, printed by the CLI as
``error: <file>:<key path>: <what is wrong>; allowed: <range or choices>``.
"""

from rlperf.inputs.loader import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NODES,
    check_path,
    load_json,
    load_yaml,
    parse_json,
    parse_yaml,
    read_text,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_NODES",
    "check_path",
    "load_json",
    "load_yaml",
    "parse_json",
    "parse_yaml",
    "read_text",
]

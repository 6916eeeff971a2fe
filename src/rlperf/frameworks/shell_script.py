"""A bash launch script read the way bash would for one purpose: the trainer's command line.

Users launch verl and OpenRLHF with shell scripts: variables set at the top, then one
``python3 -m <trainer> key=value ...`` (or ``ray job submit ... -- python3 -m ...``,
``deepspeed --module ...``, ``bash -c "..."`` inside ``srun``). This module runs the part of
bash's semantics that decides that command line, without running bash (bash manual, §3.1-3.5):

1. Tokens: ``\\<newline>`` joins lines; ``#`` starts a comment at the start of a word; ``'...'``
   is literal; ``"..."`` expands ``$`` but does not split; ``;``, ``&&``, ``||``, ``|``, ``&``
   and newlines end a command; redirections (``> f``, ``2>&1``, ``&>> f``) are dropped.
2. Expansion, in order, with the variables set so far (``--set NAME=VALUE`` gives the
   environment): ``$VAR``, ``${VAR}``, ``${VAR:-x}`` / ``${VAR-x}`` / ``${VAR:=x}`` /
   ``${VAR:+x}``, arrays ``a=(x y)``, ``"${a[@]}"``, ``${a[i]}``, ``${#a[@]}``, arithmetic
   ``$((...))`` (integers, ``+ - * / % **``); an unquoted expansion is split on blanks.
   ``$@``, ``$*`` and ``$1..`` are empty (the script is read without arguments). Command
   substitution ``$(...)`` and backquotes are not run: each reads as the one word ``$(...)``
   and a warning names the command. An unset variable is empty, with a warning naming it
   (``HOME`` and ``PWD`` stand in as ``~`` and ``.``).
3. Commands: assignments (also after ``export``, ``local``, ``declare``, ``readonly``) set
   variables; ``if [ a = b ]`` / ``[[ ... ]]`` with ``=``, ``==``, ``!=``, ``-n``, ``-z`` picks
   its branch (any other test takes the ``then`` branch, with a warning); loop and ``case``
   bodies are skipped with a warning, unless no command outside them launches the trainer: then
   a loop's first pass is read (``for NAME in a b``: NAME=a), with a warning; ``bash -c "..."``
   and ``eval "..."`` read their string as a script; ``source FILE`` / ``. FILE`` runs a FILE
   beside the script (others are warned about); a here-document's lines are no commands, and
   ``read [-d ''] NAME <<EOF`` sets NAME to it.
4. The invocation: the first command with ``-m <module>`` (or ``--module``) or a ``*.py`` path
   that an ``is_entry`` predicate accepts; its arguments are the words after it.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar, overload

from rlperf.errors import SpecError

_T = TypeVar("_T")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=")
# What a command substitution reads as: one word, so that the words around it keep their places.
NOT_RUN = "$(...)"
# Stand-ins for the login environment: paths only matter to us through their last component.
_ENVIRONMENT = {"HOME": "~", "PWD": "."}
_REDIRECT = re.compile(r"\d*(&>>|&>|>>|>&|<&|>|<<<|<)(?:(?<=&)(\d+-?|-))?")
_HEREDOC = re.compile(r"\d*<<(-?)[ \t]*")
_SEPARATORS = (";;", "&&", "||", ";", "|", "&", "\n")
_DECLARE = ("export", "local", "declare", "readonly", "typeset")
_SKIPPED_BLOCKS = {"for": "done", "while": "done", "until": "done", "case": "esac"}


class _Quoted(str):
    """An expansion whose text came from quotes (``${X:-'a b'}``): never split into words."""

    __slots__ = ()


@dataclass(frozen=True)
class Invocation:
    """The trainer's command line found in a script: its entry point and arguments."""

    entry: str
    args: tuple[str, ...]
    line: int


@dataclass(frozen=True)
class ScriptReading:
    """What a launch script says: the trainer invocation and what could not be read exactly."""

    invocation: Invocation
    warnings: tuple[str, ...]
    # argument key (``trainer.nnodes``, ``--actor_num_nodes``) -> the unset variables its value
    # came from, directly or through variables assigned from them (``N=${SLURM_NNODES}``)
    unset: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    environment: Mapping[str, str] = field(default_factory=dict)
    """The trainer's environment as the launch sets it: ``--set`` values and the script's exports
    (``export NAME=...``, ``NAME=... python ...``), with their values at the invocation."""
    exported: frozenset[str] = frozenset()
    """The names in ``environment`` that the script exports (the rest came from ``--set``)."""
    script_only: frozenset[str] = frozenset()
    """Variables the script sets without exporting: the trainer does not see them."""

    cut_at: int | None = None
    """The line where the trainer's command ended early: its next line reads as an argument, but
    this one has no line continuation (or a backslash followed by blanks: bash reads ``\\ `` as
    an escaped blank, then the newline ends the command)."""
    unused_set: Mapping[str, str] = field(default_factory=dict)
    """``--set`` name -> why the script's command line does not depend on it (never read, or
    assigned by the script first); a verl config may still read it through ``${oc.env:NAME}``."""

    def explain(self, err: SpecError) -> SpecError:
        """``err`` with the unset variables behind its field named (a bad value is often one),
        or with the line that cut the command short (a missing key is often after it)."""
        names = self.unset.get(err.field.lstrip("+~-")) or ()
        if names:
            given = " ".join(f"{n}=VALUE" for n in names)
            hint = f" (from {', '.join('$' + n for n in names)}, not set when the script is read: --set {given})"
        elif self.cut_at is not None:
            hint = (f" (the trainer's command ends on line {self.cut_at} without a line continuation: bash passes "
                    "none of the arguments after it)")
        else:
            return err
        return SpecError(err.field, err.problem + hint, err.allowed, err.source)


@dataclass
class _Word:
    """A word as written (quotes kept) and the line it starts on."""

    raw: str
    line: int
    heredoc: _HereDoc | None = None
    """For the empty word that stands for ``<<EOF``: the here-document."""


@dataclass
class _HereDoc:
    """A here-document given to a command (``<<EOF`` ... ``EOF``): its text, and whether it is
    expanded (an unquoted delimiter) or literal (``<<'EOF'``)."""

    body: str = ""
    expand: bool = True


class _Variables(dict[str, str | list[str]]):
    """The shell's variables, noting what became of each ``--set`` value: read by the script (a
    read goes through :meth:`get`), or replaced by an assignment before any read (a plain
    assignment wins, as in bash). A value the script never reads does nothing: the import says so
    instead of answering as if it had been used."""

    def __init__(self, environment: Mapping[str, str], given: Mapping[str, str]) -> None:
        super().__init__({**environment, **given})
        self.pending = set(given)
        """``--set`` names whose value the script has neither read nor replaced yet."""
        self.replaced: set[str] = set()

    @overload
    def get(self, name: str, default: None = None, /) -> str | list[str] | None: ...
    @overload
    def get(self, name: str, default: str | list[str], /) -> str | list[str]: ...
    @overload
    def get(self, name: str, default: _T, /) -> str | list[str] | _T: ...
    def get(self, name: str, default: object = None, /) -> object:
        self.pending.discard(name)
        return super().get(name, default)

    def __setitem__(self, name: str, value: str | list[str]) -> None:
        if name in self.pending:
            self.pending.discard(name)
            self.replaced.add(name)
        super().__setitem__(name, value)

    def unused(self) -> dict[str, str]:
        """``--set`` name -> why its value never reached the trainer's command line."""
        out = {n: f"the script never reads ${n}" for n in self.pending}
        out.update({n: f"the script assigns {n} before it reads it (a plain assignment wins, as in bash)"
                    for n in self.replaced})
        return dict(sorted(out.items()))


@dataclass
class _Shell:
    variables: _Variables
    warnings: list[str] = field(default_factory=list)
    unset_read: list[str] = field(default_factory=list)  # unset variables read, in order
    derived: dict[str, tuple[str, ...]] = field(default_factory=dict)  # variable -> unset ones it came from
    unset_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    exported: set[str] = field(default_factory=set)  # names the script exports
    base: Path | None = None  # the script's folder: where a sourced file is looked up

    def warn(self, text: str) -> None:
        if text not in self.warnings:
            self.warnings.append(text)


def read_launch_script(
    text: str, is_entry: Callable[[str], bool], env: Mapping[str, str] | None = None, base: Path | None = None
) -> ScriptReading:
    """The trainer invocation of a bash script (see the module docstring); ``base`` is the
    script's folder (``source FILE`` reads FILE from there).

    Raises:
        SpecError: no command of the script runs an entry point that ``is_entry`` accepts.
    """
    given = dict(env or {})
    shell = _Shell(_Variables(_ENVIRONMENT, given), base=base)
    found = _run(text, shell, is_entry, 0)
    if found is None:
        raise SpecError("script", "no trainer invocation found (python -m <trainer> ..., ray job submit -- ..., deepspeed --module ...)")
    unused = shell.variables.unused()  # before the environment below reads every --set value
    names = set(given) | shell.exported
    environment = {n: _joined(shell.variables[n]) for n in sorted(names) if n in shell.variables}
    script_only = frozenset(n for n in shell.variables if n not in names and n not in _ENVIRONMENT)
    cut_at = _cut_short(text, found.line)
    if cut_at is not None:
        shell.warn(f"line {cut_at}: the trainer's command ends here, but the next line reads as one of its arguments "
                   "(a missing backslash, or one followed by blanks); bash runs the command without them")
    return ScriptReading(found, tuple(shell.warnings), dict(shell.unset_args), environment,
                         frozenset(shell.exported), script_only, cut_at, unused)


def unused_set_error(unused: Mapping[str, str]) -> SpecError:
    """The error for ``--set`` values nothing read (name -> why): an option that does nothing."""
    return SpecError("--set", "; ".join(f"{name}: {why}" for name, why in unused.items()),
                     "a variable the launch script (or its config's ${oc.env:NAME}) reads, or leave it out")


_CUT = re.compile(r"\\[ \t]+(#.*)?$")
# an indented Hydra override (a dotted key) or option: not an assignment such as STATUS=$?
_ARGUMENT = re.compile(r"\s+(--[\w.-]+|[+~]*\w+(\.\w+)+=)")


def _cut_short(text: str, start: int) -> int | None:
    """The line, from ``start`` (the invocation's) on, where the command ends (no backslash at
    its end, or a backslash and blanks) while the next line is an indented argument
    (``key=value``, ``--flag``): where bash cut the command short of what its author meant."""
    lines = text.splitlines()
    for k in range(start - 1, len(lines) - 1):
        continued = lines[k].endswith("\\") and not _CUT.search(lines[k])
        if not continued:
            return k + 1 if _ARGUMENT.match(lines[k + 1]) else None
    return None


def _joined(value: str | list[str]) -> str:
    return " ".join(value) if isinstance(value, list) else value


# ---------------------------------------------------------------------- tokens
def _commands(text: str) -> list[list[_Word]]:
    """Commands as lists of raw words (quotes kept), split on separators; comments and
    redirections dropped. A here-document's lines are no commands: its text goes to an empty
    word of the command it is given to."""
    commands: list[list[_Word]] = [[]]
    pending: list[tuple[str, bool, _HereDoc]] = []  # delimiter, strip tabs, the document
    i, n, line = 0, len(text), 1
    while i < n:
        c = text[i]
        if c == "\n" and pending:  # the here-documents start on the next line
            i, line = _read_heredocs(text, i + 1, line + 1, pending)
            pending.clear()
            if commands[-1]:
                commands.append([])
            continue
        heredoc = _HEREDOC.match(text, i) if c in "<0123456789" and not text.startswith("<<<", i) else None
        if heredoc:
            end, raw = _scan_word(text, heredoc.end())
            delimiter = "".join(_literal_words(raw))
            doc = _HereDoc(expand=not any(q in raw for q in "'\"\\"))
            pending.append((delimiter, heredoc.group(1) == "-", doc))
            commands[-1].append(_Word("", line, doc))
            i = end
            continue
        if c == "\\" and i + 1 < n and text[i + 1] == "\n":
            i, line = i + 2, line + 1
            continue
        if c == "\\" and i + 1 == n:  # a continuation at the end of the file: bash drops it
            break
        if c in " \t\r":
            i += 1
            continue
        if c == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        redirect = _REDIRECT.match(text, i)
        if redirect:
            i = redirect.end()
            if not redirect.group(2):  # the target is the next word
                while i < n and text[i] in " \t":
                    i += 1
                i, _ = _scan_word(text, i)
            continue
        sep = next((s for s in _SEPARATORS if text.startswith(s, i)), None)
        if sep is not None:
            line += sep == "\n"
            i += len(sep)
            if commands[-1]:
                commands.append([])
            continue
        start_line = line
        end, raw = _scan_word(text, i)
        line += text.count("\n", i, end)
        i = end
        if raw.endswith("=") and _ASSIGN.fullmatch(raw) and i < n and text[i] == "(":
            close = _matching(text, i, "(", ")")
            raw += text[i : close + 1]
            line += text.count("\n", i, close)
            i = close + 1
        commands[-1].append(_Word(raw, start_line))
    return [c for c in commands if c]


def _read_heredocs(text: str, i: int, line: int, pending: list[tuple[str, bool, _HereDoc]]) -> tuple[int, int]:
    """Read the here-documents' lines from ``text[i]`` (each up to its delimiter line); the index
    and line number after them."""
    for delimiter, strip_tabs, doc in pending:
        lines: list[str] = []
        while i < len(text):
            end = text.find("\n", i)
            end = len(text) if end < 0 else end
            current = text[i:end]
            i, line = end + 1, line + 1
            if (current.lstrip("\t") if strip_tabs else current) == delimiter:
                break
            lines.append(current.lstrip("\t") if strip_tabs else current)
        doc.body = "\n".join(lines) + ("\n" if lines else "")
    return i, line


def _literal_words(raw: str) -> list[str]:
    """``raw`` with its quotes removed and nothing expanded (a here-document's delimiter)."""
    return [raw.replace("'", "").replace('"', "").replace("\\", "")]


def _scan_word(text: str, i: int) -> tuple[int, str]:
    """The end of the word starting at ``i`` and its raw text."""
    start, n = i, len(text)
    while i < n:
        c = text[i]
        if c in " \t\r\n;&|<>" or c == ")" or (c == "(" and (i == start or _ASSIGN.fullmatch(text[start:i]))):
            break
        if c == "\\":
            i += 2
        elif c == "'":
            i = text.index("'", i + 1) + 1 if "'" in text[i + 1 :] else n
        elif c == '"':
            i = _close_double(text, i)
        elif c == "`":
            i = text.index("`", i + 1) + 1 if "`" in text[i + 1 :] else n
        elif text.startswith("$(", i):
            i = _matching(text, i + 1, "(", ")") + 1
        elif text.startswith("${", i):
            i = _matching(text, i + 1, "{", "}") + 1
        else:
            i += 1
    if i == start:  # a lone "(" or ")"
        return i + 1, text[i]
    return i, text[start:i]


def _close_double(text: str, i: int) -> int:
    """The index after the double quote closing the one at ``i``."""
    j, n = i + 1, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
        elif c == '"':
            return j + 1
        elif text.startswith("$(", j):
            j = _matching(text, j + 1, "(", ")") + 1
        elif text.startswith("${", j):
            j = _matching(text, j + 1, "{", "}") + 1
        elif c == "`":
            j = text.index("`", j + 1) + 1 if "`" in text[j + 1 :] else n
        else:
            j += 1
    return n


def _matching(text: str, i: int, open_: str, close: str) -> int:
    """The index of the bracket closing the one at ``i`` (quotes respected)."""
    depth, j, n = 0, i, len(text)
    while j < n:
        c = text[j]
        if c == "\\":
            j += 2
            continue
        if c == "'" and open_ == "(":
            j = text.index("'", j + 1) + 1 if "'" in text[j + 1 :] else n
            continue
        if c == "#" and open_ == "(" and text[j - 1] in " \t\n(":  # a comment (in an array literal)
            j = text.find("\n", j)
            j = n if j < 0 else j
            continue
        if c == '"':
            j = _close_double(text, j)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return j
        j += 1
    return n - 1


# ---------------------------------------------------------------------- expansion
def _expand(raw: str, shell: _Shell) -> list[str]:
    """The words a raw word becomes: quotes removed, ``$`` expanded, unquoted results split."""
    words: list[str] = []
    current: list[str] = []
    have = False  # a quoted empty string still makes a word

    def flush() -> None:
        nonlocal have
        if current or have:
            words.append("".join(current))
        current.clear()
        have = False

    def add(text: str) -> None:
        nonlocal have
        current.append(text)
        have = True

    def add_split(value: str) -> None:
        parts = value.split()
        if value[:1].isspace():
            flush()
        for k, part in enumerate(parts):
            if k:
                flush()
            add(part)
        if parts and value[-1:].isspace():
            flush()

    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "\\" and i + 1 < n:
            if raw[i + 1] != "\n":  # a line continuation inside a word joins it (nothing is added)
                add(raw[i + 1])
            i += 2
        elif c == "'":
            end = raw.find("'", i + 1)
            end = n if end < 0 else end
            add(raw[i + 1 : end])
            i = end + 1
        elif c == '"':
            end = _close_double(raw, i)
            inner = raw[i + 1 : end - 1]
            i = end
            array = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\[@\]\}|\$@|\$\{@\}", inner)
            if array:  # "${a[@]}" and "$@": one word per element, none when empty
                value = shell.variables.get(array.group(1) or "", []) if array.group(1) else []
                items = value if isinstance(value, list) else [value]
                for k, item in enumerate(items):
                    if k:
                        flush()
                    add(item)
                continue
            add(_expand_quoted(inner, shell))
        elif c in "$`":
            value, i = _dollar(raw, i, shell)
            for k, item in enumerate(value if isinstance(value, list) else [value]):
                if k:
                    flush()
                if isinstance(item, _Quoted):
                    add(item)
                else:
                    add_split(item)
        else:
            add(c)
            i += 1
    flush()
    return words


def _expand_quoted(inner: str, shell: _Shell) -> str:
    """The text of a double-quoted string: ``$`` expanded, ``\\`` before ``$ ` " \\`` removed,
    ``\\<newline>`` removed (a line continued inside the quotes)."""
    out: list[str] = []
    i, n = 0, len(inner)
    while i < n:
        c = inner[i]
        if c == "\\" and i + 1 < n and inner[i + 1] == "\n":
            i += 2
        elif c == "\\" and i + 1 < n and inner[i + 1] in '$`"\\':
            out.append(inner[i + 1])
            i += 2
        elif c in "$`":
            value, i = _dollar(inner, i, shell)
            out.append(" ".join(value) if isinstance(value, list) else value)
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _dollar(text: str, i: int, shell: _Shell) -> tuple[str | list[str], int]:
    """The value of the expansion starting at ``text[i]`` and the index after it."""
    if text[i] == "`":
        end = text.find("`", i + 1)
        end = len(text) - 1 if end < 0 else end
        shell.warn(f"command substitution {text[i : end + 1]} not run (read as {NOT_RUN})")
        return NOT_RUN, end + 1
    if text.startswith("$((", i):
        end = _matching(text, i + 1, "(", ")")
        expr = text[i + 3 : end - 1]
        return _arithmetic(expr, shell), end + 1
    if text.startswith("$(", i):
        end = _matching(text, i + 1, "(", ")")
        shell.warn(f"command substitution {text[i : end + 1]} not run (read as {NOT_RUN})")
        return NOT_RUN, end + 1
    if text.startswith("${", i):
        end = _matching(text, i + 1, "{", "}")
        return _braced(text[i + 2 : end], shell), end + 1
    m = _NAME.match(text, i + 1)
    if m:
        return _value(m.group(0), shell), m.end()
    if i + 1 < len(text) and text[i + 1] in "@*#?$!0123456789-":
        special = text[i + 1]
        return ("0" if special in "#?" else ""), i + 2
    return "$", i + 1


def _value(name: str, shell: _Shell, *, warn: bool = True) -> str | list[str]:
    value = shell.variables.get(name)
    shell.unset_read.extend(shell.derived.get(name, ()))
    if value is None:
        if warn:
            shell.warn(f"variable {name} is not set (read as empty; --set {name}=VALUE gives it)")
            shell.unset_read.append(name)
        return ""
    return value[0] if isinstance(value, list) and value else value


def _braced(body: str, shell: _Shell) -> str | list[str]:
    """``${...}``: defaults, array elements and lengths."""
    if body in ("@", "*") or body.isdigit():
        return ""
    positional = re.fullmatch(r"\d+(:?[-=+?])(.*)", body, re.DOTALL)
    if positional:  # the script is read without arguments: $1.. are unset
        return "" if positional.group(1).endswith("+") else _expand_quoted(_requote(positional.group(2)), shell)
    m = re.fullmatch(r"#([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?", body)
    if m:
        counted = shell.variables.get(m.group(1), "")
        return str(len(counted))
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\[([^\]]+)\]", body)
    if m:
        element = shell.variables.get(m.group(1))
        items = element if isinstance(element, list) else ([] if element is None else [element])
        index = m.group(2)
        if index in ("@", "*"):
            return list(items)
        k = _arithmetic(index, shell)
        return items[int(k)] if k.lstrip("-").isdigit() and int(k) < len(items) else ""
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(:?[-=+?])(.*)", body, re.DOTALL)
    if m:
        name, op, word = m.groups()
        current = shell.variables.get(name)
        unset = current is None or (op.startswith(":") and current in ("", []))
        alternative = _expand_quoted(_requote(word), shell)
        if op.endswith("+"):
            return "" if unset else _Quoted(alternative) if any(q in word for q in "'\"") else alternative
        if not unset:
            return _value(name, shell)
        if op.endswith("="):
            shell.variables[name] = alternative
        return _Quoted(alternative) if any(q in word for q in "'\"") else alternative
    if _NAME.fullmatch(body):
        return _value(body, shell)
    shell.warn(f"expansion ${{{body}}} not understood (read as empty)")
    return ""


_BINARY: dict[type[ast.operator], Callable[[int, int], int]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: lambda base, exp: pow(base, exp, 2**64) if exp >= 0 else 0,  # bash: 64-bit; 2**-1 is 0 there
}
_MAX_VALUE_CHARS = 1_000_000  # a variable's value (a script's longest real value: a few kB)
_MAX_ARRAY_INDEX = 100_000


def _int64(value: int) -> int:
    """``value`` wrapped to a signed 64-bit integer, as bash computes (bounds the work too)."""
    return (value + 2**63) % 2**64 - 2**63


def _bounded(what: str, value: str) -> str:
    if len(value) > _MAX_VALUE_CHARS:
        raise SpecError("script", f"{what} expands to over {_MAX_VALUE_CHARS:,} characters",
                        f"values up to {_MAX_VALUE_CHARS:,} characters")
    return value


def _arithmetic(expr: str, shell: _Shell) -> str:
    """``$((expr))`` over integers; names are variables (unset: 0); bash's ``/`` truncates."""

    def name_value(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(0)
        if name not in shell.variables:  # 0 in bash, but a value that depends on it is likely wrong
            shell.unset_read.append(name)
        value = _value(name, shell, warn=False)
        text = value[0] if isinstance(value, list) else value
        return f"({text.strip() or '0'})"

    substituted = re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?|[A-Za-z_][A-Za-z0-9_]*", name_value, expr)
    try:
        tree = ast.parse(substituted.replace("/", "//").strip(), mode="eval")
        return str(_eval(tree.body))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        shell.warn(f"arithmetic $(({expr})) not evaluated (read as $((...)))")
        return "$((...))"


def _eval(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return _int64(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval(node.operand)
        return _int64(-value if isinstance(node.op, ast.USub) else value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.FloorDiv):  # bash truncates toward zero
            return _int64(int(left / right) if right else left // right)
        return _int64(_BINARY[type(node.op)](left, right))
    raise ValueError("not integer arithmetic")


# ---------------------------------------------------------------------- commands
def _run(text: str, shell: _Shell, is_entry: Callable[[str], bool], depth: int) -> Invocation | None:
    return _run_commands(_commands(text), shell, is_entry, depth)


def _run_commands(
    commands: list[list[_Word]], shell: _Shell, is_entry: Callable[[str], bool], depth: int
) -> Invocation | None:
    branches: list[tuple[bool, bool]] = []  # (this branch runs, some branch already ran)
    skip_until: list[str] = []
    loops: list[tuple[list[_Word], list[list[_Word]]]] = []  # skipped loops: header, body
    for words in commands:
        head = words[0].raw
        if skip_until:
            if head in _SKIPPED_BLOCKS:
                skip_until.append(_SKIPPED_BLOCKS[head])
            elif head == skip_until[-1]:
                skip_until.pop()
                if not skip_until:
                    continue
            if loops:
                loops[-1][1].append(words)
            continue
        if head in ("then", "else", "do") and len(words) > 1:
            if head == "else":
                words = [words[0]]
            else:
                words = words[1:]
                head = words[0].raw
        if head == "if" or head == "elif":
            if head == "elif" and branches:
                running, taken = branches.pop()
                taken = taken or running
                ok = not taken and _test(words[1:], shell)
                branches.append((ok, taken))
            else:
                outer = all(b[0] for b in branches)
                branches.append((outer and _test(words[1:], shell), not outer))
            continue
        if head == "else" and branches:
            running, taken = branches.pop()
            branches.append((not (running or taken), True))
            continue
        if head == "fi" and branches:
            branches.pop()
            continue
        if head == "then":
            continue
        if not all(b[0] for b in branches):
            continue
        if head in _SKIPPED_BLOCKS:
            shell.warn(f"'{head}' block on line {words[0].line} skipped (its body is not run)")
            skip_until.append(_SKIPPED_BLOCKS[head])
            if head != "case":
                loops.append((words, []))
            continue
        found = _command(words, shell, is_entry, depth)
        if found is not None:
            return found
    return _first_pass_of_loops(loops, shell, is_entry, depth)


def _first_pass_of_loops(
    loops: list[tuple[list[_Word], list[list[_Word]]]], shell: _Shell, is_entry: Callable[[str], bool], depth: int
) -> Invocation | None:
    """The trainer invoked inside a loop (a sweep over seeds or models): its first pass.

    Only when no command outside a loop launches the trainer: ``for NAME in WORDS`` runs its
    body with NAME set to the first word, ``while``/``until`` bodies run once; a warning says so.
    """
    for header, body in loops:
        if header[0].raw == "for" and len(header) > 1 and _NAME.fullmatch(header[1].raw):
            items = [t for w in header[3:] for t in _expand(w.raw, shell)] if len(header) > 2 and header[2].raw == "in" else []
            first = items[0] if items else ""
            shell.variables[header[1].raw] = first
            what = f"its first pass ({header[1].raw}={first})"
        else:
            what = "its body once"
        found = _run_commands(body, shell, is_entry, depth)
        if found is not None:
            skipped = f"'{header[0].raw}' block on line {header[0].line} skipped (its body is not run)"
            shell.warnings[:] = [w for w in shell.warnings if w != skipped]
            shell.warn(f"the trainer runs inside the '{header[0].raw}' loop on line {header[0].line}: read {what}")
            return found
    return None


def _command(words: list[_Word], shell: _Shell, is_entry: Callable[[str], bool], depth: int) -> Invocation | None:
    """Run one simple command: assignments, ``bash -c``, or the trainer invocation."""
    i = 0
    while i < len(words) and _assign(words[i].raw, shell):  # VAR=x [command]: set for our purpose
        i += 1
    if i == len(words):
        return None
    if words[i].raw in _DECLARE:
        exports = words[i].raw == "export" or any(w.raw.startswith("-") and "x" in w.raw for w in words[i + 1 :])
        for w in words[i + 1 :]:
            if not w.raw.startswith("-") and not _assign(w.raw, shell) and _NAME.fullmatch(w.raw) is None:
                shell.warn(f"'{words[i].raw} {w.raw}' not understood")
            assigned = _ASSIGN.match(w.raw)
            name = assigned.group(1) if assigned else w.raw if _NAME.fullmatch(w.raw) else None
            if exports and name is not None:
                shell.exported.add(name)
        return None
    if words[i].raw == "read":
        _read(words[i + 1 :], shell)
        return None
    if words[i].raw in ("source", ".") and len(words) > i + 1:
        return _source(words[i + 1], shell, is_entry, depth)
    found = _invocation(words, i, shell, is_entry, depth)
    if found is not None:  # VAR=x before the command: in the trainer's environment
        shell.exported.update(m.group(1) for w in words[:i] if (m := _ASSIGN.match(w.raw)) is not None)
    return found


def _read(words: list[_Word], shell: _Shell) -> None:
    """``read [-r] [-d ''] NAME <<EOF``: NAME is the here-document (its first line without
    ``-d``), blanks around it trimmed; ``read`` from anything else sets nothing (a warning)."""
    doc = next((w.heredoc for w in words if w.heredoc is not None), None)
    names = [w.raw for w in words if _NAME.fullmatch(w.raw)]
    if doc is None or not names:
        shell.warn(f"'read {' '.join(w.raw for w in words)}' not run (it reads no here-document)")
        return
    text = _expand_quoted(doc.body, shell) if doc.expand else doc.body
    whole = any(w.raw == "-d" or w.raw.startswith("-d") or (w.raw.startswith("-") and "d" in w.raw) for w in words)
    shell.variables[names[-1]] = (text if whole else text.split("\n", 1)[0]).strip()


def _invocation(words: list[_Word], i: int, shell: _Shell, is_entry: Callable[[str], bool], depth: int) -> Invocation | None:
    """The trainer invocation in the command ``words[i:]``, if it is one (or a ``bash -c`` holding one)."""
    tokens: list[str] = []
    size = 0
    for w in words[i:]:
        expanded = _expand_arg(w.raw, shell, tokens)
        tokens.extend(expanded)
        size += sum(len(t) + 1 for t in expanded)
        if size > _MAX_VALUE_CHARS:
            _bounded("the command line", " ".join(tokens))
    for k, tok in enumerate(tokens):
        if tok in ("-m", "--module") and k + 1 < len(tokens) and is_entry(tokens[k + 1]):
            return Invocation(tokens[k + 1], tuple(tokens[k + 2 :]), words[0].line)
        if tok.endswith(".py") and is_entry(tok):
            return Invocation(tok, tuple(tokens[k + 1 :]), words[0].line)
    for k, tok in enumerate(tokens[:-1]):
        if tok == "-c" and k > 0 and tokens[k - 1].rsplit("/", 1)[-1] in ("bash", "sh") and depth < 4:
            inner = _run(tokens[k + 1], shell, is_entry, depth + 1)
            if inner is not None:
                return inner
    if tokens[:1] == ["eval"] and depth < 4:  # eval reads its words, joined, as a command line
        return _run(" ".join(tokens[1:]), shell, is_entry, depth + 1)
    return None


def _source(word: _Word, shell: _Shell, is_entry: Callable[[str], bool], depth: int) -> Invocation | None:
    """``source FILE`` / ``. FILE``: FILE's commands run here (its variables are set; it may launch
    the trainer). A relative FILE is read from the script's folder; one not found is a warning."""
    from rlperf.inputs import read_text

    names = _expand(word.raw, shell)
    # only a file beside the script (a relative path): not the launch machine's environment
    # scripts; "$SCRIPT_DIR/env.sh" with SCRIPT_DIR=$(cd "$(dirname "$0")" && pwd) is read by
    # what follows the computed part
    name = names[0].rsplit(NOT_RUN, 1)[1].lstrip("/") if names and NOT_RUN in names[0] else names[0] if names else ""
    relative = name if name and not name.startswith(("/", "~")) else None
    target = shell.base / relative if relative is not None and shell.base is not None else None
    try:
        exists = target is not None and target.is_file()
    except OSError:
        exists = False
    if target is None or not exists or depth >= 4:
        shell.warn(f"'source {word.raw}' on line {word.line} not read (not a file beside the script): its variables are not set")
        return None
    return _run(read_text(target, "script"), shell, is_entry, depth + 1)


def _expand_arg(raw: str, shell: _Shell, before: list[str]) -> list[str]:
    """:func:`_expand` of an argument, noting the unset variables its value came from under its
    key (``key=value``, or the option before it: ``--nodes $N``)."""
    start = len(shell.unset_read)
    expanded = _expand(raw, shell)
    came_from = tuple(dict.fromkeys(shell.unset_read[start:]))
    if came_from:
        tok = expanded[0] if expanded else ""
        key = tok.split("=", 1)[0] if "=" in tok else (before[-1] if before else "")
        if key:
            shell.unset_args[key.lstrip("+~-")] = came_from
    return expanded


def _assign(raw: str, shell: _Shell) -> bool:
    """Run ``raw`` if it is an assignment (``a=x``, ``a+=x``, ``a=(x y)``, ``a[i]=x``)."""
    m = _ASSIGN.match(raw)
    if not m:
        return False
    name, index, append = m.group(1), m.group(2), m.group(3)
    rest = raw[m.end() :]
    start = len(shell.unset_read)
    try:
        return _assign_value(name, index, append, rest, shell)
    finally:
        came_from = tuple(dict.fromkeys(shell.unset_read[start:]))
        if came_from:
            shell.derived[name] = came_from
        elif not append:
            shell.derived.pop(name, None)


def _assign_value(name: str, index: str | None, append: str, rest: str, shell: _Shell) -> bool:
    if rest.startswith("(") and rest.endswith(")") and index is None:
        items = [t for w in _commands(rest[1:-1]) for word in w for t in _expand_arg(word.raw, shell, [])]
        old = shell.variables.get(name, [])
        base = (old if isinstance(old, list) else [old]) if append else []
        shell.variables[name] = base + items
        _bounded(f"array {name}", " ".join(base + items))
        return True
    value = _bounded(f"variable {name}", "".join(_expand_quoted_word(rest, shell)))
    if index is not None:
        old = shell.variables.get(name, [])
        items = list(old) if isinstance(old, list) else [old]
        k = int(_arithmetic(index[1:-1], shell) or 0)
        if not 0 <= k <= _MAX_ARRAY_INDEX:
            raise SpecError("script", f"array index {name}[{k}]", f"0 to {_MAX_ARRAY_INDEX:,}")
        items.extend([""] * (k + 1 - len(items)))
        items[k] = value
        shell.variables[name] = items
        return True
    previous = _value(name, shell, warn=False) if append else ""
    shell.variables[name] = _bounded(f"variable {name}", (previous if isinstance(previous, str) else " ".join(previous)) + value)
    return True


def _expand_quoted_word(raw: str, shell: _Shell) -> list[str]:
    """An assignment's value: expanded, never split (bash does not split assignment values)."""
    return [" ".join(_expand(f'"{_requote(raw)}"', shell))] if raw else [""]


def _requote(raw: str) -> str:
    """``raw`` as the inside of a double-quoted string with the same meaning (an assignment's
    value, the word of ``${VAR:-word}``: expanded, quotes removed, never split)."""
    out: list[str] = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "'":
            end = raw.find("'", i + 1)
            end = n if end < 0 else end
            out.append(raw[i + 1 : end].replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$").replace("`", "\\`"))
            i = end + 1
        elif c == '"':
            end = _close_double(raw, i)
            out.append(raw[i + 1 : end - 1])
            i = end
        elif c == "\\" and i + 1 < n:
            if raw[i + 1] != "\n":  # a line continuation joins the value
                out.append(raw[i : i + 2] if raw[i + 1] in '$`"\\' else raw[i + 1])
            i += 2
        elif raw.startswith("$(", i) or raw.startswith("${", i):  # kept whole: quotes inside are its own
            end = _matching(raw, i + 1, raw[i + 1], ")" if raw[i + 1] == "(" else "}")
            out.append(raw[i : end + 1])
            i = end + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _test(words: Sequence[_Word], shell: _Shell) -> bool:
    """``[ a = b ]``, ``[[ a != b ]]``, ``[ -n a ]``, ``[ -z a ]``; anything else: True, warned."""
    tokens = [t for w in words for t in (_expand(w.raw, shell) or [""])]
    if tokens and tokens[0] in ("[", "[["):
        tokens = tokens[1:]
    if tokens and tokens[-1] in ("]", "]]"):
        tokens = tokens[:-1]
    if len(tokens) == 3 and tokens[1] in ("=", "==", "!="):
        return (tokens[0] == tokens[2]) == (tokens[1] != "!=")
    if len(tokens) == 2 and tokens[0] in ("-n", "-z"):
        return bool(tokens[1]) == (tokens[0] == "-n")
    if len(tokens) == 1:
        return bool(tokens[0])
    shell.warn(f"condition '{' '.join(w.raw for w in words)}' not evaluated (its 'then' branch is read)")
    return True

"""What an import read and what an export could not say: results as frozen dataclasses.

An import sorts every key of the framework's configuration into exactly one bucket, so nothing
is dropped silently:

- ``mapped``: read, and it set a field of the scenario (the note names the field);
- ``ignored``: known to have no effect on step time or memory (learning rate, logging, paths);
- ``unsupported``: known to affect performance, but rlperf does not model it (the note says how
  the scenario approximates it, if at all);
- ``unknown``: not recognised.

``defaulted`` lists the performance keys the configuration left out, with the framework's
documented default that was used instead; ``assumptions`` lists what no configuration of the
framework says (the GPU type, the length distributions) and what rlperf chose.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KeyNote:
    """One configuration key, its value as written, and what became of it."""

    key: str
    value: str
    note: str = ""


@dataclass(frozen=True)
class ImportReport:
    framework: str
    source: str
    mapped: tuple[KeyNote, ...] = ()
    ignored: tuple[KeyNote, ...] = ()
    unsupported: tuple[KeyNote, ...] = ()
    unknown: tuple[KeyNote, ...] = ()
    defaulted: tuple[KeyNote, ...] = ()
    assumptions: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    """What a launch script said that could not be read exactly (``$(...)``, unset variables)."""

    def lines(self) -> list[str]:
        """A plain-text listing (unknown and unsupported first: they need the reader's eye)."""
        out = [f"{self.framework} import of {self.source}"]
        out.extend(f"script: {w}" for w in self.warnings)
        for title, notes in (
            ("unknown (not recognised, not used)", self.unknown),
            ("unsupported (affects performance, not modelled)", self.unsupported),
            ("mapped", self.mapped),
            ("defaulted (not in the config; the framework's default was used)", self.defaulted),
            ("ignored by design (no effect on performance)", self.ignored),
        ):
            if notes:
                out.append(f"{title}: {len(notes)}")
                out.extend(f"  {n.key}={n.value}" + (f"  -> {n.note}" if n.note else "") for n in notes)
        if self.assumptions:
            out.append(f"assumptions: {len(self.assumptions)}")
            out.extend(f"  {a}" for a in self.assumptions)
        return out


@dataclass(frozen=True)
class ExportResult:
    """A plan said in a framework's own terms, and what it could not say."""

    framework: str
    args: tuple[str, ...]
    """verl: ``key=value`` overrides; OpenRLHF: the argument tokens after the module name."""
    not_expressible: tuple[str, ...] = ()
    prefix: tuple[str, ...] = field(default=())
    """The launcher tokens before ``args`` (e.g. ``python3 -m openrlhf.cli.train_ppo_ray``)."""
    notes: tuple[str, ...] = ()
    """Placeholders the user must fill in (checkpoint paths, URLs) and which entry point to run."""

    def command_line(self) -> str:
        """One shell command, a flag (with its values) or an override per continuation line."""
        import shlex

        lines: list[list[str]] = []
        for arg in self.args:  # a --flag starts a line; its values follow on the same line
            if lines and not arg.startswith(("--", "+")) and lines[-1][0].startswith("--"):
                lines[-1].append(shlex.quote(arg))
            else:
                lines.append([shlex.quote(arg)])
        body = [" ".join(line) for line in lines]
        return " \\\n  ".join([" ".join(self.prefix), *body] if self.prefix else body)


def fmt_value(value: Any) -> str:
    """A configuration value as the user would write it (``True``, ``0.5``, ``[a,b]``)."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(fmt_value(v) for v in value) + "]"
    return str(value)


class Recorder:
    """Collects the buckets while an importer runs; :meth:`freeze` gives the report."""

    def __init__(self, framework: str, source: str, model_config: str | None = None) -> None:
        self.model_config = model_config
        """The actor's config.json (or its folder), ``--model-config``: it wins over the catalog
        for the actor's path, and stands in for other ids the catalog does not know."""
        self.actor_model: str | None = None
        """The actor's path as written, once read with ``model_config`` (another role naming the
        same checkpoint gets the same shapes)."""
        self.framework = framework
        self.source = source
        self.mapped: dict[str, KeyNote] = {}
        self.unsupported: dict[str, KeyNote] = {}
        self.defaulted: dict[str, KeyNote] = {}
        self.assumptions: list[str] = []

    def map(self, key: str, value: Any, note: str) -> None:
        """``key`` set a field; a defaulted key (not in the config) keeps its bucket, with the note."""
        if key in self.defaulted:
            old = self.defaulted[key]
            if not old.note:
                self.defaulted[key] = KeyNote(key, old.value, note)
            return
        self.mapped.setdefault(key, KeyNote(key, fmt_value(value), note))

    def default(self, key: str, value: Any, note: str = "") -> None:
        self.defaulted.setdefault(key, KeyNote(key, fmt_value(value), note))

    def unsupported_key(self, key: str, value: Any, note: str) -> None:
        self.mapped.pop(key, None)
        self.unsupported[key] = KeyNote(key, fmt_value(value), note)

    def assume(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    def freeze(self, ignored: list[KeyNote], unknown: list[KeyNote]) -> ImportReport:
        return ImportReport(
            framework=self.framework,
            source=self.source,
            mapped=tuple(sorted(self.mapped.values(), key=lambda n: n.key)),
            ignored=tuple(sorted(ignored, key=lambda n: n.key)),
            unsupported=tuple(sorted(self.unsupported.values(), key=lambda n: n.key)),
            unknown=tuple(sorted(unknown, key=lambda n: n.key)),
            defaulted=tuple(sorted(self.defaulted.values(), key=lambda n: n.key)),
            assumptions=tuple(self.assumptions),
        )

"""One entry point for the planner and the CLI: a framework's configuration -> ScenarioSpec.

``load_framework_config("verl", "ppo.yaml", ["data.train_batch_size=512"])`` and
``load_framework_config("openrlhf", "--pretrain Qwen/Qwen2.5-7B ...", [])`` both return the
scenario and the :class:`ImportReport` that lists every key that was not mapped.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rlperf.errors import SpecError
from rlperf.frameworks.report import ImportReport
from rlperf.scenario import ScenarioSpec

if TYPE_CHECKING:
    from rlperf.frameworks.shell_script import ScriptReading

FrameworkKind = Literal["verl", "openrlhf"]
KINDS: tuple[FrameworkKind, ...] = ("verl", "openrlhf")


def read_overrides(path: str | Path) -> list[str]:
    """Overrides from a text file: one per line (or several separated by blanks, as in a shell
    script); ``#`` comments and shell line continuations are dropped; a value with brackets
    (``key=[a, b]``) stays one override."""
    import shlex

    from rlperf.inputs import read_text

    text = read_text(path, "config").replace("\\\n", " ")
    out: list[str] = []
    for line in text.splitlines():
        out.extend(join_bracketed(shlex.split(line, comments=True)))
    return out


def join_bracketed(tokens: Sequence[str]) -> list[str]:
    """Tokens rejoined (with one blank) where a ``[``/``{`` opened in one closes in a later one."""
    out: list[str] = []
    depth = 0
    for tok in tokens:
        if depth > 0:
            out[-1] += " " + tok
        else:
            out.append(tok)
        depth += tok.count("[") + tok.count("{") - tok.count("]") - tok.count("}")
        depth = max(depth, 0)
    return out


def load_framework_config(
    kind: str,
    path_or_args: str | Path | Sequence[str] | Mapping[str, Any] | None,
    overrides: Sequence[str] = (),
    *,
    gpu: str = "H100",
    mean_response_tokens: float | None = None,
    env: Mapping[str, str] | None = None,
    model_config: str | None = None,
) -> tuple[ScenarioSpec, ImportReport]:
    """Import a framework configuration.

    Args:
        kind: ``"verl"`` or ``"openrlhf"`` (any case).
        path_or_args: verl: a YAML file (Hydra ``defaults:`` composed), a mapping, a launch
            script (``*.sh``), a file of overrides (``*.overrides``, ``*.txt``) or None;
            OpenRLHF: a launch script, a command line (string or list of tokens) or a file
            holding one.
        overrides: verl: Hydra overrides applied after the YAML; OpenRLHF: more arguments,
            appended (later ones win, as in argparse).
        gpu: the accelerator (neither framework's configuration names it).
        mean_response_tokens: the mean response length, when known (default: cap/3).
        model_config: a ``config.json`` (or its folder) for models the catalog does not know.
        env: variables a launch script reads from its environment (``--set NAME=VALUE``).

    Raises:
        SpecError: bad kind, unreadable file, or a value the scenario cannot take.
    """
    from rlperf.frameworks.shell_script import unused_set_error

    key = kind.lower()
    if model_config is not None:
        check_model_config(model_config)
    if key == "verl":
        from rlperf.frameworks.verl_import import import_verl

        config: str | Path | Mapping[str, Any] | None
        extra = list(overrides)
        if isinstance(path_or_args, (str, Path)) and _is_shell_script(path_or_args):
            from rlperf.frameworks.verl_script import import_verl_script

            return import_verl_script(
                path_or_args, extra, env=env, gpu=gpu, mean_response_tokens=mean_response_tokens, model_config=model_config
            )
        if isinstance(path_or_args, (str, Path)) and Path(path_or_args).suffix in (".overrides", ".txt"):
            config, extra = None, read_overrides(path_or_args) + extra
        elif isinstance(path_or_args, (str, Path, Mapping)) or path_or_args is None:
            config = path_or_args
        else:
            config, extra = None, list(path_or_args) + extra
        from rlperf.frameworks.config_tree import Environment

        given = dict(env or {})  # without a script only the config's ${oc.env:NAME} reads them
        return import_verl(config, extra, gpu=gpu, mean_response_tokens=mean_response_tokens, model_config=model_config,
                           env=Environment(given, unread={n: "the config never reads ${oc.env:" + n + "}" for n in given}))
    if key == "openrlhf":
        from rlperf.frameworks.openrlhf_import import import_openrlhf

        if isinstance(path_or_args, Mapping) or path_or_args is None:
            raise SpecError("config", "OpenRLHF takes a command line (string, list, or a file holding one)")
        from rlperf.inputs import read_text

        args: str | Sequence[str] = path_or_args if not isinstance(path_or_args, Path) else read_text(path_or_args, "config")
        base = path_or_args.parent if isinstance(path_or_args, Path) else None  # where `source FILE` looks
        if isinstance(args, str) and _is_file(args):
            base = Path(args).parent
            args = read_text(args, "config")
        warnings: tuple[str, ...] = ()
        reading: ScriptReading | None = None
        if isinstance(args, str):  # a script: read as bash would; a bare argument list has no entry point
            from rlperf.frameworks.openrlhf_import import is_openrlhf_entry
            from rlperf.frameworks.shell_script import read_launch_script

            try:
                reading = read_launch_script(args, is_openrlhf_entry, env, base)
            except SpecError as err:
                if not _bare_command_line(args):
                    raise _other_trainer(args, env) or err from None
            if reading is not None:
                args, warnings = list(reading.invocation.args), reading.warnings
                if reading.unused_set:  # OpenRLHF's arguments read no environment: only the script
                    raise reading.explain(unused_set_error(reading.unused_set))
        if env and reading is None:
            raise unused_set_error({n: "a bare command line reads no variables" for n in env})
        try:
            spec, report = import_openrlhf(
                args, overrides, gpu=gpu, mean_response_tokens=mean_response_tokens, model_config=model_config
            )
        except SpecError as err:
            raise (reading.explain(err) if reading is not None else err) from None
        return spec, replace(report, warnings=warnings)
    raise SpecError("framework", f"unknown config kind {kind!r}", ", ".join(KINDS))


def check_model_config(path: str) -> None:
    """``--model-config`` reads as a model: a ``config.json``, or a folder holding one. Checked
    before the import: a path that is not there would be taken for a catalog name later (and
    refused as an unknown one), the option the user wrote unnamed."""
    from rlperf.catalog import load_model
    from rlperf.errors import show_path

    p = Path(path).expanduser()
    try:
        found, folder = p.is_file() or (p / "config.json").is_file(), p.is_dir()
    except OSError:  # e.g. a name too long to be a path
        found = folder = False
    if not found:
        problem = f"no config.json in the folder {show_path(path)!r}" if folder else f"file not found: {show_path(path)!r}"
        raise SpecError("--model-config", problem, "a model's config.json, or a folder holding one")
    try:
        load_model(p)
    except SpecError as err:  # the file's own errors name the file and its key; this one, the option
        raise (SpecError("--model-config", err.problem, err.allowed, err.source) if err.field == "model" else err) from None


def _is_shell_script(path: str | Path) -> bool:
    """A launch script: ``*.sh``/``*.bash``, or a file without a config's suffix that starts
    with ``#!`` or holds ``python``/``torchrun`` (a YAML file holds neither)."""
    p = Path(path)
    if p.suffix in (".sh", ".bash"):
        return True
    if p.suffix in (".yaml", ".yml", ".json", ".overrides", ".txt") or not _is_file(str(p)):
        return False
    try:
        with p.open("rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    return head.startswith(b"#!") or re.search(rb"\b(python3?|torchrun|deepspeed)\b", head) is not None


def _bare_command_line(text: str) -> bool:
    """Whether ``text`` is a command line rather than a script: its first word is an option, or
    it names the trainer (read then by ``split_args``)."""
    from rlperf.frameworks.openrlhf_import import ENTRY

    lines = [ln for ln in text.replace("\\\n", " ").splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    words = [w for ln in lines for w in ln.split()]
    return not words or words[0].startswith("-") or (
        len(lines) == 1 and any(w.endswith((ENTRY, "train_ppo_ray.py")) for w in words))


def _other_trainer(text: str, env: Mapping[str, str] | None) -> SpecError | None:
    """A script that launches another OpenRLHF trainer (e.g. ``openrlhf.cli.train_ppo``, PPO
    without Ray and vLLM): an error naming it."""
    from rlperf.frameworks.openrlhf_import import ENTRY
    from rlperf.frameworks.shell_script import read_launch_script

    try:
        entry = read_launch_script(text, lambda t: "openrlhf" in t.replace("/", "."), env).invocation.entry
    except SpecError:
        return None
    return SpecError("script", f"runs {entry}, not OpenRLHF's Ray PPO trainer", ENTRY)


def _is_file(text: str) -> bool:
    """Whether ``text`` names a file (a long command line is not a path)."""
    if "\n" in text or text.lstrip().startswith("-"):
        return False
    try:
        return Path(text).is_file()
    except OSError:
        return False

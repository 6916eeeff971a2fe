"""A verl launch script (``run_qwen2-7b.sh``) -> the configuration verl would build from it.

The script's trainer invocation (read by :mod:`rlperf.frameworks.shell_script`) names an entry
point and Hydra arguments: ``--config-path``/``--config-name`` pick the base YAML, every other
argument is an override. What the entry point and the config name decide:

- entry ``verl.experimental.fully_async_policy.*`` (or ``recipe.fully_async_policy.*``), or a
  config name with ``fully_async``: verl's fully-async trainer;
- entry ``*.one_step_off_policy.*`` or a config name with ``one_step_off``: the one-step-off
  trainer;
- a config name with ``megatron`` (``ppo_megatron_trainer``): every role's ``strategy`` is
  ``megatron`` (that YAML's actor, ref, critic and reward-model defaults);
- ``recipe.dapo.*`` / ``dapo_trainer``: verl's DAPO recipe (its YAML only adds keys the
  overrides set: ``algorithm.filter_groups.*``, ``data.gen_batch_size``).

When ``--config-path/--config-name`` name a YAML that exists next to the script, it is
composed (Hydra ``defaults:``) and used as the base instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlperf.frameworks.config_tree import Environment
from rlperf.frameworks.report import ImportReport
from rlperf.errors import SpecError
from rlperf.frameworks.shell_script import NOT_RUN, read_launch_script
from rlperf.scenario import ScenarioSpec

# Entry points of verl's trainers (module names; a path to the .py file is accepted too).
ENTRY_MODULES = (
    "verl.trainer.main_ppo",
    "verl.experimental.one_step_off_policy.main_ppo",
    "verl.experimental.fully_async_policy.fully_async_main",
    "recipe.one_step_off_policy.main_ppo",
    "recipe.fully_async_policy.fully_async_main",
    "recipe.dapo.main_dapo",
)
_MEGATRON_ROLES = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic", "reward_model")


# verl entry points that train no policy with RL: generation and evaluation only.
NOT_RL = ("main_generation", "main_generation_server", "main_eval")


def is_verl_entry(token: str) -> bool:
    """Whether ``token`` runs a verl trainer (a module name or a path to its file)."""
    module = token.removesuffix(".py").replace("/", ".").lstrip(".")
    last = module.rsplit(".", 1)[-1]
    return any(module == m or module.endswith("." + m) for m in ENTRY_MODULES) or (
        module.startswith(("verl.", "recipe.")) and last.startswith("main_") and last not in NOT_RL
    ) or (token.endswith(".py") and last.startswith("main_ppo"))  # a copy, e.g. main_ppo_split.py


def _runs_verl(token: str) -> bool:
    """Any verl module (an SFT trainer, generation): named when no RL trainer is found."""
    return token.replace("/", ".").lstrip(".").startswith(("verl.", "recipe."))


@dataclass(frozen=True)
class VerlInvocation:
    """What a verl command line says: the entry point, the config name, and the overrides."""

    entry: str
    config_name: str
    config_file: Path | None
    overrides: tuple[str, ...]
    config_path: str = ""

    def config_warnings(self) -> tuple[str, ...]:
        """A config the command names that was not found: its settings are not read."""
        if self.config_file is not None or self.config_name in VERL_CONFIGS:
            return ()
        where = f" in {self.config_path}" if self.config_path else " next to the script"
        return (f"--config-name {self.config_name}: no {self.config_name}.yaml{where}; its settings are not read "
                "(verl's defaults and the overrides stand in; --config-name is read for its trainer only)",)

    def recipe(self) -> str:
        """``fully_async``, ``one_step_off`` or ``main``: which trainer the command runs."""
        text = f"{self.entry} {self.config_name}"
        if "fully_async" in text:
            return "fully_async"
        if "one_step_off" in text:
            return "one_step_off"
        return "main"

    def base_tree(self) -> dict[str, Any]:
        """The configuration the overrides apply to (what the config name implies)."""
        if self.config_file is not None:
            from rlperf.frameworks.hydra_compose import compose

            return compose(self.config_file)
        tree: dict[str, Any] = {}
        if "megatron" in self.config_name:
            for role in _MEGATRON_ROLES:
                node = tree
                for part in role.split("."):
                    node = node.setdefault(part, {})
                node["strategy"] = "megatron"
        return tree


def parse_invocation(entry: str, args: Sequence[str], script_dir: Path | None) -> VerlInvocation:
    """Split Hydra's own arguments (``--config-path``, ``--config-name``, ``-cn``) from overrides."""
    overrides: list[str] = []
    path = name = ""
    i = 0
    while i < len(args):
        arg = args[i]
        flag, eq, value = arg.partition("=")
        if flag in ("--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"):
            if not eq and i + 1 < len(args):
                value, i = args[i + 1], i + 1
            if flag in ("--config-path", "-cp"):
                path = value
            elif flag in ("--config-name", "-cn"):
                name = value
        elif not arg.startswith("-"):
            overrides.append(arg)
        i += 1
    name = name.removesuffix(".yaml")
    file = _config_file(script_dir, path, name, entry) if name and script_dir is not None else None
    return VerlInvocation(entry, name or "ppo_trainer", file, tuple(overrides), path)


# verl's own trainer configs (shipped in its package and recipes): read by their name (module
# docstring) when the file is not beside the script
VERL_CONFIGS = tuple(f"{recipe}{kind}" for recipe in ("", "one_step_off_", "fully_async_", "dapo_")
                     for kind in ("ppo_trainer", "ppo_megatron_trainer")) + ("dapo_trainer", "dapo_megatron_trainer")


def _config_file(script_dir: Path, path: str, name: str, entry: str) -> Path | None:
    """``<path>/<name>.yaml``: relative to the script's folder, or (Hydra's rule for a relative
    ``--config-path``) to the entry module's folder, looked up in the folders above the script
    (the repository it runs from); a path the script computes (``$(pwd)/examples/x/config``) by
    what follows the computed part. verl's own configs are read by their name, not composed."""
    candidate = script_dir / (path or ".") / f"{name}.yaml"
    if candidate.is_file() or name in VERL_CONFIGS:
        return candidate if candidate.is_file() else None
    module = entry.removesuffix(".py").replace(".", "/").rsplit("/", 1)[0] if "." in entry.removesuffix(".py") else ""
    # verl's entry points declare @hydra.main(config_path="config"): the default beside the module
    relative = path or "config"
    tails = [path.rsplit(NOT_RUN, 1)[1].strip("/")] if NOT_RUN in path else (
        [f"{module}/{relative}"] if module and not relative.startswith(("/", "~")) else [])
    for tail in tails:
        for folder in (script_dir, *script_dir.resolve().parents):
            found = folder / tail / f"{name}.yaml"
            if found.is_file():
                return found
    return None


def import_verl_script(
    path: str | Path,
    overrides: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    gpu: str = "H100",
    mean_response_tokens: float | None = None,
    model_config: str | None = None,
) -> tuple[ScenarioSpec, ImportReport]:
    """A scenario from a verl launch script; ``overrides`` apply after the script's own."""
    from rlperf.frameworks.verl_import import import_verl
    from rlperf.inputs import read_text

    p = Path(path)
    text = read_text(p, "script")
    try:
        reading = read_launch_script(text, is_verl_entry, env, p.parent)
    except SpecError as err:
        try:
            other = read_launch_script(text, _runs_verl, env, p.parent).invocation.entry
        except SpecError:
            raise err from None
        raise SpecError("script", f"runs {other}, not one of verl's RL trainers",
                        "verl.trainer.main_ppo and the recipes' main_* entry points") from None
    try:
        inv = parse_invocation(reading.invocation.entry, reading.invocation.args, p.parent)
        spec, report = import_verl(
            inv.base_tree(),
            [*inv.overrides, *overrides],
            gpu=gpu,
            mean_response_tokens=mean_response_tokens,
            recipe=inv.recipe(),
            source=f"{p.name} ({inv.entry}, config {inv.config_name})",
            model_config=model_config,
            env=Environment(reading.environment, reading.exported, reading.script_only, unread=reading.unused_set),
        )
    except SpecError as err:
        raise reading.explain(err) from None
    return spec, replace(report, warnings=reading.warnings + inv.config_warnings())

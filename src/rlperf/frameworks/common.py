"""Pieces shared by the importers and exporters: model names, the generic workload, pools.

A framework configuration names a checkpoint path, batch sizes and length caps, never the
length *distribution* of the responses. The importers fill that gap with the same generic rules
as the workload presets (rlperf.specs.workload_presets, from algorithms.md §6.2): responses
log-normal with sigma 1 and mean cap/3 after truncation, prompts log-normal with median
min(256, cap/4) and sigma 0.5, within-group correlation 0.5. Each import lists this as an
assumption; ``mean_response_tokens`` replaces the cap/3 rule when the user knows better.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from rlperf.algorithms.spec import KL, AlgorithmSpec
from pydantic import ValidationError

from rlperf.errors import SpecError, one_line
from rlperf.frameworks.shell_script import NOT_RUN
from rlperf.frameworks.report import Recorder
from rlperf.scenario import Scenario, ScenarioSpec, resolve_workload
from rlperf.specs.lengths import LogNormalLength
from rlperf.specs.parallel import TrainLayout
from rlperf.specs.plan import PLACEMENT_KEYS, Pool
from rlperf.specs.workload import Workload, workload_to_dict
from rlperf.specs.workload_presets import (
    GROUP_CORRELATION,
    MEAN_OVER_CAP,
    PROMPT_MEDIAN_TOKENS,
    PROMPT_SIGMA,
    RESPONSE_SIGMA,
)

TRAIN_ROLES = ("actor", "critic", "ref", "reward_model", "prm")
_HF_CACHE = re.compile(r"models--([^/]+?)--([^/]+)(?:/snapshots/[^/]*)?$")


def catalog_model(key: str, value: Any, rec: Recorder, *, actor: bool = False) -> str:
    """The catalog name of a checkpoint path or hub id (``/models/Qwen2.5-7B-Instruct`` ->
    ``Qwen2.5-7B``); a local folder holding a ``config.json`` is kept as a path.

    ``--model-config`` (``rec.model_config``) is the actor's model: for the actor's path
    (``actor``), and any other role's that names the same checkpoint, it wins over the catalog
    and over the folder's own config.json (an explicit option is never silently ignored); for
    another path it stands in only where the catalog does not know the id."""
    from rlperf.catalog import ALIASES, resolve_name

    if isinstance(value, bool) or value is None or not str(value).strip():  # `--pretrain` alone, `path=`
        raise SpecError(key, f"no model given (got {value!r})", "a hub id or a checkpoint path")
    text = str(value).rstrip("/")
    if rec.model_config is not None and (actor or text == rec.actor_model):
        rec.actor_model = text
        rec.map(key, value, f"model from {rec.model_config} (--model-config)")
        rec.assume(f"{key}: {text!r}: its shapes are read from {rec.model_config} (--model-config, which wins over the catalog)")
        return rec.model_config
    if (Path(text).expanduser() / "config.json").is_file():
        rec.map(key, value, "model (local config.json)")
        return text
    # The Hugging Face cache's layout: .../models--<org>--<name>/snapshots/<commit>.
    cached = _HF_CACHE.search(text)
    if cached:
        text = f"{cached.group(1)}/{cached.group(2)}"
    # A published alias of a catalog entry keeps its own name (an export then says what the
    # user wrote: DeepSeek-V3, not the entry with its shapes, DeepSeek-R1).
    alias = next((a for a in ALIASES if a.lower() == text.rsplit("/", 1)[-1].lower()), None)
    try:
        name = alias or resolve_name(text)
    except SpecError:
        name, why = _near_name(text)
        if not name and rec.model_config is not None:
            rec.map(key, value, f"model from {rec.model_config} (--model-config)")
            rec.assume(f"{key}: {text!r} is not in the catalog; its shapes are read from {rec.model_config}")
            return rec.model_config
        if not name:
            raise SpecError(key, f"{text!r} is not in the model catalog: pass its config.json with --model-config PATH") from None
        rec.assume(f"{key}: {text!r} read as {name} ({why})")
    rec.map(key, value, f"model {name}")
    return name


# Fine-tuned checkpoints (reward, value, SFT models) named after their base model, with what
# follows the marker: ``Llama-3-8b-sft-mixture``, ``Llama-3-8b-rm-700k``, ``Qwen2.5-7B-RM``.
_FINETUNE_MARKER = re.compile(r"-(rm|reward|prm|critic|value|sft)(-[\w.]+)*$", re.IGNORECASE)


_DIGIT_UNDERSCORE = re.compile(r"(?<=\d)_(?=\d)")


def _near_name(text: str) -> tuple[str, str]:
    """The catalog entry of a name the catalog does not know as written, and why: a fine-tune
    named after its base model, or a version written with ``_`` in a folder name (``Qwen2_5-7B``)."""
    from rlperf.catalog import resolve_name

    base = _strip_finetune_suffix(text)
    for candidate, why in ((base, "a fine-tune keeps its base model's shapes"),
                           (_DIGIT_UNDERSCORE.sub(".", text), "the version written with '_'"),
                           (_DIGIT_UNDERSCORE.sub(".", base), "a fine-tune keeps its base model's shapes")):
        if candidate != text:
            try:
                return resolve_name(candidate), why
            except SpecError:
                continue
    return "", ""


def _strip_finetune_suffix(text: str) -> str:
    return _FINETUNE_MARKER.sub("", text)


def build_spec(framework: str, name: str | None, model: str, parts: dict[str, Any],
               keys: Mapping[str, str] | None = None) -> ScenarioSpec:
    """The scenario of an import: ``parts`` holds cluster, workload, algorithm and plan mappings;
    a missing run name becomes ``<framework>-import``. Errors are one line naming the framework's
    key where ``keys`` (scenario field -> config key) knows it, else the scenario field."""
    from rlperf.errors import parse

    data = {"name": name if name is not None else f"{framework.lower()}-import", "model": model, **parts}
    where = f"{framework} import"
    try:
        return parse(ScenarioSpec, data, where=where)
    except SpecError as err:
        raise named(err, keys, where) from None


def named(err: SpecError, keys: Mapping[str, str] | None, where: str = "") -> SpecError:
    """``err`` under the framework key its scenario field came from, where ``keys`` knows it."""
    field = err.field.removeprefix(where + ".") if where else err.field
    for spec_field, key in (keys or {}).items():
        if field == spec_field or field.startswith(spec_field + "."):
            return SpecError(key, f"{err.problem} (as rlperf's {field})", err.allowed)
    return err


def generic_workload(
    prompts_per_step: int,
    group_size: int,
    prompt_cap_tokens: int,
    response_cap_tokens: int,
    mean_response_tokens: float | None,
    rec: Recorder,
    keys: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The workload mapping of an imported configuration (see the module docstring); a value the
    workload refuses is reported under its framework key (``keys``: scenario field -> key), a
    mean the caller gave under ``--mean-response-tokens``, the option that gave it."""
    given = mean_response_tokens is not None
    cap_key = (keys or {}).get("workload.response_length", "workload.response_length")
    mean = mean_response_tokens if mean_response_tokens is not None else response_cap_tokens * MEAN_OVER_CAP
    # The truncated log-normal takes a mean strictly between 1 token and the cap (LogNormalLength).
    if not (math.isfinite(mean) and 1 < mean < response_cap_tokens):
        if not given:  # the cap/3 rule's mean: the config's cap is what the user wrote
            raise SpecError(cap_key, f"{response_cap_tokens:,} tokens gives an assumed mean response length (cap/3) of "
                            f"{mean:.3g} tokens, not above 1 token", f">= {math.floor(1 / MEAN_OVER_CAP) + 1}, or give the "
                            "mean response length")
        shown = f"{mean:,.6g}" if math.isfinite(mean) and abs(mean) < 1e9 else f"{mean:.3g}"
        raise SpecError("--mean-response-tokens", f"{shown} tokens is not strictly between 1 and the response cap "
                        f"{response_cap_tokens:,} ({cap_key})", f"1 < mean < {response_cap_tokens:,}")
    if mean_response_tokens is None:
        rec.assume(f"mean response length {mean:,.0f} tokens = cap/3 (not in the config; algorithms.md §6.2)")
    else:
        rec.assume(f"mean response length {mean:,.0f} tokens (given by the caller)")
    rec.assume(
        f"lengths log-normal: responses sigma {RESPONSE_SIGMA:g}, prompts median"
        f" min({PROMPT_MEDIAN_TOKENS}, cap/4) sigma {PROMPT_SIGMA:g}; group correlation {GROUP_CORRELATION:g}"
    )
    where = "workload.prompt_length"
    try:
        prompt = LogNormalLength(
            median_tokens=min(PROMPT_MEDIAN_TOKENS, prompt_cap_tokens / 4), sigma=PROMPT_SIGMA, cap_tokens=prompt_cap_tokens
        )
        where = "workload.response_length"
        response = LogNormalLength.from_mean(mean, RESPONSE_SIGMA, response_cap_tokens)
        where = "workload"
        workload = Workload(
            prompts_per_step=prompts_per_step,
            group_size=group_size,
            prompt_length=prompt,
            response_length=response,
            group_length_correlation=GROUP_CORRELATION,
        )
    except ValidationError as err:
        raise named(one_line(err, where), keys) from None
    except SpecError as err:
        raise named(err, keys) from None
    return workload_to_dict(workload)


@dataclass(frozen=True)
class WorkloadCaps:
    """What a framework configuration can say about a workload."""

    prompts_per_step: int
    group_size: int
    prompt_cap_tokens: int
    response_cap_tokens: int


def workload_caps(spec: ScenarioSpec) -> WorkloadCaps:
    w = resolve_workload(spec.workload)
    return WorkloadCaps(w.prompts_per_step, w.group_size, w.max_prompt_tokens, w.max_response_tokens)


def workload_notes(spec: ScenarioSpec, framework: str) -> list[str]:
    """What an export drops of the workload: length distributions other than the generic rule
    (a configuration carries only the caps)."""
    caps = workload_caps(spec)
    scratch = Recorder(framework, "export")
    try:
        generic = generic_workload(
            caps.prompts_per_step, caps.group_size, caps.prompt_cap_tokens, caps.response_cap_tokens, None, scratch
        )
    except SpecError:  # a cap too short for the cap/3 rule: a re-import needs the mean given
        generic = None
    if {**dict(spec.workload), "max_total_tokens": None} == generic:  # the joint cap is said apart (max_model_len)
        return []
    mean = resolve_workload(spec.workload).response_length.mean_tokens()
    return [
        f"workload length distributions: {framework} configs hold only the caps; a re-import uses the"
        f" generic log-normal rule (pass mean_response_tokens={mean:.0f} to keep the mean)"
    ]


def check_runnable(sc: Scenario) -> None:
    """Refuse a plan the simulator refuses, with its error: the checks ``rlperf simulate`` makes
    before its first event (each role's layout against its model, the rollout engine's against
    the actor, every pool large enough for one model replica), made by building the simulator
    (:class:`rlperf.sim.simulate.Simulator`) without running it. An export calls this first: a
    config for such a plan would not run in the framework either."""
    from rlperf.sim.costs import AnalyticCosts
    from rlperf.sim.run import sim_config
    from rlperf.sim.simulate import Simulator

    Simulator(sim_config(sc), AnalyticCosts(sc, timeline=False))


def compact_layouts(layouts: dict[str, TrainLayout]) -> dict[str, TrainLayout]:
    """Drop the roles whose layout equals the actor's (``Plan.layout_for`` falls back to it)."""
    actor = layouts["actor"]
    return {r: lay for r, lay in layouts.items() if r == "actor" or lay != actor}


def resolved_pools(spec: ScenarioSpec) -> tuple[tuple[Pool, ...], dict[str, str], int]:
    """Concrete pools, the pool of every placement key, and the cluster's GPU count."""
    from rlperf.specs.hardware_catalog import load_accelerator

    c = spec.cluster
    gpn = c.gpus_per_node if c.gpus_per_node is not None else load_accelerator(c.gpu).gpus_per_node
    total = c.num_nodes * gpn
    pools, assign = spec.plan.placement.resolve(total)
    return pools, assign, total


def pool_size(pools: tuple[Pool, ...], name: str) -> int:
    return next(p.num_gpus for p in pools if p.name == name)


def run_algorithm(spec: ScenarioSpec) -> AlgorithmSpec:
    """The scenario's algorithm as it runs: with the KL term the scenario sets (``algorithm.kl``)."""
    from rlperf.algorithms import get_algorithm

    algo = get_algorithm(spec.algorithm.name)
    return algo if spec.algorithm.kl is None else algo.with_kl(spec.algorithm.kl)


def kl_setting(name: str, kl: KL) -> KL | None:
    """``algorithm.kl`` of an import: None where the run's KL term is the algorithm's own."""
    from rlperf.algorithms import get_algorithm

    return None if get_algorithm(name).kl == kl else kl


def roles_in_use(spec: ScenarioSpec) -> tuple[str, ...]:
    """The placement keys the scenario's algorithm uses (reward_model only for a model reward)."""
    algo = run_algorithm(spec)
    roles: set[str] = {s.role for s in algo.active_stages(updates_per_rollout=2)}
    if spec.algorithm.reward.kind != "model":
        roles.discard("reward_model")
    return tuple(k for k in PLACEMENT_KEYS if k in roles or k == "generate")


CONFIG_INT_MAX = 2**24  # above any count, size or degree a framework config sets (tokens per GPU: ~1e6)


def _not_a_number(key: str, what: str, value: Any) -> SpecError:
    hint = ""
    if isinstance(value, str) and NOT_RUN in value:
        hint = " (a command substitution the script computes; give its variable with --set NAME=VALUE)"
    elif isinstance(value, str) and "${" in value:  # oc.env, eval and other resolvers are not run
        hint = " (an interpolation rlperf does not resolve; give the value itself as an override)"
    return SpecError(key, f"expected {what}, got {value!r}{hint}")


def as_int(key: str, value: Any, lo: int = 1, hi: int = CONFIG_INT_MAX) -> int:
    """A framework config's integer: sizes, counts and degrees are >= 1 (``lo=0`` where 0 means
    something, e.g. ZeRO stage 0); a 0 would divide by zero further on, a huge one never ends."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _not_a_number(key, "an integer", value)
    try:
        n = int(value)
    except ValueError:
        raise _not_a_number(key, "an integer", value) from None
    if not lo <= n <= hi:
        raise SpecError(key, f"{n} is out of range", f"{lo:,} to {hi:,}")
    return n


def as_float(key: str, value: Any, lo: float | None = None, hi: float | None = None) -> float:
    """A framework config's number: finite, and within ``[lo, hi]`` where given."""
    if isinstance(value, bool):
        raise _not_a_number(key, "a number", value)
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise _not_a_number(key, "a number", value) from None
    if not math.isfinite(x) or (lo is not None and x < lo) or (hi is not None and x > hi):
        span = f"{lo:g} to {hi:g}" if lo is not None and hi is not None else (
            f">= {lo:g}" if lo is not None else (f"<= {hi:g}" if hi is not None else "a finite number"))
        raise SpecError(key, f"{x:g} is out of range", span)
    return x


def as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise SpecError(key, f"expected True or False, got {value!r}")


def power_of_two_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p

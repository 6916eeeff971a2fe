"""Scenario files: model, cluster, workload, algorithm and plan in one YAML document.

A scenario is validated once here (one-line errors naming the field) and then resolved into
concrete specs (ModelSpec, Cluster, Workload, AlgorithmSpec, Plan) for the simulator.

```yaml
name: grpo-qwen2.5-7b
model: Qwen2.5-7B            # catalog name or path to a config.json
cluster: {gpu: H100, num_nodes: 8, gpus_per_node: 8}
workload: {preset: deepscaler-8k}          # or a full workload mapping
algorithm: {name: GRPO, minibatches: 4, reward: {kind: rule}}
plan:
  placement: {kind: colocated}
  rollout: {tp: 2}
  layouts: {actor: {tp: 1, zero_stage: 3}}
  mode: {kind: sync}
simulation: {iterations: 4, warmup: 1}
```

Every section may be left out; a missing one takes its default (the simulate output names the
scenario, not the model or the cluster, so check these when a file omits them):

- ``model``: ``Qwen2.5-7B``;
- ``cluster``: one node of ``H100``, ``gpus_per_node`` the accelerator's NVLink domain (8);
- ``workload``: ``{preset: deepscaler-8k}``;
- ``algorithm``: ``GRPO`` with its default epochs and mini-batches, a rule reward;
- ``plan``: colocated, ``mode: {kind: sync}``, one engine layout and the ``actor`` training layout
  for every role (a layout's ``dp`` is derived from its pool: leave it out, or set that value);
- ``simulation``: ``{iterations: 4, warmup: 1}``.

A field a section's kind does not read is refused rather than ignored: ``plan.mode`` fields of
other mode kinds (``ExecutionMode.USED_BY``), ``plan.placement.rollout_gpus`` / ``pools`` /
``assign`` outside ``disaggregated`` / ``hybrid``, ``algorithm.critic_model`` and
``plan.layouts.critic`` under an algorithm without a critic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from rlperf.inputs.ranges import GPUS, GpusPerNode, NumEpochs, NumGpus, NumIterations, NumMinibatches, NumNodes, NumWorkers, TaskSeconds
from rlperf.algorithms import AlgorithmSpec, get_algorithm
from rlperf.algorithms.spec import KL
from rlperf.errors import SpecError, parse, show_path
from rlperf.specs.base import Spec
from rlperf.specs.hardware import Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.plan import Plan
from rlperf.specs.workload import Workload, workload_from_dict


class ClusterSpec(Spec):
    gpu: str = "H100"
    num_nodes: NumNodes = 1
    gpus_per_node: GpusPerNode | None = None  # default: the accelerator's NVLink domain
    # total GPUs instead of num_nodes: whole domains and a partial last one (128 GB200 = 72 + 56)
    num_gpus: NumGpus | None = None
    profile: str | None = None  # path to a hardware profile file (e.g. from `rlperf calibrate`)

    @model_validator(mode="after")
    def _check_total(self) -> ClusterSpec:
        if self.gpus_per_node is not None:  # else the accelerator's domain: checked by Cluster
            GPUS.require("num_nodes", self.num_gpus or self.num_nodes * self.gpus_per_node)
        return self


class RewardSpec(Spec):
    """How rewards are computed.

    - rule: a CPU verifier (answer extraction + equivalence); ``cpu_s_per_sample`` on
      ``cpu_workers`` parallel workers (algorithms.md §5.3: small per response, parallel).
    - sandbox: code execution; per-sample latency log-normal with median ``sandbox_median_s``
      and log-sigma ``sandbox_sigma`` on ``cpu_workers`` containers.
    - model: a reward model forward pass over prompt+response on GPUs (``reward_model`` role).
    """

    kind: Literal["rule", "sandbox", "model"] = "rule"
    cpu_s_per_sample: TaskSeconds = 0.005
    cpu_workers: NumWorkers = 32
    sandbox_median_s: TaskSeconds = Field(default=1.0, gt=0)
    sandbox_sigma: float = Field(default=0.8, ge=0, le=10)
    model: str | None = None  # reward model (catalog name/path); default: the actor's model


class AlgorithmConfig(Spec):
    name: str = "GRPO"
    epochs: NumEpochs | None = None
    minibatches: NumMinibatches | None = None  # optimizer updates per epoch
    keep_rate: float = Field(default=0.5, gt=0, le=1)  # dynamic sampling: expected share of groups kept
    reward: RewardSpec = RewardSpec()
    critic_model: str | None = None  # default: the actor's model
    # when the old-policy log-prob pass runs: with more than one update per rollout (or a KL in
    # the reward), or every step (verl runs old_log_prob regardless, for metrics), or never: the
    # rollout engine's log-probs stand in (verl fully_async ``use_rollout_log_probs``)
    old_logprob: Literal["when_needed", "always", "rollout"] = "when_needed"
    # the KL term when the run differs from the algorithm's default (None: the algorithm's):
    # "none" drops the reference model and its log-prob pass; k1_reward / k3_loss turn it on
    kl: KL | None = None


class SimulationSpec(Spec):
    iterations: NumIterations = 4
    warmup: int = Field(default=1, ge=0, le=10_000)


class ModelOverrides(Spec):
    """Fields of the actor's config.json that the run overrides (verl
    ``actor_rollout_ref.model.override_config``, or a config.json edited by hand)."""

    max_position_embeddings: int | None = Field(default=None, gt=0, le=2**30)
    """The actor's position limit (RoPE models run past their trained length when told to)."""


class ScenarioSpec(Spec):
    name: str = "scenario"
    model: str = "Qwen2.5-7B"
    model_overrides: ModelOverrides = ModelOverrides()
    cluster: ClusterSpec = ClusterSpec()
    workload: dict[str, Any] = Field(default_factory=lambda: {"preset": "deepscaler-8k"})
    algorithm: AlgorithmConfig = AlgorithmConfig()
    plan: Plan = Plan()
    simulation: SimulationSpec = SimulationSpec()


@dataclass(frozen=True)
class Scenario:
    """A resolved scenario: concrete specs, ready to cost and simulate."""

    spec: ScenarioSpec
    models: dict[str, ModelSpec]  # role -> model (actor, critic, ref, reward_model, prm)
    cluster: Cluster
    workload: Workload
    algorithm: AlgorithmSpec

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def plan(self) -> Plan:
        return self.spec.plan

    @property
    def epochs(self) -> int:
        return self.spec.algorithm.epochs or self.algorithm.default_epochs

    @property
    def minibatches(self) -> int:
        return self.spec.algorithm.minibatches or self.algorithm.default_minibatches

    def with_plan(self, plan: Plan) -> Scenario:
        return Scenario(self.spec.model_copy(update={"plan": plan}), self.models, self.cluster, self.workload, self.algorithm)


def resolve_workload(data: Mapping[str, Any]) -> Workload:
    data = dict(data)
    preset = data.pop("preset", None)
    if preset is None:
        return workload_from_dict(data)
    from rlperf.specs.workload_presets import load_workload_preset

    return load_workload_preset(str(preset), **data)


def resolve(spec: ScenarioSpec) -> Scenario:
    from rlperf.catalog import load_model
    from rlperf.specs.hardware_catalog import make_cluster

    actor = load_model(spec.model)
    if spec.model_overrides.max_position_embeddings is not None:
        actor = actor.model_copy(update={"max_position_embeddings": spec.model_overrides.max_position_embeddings})
    models = {"actor": actor, "ref": actor, "prm": actor}
    models["critic"] = _load_named(spec.algorithm.critic_model, "algorithm.critic_model") or actor
    models["reward_model"] = _load_named(spec.algorithm.reward.model, "algorithm.reward.model") or actor
    c = spec.cluster
    nodes = c.num_nodes if c.num_gpus is None or "num_nodes" in c.model_fields_set else None
    cluster = make_cluster(c.gpu, num_gpus=c.num_gpus, num_nodes=nodes, gpus_per_node=c.gpus_per_node, profile_path=c.profile)
    workload = resolve_workload(spec.workload)
    _check_positions(models, workload)
    algorithm = get_algorithm(spec.algorithm.name)
    _check_critic(spec, algorithm)
    if spec.algorithm.old_logprob == "always":
        algorithm = algorithm.with_old_logprob_always()
    elif spec.algorithm.old_logprob == "rollout":
        algorithm = algorithm.with_rollout_logprobs()
    if spec.algorithm.kl is not None:
        try:
            algorithm = algorithm.with_kl(spec.algorithm.kl)
        except ValueError as err:
            raise SpecError("algorithm.kl", str(err), "none") from None
    minibatches = spec.algorithm.minibatches
    if minibatches is not None and minibatches > workload.num_responses:  # each needs a sequence
        raise SpecError("algorithm.minibatches", f"{minibatches} mini-batches for {workload.num_responses} responses "
                        "per step", f"1 to {workload.num_responses:,}")
    if spec.simulation.warmup >= spec.simulation.iterations:
        raise SpecError("simulation.warmup", f"must be < iterations ({spec.simulation.iterations})")
    return Scenario(spec, models, cluster, workload, algorithm)


def _check_critic(spec: ScenarioSpec, algorithm: AlgorithmSpec) -> None:
    """A critic's model or layout under an algorithm that trains no critic would be ignored."""
    if "critic" in algorithm.roles:
        return
    from rlperf.algorithms.registry import list_algorithms

    with_critic = ", ".join(a.name for a in list_algorithms() if "critic" in a.roles)
    for field, value in (("algorithm.critic_model", spec.algorithm.critic_model),
                         ("plan.layouts.critic", spec.plan.layouts.get("critic"))):
        if value is not None:
            raise SpecError(field, f"{algorithm.name} has no critic", f"only with an algorithm that trains one ({with_critic})")


def _load_named(name: str | None, field: str) -> ModelSpec | None:
    """The model ``name`` at scenario key ``field`` (an error names that key, not ``model``)."""
    from rlperf.catalog import load_model

    if not name:
        return None
    try:
        return load_model(name)
    except SpecError as err:
        raise (SpecError(field, err.problem, err.allowed, err.source) if err.field == "model" else err) from None


def check_positions(spec: ScenarioSpec, caps: str, lift: str) -> None:
    """:func:`_check_positions` of the scenario's actor, its errors naming ``caps`` (where the
    length caps are set) and ``lift`` (how the run raises the model's position limit): an
    importer names its framework's keys."""
    from rlperf.catalog import load_model

    actor = load_model(spec.model)
    if spec.model_overrides.max_position_embeddings is not None:
        actor = actor.model_copy(update={"max_position_embeddings": spec.model_overrides.max_position_embeddings})
    _check_positions({"actor": actor}, resolve_workload(spec.workload), caps, lift)


def _check_positions(models: Mapping[str, ModelSpec], workload: Workload, caps: str = "workload",
                     lift: str = "model_overrides.max_position_embeddings") -> None:
    """Each model can position the workload's longest sequence (prompt cap + response cap, or
    ``max_total_tokens``):

    - learned positions (GPT-2, OPT, StarCoder) cannot run past their table: an error;
    - rotary positions past ``max_position_embeddings`` and past what the config's rope_scaling
      extends them to: an error (vLLM refuses a ``max_model_len`` beyond the length it derives
      from the config; verl asserts it, or truncates responses at ``max_position_embeddings``);
    - rotary positions past ``max_position_embeddings`` but within the rope_scaling: a warning
      (vLLM runs it; verl's rollout checks ``max_model_len`` against ``max_position_embeddings``).
    """
    import warnings

    longest = workload.max_sequence_tokens
    both = f"prompt cap {workload.max_prompt_tokens:,} + response cap {workload.max_response_tokens:,}"
    length = (f"sequences of up to {longest:,} tokens ({both}" + (
        f", max_total_tokens {workload.max_total_tokens:,})" if workload.max_total_tokens is not None else ")"))
    for role, model in models.items():
        field = lift if role == "actor" else {
            "critic": "algorithm.critic_model", "reward_model": "algorithm.reward.model"}.get(role, "model")
        limit = model.max_sequence_tokens
        if limit is not None and longest > limit:
            raise SpecError(
                "workload.max_total_tokens",
                f"sequences of up to {longest} tokens exceed the {limit} learned positions of {model.name}",
                f"<= {limit}",
            )
        if longest <= model.max_position_embeddings:
            continue
        scaled = model.rope_scaled_positions
        if scaled is None or longest > scaled:
            reach = f", rope_scaling to {scaled:,}" if scaled is not None else ", no rope_scaling"
            raise SpecError(
                caps, f"{length} exceed the {model.trained_positions:,} positions of {model.name} "
                f"(max_position_embeddings {model.max_position_embeddings:,}{reach}): vLLM refuses such a "
                "max_model_len, verl asserts or truncates",
                f"caps within {model.trained_positions:,}, or {field} >= {longest:,}",
            )
        warnings.warn(
            f"{caps}: {length} pass the max_position_embeddings {model.max_position_embeddings:,} of "
            f"{model.name} and rely on its rope_scaling (up to {scaled:,}): vLLM runs them, verl's rollout "
            "refuses a max_model_len beyond max_position_embeddings", UserWarning, stacklevel=3)


def load_scenario(source: str | Path | Mapping[str, Any]) -> Scenario:
    """Read a scenario from a YAML file, a shipped example name, or a mapping."""
    if isinstance(source, Mapping):
        return _checked(resolve(load_scenario_spec(source)))
    path = scenario_path(source)
    try:
        return _checked(resolve(load_scenario_spec(path)))
    except SpecError as err:
        raise err.in_source(path) from None


@dataclass(frozen=True)
class _Placed:
    """The scenario's placement resolved once for its checks: each role's (and ``generate``'s)
    pool, and the GPUs of every pool."""

    assign: Mapping[str, str]
    pool_gpus: Mapping[str, int]

    def gpus(self, role: str) -> int:
        return self.pool_gpus[self.assign[role]]


def _checked(sc: Scenario) -> Scenario:
    """The checks a scenario the user wrote gets on top of its fields' own (plans the planner
    builds skip them): fields that would be replaced or cannot run, then the warnings."""
    pools, assign = sc.spec.plan.placement.resolve(sc.cluster.num_gpus)
    placed = _Placed(assign, {p.name: p.num_gpus for p in pools})
    _check_dp(sc, placed)
    _check_token_budget(sc)
    _warn_idle_gpus(sc, placed)
    _warn_shared_engine(sc, placed)
    return sc


def _check_dp(sc: Scenario, placed: _Placed) -> None:
    """A layout's ``dp`` is derived from its pool (``pool GPUs // (tp·pp·cp)``, rlperf.sim.costs):
    a value the user wrote that differs would be silently replaced, so it is refused."""
    for role, lay in sc.spec.plan.layouts.items():
        mp = lay.tp * lay.pp * lay.cp
        derived = placed.gpus(role) // mp
        if "dp" in lay.model_fields_set and derived >= 1 and lay.dp != derived:
            raise SpecError(f"plan.layouts.{role}.dp", f"{lay.dp} differs from the dp derived from its pool: "
                            f"{placed.gpus(role)} GPUs // tp·pp·cp {mp} = {derived}", f"{derived}, or leave dp out")


def _check_token_budget(sc: Scenario) -> None:
    """A partial rollout trains, after its first call, only the first step's responses of at most
    ``token_budget`` tokens (the others are carried over); each of the ``minibatches``
    optimizer steps needs one, so fewer than ``minibatches`` such responses in the first step's
    draw (the simulator's, rlperf.sim.run) cannot be trained. The smallest budget that works is
    that draw's ``minibatches``-th shortest response."""
    budget = sc.plan.mode.token_budget  # a partial rollout's only (ExecutionMode.USED_BY)
    if budget is None:
        return
    lengths = np.sort(np.asarray(sc.workload.sample(0).response_tokens).ravel())
    need = min(sc.minibatches, lengths.size)
    short = int(np.count_nonzero(lengths <= budget))
    if short < need:
        raise SpecError("plan.mode.token_budget", f"{budget:,} tokens per call: {short} of the first step's {lengths.size:,} "
                        f"responses are that short, fewer than the {need} mini-batches that train them",
                        f">= {int(lengths[need - 1]):,} (or fewer algorithm.minibatches)")


def _warn_shared_engine(sc: Scenario, placed: _Placed) -> None:
    """A warning where a pipelined mode (one-step-off, async) runs its rollout on the actor's
    GPUs with the engine put to sleep for training: waking it loads the newest weights, so the
    loop is synchronous (rlperf.modes.Mode.weights_for_rollout). A legitimate degenerate case,
    not an error (the planner and what-ifs build such plans), but the user asked for staleness."""
    import warnings

    from rlperf.modes import mode_of

    plan = sc.spec.plan
    shared = plan.offload_between_phases and placed.assign["generate"] == placed.assign["actor"]
    mode = mode_of(plan.mode)
    if shared and not mode.carries_unfinished and mode.effective_staleness(True) < mode.effective_staleness(False):
        where = "a colocated placement" if plan.placement.kind == "colocated" else "the actor's pool"
        warnings.warn(f"plan.mode: {mode.label} on {where} runs synchronously: rollout and training share the GPUs "
                      "(staleness 0; plan.offload_between_phases: false keeps the engine awake)", UserWarning, stacklevel=2)


def _warn_idle_gpus(sc: Scenario, placed: _Placed) -> None:
    """A warning for each layout whose model-parallel group does not divide its pool: the
    simulator runs ``pool // group`` replicas and the rest of the pool idles in that phase
    (verl and OpenRLHF refuse such a layout; the planner never proposes one)."""
    import warnings

    plan = sc.spec.plan
    groups = [("plan.rollout", "tp·pp", plan.rollout.tp * plan.rollout.pp, placed.gpus("generate"))]
    for role in plan.layouts:
        lay = plan.layouts[role]
        groups.append((f"plan.layouts.{role}", "tp·pp·cp", lay.tp * lay.pp * lay.cp, placed.gpus(role)))
    for field, what, group, gpus in groups:
        if gpus % group and group <= gpus:
            warnings.warn(f"{field}: {what} = {group} does not divide the {gpus} GPUs of its pool; "
                          f"{gpus % group} of them idle in that phase", UserWarning, stacklevel=2)


def scenario_path(source: str | Path) -> Path:
    """The file of a scenario: ``source`` itself, or the shipped example of that name."""
    path = Path(source)
    try:
        exists = path.exists()
    except OSError:  # e.g. a name too long for the file system: reported by the loader
        exists = True
    if not exists:
        shipped = Path(__file__).parent / "scenarios" / f"{source}.yaml"
        if "/" in str(source) or str(source).endswith((".yaml", ".yml", ".json")):
            raise SpecError("scenario", f"file not found: {source}", "an existing file, or a shipped example (rlperf scenarios)")
        if not shipped.is_file():
            from rlperf.errors import unknown_name

            raise unknown_name("scenario", str(source), list_scenarios())
        path = shipped
    return path


def check_sections(data: Mapping[str, Any], path: Path, keys: tuple[str, ...]) -> None:
    """Refuse a section of a scenario file that is not a mapping (before code edits it as one)."""
    for key in keys:
        if not isinstance(data.get(key) or {}, dict):
            raise SpecError(key, f"must be a mapping, got {type(data[key]).__name__}", source=show_path(path))


def read_scenario_data(source: str | Path) -> dict[str, Any]:
    """The raw mapping of a scenario file (checked by the input layer), before validation."""
    from rlperf.inputs import load_yaml

    path = scenario_path(source)
    data = load_yaml(path, "scenario")
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise SpecError("<root>", f"the document is {kind}", "a mapping of scenario fields", show_path(path))
    return data


def load_scenario_spec(source: str | Path | Mapping[str, Any]) -> ScenarioSpec:
    """The validated, unresolved spec of a scenario (e.g. to change the cluster before resolving)."""
    if isinstance(source, Mapping):
        return parse(ScenarioSpec, dict(source))
    data = _model_paths_near(read_scenario_data(source), scenario_path(source).parent)
    try:
        return parse(ScenarioSpec, data)
    except SpecError as err:
        raise err.in_source(scenario_path(source)) from None


def _model_paths_near(data: dict[str, Any], base: Path) -> dict[str, Any]:
    """Relative config.json paths of the actor, critic and reward model, read from the
    scenario's folder (a catalog name or a path valid from here is kept)."""
    from rlperf.catalog import model_ref_near

    if isinstance(data.get("model"), str):
        data = {**data, "model": model_ref_near(data["model"], base)}
    algo = data.get("algorithm")
    if isinstance(algo, dict):
        algo = dict(algo)
        if isinstance(algo.get("critic_model"), str):
            algo["critic_model"] = model_ref_near(algo["critic_model"], base)
        reward = algo.get("reward")
        if isinstance(reward, dict) and isinstance(reward.get("model"), str):
            algo["reward"] = {**reward, "model": model_ref_near(reward["model"], base)}
        data = {**data, "algorithm": algo}
    return data


def list_scenarios() -> list[str]:
    d = Path(__file__).parent / "scenarios"
    return sorted(p.stem for p in d.glob("*.yaml"))

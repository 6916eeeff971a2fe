"""verl configuration (``ppo_trainer.yaml`` plus Hydra overrides) -> rlperf ScenarioSpec.

Which trainer a configuration is for is read from its keys (the entry point is not part of it):

- ``async_training.*`` present: the fully-async recipe (``recipe/fully_async_policy``): rollout
  and trainer on separate pools (``rollout.nnodes x rollout.n_gpus_per_node`` and
  ``trainer.nnodes x trainer.n_gpus_per_node``). One rlperf step is one parameter sync, i.e.
  ``trigger_parameter_sync_step x require_batches`` mini-batches of ``ppo_mini_batch_size``
  prompts (the recipe README's rule for comparing with the colocated trainer), trained in
  ``trigger_parameter_sync_step`` local updates as the samples stream in (``train_parts``). With
  ``partial_rollout`` the threshold ``t`` is kept exactly (mode ``streaming``: a share ``t`` of a
  batch runs ahead with the old weights); without it the rollouter waits for its requests at a
  sync, so samples are at most ``ceil(t)`` versions old (README: "staleness_threshold = 1 is
  basically one step off policy"): mode ``async`` with ``staleness = ceil(t)``. ``t = 0`` with
  more than one local update is verl's stream off-policy pipeline (``streaming``, threshold 0);
  with one, synchronous. The rollouter streams whole prompt groups, at most 16 per server in
  flight (``fully_async_rollouter.py``: ``max_concurrent_samples = servers x 16``; not a key):
  ``groups_per_engine: 16``. ``use_rollout_log_probs`` (default true) drops the old-policy log-prob
  pass (``algorithm.old_logprob: rollout``).
- ``rollout.nnodes`` / ``rollout.n_gpus_per_node`` present: the one-step-off recipe
  (``recipe/one_step_off_policy``): disaggregated, mode ``one_step_off``.
- otherwise the main trainer: everything colocated on ``trainer.nnodes x trainer.n_gpus_per_node``
  (the hybrid engine), synchronous.

Mappings (verl key -> rlperf field):

- ``data.train_batch_size`` -> prompts per step; ``rollout.n`` -> group size;
  ``data.max_prompt_length`` / ``max_response_length`` -> the length caps.
- ``ppo_epochs`` -> epochs; ``train_batch_size / ppo_mini_batch_size`` -> mini-batches (verl
  counts mini-batches in prompts, algorithms.md §2).
- ``algorithm.adv_estimator`` (+ ``norm_adv_by_std_in_grpo``, ``policy_loss.loss_mode``,
  ``algorithm.filter_groups.enable``) -> the algorithm.
- strategy ``fsdp``/``fsdp2`` -> ZeRO-3 with Ulysses ``cp``; ``megatron`` -> tp/pp/vpp/cp (ring)
  /ep with the distributed optimizer as ZeRO-1.
- ``param_offload``/``optimizer_offload``/``grad_offload`` of any role -> the plan's
  ``offload_between_phases`` (verl moves the states to host while the other phase runs).
- Megatron ``<role>.optim.override_optimizer_config.optimizer_cpu_offload`` with
  ``optimizer_offload_fraction`` 1 -> the role's ``offload_optimizer`` (Megatron-Core's CPU
  optimizer: states on host during the update, the Adam step on the CPU).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlperf.algorithms import get_algorithm
from rlperf.algorithms.spec import KL
from rlperf.errors import SpecError
from rlperf.frameworks.common import (
    as_bool,
    as_float,
    as_int,
    build_spec,
    catalog_model,
    compact_layouts,
    generic_workload,
    kl_setting,
)
from rlperf.frameworks.shell_script import unused_set_error
from rlperf.frameworks.config_tree import (
    Environment,
    KeyReader,
    apply_overrides,
    classify_rest,
    flatten,
    resolve,
)
from rlperf.frameworks.report import ImportReport, Recorder
from rlperf.frameworks.verl_keys import (
    ADV_ESTIMATORS,
    DEFAULTS,
    ENGINE_DTYPES,
    IGNORED,
    MEGATRON_DEFAULTS,
    ROLE_BASE,
    ROLE_FSDP,
    ROLE_MICRO,
    ROLE_MODEL,
    ROLE_RECOMPUTE,
    UNSUPPORTED,
    VERL_GROUPS_PER_SERVER,
)
from rlperf.scenario import ScenarioSpec, check_positions
from rlperf.specs.parallel import TrainLayout

ROLLOUT = "actor_rollout_ref.rollout"
ACTOR = "actor_rollout_ref.actor"
# Where a script lifts the actor's position limit (the recipes for Qwen2.5-Math-7B, 4,096 in its
# config.json, set 32,768); verl passes override_config into the HF config it loads.
POSITION_OVERRIDES = (
    "actor_rollout_ref.model.override_config.max_position_embeddings",
    "actor_rollout_ref.model.override_config.model_config.max_position_embeddings",
)
# Scenario field -> the verl key it is read from, so that a value the scenario refuses is reported
# under the key the user wrote (build_spec).
SOURCE_KEYS = {
    "cluster.num_nodes": "trainer.nnodes",
    "cluster.gpus_per_node": "trainer.n_gpus_per_node",
    "workload.prompts_per_step": "data.train_batch_size",
    "workload.group_size": f"{ROLLOUT}.n",
    "workload.response_length": "data.max_response_length",
    "workload.prompt_length": "data.max_prompt_length",
    "algorithm.epochs": f"{ACTOR}.ppo_epochs",
    "plan.rollout.gpu_memory_utilization": f"{ROLLOUT}.gpu_memory_utilization",
    "plan.rollout.max_num_seqs": f"{ROLLOUT}.max_num_seqs",
    "plan.rollout.max_num_batched_tokens": f"{ROLLOUT}.max_num_batched_tokens",
    "plan.layouts.actor.micro_batch_size": f"{ACTOR}.ppo_micro_batch_size_per_gpu",
    "plan.layouts.actor.max_tokens_per_microbatch": f"{ACTOR}.ppo_max_token_len_per_gpu",
    "model_overrides.max_position_embeddings": POSITION_OVERRIDES[0],
}


def import_verl(
    config: str | Path | Mapping[str, Any] | None,
    overrides: Sequence[str] = (),
    *,
    gpu: str = "H100",
    mean_response_tokens: float | None = None,
    recipe: str | None = None,
    source: str | None = None,
    model_config: str | None = None,
    env: Environment | None = None,
) -> tuple[ScenarioSpec, ImportReport]:
    """A scenario from a verl YAML file (or mapping, or None for verl's defaults) and overrides.

    ``recipe`` (``main``, ``one_step_off``, ``fully_async``) is the trainer the entry point
    names, when known; otherwise it is read from the keys. A YAML file's ``defaults:`` list is
    composed as Hydra would. ``env`` is what ``${oc.env:NAME}`` reads (default: this process's
    environment); references to keys the configuration leaves out read verl's defaults."""
    from rlperf.frameworks.hydra_compose import compose

    if config is None:
        tree: Mapping[str, Any] = {}
        label = f"{len(overrides)} command-line overrides"
    else:
        tree, label = (config, "a mapping") if isinstance(config, Mapping) else (compose(config), str(config))
        if overrides:
            label += f" + {len(overrides)} overrides"
    resolved = resolve(apply_overrides(flatten(tree), overrides), DEFAULTS, env)
    unused = {n: why for n, why in (env.unread if env is not None else {}).items() if n not in resolved.env_names}
    if unused:
        raise unused_set_error(unused)
    rec = Recorder("verl", source or label, model_config)
    for expr, value in sorted(resolved.env_reads.items()):
        rec.assume(f"{expr} = {value}")
    r = KeyReader(resolved.flat, rec, resolved.unresolved)
    return _Importer(r, gpu, mean_response_tokens, recipe).run()


class _Importer:
    def __init__(self, r: KeyReader, gpu: str, mean_response_tokens: float | None, recipe: str | None = None) -> None:
        self.recipe_hint = recipe
        self.recipe = "main"
        self.models: dict[str, str] = {}
        self.r = r
        self.rec = r.rec
        self.gpu = gpu
        self.mean_response_tokens = mean_response_tokens
        self.offload = False
        self.caps = (0, 0)  # (prompt cap, response cap), read with the batches
        self.mini_sequences = 0  # ppo_mini_batch_size x rollout.n, read with the batches

    def get(self, key: str, note: str = "") -> Any:
        return self.r.get(key, DEFAULTS.get(key), note)

    def get_int(self, key: str, note: str) -> int:
        value = as_int(key, self.get(key))
        self.rec.map(key, value, note)
        return value

    # ------------------------------------------------------------------ top level
    def run(self) -> tuple[ScenarioSpec, ImportReport]:
        recipe = self.recipe = self._recipe()
        model = catalog_model("actor_rollout_ref.model.path", self._required("actor_rollout_ref.model.path"), self.rec, actor=True)
        algorithm = self._algorithm(model)
        self.models = {"actor": model, "critic": algorithm.get("critic_model") or model}
        roles = self._roles(algorithm["name"], algorithm.get("kl"), algorithm["reward"]["kind"] == "model")
        cluster, placement, train_gpus, rollout_gpus = self._cluster(recipe)
        workload, minibatches = self._batches(recipe)
        algorithm["minibatches"] = minibatches
        if recipe == "fully_async":
            key = "async_training.use_rollout_log_probs"
            if as_bool(key, self.get(key)):
                self.rec.map(key, True, "old-policy log-probs from the rollout: no old_log_prob pass")
                algorithm["old_logprob"] = "rollout"
            else:
                self.rec.map(key, False, "the trainer recomputes the old-policy log-probs")
        elif self._bypass_old_logprob():
            algorithm["old_logprob"] = "rollout"
        layouts: dict[str, TrainLayout] = {}
        for role in roles:
            layouts[role] = self._layout(role, train_gpus, layouts.get("actor"))
        plan = {
            "placement": placement,
            "rollout": self._engine(rollout_gpus),
            "layouts": compact_layouts(layouts),
            "mode": self._mode(recipe),
            "offload_between_phases": self.offload,
        }
        run_name = self.r.get("trainer.experiment_name", None)
        if run_name is not None:
            self.rec.map("trainer.experiment_name", run_name, "scenario name")
        parts = {"cluster": cluster, "workload": workload, "algorithm": algorithm, "plan": plan,
                 "model_overrides": self._model_overrides()}
        spec = build_spec("verl", None if run_name is None else str(run_name), model, parts, SOURCE_KEYS)
        check_positions(spec, "data.max_prompt_length + data.max_response_length", f"+{POSITION_OVERRIDES[0]}")
        unused = {f"{ROLE_BASE[r]}.": f"{r} not used by {spec.algorithm.name}" for r in ROLE_BASE if r not in roles}
        if recipe == "main":
            unused["rollout."] = "rollout pool of the async recipes (not used by the colocated trainer)"
        ignored, unknown = classify_rest(self.r, IGNORED, UNSUPPORTED, unused)
        return spec, self.rec.freeze(ignored, unknown)

    def _bypass_old_logprob(self) -> bool:
        """Rollout correction's bypass mode (``algorithm.rollout_correction.bypass_mode``, verl
        >= 0.6): the main and one-step-off trainers set the old-policy log-probs to the
        rollout's (``apply_bypass_mode``) instead of running the ``old_log_prob`` pass. verl
        raises when the batch has no rollout log-probs (``rollout.calculate_log_probs``)."""
        key = "algorithm.rollout_correction.bypass_mode"
        if not self.r.has(key):
            return False
        on = as_bool(key, self.r.get(key, None))
        if not on:
            self.rec.map(key, on, "the trainer recomputes the old-policy log-probs (decoupled mode)")
            return False
        self.rec.map(key, on, "old-policy log-probs from the rollout: no old_log_prob pass (algorithm.old_logprob: rollout)")
        calc = "actor_rollout_ref.rollout.calculate_log_probs"
        if self.r.has(calc) and as_bool(calc, self.r.get(calc, None)):
            self.rec.map(calc, True, "the rollout returns its log-probs (bypass mode reads them)")
        else:
            self.rec.assume(f"bypass_mode needs {calc}=True: verl raises when the batch has no rollout log-probs")
        return True

    def _model_overrides(self) -> dict[str, Any]:
        """The actor's config.json fields the run overrides (``model.override_config``)."""
        key, value = self.r.first(POSITION_OVERRIDES, None)
        if value is None:
            return {}
        positions = as_int(key, value, hi=2**30)
        self.rec.map(key, positions, "model_overrides.max_position_embeddings")
        return {"max_position_embeddings": positions}

    def _required(self, key: str) -> Any:
        if not self.r.has(key):
            raise SpecError(key, "missing: the importer needs the actor's model path")
        return self.r.get(key, None)

    def _recipe(self) -> str:
        if self.recipe_hint in ("fully_async", "one_step_off"):
            self.rec.assume(f"trainer: verl's {self.recipe_hint.replace('_', '-')} trainer (its entry point)")
            recipe = self.recipe_hint
        elif self.recipe_hint == "main":
            recipe = "main"
        elif self.r.has_prefix("async_training"):
            self.rec.assume("trainer: verl's fully-async recipe (async_training.* is set)")
            recipe = "fully_async"
        elif self.r.has("rollout.nnodes") or self.r.has("rollout.n_gpus_per_node"):
            self.rec.assume("trainer: verl's one-step-off recipe (rollout.nnodes/n_gpus_per_node is set)")
            recipe = "one_step_off"
        else:
            recipe = "main"
        hybrid = as_bool("actor_rollout_ref.hybrid_engine", self.get("actor_rollout_ref.hybrid_engine"))
        if recipe == "main" and not hybrid:
            self.rec.unsupported_key("actor_rollout_ref.hybrid_engine", hybrid, "verl's main trainer needs the hybrid engine; imported as colocated")
        else:
            self.rec.map("actor_rollout_ref.hybrid_engine", hybrid, "colocated" if recipe == "main" else "separate rollout pool")
        return recipe

    # ------------------------------------------------------------------ algorithm
    def _algorithm(self, model: str) -> dict[str, Any]:
        key = "algorithm.adv_estimator"
        est = str(self.get(key))
        if est not in ADV_ESTIMATORS:
            raise SpecError(key, f"{est!r} has no rlperf algorithm", ", ".join(ADV_ESTIMATORS))
        name = {"gae": "PPO", "rloo": "RLOO", "remax": "ReMax"}.get(est, "REINFORCE++" if est.startswith("reinforce") else "GRPO")
        if est == "reinforce_plus_plus_baseline":
            self.rec.unsupported_key(key, est, "REINFORCE++-baseline is costed as REINFORCE++ (same stages)")
        if name == "GRPO":
            name = self._grpo_variant()
        self.rec.map(key, est, f"algorithm {name}")
        epochs = self.get_int(f"{ACTOR}.ppo_epochs", "epochs")
        kl = self._check_kl(name)
        out: dict[str, Any] = {"name": name, "epochs": epochs, "reward": self._reward()}
        if kl_setting(name, kl) is not None:
            out["kl"] = kl
        if name == "PPO":
            critic_key = "critic.model.path"
            if self.r.has(critic_key):
                critic = catalog_model(critic_key, self.r.get(critic_key, None), self.rec)
                out["critic_model"] = critic if critic != model else None
            else:
                self.rec.assume("critic model: the actor's (critic.model.path not set)")
        return out

    def _grpo_variant(self) -> str:
        if as_bool("algorithm.filter_groups.enable", self.r.get("algorithm.filter_groups.enable", None) or False):
            self.rec.map("algorithm.filter_groups.enable", True, "dynamic sampling: DAPO")
            self._dapo_gen_batch()
            return "DAPO"
        mode = str(self.r.get(f"{ACTOR}.policy_loss.loss_mode", None) or "vanilla")
        if mode == "gspo":
            self.rec.map(f"{ACTOR}.policy_loss.loss_mode", mode, "sequence-level ratio: GSPO")
            return "GSPO"
        if mode != "vanilla":
            self.rec.unsupported_key(f"{ACTOR}.policy_loss.loss_mode", mode, "costed as GRPO (same stages)")
        norm = as_bool("algorithm.norm_adv_by_std_in_grpo", self.get("algorithm.norm_adv_by_std_in_grpo"))
        self.rec.map("algorithm.norm_adv_by_std_in_grpo", norm, "GRPO" if norm else "no std normalization: Dr.GRPO")
        return "GRPO" if norm else "Dr.GRPO"

    def _dapo_gen_batch(self) -> None:
        key = "data.gen_batch_size"
        if not self.r.has(key):
            return
        gen = as_int(key, self.r.get(key, None))
        train = as_int("data.train_batch_size", self.get("data.train_batch_size"))
        multiplier = get_algorithm("DAPO").gen_batch_multiplier
        if gen == round(multiplier * train):
            self.rec.map(key, gen, f"DAPO generates {multiplier:g}x the kept prompts per round")
        else:
            self.rec.unsupported_key(key, gen, f"DAPO's rounds are costed at {multiplier:g}x the train batch")

    def _check_kl(self, name: str) -> KL:
        """The KL term the run uses: the reference pass runs iff ``use_kl_loss`` or
        ``use_kl_in_reward`` (verl builds the reference worker only then). In the reward it needs
        the old-policy log-probs (k1 in the reward); in the loss verl's default estimator is
        ``low_var_kl`` (k3). Both share one reference pass: costed as the reward form."""
        loss = as_bool(f"{ACTOR}.use_kl_loss", self.get(f"{ACTOR}.use_kl_loss"))
        reward = as_bool("algorithm.use_kl_in_reward", self.get("algorithm.use_kl_in_reward"))
        kl: KL = "k1_reward" if reward else "k3_loss" if loss else "none"
        for key, value in ((f"{ACTOR}.use_kl_loss", loss), ("algorithm.use_kl_in_reward", reward)):
            self.rec.map(key, value, f"reference pass (algorithm.kl {kl})" if value else "no KL term")
        if kl != "none" and not any(s.condition == "kl" for s in get_algorithm(name).stages):
            key = "algorithm.use_kl_in_reward" if reward else f"{ACTOR}.use_kl_loss"
            self.rec.unsupported_key(key, True, f"rlperf's {name} has no reference pass; costed without it")
            return "none"
        return kl

    def _reward(self) -> dict[str, Any]:
        enable = as_bool("reward_model.enable", self.get("reward_model.enable"))
        if enable:
            path = self.r.get("reward_model.model.path", None)
            if path is None:
                raise SpecError("reward_model.model.path", "missing while reward_model.enable is True")
            self.rec.map("reward_model.enable", enable, "reward: model")
            return {"kind": "model", "model": catalog_model("reward_model.model.path", path, self.rec)}
        url = self.r.get("reward_model.sandbox_fusion.url", None)
        if url:
            workers = as_int("reward_model.sandbox_fusion.max_concurrent", self.r.get("reward_model.sandbox_fusion.max_concurrent", 64))
            self.rec.map("reward_model.sandbox_fusion.url", url, "reward: sandbox")
            self.rec.map("reward_model.sandbox_fusion.max_concurrent", workers, "reward.cpu_workers")
            self.rec.assume("sandbox latency: rlperf's default log-normal (not in the config)")
            return {"kind": "sandbox", "cpu_workers": workers}
        self.r.touch("reward_model.sandbox_fusion.url")
        self.r.touch("reward_model.sandbox_fusion.max_concurrent")
        self.rec.map("reward_model.enable", enable, "reward: rule (CPU verifier)")
        self.rec.assume("rule reward: rlperf's default CPU cost per sample (not in the config)")
        return {"kind": "rule"}

    def _roles(self, name: str, kl: KL | None, reward_model: bool) -> tuple[str, ...]:
        algo = get_algorithm(name) if kl is None else get_algorithm(name).with_kl(kl)
        used = {s.role for s in algo.active_stages(updates_per_rollout=2)}
        roles: list[str] = [r for r in ("actor", "ref", "critic") if r in used]
        if reward_model:
            roles.append("reward_model")
        if "prm" in used:
            raise SpecError("algorithm.adv_estimator", f"{name} needs a PRM, which verl's ppo_trainer.yaml does not configure")
        return tuple(roles)

    # ------------------------------------------------------------------ batches
    def _batches(self, recipe: str) -> tuple[dict[str, Any], int]:
        n = self.get_int(f"{ROLLOUT}.n", "group size")
        mini = self.get_int(f"{ACTOR}.ppo_mini_batch_size", "prompts per mini-batch")
        if recipe == "fully_async":
            trigger = self.get_int("async_training.trigger_parameter_sync_step", "mini-batch rounds per step")
            require = self.get_int("async_training.require_batches", "mini-batches per round")
            prompts = trigger * require * mini
            minibatches = trigger * require
            self.rec.assume(f"one step = one parameter sync = {trigger} x {require} x {mini} prompts")
            if self.r.has("data.train_batch_size"):
                tb = self.r.get("data.train_batch_size", None)
                self.rec.unsupported_key("data.train_batch_size", tb, "not used by the fully-async recipe (see trigger_parameter_sync_step)")
        else:
            prompts = self.get_int("data.train_batch_size", "prompts per step")
            if prompts % mini != 0:
                raise SpecError(f"{ACTOR}.ppo_mini_batch_size", f"{mini} does not divide data.train_batch_size ({prompts})")
            minibatches = prompts // mini
        caps = [self.get_int(k, n_) for k, n_ in (("data.max_prompt_length", "prompt cap"), ("data.max_response_length", "response cap"))]
        self.caps = (caps[0], caps[1])
        self.mini_sequences = mini * n
        workload = generic_workload(prompts, n, caps[0], caps[1], self.mean_response_tokens, self.rec, SOURCE_KEYS)
        key = f"{ROLLOUT}.max_model_len"
        context = self.r.get(key, None)
        if context is not None:  # vLLM stops a response at max_model_len - prompt (verl's default: the caps' sum)
            total = as_int(key, context)
            if total < caps[0] + caps[1]:
                if total <= caps[0]:
                    raise SpecError(key, f"{total:,} leaves no room for a response after data.max_prompt_length ({caps[0]:,})",
                                    f"> {caps[0]:,}")
                workload["max_total_tokens"] = total
                self.rec.map(key, total, "workload.max_total_tokens: a response stops at max_model_len - prompt")
            else:
                self.rec.map(key, total, "no joint cap: prompt cap + response cap fit in it")
        return workload, minibatches

    # ------------------------------------------------------------------ cluster
    def _cluster(self, recipe: str) -> tuple[dict[str, Any], dict[str, Any], int, int]:
        """Cluster mapping, placement mapping, training-pool GPUs and rollout-pool GPUs."""
        from rlperf.specs.hardware_catalog import load_accelerator

        from rlperf.inputs.ranges import GPUS_PER_NODE, NODES

        tn = self.get_int("trainer.nnodes", "nodes" if recipe == "main" else "training pool nodes")
        tg = self.get_int("trainer.n_gpus_per_node", "GPUs per node" if recipe == "main" else "training pool GPUs per node")
        NODES.require("trainer.nnodes", tn)  # here, before a layout derived from it is refused as "dp"
        GPUS_PER_NODE.require("trainer.n_gpus_per_node", tg)
        self.rec.assume(f"GPU type {self.gpu} (verl configs do not name it)")
        if recipe == "main":
            return {"gpu": self.gpu, "num_nodes": tn, "gpus_per_node": tg}, {"kind": "colocated"}, tn * tg, tn * tg
        rn = self.get_int("rollout.nnodes", "rollout pool nodes")
        rg = self.get_int("rollout.n_gpus_per_node", "rollout pool GPUs per node")
        NODES.require("rollout.nnodes", rn)
        GPUS_PER_NODE.require("rollout.n_gpus_per_node", rg)
        node = load_accelerator(self.gpu).gpus_per_node
        rollout, train = rn * rg, tn * tg
        if rn == tn and rg + tg <= node:
            self.rec.assume(f"rollout and training pools share {tn} node(s) of {rg + tg} GPUs")
            cluster = {"gpu": self.gpu, "num_nodes": tn, "gpus_per_node": rg + tg}
        elif rg == tg:
            cluster = {"gpu": self.gpu, "num_nodes": tn + rn, "gpus_per_node": tg}
        else:
            gpn = max(rg, tg)
            self.rec.assume(f"pools on separate nodes of {gpn} GPUs; {(tn + rn) * gpn - rollout - train} GPUs idle")
            cluster = {"gpu": self.gpu, "num_nodes": tn + rn, "gpus_per_node": gpn}
            pools = [{"name": "rollout", "num_gpus": rollout}, {"name": "train", "num_gpus": train}]
            return cluster, {"kind": "hybrid", "pools": pools, "assign": {"generate": "rollout", "actor": "train"}}, train, rollout
        return cluster, {"kind": "disaggregated", "rollout_gpus": rollout}, train, rollout

    # ------------------------------------------------------------------ layouts
    def _layout(self, role: str, gpus: int, actor: TrainLayout | None) -> TrainLayout:
        base = ROLE_BASE[role]
        strategy_key = f"{base}.strategy"
        default_strategy = self.r.flat.get(f"{ACTOR}.strategy", "fsdp") if role == "ref" else DEFAULTS.get(strategy_key, "fsdp")
        strategy = str(self.r.get(strategy_key, default_strategy))
        if strategy not in ("fsdp", "fsdp2", "megatron"):
            raise SpecError(strategy_key, f"unknown strategy {strategy!r}", "fsdp, fsdp2, megatron")
        self.rec.map(strategy_key, strategy, "FSDP = ZeRO-3" if strategy != "megatron" else "Megatron-Core")
        lay = self._megatron(role) if strategy == "megatron" else self._fsdp(role)
        cp_key = f"{base}.megatron.context_parallel_size" if strategy == "megatron" else f"{base}.ulysses_sequence_parallel_size"
        dp = max(1, gpus // (lay.get("tp", 1) * lay.get("pp", 1) * lay["cp"]))
        lay.update(self._micro(role, lay["cp"], cp_key, dp))
        if role == "actor" and strategy != "megatron":
            self._check_fsdp_minibatch(dp, lay["micro_batch_size"])
        if role in ("actor", "critic"):
            lay["lora_rank"] = self._lora(role, strategy == "megatron")
        # verl's Megatron workers pack sequences (thd) unless <role>.megatron.use_remove_padding
        # is false (engine/megatron.yaml, True; before #4323, Dec 2025, they always packed);
        # model.use_remove_padding is the FSDP workers' switch.
        megatron = strategy == "megatron"
        rp_key = f"{base}.megatron.use_remove_padding" if megatron else f"{ROLE_MODEL[role]}.use_remove_padding"
        version_note = "verl >= 0.7's default (#4461); verl <= 0.6 padded (False)" if rp_key == "actor_rollout_ref.model.use_remove_padding" else ""
        lay["packing"] = as_bool(rp_key, self.r.get(rp_key, True if megatron else DEFAULTS.get(rp_key, False), version_note))
        fsdp_key = f"{ROLE_MODEL[role]}.use_remove_padding"
        if megatron and self.r.has(fsdp_key):
            self.rec.map(fsdp_key, self.r.get(fsdp_key, False), f"the FSDP workers' switch; {role} packs by {rp_key}")
        self.rec.map(rp_key, lay["packing"], "packed sequences" if lay["packing"] else "padded micro-batches (computes on padding)")
        if lay["packing"] and strategy != "megatron":
            # dp_actor's remove-padding path takes log-probs from the model's bf16 logits
            # (div_ by the temperature in place, fused in-place cross-entropy, compiled entropy)
            lay["forward_logits_dtype"] = "bf16"
        # Forward-only roles never recompute; they take the actor's setting so equal layouts compare equal.
        lay["recompute"] = actor.recompute if actor is not None and role in ("ref", "reward_model") else self._recompute(role, strategy)
        mp = lay.get("tp", 1) * lay.get("pp", 1) * lay.get("cp", 1)
        if gpus % mp != 0:
            # the key of the largest degree the config sets (the one a user would change)
            keys = {"tp": f"{base}.megatron.tensor_model_parallel_size", "pp": f"{base}.megatron.pipeline_model_parallel_size",
                    "cp": f"{base}.megatron.context_parallel_size" if strategy == "megatron" else f"{base}.ulysses_sequence_parallel_size"}
            given = [(lay.get(d, 1), k) for d, k in keys.items() if self.r.has(k) and lay.get(d, 1) > 1]
            key = max(given)[1] if given else strategy_key
            raise SpecError(key, f"tp·pp·cp = {mp} does not divide the {gpus} GPUs of the {role} pool",
                            f"a divisor of {gpus} (the pool: nnodes x n_gpus_per_node)")
        lay["dp"] = gpus // mp
        return TrainLayout.model_validate(lay)

    def _fsdp(self, role: str) -> dict[str, Any]:
        base, fsdp = ROLE_BASE[role], ROLE_FSDP[role]
        default_sp = self.r.flat.get(f"{ACTOR}.ulysses_sequence_parallel_size", 1) if role == "ref" else 1
        key = f"{base}.ulysses_sequence_parallel_size"
        sp = as_int(key, self.r.get(key, default_sp))
        self.rec.map(key, sp, f"{role} cp (Ulysses)")
        lay: dict[str, Any] = {"zero_stage": 3, "cp": sp, "cp_kind": "ulysses"}
        lay.update(self._role_offload(role, fsdp, ("param_offload", "optimizer_offload")))
        if role in ("ref", "reward_model"):
            # fsdp_workers: "We force reference policy to use CPUOffload to save memory" (verl #121,
            # Jan 2025: FSDP1 CPUOffload(offload_params=True), FSDP2 CPUOffloadPolicy; the reward
            # model's worker likewise): its weights stay on host, each rank's shard copied in per pass
            lay["offload_params"] = True
            self.rec.assume(f"{role}: weights on host, streamed in per pass (verl's FSDP workers force CPUOffload for it)")
        policy_key = f"{fsdp}.offload_policy"
        if role == "actor" and self.r.has(policy_key):
            on = as_bool(policy_key, self.r.get(policy_key, None))
            self.rec.map(policy_key, on, "FSDP2 CPU offload of params and optimizer" if on else "no CPU offload")
            lay.update(offload_params=on, offload_optimizer=on)
        return lay

    def _lora(self, role: str, megatron: bool) -> int:
        """The LoRA rank of a trained role: adapters on every linear layer, the base frozen
        (rlperf.cost.lora); MoE and MLA models keep full fine-tuning and list the key. verl's
        FSDP workers read ``model.lora_rank``; its Megatron workers build their PEFT from
        ``model.lora`` (``model.lora.rank``, Megatron-Bridge, verl #4063, Nov 2025) and ignore
        ``lora_rank``: the key the role's backend does not read is listed."""
        from rlperf.catalog import load_model
        from rlperf.cost.lora import adapter_params_per_layer

        flat_key, nested_key = f"{ROLE_MODEL[role]}.lora_rank", f"{ROLE_MODEL[role]}.lora.rank"
        key, other = (nested_key, flat_key) if megatron else (flat_key, nested_key)
        if self.r.has(other) and self.r.flat[other] not in (None, 0, "0"):
            backend = "Megatron" if megatron else "FSDP"
            self.rec.unsupported_key(other, self.r.flat[other], f"verl's {backend} workers take the LoRA rank from {key}, not this key")
        if not self.r.has(key):
            return 0
        rank = as_int(key, self.r.get(key, None), lo=0)
        if rank:
            model = self.models.get(role, self.models["actor"])
            try:
                adapter_params_per_layer(load_model(model), rank)
            except SpecError as err:
                self.rec.unsupported_key(key, rank, f"{err.problem}: costed as full fine-tuning")
                return 0
        self.rec.map(key, rank, f"{role} LoRA rank (frozen base weights)" if rank else "full fine-tuning")
        return rank

    def _role_offload(self, role: str, prefix: str, keys: tuple[str, ...]) -> dict[str, Any]:
        """Offload switches of one role. A trained role (actor, critic) moves its states to host
        while the other phase runs: the plan's ``offload_between_phases``. A forward-only role
        (reference, reward model) keeps its weights on host and streams them in for each pass
        (FSDP ``CPUOffload(offload_params=True)``): its own layout's ``offload_params``, never
        the plan-wide switch."""
        out: dict[str, Any] = {}
        for which in keys:
            k = f"{prefix}.{which}"
            if not self.r.has(k):
                continue
            on = as_bool(k, self.r.get(k, None))
            if role in ("actor", "critic") and on and self.recipe != "main":
                self.rec.unsupported_key(k, on, "a separate training pool has no other phase to offload for: rlperf keeps the states on GPU (the host round trip is not charged)")
            elif role in ("actor", "critic"):
                self.offload |= on
                self.rec.map(k, on, "offload_between_phases" if on else "states stay on GPU")
            elif which == "param_offload" and not prefix.endswith(".megatron"):
                # verl's FSDP workers wrap a forward-only role in CPUOffload(offload_params=True)
                # whatever this key says (_fsdp); the key only parks its weights between phases
                self.rec.map(k, on, f"{role} weights on host either way (verl forces CPUOffload for it)")
            elif which == "param_offload":
                # megatron_workers load the whole model before the role's pass and offload it
                # after (load_megatron_model_to_gpu / offload_megatron_model_to_cpu): its weights
                # are on GPU during the pass, parked on host between phases
                self.rec.map(k, on, f"{role} weights parked on host between phases, loaded whole for its pass "
                             "(the load is not costed)" if on else "weights stay on GPU")
            else:
                self.rec.map(k, on, f"{role} has no optimizer or gradients: no effect")
        return out

    def _megatron(self, role: str) -> dict[str, Any]:
        base = ROLE_BASE[role]
        vals: dict[str, Any] = {}
        for field, default in MEGATRON_DEFAULTS.items():
            if role == "ref":  # the reference inherits the actor's Megatron layout unless set
                default = self.r.flat.get(f"{ACTOR}.megatron.{field}", default)
            key = f"{base}.megatron.{field}"
            vals[field] = self.r.get(key, default)
            if isinstance(vals[field], str) and vals[field].strip() in ("None", "none"):
                vals[field] = None  # Python's None written in a YAML file (verl 0.4's own ref etp): a string there
            if self.r.has(key):
                self.rec.map(key, vals[field], f"{role} {field}")
        offload = self._role_offload(role, f"{base}.megatron", ("param_offload", "grad_offload", "optimizer_offload"))
        m = f"{base}.megatron"
        vpp = vals["virtual_pipeline_model_parallel_size"]
        lay: dict[str, Any] = {
            "tp": as_int(f"{m}.tensor_model_parallel_size", vals["tensor_model_parallel_size"]),
            "pp": as_int(f"{m}.pipeline_model_parallel_size", vals["pipeline_model_parallel_size"]),
            "cp": as_int(f"{m}.context_parallel_size", vals["context_parallel_size"]),
            "cp_kind": "ring",
            "ep": as_int(f"{m}.expert_model_parallel_size", vals["expert_model_parallel_size"]),
            "etp": None if vals["expert_tensor_parallel_size"] is None else as_int(f"{m}.expert_tensor_parallel_size", vals["expert_tensor_parallel_size"]),
            "backend": "megatron",
            "sequence_parallel": as_bool(f"{m}.sequence_parallel", vals["sequence_parallel"]),
            "zero_stage": 1 if as_bool(f"{m}.use_distributed_optimizer", vals["use_distributed_optimizer"]) else 0,
        }
        lay.update(offload)
        lay.update(self._fused_activation(role))
        if role in ("actor", "critic"):
            lay.update(self._cpu_optimizer(role))
        if vpp is not None and as_int(f"{m}.virtual_pipeline_model_parallel_size", vpp) > 1:
            lay.update(pp_schedule="interleaved", virtual_stages=as_int(f"{m}.virtual_pipeline_model_parallel_size", vpp))
        return lay

    def _fused_activation(self, role: str) -> dict[str, Any]:
        """Megatron's ``bias_activation_fusion`` (fused SwiGLU: fewer activations kept, see
        rlperf.cost.memory_activations); the reference inherits the actor's
        ``override_transformer_config`` (verl's megatron.yaml, oc.select)."""
        key = f"{ROLE_BASE[role]}.megatron.override_transformer_config.bias_activation_fusion"
        if role == "ref" and not self.r.has(key):
            key = f"{ACTOR}.megatron.override_transformer_config.bias_activation_fusion"
        if not self.r.has(key):
            return {}
        on = as_bool(key, self.r.get(key, False))
        self.rec.map(key, on, "fused SwiGLU (activation memory)" if on else "unfused SwiGLU")
        return {"fused_activation": on}

    def _cpu_optimizer(self, role: str) -> dict[str, Any]:
        """Megatron-Core's CPU optimizer of a trained role. verl copies
        ``<role>.optim.override_optimizer_config`` into Megatron's ``OptimizerConfig``
        (verl/utils/megatron/optimizer.py); with ``optimizer_cpu_offload`` Megatron builds a
        ``HybridDeviceOptimizer`` whose first ``optimizer_offload_fraction`` of the parameters
        (Megatron's default 0.0) keep their fp32 master copy and Adam states on the host and step
        there (torch's AdamW), the gradients copied down and the weights up each step: rlperf's
        ``offload_optimizer`` when the fraction is 1. Unlike ``megatron.optimizer_offload``
        (states parked on host between phases, loaded back for the update), this holds during
        the update itself."""
        prefix = f"{ROLE_BASE[role]}.optim.override_optimizer_config"
        on_key, frac_key = f"{prefix}.optimizer_cpu_offload", f"{prefix}.optimizer_offload_fraction"
        on = as_bool(on_key, self.r.get(on_key, False)) if self.r.has(on_key) else False
        fraction = as_float(frac_key, self.r.get(frac_key, None), 0.0, 1.0) if self.r.has(frac_key) else 0.0
        if not on:
            if self.r.has(on_key):
                self.rec.map(on_key, on, f"{role} optimizer on GPU")
            if self.r.has(frac_key):
                self.rec.map(frac_key, fraction, "unused (optimizer_cpu_offload is off)")
            return {}
        if fraction >= 1.0:
            self.rec.map(on_key, on, f"{role} optimizer states and Adam step on host (offload_optimizer)")
            self.rec.map(frac_key, fraction, "the whole optimizer on host")
            return {"offload_optimizer": True}
        if fraction <= 0.0:
            self.rec.map(on_key, on, f"{role}: optimizer_offload_fraction {fraction:g} (Megatron's default 0.0) offloads nothing: optimizer on GPU")
            return {}
        self.rec.unsupported_key(frac_key, fraction, f"a part of the {role} optimizer on host is not modelled: costed whole on GPU "
                                 f"(its {fraction:.0%} on host not subtracted, nor its CPU step added)")
        self.r.touch(on_key)
        return {}

    def _micro(self, role: str, cp: int, cp_key: str, dp: int) -> dict[str, Any]:
        base = ROLE_BASE[role]
        micro_k, dyn_k, tok_k = (f"{base}.{k}" for k in ROLE_MICRO[role])
        actor_micro, actor_dyn, actor_tok = (f"{ACTOR}.{k}" for k in ROLE_MICRO["actor"])
        fallback = {  # verl's oc.select defaults: forward-only roles follow the actor or critic
            "ref": (actor_micro, actor_dyn, actor_tok),
            "reward_model": ("critic.ppo_micro_batch_size_per_gpu", "critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu"),
            "critic": (None, actor_dyn, None),
        }.get(role, (None, None, None))
        dyn = as_bool(dyn_k, self.r.get(dyn_k, self._fallback(fallback[1], DEFAULTS.get(dyn_k, False))))
        out: dict[str, Any] = {}
        if dyn:
            tok = as_int(tok_k, self.r.get(tok_k, self._fallback(fallback[2], DEFAULTS.get(tok_k, 16384))))
            self.rec.map(dyn_k, dyn, f"{role} dynamic batching")
            self.rec.map(tok_k, tok, f"{role} max_tokens_per_microbatch")
            out["max_tokens_per_microbatch"] = tok
            source = tok_k if self.r.has(tok_k) or fallback[2] is None or not self.r.has(fallback[2]) else fallback[2]
            self._check_budget(source, tok, cp, cp_key)
        else:
            self.r.touch(tok_k)
            self.rec.map(dyn_k, dyn, f"{role} fixed micro-batches")
        micro = self._global_micro(micro_k, dp)
        if micro is None:
            micro = self.r.get(micro_k, self._fallback(fallback[0], None))
        else:
            self.r.touch(micro_k)
        if micro is None:
            if not dyn:
                self.rec.default(micro_k, "null", "rlperf uses 1 sequence per micro-batch")
            micro = 1
        else:
            self.rec.map(micro_k, micro, f"{role} micro_batch_size")
        out["micro_batch_size"] = as_int(micro_k, micro)
        out.update(self._forward_micro(role, dyn, cp, cp_key, dp))
        return out

    def _forward_micro(self, role: str, train_dyn: bool, cp: int, cp_key: str, dp: int) -> dict[str, Any]:
        """How a trained role cuts its forward-only passes (the actor's old-policy log-probs,
        the critic's values): verl's ``rollout.log_prob_*`` and ``critic.forward_*`` keys, which
        default to the training settings (``oc.select``)."""
        keys = {
            "actor": (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ROLLOUT}.log_prob_max_token_len_per_gpu"),
            "critic": ("critic.forward_micro_batch_size_per_gpu", "critic.use_dynamic_bsz", "critic.forward_max_token_len_per_gpu"),
        }.get(role)
        if keys is None:
            return {}
        micro_k, dyn_k, tok_k = keys
        out: dict[str, Any] = {}
        dyn = as_bool(dyn_k, self.r.flat.get(dyn_k, train_dyn))
        if role == "actor" and self.r.has(dyn_k):
            self.r.touch(dyn_k)
            self.rec.map(dyn_k, dyn, "old-policy log-prob dynamic batching" if dyn else "old-policy log-probs in fixed micro-batches")
        if dyn and self.r.has(tok_k):
            out["forward_max_tokens_per_microbatch"] = as_int(tok_k, self.r.get(tok_k, None))
            self.rec.map(tok_k, out["forward_max_tokens_per_microbatch"], f"{role} forward_max_tokens_per_microbatch")
            self._check_budget(tok_k, out["forward_max_tokens_per_microbatch"], cp, cp_key)
        elif self.r.has(tok_k):
            self.r.touch(tok_k)
            self.rec.map(tok_k, self.r.flat[tok_k], "unused (fixed micro-batches)")
        legacy = self._global_micro(micro_k, dp)
        if legacy is not None:
            if not dyn:
                out["forward_micro_batch_size"] = legacy
        elif self.r.has(micro_k) and self.r.flat[micro_k] is not None:
            value = as_int(micro_k, self.r.get(micro_k, None))
            if not dyn:
                out["forward_micro_batch_size"] = value
                self.rec.map(micro_k, value, f"{role} forward_micro_batch_size")
            else:
                self.rec.map(micro_k, value, "unused (dynamic batching)")
        if dyn != train_dyn:
            self.rec.assume(f"{role}: forward passes {'by token budget' if dyn else 'in fixed micro-batches'} while training is not; costed with the forward settings where given")
        return out

    def _global_micro(self, per_gpu_key: str, dp: int) -> int | None:
        """A micro-batch given by its deprecated global key (``ppo_micro_batch_size``,
        ``log_prob_micro_batch_size``, ``forward_micro_batch_size``, ``micro_batch_size``:
        ``per_gpu_key`` without ``_per_gpu``), per GPU: verl's workers divide it by the
        data-parallel size (``//= world / ulysses sp`` in fsdp_workers, ``//=`` the dp world
        size in megatron_workers) and use that as the per-GPU value. None when it is not set.
        verl refuses both keys together (``check_mutually_exclusive``), and a global value
        below the dp size leaves no sequence per GPU."""
        key = per_gpu_key.removesuffix("_per_gpu")
        if key == per_gpu_key or not self.r.has(key) or self.r.flat[key] is None:
            return None
        total = as_int(key, self.r.get(key, None))
        if self.r.has(per_gpu_key) and self.r.flat[per_gpu_key] is not None:
            raise SpecError(key, f"set beside {per_gpu_key}; verl refuses both (the global one is deprecated)",
                            f"only {per_gpu_key}")
        if total < dp:
            raise SpecError(key, f"{total} sequences over {dp} data-parallel ranks leave none per GPU (verl divides it "
                            "by the data-parallel size)", f">= {dp}, or {per_gpu_key}")
        self.rec.map(key, total, f"deprecated global micro-batch: {total // dp} per GPU over {dp} data-parallel ranks")
        return total // dp

    def _check_fsdp_minibatch(self, dp: int, micro: int) -> None:
        """verl's FSDP actor normalizes ``ppo_mini_batch_size`` to sequences per GPU
        (``x rollout.n // (world / ulysses sp)``) and asserts it is positive and, where a
        micro-batch size is given, divisible by ``ppo_micro_batch_size_per_gpu``
        (fsdp_workers.ActorRolloutRefWorker.__init__)."""
        mini_key, micro_key = f"{ACTOR}.ppo_mini_batch_size", f"{ACTOR}.ppo_micro_batch_size_per_gpu"
        per_gpu = self.mini_sequences // dp
        if per_gpu == 0:
            raise SpecError(mini_key, f"{self.mini_sequences} sequences a mini-batch (x rollout.n) over {dp} data-parallel ranks "
                            "leave none per GPU; verl asserts the normalized mini-batch is positive", f"x rollout.n >= {dp}")
        given = self.r.has(micro_key) and self.r.flat[micro_key] is not None
        legacy = micro_key.removesuffix("_per_gpu")
        if given or (self.r.has(legacy) and self.r.flat[legacy] is not None):
            if per_gpu % micro:
                key = micro_key if given else legacy
                # verl's //: name the rounding where the mini-batch does not split evenly
                split = (f"{self.mini_sequences} (ppo_mini_batch_size x rollout.n) // {dp} data-parallel ranks"
                         + (", rounded down as verl does" if self.mini_sequences % dp else ""))
                raise SpecError(key, f"{micro} per GPU does not divide the {per_gpu} sequences of a mini-batch per GPU "
                                f"({split}); verl asserts it", f"a divisor of {per_gpu}")

    def _check_budget(self, key: str, budget: int, cp: int, cp_key: str) -> None:
        """A dynamic-batch token budget holds the longest sequence. verl's workers cut
        micro-batches with ``rearrange_micro_batches(batch, budget x cp)`` (cp: the role's
        Ulysses or Megatron context-parallel size), which asserts ``max_token_len >=`` the
        batch's sequence length, since verl #118 (Jan 2025). Its legacy workers (the default,
        ``trainer.use_legacy_worker_impl`` auto) hold the batch padded to the prompt cap plus
        the response cap, so a budget below that fails at the first update whatever the lengths;
        the new engine (``disable``) unpads first and asserts on the longest actual sequence
        (listed here; rlperf costs such a sequence alone in its micro-batch)."""
        prompt, response = self.caps
        width = prompt + response
        if budget * cp >= width:
            return
        times = f" x {cp_key.rsplit('.', 1)[-1]} {cp}" if cp > 1 else ""
        legacy_key = "trainer.use_legacy_worker_impl"
        if str(self.r.get(legacy_key, None) or "auto") == "disable":
            self.rec.map(legacy_key, "disable", "verl's new worker engine (unpadded batches)")
            self.rec.unsupported_key(key, budget, f"{budget:,}{times} tokens hold no sequence longer than that; verl's new "
                                     "engine asserts on one, rlperf costs it alone in its micro-batch")
            return
        raise SpecError(key, f"{budget:,}{times} tokens are fewer than the {width:,}-token padded sequences (data.max_prompt_length "
                        f"{prompt:,} + data.max_response_length {response:,}); verl's rearrange_micro_batches asserts max_token_len "
                        "covers them", f">= {math.ceil(width / cp):,}")

    def _fallback(self, key: str | None, default: Any) -> Any:
        if key is None:
            return default
        return self.r.flat.get(key, DEFAULTS.get(key, default))

    def _recompute(self, role: str, strategy: str) -> str:
        if strategy == "megatron":
            if role in ROLE_RECOMPUTE and self.r.has(ROLE_RECOMPUTE[role]):
                # verl's Megatron workers recompute by override_transformer_config only
                self.r.touch(ROLE_RECOMPUTE[role])
                self.rec.map(ROLE_RECOMPUTE[role], self.r.flat[ROLE_RECOMPUTE[role]], "not read by verl's Megatron workers")
            key = f"{ROLE_BASE[role]}.megatron.override_transformer_config.recompute_granularity"
            gran = self.r.get(key, None)
            if gran is not None:
                self.rec.map(key, gran, f"{role} recompute")
            return str(gran) if gran in ("full", "selective") else "none"
        key = ROLE_RECOMPUTE[role]
        on = as_bool(key, self.get(key))
        self.rec.map(key, on, "recompute full" if on else "no recompute")
        return "full" if on else "none"

    # ------------------------------------------------------------------ rollout and mode
    def _engine(self, gpus: int) -> dict[str, Any]:
        name = str(self.get(f"{ROLLOUT}.name"))
        if name in ("vllm", "sglang"):
            # SGLang runs its overlap scheduler by default; vLLM schedules between steps
            self.rec.map(f"{ROLLOUT}.name", name, "continuous-batching engine"
                         + (", overlap scheduling" if name == "sglang" else ", host time between steps"))
        else:
            self.rec.unsupported_key(f"{ROLLOUT}.name", name, "costed as a vLLM-like engine")
        tp = self.get_int(f"{ROLLOUT}.tensor_model_parallel_size", "engine tp")
        pp = as_int(f"{ROLLOUT}.pipeline_model_parallel_size", self.r.get(f"{ROLLOUT}.pipeline_model_parallel_size", 1))
        ep = as_int(f"{ROLLOUT}.expert_parallel_size", self.r.get(f"{ROLLOUT}.expert_parallel_size", 1))
        for key, value in (("pipeline_model_parallel_size", pp), ("expert_parallel_size", ep)):
            if self.r.has(f"{ROLLOUT}.{key}"):
                self.rec.map(f"{ROLLOUT}.{key}", value, f"engine {key.split('_')[0]}")
        dp_attention = self._data_parallel_experts(tp, pp, ep)
        if dp_attention:
            tp = ep  # one server spans tp·dp GPUs; each data-parallel rank attends to its own sequences
        if gpus % (tp * pp) != 0:
            raise SpecError(f"{ROLLOUT}.tensor_model_parallel_size", f"tp·pp = {tp * pp} does not divide the {gpus} rollout GPUs")
        dtype_key = f"{ROLLOUT}.dtype"
        dtype = ENGINE_DTYPES.get(str(self.get(dtype_key)))
        if dtype is None:
            self.rec.unsupported_key(dtype_key, self.r.flat.get(dtype_key), "costed in bf16")
            dtype = "bf16"
        else:
            self.rec.map(dtype_key, self.r.flat.get(dtype_key, "bfloat16"), f"engine dtype {dtype}")
        dtype = self._quantization(dtype)
        prefix_keys = (f"{ROLLOUT}.engine_kwargs.vllm.enable_prefix_caching", f"{ROLLOUT}.enable_prefix_caching")
        prefix_key, prefix_value = self.r.first(prefix_keys, True, "vLLM caches prefixes by default")
        prefix = as_bool(prefix_key, prefix_value)
        self.rec.map(prefix_key, prefix, "prefix_sharing")
        return {
            "tp": tp,
            "pp": pp,
            "ep": ep,
            "replicas": gpus // (tp * pp),
            "gpu_memory_utilization": as_float(f"{ROLLOUT}.gpu_memory_utilization", self._mapped(f"{ROLLOUT}.gpu_memory_utilization", "engine memory share"), 0.01, 1.0),
            "max_num_seqs": self.get_int(f"{ROLLOUT}.max_num_seqs", "engine max sequences"),
            "max_num_batched_tokens": self.get_int(f"{ROLLOUT}.max_num_batched_tokens", "engine chunked-prefill budget"),
            "prefix_sharing": prefix,
            "dtype": dtype,
            "cuda_graphs": not as_bool(f"{ROLLOUT}.enforce_eager", self._mapped(f"{ROLLOUT}.enforce_eager", "engine CUDA graphs off when true")),
            "overlap_scheduling": name == "sglang",
            "dp_attention": dp_attention,
        }

    def _quantization(self, dtype: str) -> str:
        """``rollout.quantization``: ``fp8`` makes verl's vLLM and SGLang servers load the
        weights block-quantized to FP8 (e4m3, 128 x 128 blocks, dynamic activation scales:
        FP8 GEMMs; vllm_async_server / async_sglang_server), the KV cache staying in the model
        dtype: the engine's ``dtype`` fp8 (``kv_dtype`` unchanged). ``torchao`` (vLLM only) is
        listed and costed unquantized; anything else verl refuses."""
        key = f"{ROLLOUT}.quantization"
        value = self.r.get(key, None)
        if value is None:
            return dtype
        name = str(value)
        if name == "fp8":
            self.rec.map(key, name, "engine weights and GEMMs in FP8 (block-quantized), KV cache unchanged")
            return "fp8"
        if name == "torchao":
            self.rec.unsupported_key(key, name, f"torchao quantization is not modelled: costed in {dtype}")
            return dtype
        raise SpecError(key, f"{name!r} is not a quantization verl's rollout servers take", "fp8, torchao (vLLM), null")

    def _data_parallel_experts(self, tp: int, pp: int, ep: int) -> bool:
        """Whether the server runs data-parallel attention with experts over its ranks: verl's
        ``rollout.data_parallel_size`` dp > 1 with ``expert_parallel_size`` = tp·dp (verl's
        RolloutConfig asserts that equality; vLLM spreads the experts over all tp·dp GPUs) is
        rlperf's replica of tp·dp GPUs with ``dp_attention`` (exact for tp = 1)."""
        key = f"{ROLLOUT}.data_parallel_size"
        dp = as_int(key, self.r.get(key, 1))
        if dp == 1 or ep == 1:
            if self.r.has(key):  # dense data-parallel ranks are independent engines: replicas of the pool
                self.rec.map(key, dp, "engine replicas follow from the pool")
            return False
        if ep != tp * dp or pp != 1:
            raise SpecError(f"{ROLLOUT}.expert_parallel_size", f"{ep} with tensor_model_parallel_size {tp}, data_parallel_size "
                            f"{dp} and pipeline_model_parallel_size {pp}", f"tp·dp = {tp * dp} with pipeline size 1 (verl asserts it)")
        note = f"data-parallel attention: a replica of {ep} GPUs, experts over all of them"
        if tp > 1:
            self.rec.unsupported_key(key, dp, note + f" (attention costed whole per GPU, not split {tp} ways)")
        else:
            self.rec.map(key, dp, note)
        return True

    def _mapped(self, key: str, note: str) -> Any:
        value = self.get(key)
        self.rec.map(key, value, note)
        return value

    def _mode(self, recipe: str) -> dict[str, Any]:
        if recipe == "main":
            return {"kind": "sync"}
        if recipe == "one_step_off":
            return {"kind": "one_step_off"}
        key = "async_training.staleness_threshold"
        t = as_float(key, self.get(key), lo=0.0)
        partial_key = "async_training.partial_rollout"
        # The trainer syncs after ``trigger`` local updates, each on the samples that have
        # arrived (require_batches mini-batches): rlperf's train_parts.
        trigger = as_int("async_training.trigger_parameter_sync_step", self.get("async_training.trigger_parameter_sync_step"))
        if t <= 0:
            if self.r.has(partial_key):
                self._mapped(partial_key, "synchronous: nothing runs ahead to interrupt")
            if trigger > 1:
                # verl's "stream off policy pipeline": one batch per version, consumed as it streams.
                self.rec.map(key, t, f"streaming, threshold 0: the batch waits for each sync; {trigger} local updates as it streams in")
                return {"kind": "streaming", "staleness_threshold": 0.0, "train_parts": trigger,
                        "groups_per_engine": VERL_GROUPS_PER_SERVER}
            self.rec.map(key, t, "synchronous (rollouter waits for each sync)")
            return {"kind": "sync"}
        partial = self.r.get(partial_key, None)
        if partial is not None and as_bool(partial_key, partial):
            # The rollouter keeps t x batch in flight and interrupts them at each sync.
            self.rec.map(key, t, f"streaming, staleness threshold {t:g} (fraction of a batch in flight), {trigger} local updates per sync")
            self.rec.map(partial_key, True, "streaming: in-flight requests resume after each sync (KV re-prefilled)")
            return {"kind": "streaming", "staleness_threshold": t, "train_parts": trigger,
                    "groups_per_engine": VERL_GROUPS_PER_SERVER}
        staleness = math.ceil(t)
        self.rec.map(key, t, f"async, staleness {staleness} (ceil of the threshold)")
        if trigger > 1:
            self.rec.assume(f"{trigger} local updates per sync without partial rollout: the trainer is costed as waiting for the whole batch")
        if partial is not None:
            self.rec.map(partial_key, False, "no interrupted rollouts")
        return {"kind": "async", "staleness": staleness}

"""rlperf scenario -> verl command-line overrides (the inverse of :mod:`verl_import`).

Every performance key the importer reads is written explicitly, so importing the overrides
alone (no YAML) gives the same scenario back. What verl cannot express is listed:

- hybrid pools: verl's trainers put every role on one pool (main trainer) or split rollout from
  training (recipes); the nearest two-pool split is written;
- an execution mode other than synchronous on a colocated pool (verl's one-step-off and
  fully-async recipes need a separate rollout pool), partial rollout with a token budget (the
  fully-async recipe interrupts rollouts at weight syncs instead), stage fusion;
- layouts neither backend has: FSDP with ZeRO-1/2, Megatron with ZeRO-3, Ulysses with Megatron or
  ring attention with FSDP, a GPipe schedule, non-bf16 compute, PRIME and VAPO (verl runs them
  from recipe entry points with their own configs).
"""

from __future__ import annotations

from rlperf.algorithms import get_algorithm
from rlperf.frameworks.common import (
    pool_size,
    resolved_pools,
    roles_in_use,
    run_algorithm,
    workload_caps,
    workload_notes,
)
from rlperf.frameworks.report import ExportResult, fmt_value
from rlperf.modes import mode_of
from rlperf.frameworks.verl_keys import (
    ROLE_BASE,
    ROLE_FSDP,
    ROLE_MICRO,
    ROLE_MODEL,
    ROLE_RECOMPUTE,
    VERL_GROUPS_PER_SERVER,
)
from rlperf.scenario import RewardSpec, Scenario, ScenarioSpec, resolve_workload
from rlperf.specs.parallel import TrainLayout
from rlperf.specs.plan import Plan

ACTOR = "actor_rollout_ref.actor"
ROLLOUT = "actor_rollout_ref.rollout"
MAIN = ("python3", "-m", "verl.trainer.main_ppo")
# verl's current entry points (verl/experimental since the recipes left the main tree, 2025).
ONE_STEP = ("python3", "-m", "verl.experimental.one_step_off_policy.main_ppo")
FULLY_ASYNC = ("python3", "-m", "verl.experimental.fully_async_policy.fully_async_main")
# The config each entry point loads when its roles run on Megatron (verl picks the backend's
# defaults by config name: ppo_megatron_trainer.yaml and the recipes' *_megatron_trainer.yaml).
MEGATRON_CONFIG = {
    "verl.trainer.main_ppo": "ppo_megatron_trainer",
    "verl.experimental.one_step_off_policy.main_ppo": "one_step_off_ppo_megatron_trainer",
    "verl.experimental.fully_async_policy.fully_async_main": "fully_async_ppo_megatron_trainer",
}


class _Out:
    def __init__(self) -> None:
        self.args: list[str] = []
        self.missing: list[str] = []
        self.notes: list[str] = []

    def set(self, key: str, value: object) -> None:
        self.args.append(f"{key}={fmt_value(value)}")

    def add(self, key: str, value: object) -> None:
        """A key verl's schema may lack (Hydra needs ``++`` to add it)."""
        self.args.append(f"++{key}={fmt_value(value)}")


def export_verl(scenario: ScenarioSpec | Scenario) -> ExportResult:
    """verl overrides expressing ``scenario``; parts verl cannot express are listed."""
    spec = scenario.spec if isinstance(scenario, Scenario) else scenario
    out = _Out()
    out.set("trainer.experiment_name", spec.name)
    out.set("actor_rollout_ref.model.path", spec.model)
    out.notes.append("actor_rollout_ref.model.path holds rlperf's catalog name: point it at your checkpoint")
    if spec.model_overrides.max_position_embeddings is not None:
        out.add("actor_rollout_ref.model.override_config.max_position_embeddings", spec.model_overrides.max_position_embeddings)
    prefix = _placement_and_mode(spec, out)
    _algorithm(spec, out, train_batch=prefix != FULLY_ASYNC)
    roles = [r for r in roles_in_use(spec) if r in ROLE_BASE]
    caps = workload_caps(spec)
    width = caps.prompt_cap_tokens + caps.response_cap_tokens
    for role in roles:
        _layout(role, spec.plan.layout_for(role), out, width)
    _offload(spec.plan, roles, out)
    _engine(spec.plan, out)
    out.missing.extend(workload_notes(spec, "verl"))
    if any(_strategy(spec.plan.layout_for(r)) == "megatron" for r in roles):
        prefix = (*prefix, f"--config-name={MEGATRON_CONFIG[prefix[-1]]}")
    return ExportResult("verl", tuple(out.args), tuple(out.missing), prefix, tuple(out.notes))


# ---------------------------------------------------------------------- algorithm and batches
_ESTIMATOR = {  # algorithm -> adv_estimator
    "PPO": "gae",
    "GRPO": "grpo",
    "Dr.GRPO": "grpo",
    "DAPO": "grpo",
    "GSPO": "grpo",
    "RLOO": "rloo",
    "REINFORCE++": "reinforce_plus_plus",
    "ReMax": "remax",
    "PRIME": "rloo",
    "VAPO": "gae",
}


def _algorithm(spec: ScenarioSpec, out: _Out, train_batch: bool) -> None:
    """Algorithm, batch and reward keys; the fully-async recipe has no train batch (a step is
    ``trigger_parameter_sync_step`` mini-batches)."""
    algo = run_algorithm(spec)
    name, est = algo.name, _ESTIMATOR[algo.name]
    out.set("algorithm.adv_estimator", est)
    out.set(f"{ACTOR}.use_kl_loss", algo.kl in ("k2_loss", "k3_loss"))
    out.set("algorithm.use_kl_in_reward", algo.kl == "k1_reward")
    if algo.kl == "k2_loss":
        out.set(f"{ACTOR}.kl_loss_type", "mse")
    if name in ("GRPO", "Dr.GRPO"):
        out.set("algorithm.norm_adv_by_std_in_grpo", name == "GRPO")
    if name == "Dr.GRPO":
        out.set(f"{ACTOR}.loss_agg_mode", "seq-mean-token-sum-norm")
    if name == "GSPO":
        out.set(f"{ACTOR}.policy_loss.loss_mode", "gspo")
        out.set(f"{ACTOR}.loss_agg_mode", "seq-mean-token-mean")
    if name in ("PRIME", "VAPO"):
        out.missing.append(f"algorithm {name}: verl runs it from its recipe entry point with its own config; written as {est}")
    caps = workload_caps(spec)
    if name == "DAPO":
        algo = get_algorithm("DAPO")
        out.add("algorithm.filter_groups.enable", True)
        out.add("data.gen_batch_size", round(algo.gen_batch_multiplier * caps.prompts_per_step))
        out.set(f"{ACTOR}.clip_ratio_high", algo.clip_high)
        out.notes.append("DAPO's dynamic sampling runs with verl's recipe/dapo entry point")
    epochs = spec.algorithm.epochs or get_algorithm(name).default_epochs
    minibatches = spec.algorithm.minibatches or get_algorithm(name).default_minibatches
    if caps.prompts_per_step % minibatches != 0:
        out.missing.append(f"{minibatches} mini-batches do not divide {caps.prompts_per_step} prompts; ppo_mini_batch_size rounded down")
    if train_batch:
        out.set("data.train_batch_size", caps.prompts_per_step)
    out.set(f"{ACTOR}.ppo_epochs", epochs)
    out.set(f"{ACTOR}.ppo_mini_batch_size", caps.prompts_per_step // minibatches)
    out.set(f"{ROLLOUT}.n", caps.group_size)
    out.set("data.max_prompt_length", caps.prompt_cap_tokens)
    out.set("data.max_response_length", caps.response_cap_tokens)
    total = resolve_workload(spec.workload).max_total_tokens
    if total is not None:
        out.add(f"{ROLLOUT}.max_model_len", total)
    _reward(spec, out)
    if name in ("PPO", "VAPO"):
        out.set("critic.model.path", spec.algorithm.critic_model or spec.model)


def _reward(spec: ScenarioSpec, out: _Out) -> None:
    reward = spec.algorithm.reward
    out.set("reward_model.enable", reward.kind == "model")
    if reward.kind == "model":
        out.set("reward_model.model.path", reward.model or spec.model)
    elif reward.kind == "sandbox":
        out.add("reward_model.sandbox_fusion.url", "http://localhost:8080/run_code")
        out.set("reward_model.sandbox_fusion.max_concurrent", reward.cpu_workers)
        out.notes.append("reward_model.sandbox_fusion.url is a placeholder: point it at your sandbox")
    if _reward_costs(reward) != _reward_costs(RewardSpec(kind=reward.kind)):
        out.missing.append("reward cost parameters (CPU seconds per sample, workers, sandbox latency) are rlperf's, not verl's")


def _reward_costs(reward: RewardSpec) -> dict[str, object]:
    """The reward's cost parameters that no verl key holds."""
    skip = {"kind", "model"} | ({"cpu_workers"} if reward.kind == "sandbox" else set())
    return reward.model_dump(exclude=skip)


# ---------------------------------------------------------------------- placement and mode
def _placement_and_mode(spec: ScenarioSpec, out: _Out) -> tuple[str, ...]:
    pools, assign, total = resolved_pools(spec)
    c = spec.cluster
    gpn = total // c.num_nodes
    mode = mode_of(spec.plan.mode)
    st = mode.settings
    if spec.plan.mode.fusion:
        out.missing.append("stage fusion: verl does not stream finished samples into the log-prob passes")
    placement = spec.plan.placement
    rollout = pool_size(pools, assign["generate"])
    if placement.kind == "hybrid":
        if assign["generate"] == assign["actor"]:
            out.missing.append("hybrid pools: verl puts every role on one pool; written as colocated on all GPUs")
            rollout = total
        else:
            rollout = min(rollout, total - 1)
            out.missing.append(f"hybrid pools: verl splits only rollout ({rollout} GPUs) from training (the rest)")
    if placement.kind == "colocated" or rollout == total:
        out.set("actor_rollout_ref.hybrid_engine", True)
        out.set("trainer.nnodes", c.num_nodes)
        out.set("trainer.n_gpus_per_node", gpn)
        if not st.synchronous:
            out.missing.append(f"mode {mode.label} ({mode.family.replace('_', ' ')}): verl's one-step-off and fully-async recipes need a separate rollout pool")
        _bypass(spec, out)
        return MAIN
    out.set("actor_rollout_ref.hybrid_engine", False)
    _split_pools(c.num_nodes, gpn, rollout, out)
    if st.one_step_pipeline:
        _bypass(spec, out)
        return ONE_STEP
    out.set(f"{ROLLOUT}.mode", "async")
    staleness = st.ahead_batches
    if st.token_budget is not None:
        staleness = max(staleness, 1.0)
        out.missing.append(f"partial rollout with a token budget: verl's fully-async recipe interrupts rollouts at weight syncs; written as staleness {staleness:g}, partial_rollout=True")
    if st.inflight_weight_updates:
        out.missing.append("in-flight weight updates: verl's rollouter pauses generation for each parameter sync")
    if st.groups_per_engine != VERL_GROUPS_PER_SERVER:
        out.missing.append(f"verl's rollouter admits whole prompt groups, {VERL_GROUPS_PER_SERVER} per server in flight "
                           f"(a constant of its code), not {st.groups_per_engine or 'request by request'}")
    # One rlperf step = one parameter sync = trigger_parameter_sync_step local updates of
    # require_batches mini-batches each.
    minibatches = spec.algorithm.minibatches or get_algorithm(spec.algorithm.name).default_minibatches
    trigger = st.train_parts
    if minibatches % trigger:
        out.missing.append(f"{trigger} local updates do not divide {minibatches} mini-batches; written as {minibatches} updates of one")
        trigger = minibatches
    out.add("async_training.staleness_threshold", staleness)
    out.add("async_training.trigger_parameter_sync_step", trigger)
    out.add("async_training.require_batches", minibatches // trigger)
    out.add("async_training.partial_rollout", st.interrupts_at_sync)
    out.add("async_training.use_rollout_log_probs", spec.algorithm.old_logprob == "rollout")
    return FULLY_ASYNC


def _bypass(spec: ScenarioSpec, out: _Out) -> None:
    """Old-policy log-probs from the rollout in the main and one-step-off trainers: rollout
    correction's bypass mode, which needs the rollout's log-probs (verl >= 0.6)."""
    if spec.algorithm.old_logprob == "rollout":
        out.add("algorithm.rollout_correction.bypass_mode", True)
        out.add(f"{ROLLOUT}.calculate_log_probs", True)


def _split_pools(nodes: int, gpn: int, rollout: int, out: _Out) -> None:
    """``rollout.*`` and ``trainer.*`` pools: both across all nodes when the rollout GPUs split
    evenly over them (the recipes' scripts), else whole nodes for each pool."""
    if rollout % nodes == 0 and rollout // nodes < gpn:
        r_nodes, r_gpn, t_nodes, t_gpn = nodes, rollout // nodes, nodes, gpn - rollout // nodes
    elif rollout % gpn == 0:
        r_nodes, r_gpn, t_nodes, t_gpn = rollout // gpn, gpn, nodes - rollout // gpn, gpn
    else:
        per = max(1, rollout // nodes)
        r_nodes, r_gpn, t_nodes, t_gpn = nodes, per, nodes, gpn - per
        out.missing.append(f"{rollout} rollout GPUs split neither evenly over {nodes} nodes nor into whole nodes; written as {per} per node")
    out.add("rollout.nnodes", r_nodes)
    out.add("rollout.n_gpus_per_node", r_gpn)
    out.set("trainer.nnodes", t_nodes)
    out.set("trainer.n_gpus_per_node", t_gpn)


# ---------------------------------------------------------------------- layouts
TRAINED = ("actor", "critic")


def _strategy(lay: TrainLayout) -> str:
    fsdp_ok = lay.zero_stage == 3 and lay.tp == lay.pp == lay.ep == 1 and (lay.cp == 1 or lay.cp_kind == "ulysses")
    return "fsdp" if fsdp_ok else "megatron"


def _budget(role: str, what: str, budget: int, lay: TrainLayout, width: int, out: _Out) -> int:
    """A token budget as verl takes it: ``budget x cp`` must cover the batch padded to prompt
    cap + response cap (``rearrange_micro_batches`` asserts it). rlperf costs a longer sequence
    alone in its micro-batch; verl's smallest budget that runs holds exactly that sequence, so
    the peak micro-batch is the same and the budget is raised to it, said in ``missing``."""
    need = -(-width // lay.cp)
    if budget >= need:
        return budget
    out.missing.append(f"{role}: {what} token budget {budget:,} x cp {lay.cp} is below the {width:,}-token padded sequences "
                       f"verl asserts it covers; written as {need:,} (the peak micro-batch either way: the longest possible sequence's)")
    return need


def _layout(role: str, lay: TrainLayout, out: _Out, width: int) -> None:
    base = ROLE_BASE[role]
    strategy = _strategy(lay)
    micro_k, dyn_k, tok_k = ROLE_MICRO[role]
    if strategy == "fsdp":
        out.set(f"{base}.strategy", "fsdp2" if lay.offload_params and role in TRAINED else "fsdp")
        out.set(f"{base}.ulysses_sequence_parallel_size", lay.cp)
        if role == "actor":
            out.set(f"{ROLE_FSDP[role]}.offload_policy", lay.offload_params)
            if lay.offload_params != lay.offload_optimizer:
                out.missing.append("actor: FSDP2 offloads parameters and optimizer together (offload_policy)")
    else:
        _megatron(role, lay, out)
    out.set(f"{base}.{dyn_k}", lay.max_tokens_per_microbatch is not None)
    if lay.max_tokens_per_microbatch is not None:
        out.set(f"{base}.{tok_k}", _budget(role, "the", lay.max_tokens_per_microbatch, lay, width, out))
    out.set(f"{base}.{micro_k}", lay.micro_batch_size)
    _forward_micro(role, lay, out, width)
    if role in TRAINED and lay.lora_rank:  # Megatron workers take their PEFT from model.lora
        if strategy == "megatron":
            out.add(f"{ROLE_MODEL[role]}.lora.rank", lay.lora_rank)
        else:
            out.set(f"{ROLE_MODEL[role]}.lora_rank", lay.lora_rank)
    elif lay.lora_rank:
        out.missing.append(f"{role}: LoRA on a forward-only role (verl's reference is the base model)")
    # actor, reference (and rollout) share actor_rollout_ref.model; the actor's setting is written.
    # Megatron workers read their own engine's switch.
    if strategy == "megatron":
        out.set(f"{base}.megatron.use_remove_padding", lay.packing)
    elif role != "ref":
        out.set(f"{ROLE_MODEL[role]}.use_remove_padding", lay.packing)
    if role in ROLE_RECOMPUTE:
        _recompute(role, lay, strategy, out)
    for field, want in (("param_dtype", "bf16"), ("grad_dtype", "fp32"), ("overlap_grad_comm", True),
                        ("prefetch_gathers", True)):
        if getattr(lay, field) != want:
            out.missing.append(f"{role}.{field}={getattr(lay, field)}: verl's engines use {want}")


def _megatron(role: str, lay: TrainLayout, out: _Out) -> None:
    m = f"{ROLE_BASE[role]}.megatron"
    out.set(f"{ROLE_BASE[role]}.strategy", "megatron")
    out.set(f"{m}.tensor_model_parallel_size", lay.tp)
    out.set(f"{m}.pipeline_model_parallel_size", lay.pp)
    out.set(f"{m}.virtual_pipeline_model_parallel_size", lay.virtual_stages if lay.virtual_stages > 1 else None)
    out.set(f"{m}.context_parallel_size", lay.cp)
    out.set(f"{m}.expert_model_parallel_size", lay.ep)
    if lay.etp is not None:
        out.set(f"{m}.expert_tensor_parallel_size", lay.etp)
    out.set(f"{m}.sequence_parallel", lay.sequence_parallel)
    out.set(f"{m}.use_distributed_optimizer", lay.zero_stage >= 1)
    if lay.zero_stage >= 2:
        out.missing.append(f"{role}: ZeRO-{lay.zero_stage} with tp/pp/ep or ring attention: verl's Megatron shards only optimizer states (written as ZeRO-1)")
    if lay.cp > 1 and lay.cp_kind == "ulysses":
        out.missing.append(f"{role}: Ulysses cp with Megatron (Megatron's cp is ring attention)")
    if lay.pp_schedule == "gpipe":
        out.missing.append(f"{role}: GPipe schedule (Megatron runs 1F1B)")
    if role in TRAINED and lay.offload_optimizer:
        # Megatron-Core's CPU optimizer, whole (verl passes these into its OptimizerConfig)
        out.add(f"{ROLE_BASE[role]}.optim.override_optimizer_config.optimizer_cpu_offload", True)
        out.add(f"{ROLE_BASE[role]}.optim.override_optimizer_config.optimizer_offload_fraction", 1.0)
    if role in TRAINED and lay.offload_params:
        out.missing.append(f"{role}: parameter offload during training with Megatron")


def _forward_micro(role: str, lay: TrainLayout, out: _Out, width: int) -> None:
    """The forward-only passes' micro-batching of a trained role, where it differs from training
    (the actor's old-policy log-probs: ``rollout.log_prob_*``; the critic's values: ``forward_*``)."""
    keys = {
        "actor": (f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu", f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ROLLOUT}.log_prob_max_token_len_per_gpu"),
        "critic": ("critic.forward_micro_batch_size_per_gpu", None, "critic.forward_max_token_len_per_gpu"),
    }.get(role)
    if keys is None:
        return
    micro_k, dyn_k, tok_k = keys
    dynamic = lay.max_tokens_per_microbatch is not None
    if lay.forward_max_tokens_per_microbatch is not None:
        if not dynamic and dyn_k is None:
            out.missing.append(f"{role}: a forward token budget with fixed training micro-batches (verl's critic shares use_dynamic_bsz)")
        if dyn_k is not None:
            out.set(dyn_k, True)
        out.set(tok_k, _budget(role, "the forward passes'", lay.forward_max_tokens_per_microbatch, lay, width, out))
    if lay.forward_micro_batch_size is not None:
        if dyn_k is not None and lay.forward_max_tokens_per_microbatch is None:
            out.set(dyn_k, False)
        out.set(micro_k, lay.forward_micro_batch_size)


def _recompute(role: str, lay: TrainLayout, strategy: str, out: _Out) -> None:
    if strategy == "megatron":
        gran = None if lay.recompute == "none" else lay.recompute
        out.add(f"{ROLE_BASE[role]}.megatron.override_transformer_config.recompute_granularity", gran)
        if lay.fused_activation:  # Megatron's fused SwiGLU (fewer activations kept)
            out.add(f"{ROLE_BASE[role]}.megatron.override_transformer_config.bias_activation_fusion", True)
        return
    out.set(ROLE_RECOMPUTE[role], lay.recompute != "none")
    if lay.recompute == "selective":
        out.missing.append(f"{role}: selective recompute with FSDP (verl checkpoints whole layers); written as full")


def _offload(plan: Plan, roles: list[str], out: _Out) -> None:
    """Offload keys per role. A trained role's ``param_offload``/``optimizer_offload`` move its
    states to host between phases: the plan's ``offload_between_phases``, which only a
    colocated plan charges (written False otherwise). A forward-only role's ``param_offload``
    streams its weights from host in each pass: its layout's ``offload_params``."""
    on = plan.offload_between_phases and plan.placement.kind == "colocated"
    if plan.offload_between_phases and not on:
        out.missing.append(f"offload_between_phases on a {plan.placement.kind} plan: no phase to offload for; written as False")
    for role in roles:
        lay = plan.layout_for(role)
        trained = role in TRAINED
        if _strategy(lay) == "megatron":
            prefix = f"{ROLE_BASE[role]}.megatron"
            whats: tuple[str, ...] = ("param_offload", "grad_offload", "optimizer_offload") if trained else ("param_offload",)
        else:
            prefix = ROLE_FSDP[role]
            whats = ("param_offload", "optimizer_offload") if trained else ("param_offload",)
        for what in whats:
            out.set(f"{prefix}.{what}", on if trained else lay.offload_params)
        if not trained and lay.offload_optimizer:
            out.missing.append(f"{role}: offload_optimizer on a forward-only role (it has no optimizer)")
        if not trained and _strategy(lay) == "megatron" and lay.offload_params:
            out.missing.append(f"{role}: weights streamed from host per pass; verl's Megatron workers load a {role} whole for its pass (param_offload parks it between phases)")
        if not trained and _strategy(lay) == "fsdp" and not lay.offload_params:
            out.missing.append(f"{role}: weights kept on GPU; verl's FSDP workers always stream a {role}'s weights from host (CPUOffload)")


def _engine(plan: Plan, out: _Out) -> None:
    e = plan.rollout
    # SGLang is the engine that overlaps its scheduling with the GPU by default
    out.set(f"{ROLLOUT}.name", "sglang" if e.overlap_scheduling else "vllm")
    out.set(f"{ROLLOUT}.enforce_eager", not e.cuda_graphs)
    # data-parallel attention: tp·dp GPUs a server, attention whole on each, experts over all
    out.set(f"{ROLLOUT}.tensor_model_parallel_size", 1 if e.dp_attention else e.tp)
    if e.dp_attention:
        out.add(f"{ROLLOUT}.data_parallel_size", e.tp)
    if e.pp > 1:
        out.add(f"{ROLLOUT}.pipeline_model_parallel_size", e.pp)
    if e.ep > 1:
        out.add(f"{ROLLOUT}.expert_parallel_size", e.ep)
    out.set(f"{ROLLOUT}.gpu_memory_utilization", e.gpu_memory_utilization)
    out.set(f"{ROLLOUT}.max_num_seqs", e.max_num_seqs)
    out.set(f"{ROLLOUT}.max_num_batched_tokens", e.max_num_batched_tokens)
    dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(e.dtype)
    if e.dtype == "fp8":  # FP8 weights by verl's on-the-fly block quantization; the KV cache in kv_dtype
        out.add(f"{ROLLOUT}.quantization", "fp8")
        dtype = {"bf16": "bfloat16", "fp16": "float16"}.get(e.kv_dtype)
    if dtype is None:
        out.missing.append(f"engine dtype {e.dtype}: verl's rollout.dtype is bfloat16 or float16")
        dtype = "bfloat16"
    out.set(f"{ROLLOUT}.dtype", dtype)
    if not e.prefix_sharing:
        out.add(f"{ROLLOUT}.engine_kwargs.vllm.enable_prefix_caching", False)
    if e.kv_dtype != "bf16":
        out.missing.append(f"KV cache dtype {e.kv_dtype}: not a verl rollout key")

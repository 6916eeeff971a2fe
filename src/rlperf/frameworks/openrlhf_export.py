"""rlperf scenario -> an OpenRLHF ``train_ppo_ray`` command line (inverse of :mod:`openrlhf_import`).

OpenRLHF gives each model its own GPU group and shares groups only in three ways
(``--colocate_actor_ref``, ``--colocate_critic_reward``, ``--colocate_all_models``), uses one
DeepSpeed strategy for every model, and has no pipeline or expert parallelism, Ulysses attention,
partial rollout or stage fusion in this argument set. Those parts of a plan are listed as not
expressible, and the nearest command line is written.
"""

from __future__ import annotations

import math

from rlperf.frameworks.common import resolved_pools, roles_in_use, run_algorithm, workload_caps, workload_notes
from rlperf.frameworks.report import ExportResult, fmt_value
from rlperf.modes import mode_of
from rlperf.scenario import RewardSpec, Scenario, ScenarioSpec, resolve_workload
from rlperf.specs.parallel import EngineLayout, TrainLayout
from rlperf.specs.plan import Pool

PREFIX = ("python3", "-m", "openrlhf.cli.train_ppo_ray")
# algorithm -> (advantage_estimator, extra flags)
_ALGO = {
    "PPO": ("gae", ()),
    "GRPO": ("group_norm", ()),
    "Dr.GRPO": ("dr_grpo", ()),
    "DAPO": ("group_norm", ("--dynamic_filtering",)),
    "GSPO": ("group_norm", ("--policy_loss_type", "gspo")),
    "RLOO": ("rloo", ()),
    "REINFORCE++": ("reinforce", ()),
}
_NEAREST = {"ReMax": "reinforce", "PRIME": "rloo", "VAPO": "gae"}
_ROLE_FLAG = {"ref": "ref", "critic": "critic", "reward_model": "reward"}


class _Out:
    def __init__(self) -> None:
        self.args: list[str] = []
        self.missing: list[str] = []
        self.notes: list[str] = []

    def set(self, name: str, *values: object) -> None:
        self.args.append(f"--{name}")
        self.args.extend(fmt_value(v) for v in values)


def export_openrlhf(scenario: ScenarioSpec | Scenario) -> ExportResult:
    """An OpenRLHF command line expressing ``scenario``; what it cannot express is listed."""
    spec = scenario.spec if isinstance(scenario, Scenario) else scenario
    out = _Out()
    out.set("pretrain", spec.model)
    out.notes.append("--pretrain (and --reward_pretrain/--critic_pretrain) hold rlperf's catalog names: point them at your checkpoints")
    if spec.model_overrides.max_position_embeddings is not None:
        out.missing.append(f"max_position_embeddings {spec.model_overrides.max_position_embeddings:,}: OpenRLHF has no "
                           "flag for it; set it in the checkpoint's config.json")
    _algorithm(spec, out)
    _placement(spec, out)
    _mode(spec, out)
    _layout(spec, out)
    _engine(spec.plan.rollout, out)
    out.set("bf16")
    out.set("wandb_run_name", spec.name)
    out.missing.extend(workload_notes(spec, "OpenRLHF"))
    return ExportResult("OpenRLHF", tuple(out.args), tuple(out.missing), PREFIX, tuple(out.notes))


def _algorithm(spec: ScenarioSpec, out: _Out) -> None:
    algo = run_algorithm(spec)
    if algo.name in _ALGO:
        est, extra = _ALGO[algo.name]
    else:
        est, extra = _NEAREST[algo.name], ()
        out.missing.append(f"algorithm {algo.name}: no OpenRLHF estimator; written as {est}")
    out.set("advantage_estimator", est)
    out.args.extend(extra)
    out.set("init_kl_coef", 0.01 if algo.kl != "none" else 0)
    if algo.kl in ("k2_loss", "k3_loss"):  # the KL in the loss, with its estimator
        out.set("use_kl_loss")
        out.set("kl_estimator", "k2" if algo.kl == "k2_loss" else "k3")
    reward = spec.algorithm.reward
    if reward.kind == "model":
        out.set("reward_pretrain", reward.model or spec.model)
    else:
        out.set("remote_rm_url", "http://localhost:5000/get_reward")
        out.notes.append("--remote_rm_url is a placeholder: point it at your verifier")
    if reward.model_dump(exclude={"model"}) != RewardSpec(kind=reward.kind).model_dump(exclude={"model"}):
        out.missing.append("reward cost parameters (CPU seconds per sample, workers, sandbox latency) are rlperf's, not OpenRLHF's")
    if algo.name in ("PPO", "VAPO"):
        out.set("critic_pretrain", spec.algorithm.critic_model or spec.model)
    caps = workload_caps(spec)
    minibatches = spec.algorithm.minibatches or algo.default_minibatches
    samples = caps.prompts_per_step * caps.group_size
    if samples % minibatches != 0:
        out.missing.append(f"{minibatches} mini-batches do not divide {samples} samples; train_batch_size rounded down")
    out.set("rollout_batch_size", caps.prompts_per_step)
    out.set("n_samples_per_prompt", caps.group_size)
    out.set("train_batch_size", samples // minibatches)
    out.set("max_epochs", spec.algorithm.epochs or algo.default_epochs)
    out.set("prompt_max_len", caps.prompt_cap_tokens)
    out.set("generate_max_len", caps.response_cap_tokens)
    total = resolve_workload(spec.workload).max_total_tokens
    if total is not None:  # vLLM's max_model_len (OpenRLHF's --max_len beside the two caps)
        out.set("max_len", total)


# ---------------------------------------------------------------------- placement
def _group(name: str, gpus: int, gpn: int, out: _Out) -> None:
    """``--{name}_num_nodes`` and ``--{name}_num_gpus_per_node`` for a group of ``gpus``."""
    if gpus <= gpn:
        nodes, per = 1, gpus
    else:
        nodes, per = -(-gpus // gpn), gpn
        if gpus % gpn:
            out.missing.append(f"{name} group of {gpus} GPUs is not whole nodes of {gpn}; written as {nodes} nodes")
    out.set(f"{name}_num_nodes", nodes)
    out.set(f"{name}_num_gpus_per_node", per)


def _placement(spec: ScenarioSpec, out: _Out) -> None:
    pools, assign, total = resolved_pools(spec)
    gpn = total // spec.cluster.num_nodes
    size = {p.name: p.num_gpus for p in pools}
    plan = spec.plan
    roles = [r for r in roles_in_use(spec) if r in _ROLE_FLAG]
    engine_gpus = size[assign["generate"]]
    _engines(plan.rollout, engine_gpus, out)
    if plan.placement.kind == "colocated":
        out.set("colocate_all_models")
        for name in ("actor", *(_ROLE_FLAG[r] for r in roles)):
            _group(name, total, gpn, out)
        if plan.offload_between_phases:
            out.set("vllm_enable_sleep")
            out.set("deepspeed_enable_sleep")
        mode = mode_of(plan.mode)
        if not mode.settings.synchronous:
            out.missing.append(f"mode {mode.label} ({mode.family.replace('_', ' ')}) on a colocated pool: OpenRLHF's async trainer keeps vLLM on its own GPUs")
        return
    if assign["generate"] in (assign[r] for r in ("actor", *roles)):
        out.missing.append("generation sharing GPUs with some but not all models: OpenRLHF colocates vLLM only with --colocate_all_models")
    actor_pool = assign["actor"]
    _group("actor", size[actor_pool], gpn, out)
    _shared_groups(spec, pools, assign, roles, gpn, out)


def _shared_groups(spec: ScenarioSpec, pools: tuple[Pool, ...], assign: dict[str, str], roles: list[str], gpn: int, out: _Out) -> None:
    size = {p.name: p.num_gpus for p in pools}
    actor_pool = assign["actor"]
    on_actor = [r for r in roles if assign[r] == actor_pool]
    if on_actor and set(on_actor) != {"ref"}:
        if mode_of(spec.plan.mode).settings.synchronous:
            out.missing.append(f"{', '.join(on_actor)} on the actor's GPUs: OpenRLHF shares the actor's GPUs beyond the reference only with --colocate_all_models (async, or with vLLM)")
            on_actor = [r for r in on_actor if r == "ref"]
        else:
            out.set("colocate_all_models")
            for r in on_actor:
                _group(_ROLE_FLAG[r], size[actor_pool], gpn, out)
            return
    if "ref" in on_actor:
        out.set("colocate_actor_ref")
        _group("ref", size[actor_pool], gpn, out)
    rest = [r for r in roles if r not in on_actor]
    if "critic" in rest and "reward_model" in rest and assign["critic"] == assign["reward_model"]:
        out.set("colocate_critic_reward")
    seen: dict[str, str] = {}
    for r in rest:
        pool = assign[r]
        if pool in seen and {seen[pool], r} != {"critic", "reward_model"}:
            out.missing.append(f"{seen[pool]} and {r} share a pool: OpenRLHF gives them separate GPUs")
        seen.setdefault(pool, r)
        _group(_ROLE_FLAG[r], size[pool], gpn, out)


def _engines(e: EngineLayout, gpus: int, out: _Out) -> None:
    if e.pp > 1 or e.ep > 1:
        out.missing.append(f"engine pp {e.pp} / ep {e.ep}: OpenRLHF's vLLM engines take a tensor-parallel size only")
    out.set("vllm_num_engines", max(1, gpus // (e.tp * e.pp)))
    out.set("vllm_tensor_parallel_size", e.tp)


def _mode(spec: ScenarioSpec, out: _Out) -> None:
    if spec.plan.mode.fusion:
        out.missing.append("stage fusion: OpenRLHF does not stream finished samples into the log-prob passes")
    if spec.algorithm.old_logprob == "rollout":
        out.missing.append("old-policy log-probs from the rollout: OpenRLHF recomputes them")
    st = mode_of(spec.plan.mode).settings
    if st.token_budget is not None:
        out.missing.append("partial rollout with a token budget: not an OpenRLHF train_ppo_ray argument; written as synchronous")
    if st.train_parts > 1:
        out.missing.append(f"{st.train_parts} local updates per batch as it streams in: OpenRLHF trains on whole batches")
    if spec.plan.placement.kind == "colocated" or st.token_budget is not None or (st.ahead_batches == 0 and not st.interrupts_at_sync):
        return
    out.set("async_train")
    # OpenRLHF's queue holds whole batches: a fractional threshold rounds up.
    queue = max(1, math.ceil(st.ahead_batches))
    out.set("async_queue_size", queue)
    if st.interrupts_at_sync:
        if queue != st.ahead_batches:
            out.missing.append(f"streaming threshold {st.ahead_batches:g}: OpenRLHF queues whole batches; written as {queue}")
        out.set("partial_rollout")


# ---------------------------------------------------------------------- layouts and engine
def _per_tp_gpu(budget: int, tp: int, which: str, out: _Out) -> int:
    """OpenRLHF's per-GPU budget for rlperf's ``budget`` (tokens a micro-batch holds per device
    of the cp group): OpenRLHF multiplies its flag by ``ds_tensor_parallel_size`` as well."""
    per_gpu = -(-budget // tp)
    if per_gpu * tp != budget:
        out.missing.append(f"{which} token budget {budget:,} is not a multiple of tp {tp}: written as {per_gpu:,} per GPU "
                           f"({per_gpu * tp:,} per micro-batch)")
    return per_gpu


def _layout(spec: ScenarioSpec, out: _Out) -> None:
    lay = spec.plan.layout_for("actor")
    for role in roles_in_use(spec):
        if role in _ROLE_FLAG and _shape(spec.plan.layout_for(role)) != _shape(lay):
            out.missing.append(f"{role} layout differs from the actor's: OpenRLHF uses one DeepSpeed strategy for all models")
    out.set("zero_stage", lay.zero_stage)
    if lay.tp > 1:
        out.set("ds_tensor_parallel_size", lay.tp)
        if lay.sequence_parallel:
            out.missing.append("Megatron sequence parallelism on the tp group: DeepSpeed AutoTP has none")
    if lay.cp > 1:
        if lay.cp_kind == "ulysses":
            out.missing.append("Ulysses sequence parallelism: OpenRLHF's context parallelism is ring attention; written as ring")
        out.set("ring_attn_size", lay.cp)
    for what, n in (("pipeline", lay.pp), ("expert", lay.ep)):
        if n > 1:
            out.missing.append(f"{what} parallelism ({n}): not in OpenRLHF's DeepSpeed strategy")
    if lay.recompute != "none":
        out.set("gradient_checkpointing")
        if lay.recompute == "selective":
            out.missing.append("selective recompute: OpenRLHF checkpoints whole layers; written as full")
    out.set("micro_train_batch_size", lay.micro_batch_size)
    if lay.packing:
        out.set("packing_samples")
    if lay.max_tokens_per_microbatch is not None:
        out.set("use_dynamic_batch")
        out.set("train_max_tokens_per_gpu", _per_tp_gpu(lay.max_tokens_per_microbatch, lay.tp, "train", out))
    # forward passes (make_experience): their own micro-batch, or token budget when dynamic
    if lay.forward_max_tokens_per_microbatch is not None:
        if lay.max_tokens_per_microbatch is None:
            out.missing.append("a forward token budget with fixed training micro-batches: OpenRLHF's --use_dynamic_batch covers both")
        else:
            out.set("rollout_max_tokens_per_gpu", _per_tp_gpu(lay.forward_max_tokens_per_microbatch, lay.tp, "rollout", out))
    if lay.forward_micro_batch_size is not None:
        out.set("micro_rollout_batch_size", lay.forward_micro_batch_size)
    if lay.offload_optimizer:
        out.set("adam_offload")
    if lay.lora_rank:
        out.set("lora_rank", lay.lora_rank)
    for role in roles_in_use(spec):
        other = spec.plan.layout_for(role).lora_rank
        if role in _ROLE_FLAG and other != (lay.lora_rank if role == "critic" else 0):
            out.missing.append(f"{role}: LoRA rank {other}; OpenRLHF gives the actor's --lora_rank to the critic, none to frozen models")
    if lay.offload_params:
        out.missing.append("parameter offload during training (ZeRO-Offload of parameters): not an OpenRLHF argument")
    for field, want in (("param_dtype", "bf16"), ("grad_dtype", "fp32"), ("overlap_grad_comm", True)):
        if getattr(lay, field) != want:
            out.missing.append(f"{field}={getattr(lay, field)}: OpenRLHF trains in bf16 with fp32 reduction")
    if not lay.prefetch_gathers:
        out.missing.append("prefetch_gathers=False: OpenRLHF's DeepSpeed config keeps ZeRO-3's prefetch")
    if lay.max_reuse_distance_params != 1e9:
        out.missing.append("max_reuse_distance_params: OpenRLHF's DeepSpeed config leaves stage3_max_reuse_distance at 1e9")


def _shape(lay: TrainLayout) -> dict[str, object]:
    """A layout without its data-parallel degree (each OpenRLHF group has its own size) and its
    LoRA rank (the actor's and critic's, the frozen models' 0: one --lora_rank says both)."""
    return lay.model_dump(exclude={"dp", "lora_rank"})


def _engine(e: EngineLayout, out: _Out) -> None:
    out.set("vllm_gpu_memory_utilization", e.gpu_memory_utilization)
    if e.prefix_sharing:
        out.set("enable_prefix_caching")
    if not e.cuda_graphs:
        out.set("enforce_eager")
    default = EngineLayout()
    for field in ("max_num_seqs", "max_num_batched_tokens", "dtype", "kv_dtype"):
        if getattr(e, field) != getattr(default, field):
            out.missing.append(f"engine {field}={getattr(e, field)}: OpenRLHF leaves it at vLLM's default")

"""The built-in framework presets. Every support entry restates a cell of the framework's row in
``shared/research/frameworks_overview.md`` §1 ("At-a-glance design comparison"); the row's
source tags are in ``sources``. Default numbers cite the framework's own configuration.
"""

from __future__ import annotations

from rlperf.frameworks.presets import (
    FrameworkPreset,
    PlanDefaults,
    no,
    partial,
    register_framework,
    unknown,
    yes,
)

_NO_CRIT = "not in the framework's row"


@register_framework
def verl() -> FrameworkPreset:
    return FrameworkPreset(
        name="verl",
        aliases=("HybridFlow",),
        summary="HybridFlow: colocated hybrid engine by default; recipes for one-step-off and fully async",
        support=(
            ("colocated", yes("hybrid engine, the default")),
            ("disaggregated", yes("one-step-off and fully-async recipes")),
            ("hybrid", partial("automatic device mapping is in the HybridFlow paper; the trainers split at most rollout from training")),
            ("sync", yes("the main trainer")),
            ("one_step_off", yes("recipe/one_step_off_policy")),
            ("async", yes("fully-async recipe with a staleness threshold")),
            ("partial_rollout", partial("the fully-async recipe interrupts rollouts at weight syncs (no token budget)")),
            ("fusion", partial("the fully-async recipe streams samples into training, not into the log-prob passes")),
            ("zero", yes("FSDP/FSDP2 (ZeRO-2/3, HSDP)")),
            ("tp", yes("Megatron-Core")),
            ("pp", yes("Megatron-Core, with VPP")),
            ("sp_ulysses", yes("Ulysses with FSDP")),
            ("cp_ring", yes("Megatron-Core CP")),
            ("ep", yes("Megatron-Core EP/ETP")),
        ),
        training_backends=("FSDP", "FSDP2", "Megatron-Core"),
        rollout_engines=("vLLM", "SGLang", "HF"),
        weight_sync="3D-HybridEngine in-place reshard (colocated); NCCL broadcast + checkpoint-engine buckets (disaggregated)",
        algorithms=("PPO", "GRPO", "GSPO", "ReMax", "REINFORCE++", "RLOO", "PRIME", "DAPO", "Dr.GRPO"),
        defaults=PlanDefaults(
            placement="colocated",
            mode="sync",
            backend="fsdp",
            zero_stage=3,
            engine_tp=2,
            gpu_memory_utilization=0.5,
            offload_between_phases=False,
            max_tokens_per_microbatch=16384,
            max_num_seqs=1024,
            # dp_actor._forward_micro_batch with remove-padding (the default plan packs) divides
            # the model's bf16 logits by the temperature in place and takes log-probs with
            # flash-attn's in-place cross-entropy: one bf16 copy (the importer's rule, d55f57d;
            # the padded path slices the responses out and reshapes them, a second bf16 copy)
            forward_logits_dtype="bf16",
            source="verl ppo_trainer.yaml: hybrid_engine, strategy fsdp, rollout tp 2, gpu_memory_utilization 0.5,"
            " max_num_seqs 1024, param/optimizer offload off, gradient checkpointing on, ppo_max_token_len_per_gpu 16384;"
            " dp_actor: forward log-probs from the bf16 logits",
            assumed=("dynamic batching on (use_dynamic_bsz defaults off, but then ppo_micro_batch_size_per_gpu has no default)",),
        ),
        sources=("verl-readme", "verl-async", "hf-async"),
        zero3_with_model_parallel=False,
    )


@register_framework
def openrlhf() -> FrameworkPreset:
    return FrameworkPreset(
        name="OpenRLHF",
        summary="Ray placement of actor/critic/RM/ref/vLLM on separate GPUs, or hybrid-engine colocation with sleep mode",
        support=(
            ("colocated", yes("hybrid engine with sleep mode (--colocate_all_models)")),
            ("disaggregated", yes("distributed Ray placement")),
            ("hybrid", partial("each model its own GPU group; only actor+ref and critic+RM can share")),
            ("sync", yes("the default")),
            ("one_step_off", yes("async trainer with a queue of one batch")),
            ("async", yes("--async_train (--train.async_enable in newer releases)")),
            ("partial_rollout", yes("async + partial rollout")),
            ("fusion", no(_NO_CRIT)),
            ("zero", yes("DeepSpeed ZeRO-3")),
            ("tp", yes("DeepSpeed AutoTP")),
            ("pp", no("vLLM PP for rollout only")),
            ("sp_ulysses", no(_NO_CRIT)),
            ("cp_ring", yes("ring-attention SP")),
            ("ep", no("hf-async: only Megatron-backed libraries and PRIME-RL have working EP")),
        ),
        training_backends=("DeepSpeed",),
        rollout_engines=("vLLM",),
        weight_sync="NCCL (--vllm_sync_backend nccl) or CUDA IPC",
        algorithms=("PPO", "REINFORCE++", "GRPO", "RLOO", "Dr.GRPO"),
        defaults=PlanDefaults(
            placement="colocated",
            mode="sync",
            backend="deepspeed",
            zero_stage=2,
            engine_tp=1,
            gpu_memory_utilization=0.95,
            offload_between_phases=True,
            micro_batch_size=4,
            prefix_sharing=False,
            source="train_ppo_ray.py argparse: zero_stage 2, vllm_tensor_parallel_size 1, vllm_gpu_memory_utilization 0.95,"
            " micro_train_batch_size 4, enable_prefix_caching off; hybrid engine with vLLM/DeepSpeed sleep",
            assumed=("gradient checkpointing on (a flag, off by default; long responses need it)",),
        ),
        sources=("openrlhf-readme", "openrlhf-arch"),
    )


@register_framework
def deepspeed_chat() -> FrameworkPreset:
    return FrameworkPreset(
        name="DeepSpeed-Chat",
        aliases=("dschat",),
        summary="all models colocated in the DeepSpeed Hybrid Engine, synchronous",
        support=(
            ("colocated", yes("Hybrid Engine: all models on the same GPUs")),
            ("disaggregated", no(_NO_CRIT)),
            ("hybrid", no(_NO_CRIT)),
            ("sync", yes()),
            ("one_step_off", no(_NO_CRIT)),
            ("async", no(_NO_CRIT)),
            ("partial_rollout", no(_NO_CRIT)),
            ("fusion", no(_NO_CRIT)),
            ("zero", yes("ZeRO 1-3, offload")),
            ("tp", partial("TP for generation only (in-place ZeRO -> TP repartition)")),
            ("pp", no(_NO_CRIT)),
            ("sp_ulysses", no(_NO_CRIT)),
            ("cp_ring", no(_NO_CRIT)),
            ("ep", no(_NO_CRIT)),
        ),
        training_backends=("DeepSpeed ZeRO",),
        rollout_engines=("DeepSpeed-Inference kernels",),
        weight_sync="in-place ZeRO -> TP repartition inside the Hybrid Engine",
        algorithms=("PPO",),
        defaults=PlanDefaults(
            placement="colocated",
            mode="sync",
            backend="deepspeed",
            zero_stage=3,
            engine_tp=1,
            gpu_memory_utilization=0.85,
            offload_between_phases=False,
            prefix_sharing=False,
            source="frameworks_overview.md §1 (Hybrid Engine, ZeRO, TP for generation)",
            assumed=(
                "ZeRO-3 and generation tp 1",
                "engine memory share 0.85 (not vLLM; rlperf's engine default)",
                "generation costed as continuous batching (DeepSpeed-Chat generates in fixed batches)",
            ),
        ),
        sources=("dschat-blog",),
    )


@register_framework
def nemo_rl() -> FrameworkPreset:
    return FrameworkPreset(
        name="NeMo-RL",
        summary="colocated by default; disaggregated for async GRPO with a trajectory-age bound",
        support=(
            ("colocated", yes("colocated.enabled: true, the default")),
            ("disaggregated", yes("for async")),
            ("hybrid", no(_NO_CRIT)),
            ("sync", yes("on-policy")),
            ("one_step_off", yes("max_trajectory_age_steps = 1")),
            ("async", yes("max_trajectory_age_steps (e.g. 8-off)")),
            ("partial_rollout", partial("optional in-flight weight updates (rollouts continue with new weights)")),
            ("fusion", no(_NO_CRIT)),
            ("zero", yes("DTensor FSDP2")),
            ("tp", yes("DTensor or Megatron-Core")),
            ("pp", yes("Megatron-Core, with VPP")),
            ("sp_ulysses", no("DTensor SP is Megatron-style (on the TP group)")),
            ("cp_ring", yes("DTensor or Megatron-Core CP")),
            ("ep", yes("Megatron-Core")),
        ),
        training_backends=("DTensor (FSDP2+TP+SP+CP)", "Megatron-Core"),
        rollout_engines=("vLLM", "SGLang", "Megatron"),
        weight_sync="NCCL, CUDA-IPC/ZMQ, experimental nccl_reshard, NIXL checkpoint-engine",
        algorithms=("GRPO", "DAPO", "PPO"),
        defaults=PlanDefaults(
            placement="colocated",
            mode="sync",
            backend="fsdp",
            zero_stage=3,
            engine_tp=1,
            gpu_memory_utilization=0.6,
            offload_between_phases=True,
            max_tokens_per_microbatch=16384,
            source="frameworks_overview.md §1 (colocated default, DTensor FSDP2, vLLM)",
            assumed=("vLLM gpu_memory_utilization 0.6, tp 1, token budget 16384, offload between phases on",),
        ),
        sources=("nemorl-perf", "nemorl-refit", "hf-async"),
    )


@register_framework
def areal() -> FrameworkPreset:
    return FrameworkPreset(
        name="AReaL",
        summary="disaggregated, fully asynchronous with a head off-policyness bound and interruptible rollouts",
        support=(
            ("colocated", no(_NO_CRIT)),
            ("disaggregated", yes("inference:training GPUs 3:1 in the paper")),
            ("hybrid", no(_NO_CRIT)),
            ("sync", partial("max_head_offpolicyness 0 (rollout still on its own GPUs)")),
            ("one_step_off", yes("max_head_offpolicyness 1")),
            ("async", yes("max_head_offpolicyness η, decoupled PPO objective")),
            ("partial_rollout", yes("interruptible rollout: in-flight requests continue after a weight update")),
            ("fusion", no(_NO_CRIT)),
            ("zero", yes("FSDP2")),
            ("tp", yes("Megatron / Archon")),
            ("pp", yes("Megatron / Archon")),
            ("sp_ulysses", yes("Archon SP")),
            ("cp_ring", yes("Megatron / Archon CP")),
            ("ep", yes("Megatron / Archon")),
        ),
        training_backends=("FSDP2", "Megatron", "Archon"),
        rollout_engines=("SGLang", "vLLM"),
        weight_sync="NCCL chunked or filesystem safetensors; soft pause (in-flight requests finish)",
        algorithms=("PPO", "GRPO", "DAPO", "RLOO", "Dr.GRPO", "GSPO"),
        defaults=PlanDefaults(
            placement="disaggregated",
            rollout_share=0.75,
            mode="async",
            staleness=2,
            backend="fsdp",
            zero_stage=3,
            engine_tp=1,
            gpu_memory_utilization=0.9,
            offload_between_phases=False,
            max_tokens_per_microbatch=16384,
            source="frameworks_overview.md §1 (3:1 inference:training); AReaL example configs: rollout.max_head_offpolicyness 2",
            assumed=("SGLang memory fraction 0.9, tp 1, token budget 16384",),
        ),
        sources=("areal-readme", "hf-async", "areal-pc"),
    )


@register_framework
def slime() -> FrameworkPreset:
    return FrameworkPreset(
        name="slime",
        summary="Megatron-LM training + SGLang rollout, decoupled by default or --colocate",
        support=(
            ("colocated", yes("--colocate")),
            ("disaggregated", yes("decoupled, the default")),
            ("hybrid", no(_NO_CRIT)),
            ("sync", yes()),
            ("one_step_off", yes("async training overlaps one rollout")),
            ("async", yes("fully-async example")),
            ("partial_rollout", yes("APRIL: abort when N are done, resume partials next step")),
            ("fusion", no(_NO_CRIT)),
            ("zero", partial("Megatron distributed optimizer, CPU Adam, full GPU offload (no FSDP)")),
            ("tp", yes("Megatron-LM")),
            ("pp", yes("Megatron-LM")),
            ("sp_ulysses", no(_NO_CRIT)),
            ("cp_ring", yes("Megatron-LM CP")),
            ("ep", yes("Megatron-LM EP")),
        ),
        training_backends=("Megatron-LM",),
        rollout_engines=("SGLang (+router)",),
        weight_sync="colocated: CUDA IPC update_weights_from_tensor; disaggregated: NCCL update_weights_from_distributed, bucketed",
        algorithms=("GRPO", "GSPO", "PPO", "DAPO"),
        defaults=PlanDefaults(
            placement="disaggregated",
            rollout_share=0.5,
            mode="sync",
            backend="megatron",
            zero_stage=1,
            engine_tp=1,
            gpu_memory_utilization=0.8,
            offload_between_phases=False,
            max_tokens_per_microbatch=16384,
            source="frameworks_overview.md §1 (--colocate is opt-in, Megatron-LM, SGLang)",
            assumed=("half the GPUs generate", "SGLang memory fraction 0.8", "token budget 16384"),
        ),
        sources=("slime-blog", "slime-ws", "hf-async"),
    )


@register_framework
def real() -> FrameworkPreset:
    return FrameworkPreset(
        name="ReaL",
        aliases=("ReaLHF",),
        summary="parameter reallocation: each model call gets its own layout and device set (searched plan)",
        support=(
            ("colocated", partial("a reallocation plan may run every call on all GPUs")),
            ("disaggregated", partial("a reallocation plan may split calls over device sets")),
            ("hybrid", yes("per-call device sets and layouts (MCMC-searched)")),
            ("sync", yes("concurrent independent calls")),
            ("one_step_off", no(_NO_CRIT)),
            ("async", no(_NO_CRIT)),
            ("partial_rollout", no(_NO_CRIT)),
            ("fusion", no(_NO_CRIT)),
            ("zero", partial("Megatron-style data parallelism")),
            ("tp", yes("Megatron-style 3D")),
            ("pp", yes("Megatron-style 3D")),
            ("sp_ulysses", no(_NO_CRIT)),
            ("cp_ring", no(_NO_CRIT)),
            ("ep", no(_NO_CRIT)),
        ),
        training_backends=("Megatron-style 3D",),
        rollout_engines=("built-in generation (CUDA graph)",),
        weight_sync="parameter redistribution between calls",
        algorithms=("PPO",),
        defaults=PlanDefaults(
            placement="colocated",
            mode="sync",
            backend="megatron",
            zero_stage=1,
            engine_tp=1,
            gpu_memory_utilization=0.85,
            offload_between_phases=False,
            source="frameworks_overview.md §1 (Megatron-style 3D, built-in generation)",
            assumed=(
                "one colocated layout for every call (ReaL searches a layout per call)",
                "engine memory share 0.85 (rlperf's engine default)",
            ),
        ),
        sources=("real-final", "real-v1"),
    )


@register_framework
def rlhfuse() -> FrameworkPreset:
    return FrameworkPreset(
        name="RLHFuse",
        summary="stage fusion: sample-level generation/inference overlap and a fused actor+critic pipeline",
        support=(
            ("colocated", yes("fused stages share the GPUs")),
            ("disaggregated", no(_NO_CRIT)),
            ("hybrid", no(_NO_CRIT)),
            ("sync", yes("synchronous with stage fusion")),
            ("one_step_off", no(_NO_CRIT)),
            ("async", no(_NO_CRIT)),
            ("partial_rollout", no(_NO_CRIT)),
            ("fusion", yes("sample-level generation/inference overlap")),
            ("zero", partial("Megatron-style data parallelism")),
            ("tp", yes("Megatron-style 3D")),
            ("pp", yes("fused 1F1B schedules")),
            ("sp_ulysses", no(_NO_CRIT)),
            ("cp_ring", no(_NO_CRIT)),
            ("ep", no(_NO_CRIT)),
        ),
        training_backends=("Megatron-style 3D",),
        rollout_engines=("custom inference engine",),
        weight_sync="RDMA transfer; other overhead < 3% of the iteration",
        algorithms=("PPO",),
        defaults=PlanDefaults(
            placement="colocated",
            mode="sync",
            fusion=True,
            backend="megatron",
            zero_stage=1,
            engine_tp=1,
            gpu_memory_utilization=0.85,
            offload_between_phases=False,
            source="frameworks_overview.md §1 (fused stages, Megatron-style 3D)",
            assumed=("engine memory share 0.85 (rlperf's engine default)", "the fused actor+critic pipeline is not modelled"),
        ),
        sources=("rlhfuse-pc",),
    )


@register_framework
def streamrl() -> FrameworkPreset:
    return FrameworkPreset(
        name="StreamRL",
        summary="disaggregated stream generation service + trainer; stream generation or one-step async",
        support=(
            ("colocated", no(_NO_CRIT)),
            ("disaggregated", yes("Stream Generation Service + Trainer, heterogeneous and cross-datacenter")),
            ("hybrid", no(_NO_CRIT)),
            ("sync", yes("stream generation")),
            ("one_step_off", yes("one-step async")),
            ("async", no("one step only")),
            ("partial_rollout", no(_NO_CRIT)),
            ("fusion", yes("stream generation: samples flow to the trainer as they finish")),
            ("zero", unknown()),
            ("tp", unknown()),
            ("pp", unknown()),
            ("sp_ulysses", unknown()),
            ("cp_ring", unknown()),
            ("ep", unknown()),
        ),
        training_backends=("not documented",),
        rollout_engines=("custom stream generation service",),
        weight_sync="weight transfer < 2% of the iteration, even cross-datacenter for 72B",
        algorithms=("PPO",),
        defaults=PlanDefaults(
            placement="disaggregated",
            rollout_share=0.5,
            mode="sync",
            fusion=True,
            backend="megatron",
            zero_stage=1,
            engine_tp=1,
            gpu_memory_utilization=0.85,
            offload_between_phases=False,
            source="frameworks_overview.md §1 (disaggregated, stream generation)",
            assumed=("half the GPUs generate", "a Megatron-style trainer", "engine memory share 0.85"),
        ),
        sources=("streamrl-pc",),
    )


@register_framework
def trl() -> FrameworkPreset:
    return FrameworkPreset(
        name="TRL",
        aliases=("GRPOTrainer",),
        summary="Hugging Face GRPOTrainer: vLLM colocated (sleep mode) or a vLLM server on separate GPUs",
        support=(
            ("colocated", yes("vllm_mode colocate, the default, with sleep mode")),
            ("disaggregated", yes("vllm_mode server on separate GPUs")),
            ("hybrid", no(_NO_CRIT)),
            ("sync", yes()),
            ("one_step_off", no("an async trainer is in progress")),
            ("async", no("an async trainer is in progress")),
            ("partial_rollout", no(_NO_CRIT)),
            ("fusion", no(_NO_CRIT)),
            ("zero", yes("Accelerate + DeepSpeed ZeRO / FSDP2")),
            ("tp", no("vLLM TP for generation only")),
            ("pp", no(_NO_CRIT)),
            ("sp_ulysses", no(_NO_CRIT)),
            ("cp_ring", no(_NO_CRIT)),
            ("ep", no(_NO_CRIT)),
        ),
        training_backends=("Accelerate + DeepSpeed ZeRO", "FSDP2"),
        rollout_engines=("vLLM",),
        weight_sync="per-parameter update_named_param (server); in-process (colocate)",
        algorithms=("GRPO", "RLOO", "PPO"),
        defaults=PlanDefaults(
            placement="colocated",
            mode="sync",
            backend="deepspeed",
            zero_stage=3,
            engine_tp=1,
            gpu_memory_utilization=0.3,
            offload_between_phases=True,
            source="frameworks_overview.md §1 (vLLM colocate default, sleep mode); GRPOConfig vllm_gpu_memory_utilization 0.3, vllm_tensor_parallel_size 1",
            assumed=("ZeRO-3 through Accelerate's DeepSpeed config",),
        ),
        sources=("trl-colocate", "hf-async"),
    )

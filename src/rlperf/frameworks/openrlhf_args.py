"""OpenRLHF's ``openrlhf.cli.train_ppo_ray`` arguments: arity, defaults, and how rlperf treats them.

Names and defaults follow the script's argparse definitions (OpenRLHF, 2025); a flag is either
read by the importer (``READ``), ignored by design (no effect on step time or memory), or
unsupported (affects performance, not modelled; the value listed as harmless is the default or
what rlperf models anyway).
"""

from __future__ import annotations

from typing import Any

# Arguments the importer reads: name -> default ("flag" marks store_true, default False).
READ: dict[str, Any] = {
    "pretrain": None,
    "reward_pretrain": None,
    "critic_pretrain": None,
    "remote_rm_url": None,
    "actor_num_nodes": 1,
    "actor_num_gpus_per_node": 8,
    "ref_num_nodes": 1,
    "ref_num_gpus_per_node": 8,
    "critic_num_nodes": 1,
    "critic_num_gpus_per_node": 8,
    "reward_num_nodes": 1,
    "reward_num_gpus_per_node": 8,
    "colocate_all_models": "flag",
    "colocate_actor_ref": "flag",
    "colocate_critic_reward": "flag",
    "vllm_num_engines": None,
    "vllm_tensor_parallel_size": 1,
    "vllm_gpu_memory_utilization": 0.95,
    "enable_prefix_caching": "flag",
    "vllm_enable_sleep": "flag",
    "deepspeed_enable_sleep": "flag",
    "async_train": "flag",
    "async_queue_size": 1,
    "zero_stage": 2,
    "gradient_checkpointing": "flag",
    "adam_offload": "flag",
    "ds_tensor_parallel_size": 1,
    "ring_attn_size": 1,
    "packing_samples": "flag",
    "use_dynamic_batch": "flag",
    "train_max_tokens_per_gpu": 16192,
    "micro_train_batch_size": 4,
    "bf16": "flag",
    "rollout_batch_size": 1024,
    "n_samples_per_prompt": 1,
    "train_batch_size": 128,
    "max_epochs": 1,
    "prompt_max_len": 1024,
    "generate_max_len": 1024,
    "advantage_estimator": "gae",
    "init_kl_coef": 0.01,
    "use_kl_loss": "flag",
    "dynamic_filtering": "flag",
    "policy_loss_type": "ppo",
    "wandb_run_name": None,
}

ESTIMATORS = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo")

_NO_PERF = "no effect on step time or memory"
IGNORED: dict[str, str] = {
    **{k: "optimizer hyperparameter (" + _NO_PERF + ")" for k in (
        "actor_learning_rate", "critic_learning_rate", "lr_warmup_ratio", "lr_scheduler", "l2",
        "adam_betas", "max_norm")},
    **{k: "loss or advantage hyperparameter" for k in (
        "eps_clip", "eps_clip_low_high", "dual_clip", "value_clip", "lambd", "gamma", "ptx_coef",
        "normalize_reward", "kl_target", "kl_horizon", "reward_clip_range", "entropy_loss_coef",
        "aux_loss_coef", "no_advantage_std_norm", "overlong_buffer_len", "overlong_penalty_factor",
        "kl_estimator", "dynamic_filtering_reward_range", "enable_vllm_is_correction",
        "vllm_is_truncated_threshold")},
    **{k: "sampling (lengths are the workload's)" for k in ("top_p", "temperature")},
    **{k: "randomness" for k in ("seed", "full_determinism")},
    **{k: "checkpointing" for k in (
        "save_path", "ckpt_path", "save_steps", "save_hf_ckpt", "disable_ds_ckpt", "max_ckpt_num",
        "max_ckpt_mem", "load_checkpoint", "use_ds_universal_ckpt", "save_value_network",
        "value_head_prefix")},
    **{k: "logging" for k in (
        "logging_steps", "use_wandb", "wandb_org", "wandb_group", "wandb_project",
        "use_tensorboard", "perf")},
    **{k: "validation" for k in (
        "eval_steps", "eval_dataset", "eval_split", "eval_temperature", "eval_n_samples_per_prompt")},
    **{k: "dataset" for k in (
        "prompt_data", "prompt_data_probs", "prompt_split", "input_key", "label_key",
        "input_template", "apply_chat_template", "max_samples", "use_ms", "disable_fast_tokenizer")},
    **{k: "LoRA hyperparameter" for k in ("lora_alpha", "target_modules", "lora_dropout")},
    "num_episodes": "run length, not step time",
    "local_rank": "launcher",
    "max_len": "deprecated (prompt_max_len + generate_max_len)",
    "ema_beta": "EMA hyperparameter",
}

# name -> (what rlperf does instead, harmless values)
UNSUPPORTED: dict[str, tuple[str, tuple[Any, ...]]] = {
    "enforce_eager": ("decode efficiency is the profile's (CUDA graphs assumed)", (False,)),
    "vllm_sync_backend": ("weight sync is costed as an NCCL broadcast", ("nccl",)),
    "vllm_sync_with_ray": ("weight sync is costed as an NCCL broadcast", (False,)),
    "micro_rollout_batch_size": ("forward passes use the training micro-batch (micro_train_batch_size)", ()),
    "rollout_max_tokens_per_gpu": ("forward passes use the training token budget", (None,)),
    "vllm_generate_batch_size": ("the engine receives the whole rollout batch", (None,)),
    "rollout_tasks_per_gpu": ("CPU-side rollout workers are not modelled", (32,)),
    "load_in_4bit": ("quantized training is not modelled", (False,)),
    "lora_rank": ("LoRA is not modelled (full fine-tuning is costed)", (0,)),
    "attn_implementation": ("attention is costed as FlashAttention", ("flash_attention_2",)),
    "use_liger_kernel": ("kernel choice is not modelled", (False,)),
    "grad_accum_dtype": ("gradients are accumulated in the layout's grad dtype (fp32)", (None,)),
    "overlap_comm": ("ZeRO communication overlap is the layout's default", (False, True)),
    "gradient_checkpointing_use_reentrant": ("recompute cost does not depend on it", (False, True)),
    "deepcompile": ("compiler effects are not modelled", (False,)),
    "zpg": ("ZeRO++ partitioning is not modelled", (1,)),
    "enable_ema": ("an EMA copy of the weights is not modelled", (False,)),
    "actor_init_on_gpu": ("start-up is not costed", (False,)),
    "ref_reward_offload": ("offload of frozen models is not modelled separately", (False,)),
    "ring_head_stride": ("ring attention is costed over all heads at once", (1,)),
    "agent_func_path": ("agent rollouts are not modelled (costed as single-turn generation)", (None,)),
    "freezing_actor_steps": ("critic-only warm-up steps are not modelled (steady state)", (-1,)),
}

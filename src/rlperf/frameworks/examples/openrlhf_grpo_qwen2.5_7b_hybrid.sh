# GRPO (group_norm) on Qwen2.5-7B with OpenRLHF's hybrid engine: actor, reference and 8 vLLM
# engines colocated on 2 nodes x 8 GPUs with sleep mode, rule reward from a remote verifier.
# Written for rlperf's tests from the arguments of openrlhf.cli.train_ppo_ray.
python3 -m openrlhf.cli.train_ppo_ray \
  --ref_num_nodes 2 --ref_num_gpus_per_node 8 \
  --actor_num_nodes 2 --actor_num_gpus_per_node 8 \
  --vllm_num_engines 8 --vllm_tensor_parallel_size 2 \
  --colocate_all_models --vllm_enable_sleep --deepspeed_enable_sleep \
  --vllm_gpu_memory_utilization 0.6 --enable_prefix_caching \
  --pretrain Qwen/Qwen2.5-7B-Instruct \
  --remote_rm_url http://localhost:5000/get_reward \
  --micro_train_batch_size 2 --train_batch_size 512 \
  --micro_rollout_batch_size 8 --rollout_batch_size 256 --n_samples_per_prompt 8 \
  --max_epochs 1 --prompt_max_len 1024 --generate_max_len 8192 \
  --advantage_estimator group_norm --init_kl_coef 0.001 --use_kl_loss --kl_estimator k3 \
  --zero_stage 3 --bf16 --gradient_checkpointing --packing_samples \
  --use_dynamic_batch --train_max_tokens_per_gpu 32768 \
  --ring_attn_size 2 --ring_head_stride 2 \
  --actor_learning_rate 1e-6 --lr_warmup_ratio 0.03 \
  --prompt_data /data/math --input_key prompt --label_key answer --apply_chat_template \
  --wandb_run_name openrlhf-grpo-qwen2.5-7b-hybrid \
  --my_unknown_option 3

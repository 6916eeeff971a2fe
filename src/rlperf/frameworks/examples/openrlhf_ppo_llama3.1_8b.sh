# PPO on Llama-3.1-8B with OpenRLHF's distributed placement: actor, reference, critic, reward
# model and 4 vLLM engines on separate GPUs (5 groups of 8 = 40 GPUs). Written for rlperf's tests
# from the arguments of openrlhf.cli.train_ppo_ray; not a copy of an OpenRLHF script.
ray job submit --address="http://127.0.0.1:8265" \
  --runtime-env-json='{"working_dir": "/openrlhf"}' \
  -- python3 -m openrlhf.cli.train_ppo_ray \
  --ref_num_nodes 1 --ref_num_gpus_per_node 8 \
  --reward_num_nodes 1 --reward_num_gpus_per_node 8 \
  --critic_num_nodes 1 --critic_num_gpus_per_node 8 \
  --actor_num_nodes 1 --actor_num_gpus_per_node 8 \
  --vllm_num_engines 4 --vllm_tensor_parallel_size 2 \
  --vllm_gpu_memory_utilization 0.9 \
  --pretrain meta-llama/Llama-3.1-8B-Instruct \
  --reward_pretrain /models/Llama-3.1-8B-rm \
  --critic_pretrain meta-llama/Llama-3.1-8B-Instruct \
  --save_path ./checkpoint/llama3.1-8b-ppo \
  --micro_train_batch_size 4 --train_batch_size 128 \
  --micro_rollout_batch_size 8 --rollout_batch_size 512 \
  --max_epochs 1 --prompt_max_len 1024 --generate_max_len 2048 \
  --zero_stage 3 --bf16 \
  --actor_learning_rate 5e-7 --critic_learning_rate 9e-6 \
  --init_kl_coef 0.01 --advantage_estimator gae \
  --prompt_data OpenRLHF/prompt-collection-v0.1 --input_key context_messages --apply_chat_template \
  --normalize_reward --packing_samples --gradient_checkpointing \
  --use_wandb True --wandb_run_name openrlhf-ppo-llama3.1-8b

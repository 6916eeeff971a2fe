# REINFORCE++ on Qwen3-8B with OpenRLHF's asynchronous trainer: 4 vLLM engines (tp 2) on one
# node, actor and reference sharing the other node, queue of 2 batches (staleness 2).
# Written for rlperf's tests from the arguments of openrlhf.cli.train_ppo_ray.
python3 -m openrlhf.cli.train_ppo_ray \
  --actor_num_nodes 1 --actor_num_gpus_per_node 8 \
  --ref_num_nodes 1 --ref_num_gpus_per_node 8 --colocate_actor_ref \
  --vllm_num_engines 4 --vllm_tensor_parallel_size 2 \
  --async_train --async_queue_size 2 \
  --pretrain Qwen/Qwen3-8B --remote_rm_url http://verifier:8000/score \
  --rollout_batch_size 128 --n_samples_per_prompt 4 --train_batch_size 128 \
  --micro_train_batch_size 2 --max_epochs 1 \
  --prompt_max_len 2048 --generate_max_len 4096 \
  --advantage_estimator reinforce --init_kl_coef 0.01 \
  --zero_stage 2 --adam_offload --gradient_checkpointing --bf16 \
  --enforce_eager

"""OpenRLHF import and export: example command lines (written from train_ppo_ray's documented
arguments), field by field; round trips import -> export -> import; nothing dropped silently."""

from __future__ import annotations

from pathlib import Path

import pytest

import rlperf.frameworks
from rlperf.errors import SpecError
from rlperf.frameworks import export_openrlhf, import_openrlhf, load_framework_config
from rlperf.frameworks.openrlhf_import import parse_args, split_args
from rlperf.scenario import list_scenarios, load_scenario_spec, resolve, resolve_workload

EX = Path(rlperf.frameworks.__file__).parent / "examples"
PPO = EX / "openrlhf_ppo_llama3.1_8b.sh"
HYBRID = EX / "openrlhf_grpo_qwen2.5_7b_hybrid.sh"
ASYNC = EX / "openrlhf_reinforce_async.sh"
BASE = "--pretrain Qwen/Qwen2.5-7B --remote_rm_url http://x --advantage_estimator group_norm"


def keys(notes: tuple) -> set[str]:  # type: ignore[type-arg]
    return {n.key for n in notes}


def test_ppo_separate_groups_field_by_field() -> None:
    spec, rep = load_framework_config("openrlhf", PPO, [])
    assert (spec.name, spec.model) == ("openrlhf-ppo-llama3.1-8b", "Llama-3.1-8B")
    a = spec.algorithm
    assert (a.name, a.epochs, a.minibatches) == ("PPO", 1, 4)  # 512 x 1 samples / 128
    assert (a.reward.kind, a.reward.model, a.critic_model) == ("model", "Llama-3.1-8B", None)
    assert (spec.cluster.num_nodes, spec.cluster.gpus_per_node) == (5, 8)
    p = spec.plan.placement
    assert p.kind == "hybrid"
    assert {q.name: q.num_gpus for q in p.pools} == {"rollout": 8, "actor": 8, "ref": 8, "critic": 8, "reward": 8}
    assert p.assign == {"generate": "rollout", "actor": "actor", "ref": "ref", "critic": "critic", "reward_model": "reward"}
    e = spec.plan.rollout
    assert (e.tp, e.replicas, e.gpu_memory_utilization, e.prefix_sharing) == (2, 4, 0.9, False)
    lay = spec.plan.layouts["actor"]
    assert (lay.dp, lay.zero_stage, lay.recompute, lay.micro_batch_size, lay.cp_kind) == (8, 3, "full", 4, "ring")
    assert lay.gather_unit == "module"  # DeepSpeed's ZeRO-3 gathers submodule by submodule
    assert set(spec.plan.layouts) == {"actor"}  # every group has 8 GPUs: same layout
    w = resolve_workload(spec.workload)
    assert (w.prompts_per_step, w.group_size, w.max_prompt_tokens, w.max_response_tokens) == (512, 1, 1024, 2048)
    assert spec.plan.mode.kind == "sync" and not spec.plan.offload_between_phases
    assert not rep.unsupported and lay.forward_micro_batch_size == 8  # --micro_rollout_batch_size
    assert not rep.unknown
    ignored = {n.key: n.note for n in rep.ignored}
    assert "optimizer" in ignored["--actor_learning_rate"] and "--save_path" in ignored
    assert any("Llama-3.1-8B-rm" in a for a in rep.assumptions)  # the RM checkpoint read as its base


def test_hybrid_engine_grpo() -> None:
    spec, rep = load_framework_config("openrlhf", HYBRID, [])
    assert spec.plan.placement.kind == "colocated"
    assert (spec.cluster.num_nodes, spec.cluster.gpus_per_node) == (2, 8)
    assert spec.algorithm.name == "GRPO" and spec.algorithm.minibatches == 4  # 256 x 8 / 512
    assert spec.algorithm.reward.kind == "rule"
    e = spec.plan.rollout
    assert (e.tp, e.replicas, e.gpu_memory_utilization, e.prefix_sharing) == (2, 8, 0.6, True)
    lay = spec.plan.layouts["actor"]
    assert (lay.dp, lay.cp, lay.cp_kind, lay.max_tokens_per_microbatch, lay.micro_batch_size) == (8, 2, "ring", 32768, 2)
    assert spec.plan.offload_between_phases
    assert keys(rep.unknown) == {"--my_unknown_option"}
    assert keys(rep.unsupported) == {"--ring_head_stride"}


def test_async_with_actor_ref_colocated() -> None:
    spec, rep = load_framework_config("openrlhf", ASYNC.read_text(), [])
    p = spec.plan
    assert (p.placement.kind, p.placement.rollout_gpus) == ("disaggregated", 8)
    assert (p.mode.kind, p.mode.staleness) == ("async", 2)
    assert spec.algorithm.name == "REINFORCE++"
    lay = p.layouts["actor"]
    assert (lay.zero_stage, lay.offload_optimizer, lay.recompute) == (2, True, "full")
    assert not rep.unsupported and not p.rollout.cuda_graphs  # --enforce_eager
    ignored = {n.key: n.note for n in rep.ignored}
    assert ignored["--ref_num_nodes"] == "has no effect in this configuration"  # --colocate_actor_ref


@pytest.mark.parametrize("path", [PPO, HYBRID, ASYNC])
def test_import_export_import_is_identity(path: Path) -> None:
    spec, _ = load_framework_config("openrlhf", path, [], gpu="B200")
    exported = export_openrlhf(spec)
    again, report = import_openrlhf(list(exported.args), gpu="B200")
    assert again == spec
    assert not report.unknown and not exported.not_expressible
    assert exported.prefix == ("python3", "-m", "openrlhf.cli.train_ppo_ray")


@pytest.mark.parametrize("name", list_scenarios())
def test_export_of_shipped_scenarios_is_stable(name: str) -> None:
    try:
        spec = load_scenario_spec(name)
    except SpecError:
        pytest.skip(f"{name} does not load")
    first = export_openrlhf(spec)
    once, report = import_openrlhf(list(first.args), gpu=spec.cluster.gpu)
    assert not report.unknown
    twice, _ = import_openrlhf(list(export_openrlhf(once).args), gpu=spec.cluster.gpu)
    assert twice == once


def test_not_expressible_parts_are_listed() -> None:
    partial = " | ".join(export_openrlhf(load_scenario_spec("grpo-qwen2.5-7b-partial-rollout")).not_expressible)
    assert "partial rollout" in partial
    fusion = " | ".join(export_openrlhf(load_scenario_spec("ppo-qwen2.5-7b-fusion")).not_expressible)
    assert "stage fusion" in fusion
    hybrid = " | ".join(export_openrlhf(load_scenario_spec("ppo-qwen2.5-7b-hybrid")).not_expressible)
    assert "critic on the actor's GPUs" in hybrid or "share a pool" in hybrid
    spec = load_scenario_spec("grpo-qwen2.5-7b-colocated-sync")
    lay = spec.plan.layouts["actor"].model_copy(update={"pp": 2, "cp": 2, "cp_kind": "ulysses"})
    odd = spec.model_copy(update={"plan": spec.plan.model_copy(update={"layouts": {"actor": lay}})})
    missing = " | ".join(export_openrlhf(odd).not_expressible)
    assert "pipeline parallelism" in missing and "Ulysses" in missing
    remax = spec.model_copy(update={"algorithm": spec.algorithm.model_copy(update={"name": "ReMax"})})
    assert any("ReMax" in m for m in export_openrlhf(remax).not_expressible)


def test_argument_parsing() -> None:
    tokens = split_args("ray job submit --address=x -- python3 -m openrlhf.cli.train_ppo_ray --a 1 --flag --b=2 --eps_clip_low_high 0.2 0.28")
    assert tokens[0] == "--a"
    assert parse_args(tokens) == {"a": "1", "flag": True, "b": "2", "eps_clip_low_high": ["0.2", "0.28"]}
    assert split_args(["--x", "1"]) == ["--x", "1"]


def test_estimators_and_kl() -> None:
    for est, extra, name in (
        ("gae", "--reward_pretrain Qwen/Qwen2.5-7B --remote_rm_url ''", "PPO"),
        ("rloo", "", "RLOO"),
        ("dr_grpo", "--init_kl_coef 0", "Dr.GRPO"),
        ("group_norm", "--dynamic_filtering --init_kl_coef 0", "DAPO"),
        ("group_norm", "--policy_loss_type gspo --init_kl_coef 0", "GSPO"),
        ("reinforce_baseline", "", "REINFORCE++"),
    ):
        spec, _ = import_openrlhf(f"--pretrain Qwen/Qwen2.5-7B --remote_rm_url http://x --advantage_estimator {est} {extra}")
        assert spec.algorithm.name == name, est
    # GRPO without a reference (init_kl_coef 0): no reference model and no reference pass
    spec, rep = import_openrlhf(f"{BASE} --init_kl_coef 0")
    assert "--init_kl_coef" not in keys(rep.unsupported) and spec.algorithm.kl == "none"
    assert "ref_logprob" not in {s.name for s in resolve(spec).algorithm.active_stages(1)}
    # RLOO with the KL in the loss: the reference pass stays, old log-probs are not needed for it
    spec, _ = import_openrlhf(f"{BASE} --advantage_estimator rloo --use_kl_loss")
    assert spec.algorithm.kl == "k3_loss"


def test_errors_name_the_flag() -> None:
    with pytest.raises(SpecError, match="--pretrain: missing"):
        import_openrlhf("--remote_rm_url http://x")
    with pytest.raises(SpecError, match=r"--train_batch_size: 100 does not divide"):
        import_openrlhf(f"{BASE} --rollout_batch_size 64 --n_samples_per_prompt 4 --train_batch_size 100")
    with pytest.raises(SpecError, match=r"--advantage_estimator: unknown 'ppo2'"):
        import_openrlhf("--pretrain Qwen/Qwen2.5-7B --remote_rm_url http://x --advantage_estimator ppo2")
    with pytest.raises(SpecError, match=r"--vllm_num_engines: 3 x tp 1 != actor GPUs 8"):
        import_openrlhf(f"{BASE} --colocate_all_models --vllm_num_engines 3")
    with pytest.raises(SpecError, match="--reward_pretrain: missing"):
        import_openrlhf("--pretrain Qwen/Qwen2.5-7B")
    with pytest.raises(SpecError, match="framework: unknown config kind 'nemo'"):
        load_framework_config("nemo", "x", [])


def test_packing_samples_maps_to_packing_and_round_trips() -> None:
    from rlperf.frameworks.openrlhf_export import export_openrlhf

    args = HYBRID.read_text().replace("--packing_samples", "")
    padded, rep = load_framework_config("openrlhf", args, [])
    packed, _ = load_framework_config("openrlhf", HYBRID, [])
    assert packed.plan.layouts["actor"].packing and not padded.plan.layouts["actor"].packing
    assert any("padded" in a for a in rep.assumptions)
    for spec in (padded, packed):
        again, _ = load_framework_config("openrlhf", export_openrlhf(spec).args, [])
        assert again.plan.layouts["actor"].packing == spec.plan.layouts["actor"].packing


def test_scripts_of_old_versions_forks_and_other_trainers() -> None:
    # Before v0.4 the trainer was examples/train_ppo_ray.py; forks keep the name (simpleRL's
    # train_ppo_ray_box.py); a model path in the Hugging Face cache names its hub id.
    cached = "/hf/models--Qwen--Qwen2.5-7B/snapshots/b1013"
    for entry in ("examples/train_ppo_ray.py", "openrlhf/cli/train_ppo_ray_box.py"):
        spec, _ = load_framework_config(
            "openrlhf", f"H=/x\nsrun bash -c \"python3 {entry} --pretrain {cached} --remote_rm_url http://x\"\n", [])
        assert spec.model == "Qwen2.5-7B"
    # The DeepSpeed trainer without Ray is another program: named, not read as stray values.
    script = "set -x\nif [[ ${1} != slurm ]]; then\n  deepspeed --module openrlhf.cli.train_ppo --pretrain x\nfi\n"
    with pytest.raises(SpecError, match=r"script: runs openrlhf.cli.train_ppo, not OpenRLHF's Ray PPO trainer"):
        load_framework_config("openrlhf", script, [])


def test_layout_errors_name_the_flag_that_does_not_fit() -> None:
    base = f"{BASE} --actor_num_nodes 1 --actor_num_gpus_per_node 8 --vllm_num_engines 8 --colocate_all_models"
    with pytest.raises(SpecError, match=r"^--ring_attn_size: tp·cp = 3 does not divide"):
        import_openrlhf(f"{base} --ring_attn_size 3")
    with pytest.raises(SpecError, match=r"^--zero_stage: "):  # was "OpenRLHF import.plan.layouts.actor.zero_stage"
        import_openrlhf(f"{base} --zero_stage 4")


def test_a_model_option_without_a_value_says_so() -> None:
    with pytest.raises(SpecError, match=r"^--pretrain: no model given \(got True\)"):  # was "'True' is not in the catalog"
        import_openrlhf("--pretrain --remote_rm_url http://x")


def test_a_command_held_in_a_heredoc_is_read() -> None:
    # It was split as one command line and refused with "stray value 'EOF'", later refused as
    # "no trainer invocation found" (here-documents were not read).
    script = ("read -r -d '' CMD <<EOF\nopenrlhf.cli.train_ppo_ray --pretrain Qwen/Qwen2.5-7B \\\n"
              "  --remote_rm_url http://rm\nEOF\nray job submit -- python3 -m $CMD\n")
    spec, _ = load_framework_config("openrlhf", script, [])
    assert spec.model == "Qwen2.5-7B"
    with pytest.raises(SpecError, match=r"^script: runs openrlhf.cli.serve, not"):  # a heredoc is no argument
        load_framework_config("openrlhf", "python3 -m openrlhf.cli.serve <<EOF\n--pretrain x\nEOF\necho done\n", [])


def test_the_deprecated_max_len_beside_both_caps_is_the_joint_cap_and_round_trips() -> None:
    # OpenRLHF <= 0.8: max_len = args.max_len or prompt_max_len + generate_max_len is vLLM's
    # max_model_len; beside both caps it was ignored.
    base = ("--pretrain Qwen/Qwen2.5-7B --remote_rm_url http://rm --actor_num_nodes 1 --actor_num_gpus_per_node 8 "
            "--prompt_max_len 1024 --generate_max_len 1024 ")
    spec, _ = import_openrlhf(base + "--max_len 1500")
    assert resolve_workload(spec.workload).max_total_tokens == 1500
    again, _ = import_openrlhf(list(export_openrlhf(spec).args))
    assert resolve_workload(again.workload).max_total_tokens == 1500
    with pytest.raises(SpecError, match=r"^--max_len: 1,000 leaves no room for a response after --prompt_max_len"):
        import_openrlhf(base + "--max_len 1000")


def test_a_unique_flag_prefix_is_the_flag_as_argparse_reads_it() -> None:
    # train_ppo_ray's argparse accepts --n_samples for --n_samples_per_prompt; it was an unknown
    # flag and the group size fell back to 1.
    base = "--pretrain Qwen/Qwen2.5-7B --remote_rm_url http://rm --actor_num_nodes 1 --actor_num_gpus_per_node 8 "
    spec, rep = import_openrlhf(base + "--n_samples 4")
    assert resolve_workload(spec.workload).group_size == 4 and not rep.unknown
    _, rep = import_openrlhf(base + "--micro 2")  # ambiguous (micro_train_batch_size, micro_rollout_...)
    assert [n.key for n in rep.unknown] == ["--micro"]


@pytest.mark.parametrize("flag", ["--train.micro_batch_size 0", "--rollout.max_new_tokens 0"])
def test_an_error_in_a_dotted_command_line_names_the_flag_as_written(flag: str) -> None:
    # It named the older flag the importer stores it under (--micro_train_batch_size), which the
    # command line does not have.
    base = ("--actor.model_name_or_path Qwen/Qwen2.5-7B --reward.remote_url http://rm --actor.num_nodes 1 "
            "--actor.num_gpus_per_node 8 ")
    with pytest.raises(SpecError, match=rf"^{flag.split()[0]}: 0 is out of range"):
        import_openrlhf(base + flag)


def test_an_unset_variable_behind_a_dotted_flag_is_named() -> None:
    script = ("python3 -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path Qwen/Qwen2.5-7B --reward.remote_url "
              "http://rm --actor.num_nodes 1 --actor.num_gpus_per_node 8 --train.micro_batch_size $MICRO\n")
    with pytest.raises(SpecError, match=r"^--train\.micro_batch_size: .*--set MICRO=VALUE"):
        load_framework_config("openrlhf", script)


def test_a_token_budget_with_autotp_holds_budget_x_tp_tokens_and_round_trips() -> None:
    # OpenRLHF multiplies --train/rollout_max_tokens_per_gpu by ring_attn_size x
    # ds_tensor_parallel_size (seqlen_balancing.get_minimum_num_micro_batch_size) and every tp
    # rank holds the whole micro-batch; rlperf's budget is per device of the cp group, so the
    # imported budget is x tp (it was the flag's value: micro-batches half as long at tp 2)
    args = f"{BASE} --zero_stage 3 --use_dynamic_batch --train_max_tokens_per_gpu 8192 --rollout_max_tokens_per_gpu 12000"
    one, _ = import_openrlhf(args)
    two, rep = import_openrlhf(f"{args} --ds_tensor_parallel_size 2 --ring_attn_size 2")
    a1, a2 = one.plan.layouts["actor"], two.plan.layouts["actor"]
    assert (a1.max_tokens_per_microbatch, a1.forward_max_tokens_per_microbatch) == (8192, 12000)
    assert (a2.tp, a2.cp, a2.max_tokens_per_microbatch, a2.forward_max_tokens_per_microbatch) == (2, 2, 16384, 24000)
    assert any("x ds_tensor_parallel_size 2" in n.note for n in rep.mapped if n.key == "--train_max_tokens_per_gpu")
    exported = export_openrlhf(two)
    assert "8192" in exported.args[exported.args.index("--train_max_tokens_per_gpu") + 1]
    again, _ = import_openrlhf(list(exported.args))
    assert again.plan.layouts["actor"] == a2
    odd = two.model_copy(update={"plan": two.plan.model_copy(update={"layouts": {"actor": a2.model_copy(update={"max_tokens_per_microbatch": 16385})}})})
    assert any("not a multiple of tp 2" in m for m in export_openrlhf(odd).not_expressible)


def test_enforce_eager_turns_the_engines_cuda_graphs_off_and_round_trips() -> None:
    # vllm_engine.LLMRayActor passes --enforce_eager / --vllm.enforce_eager to vLLM (no CUDA
    # graphs: every op of a decode step launched from the host); it was listed as unsupported
    # and the engine costed with CUDA graphs
    plain, _ = import_openrlhf(BASE)
    eager, rep = import_openrlhf(f"{BASE} --enforce_eager")
    assert plain.plan.rollout.cuda_graphs and not eager.plan.rollout.cuda_graphs
    assert "--enforce_eager" in keys(rep.mapped) and "--enforce_eager" not in keys(rep.unsupported)
    dotted, _ = import_openrlhf(f"{BASE} --vllm.enforce_eager")
    assert not dotted.plan.rollout.cuda_graphs
    again, _ = import_openrlhf(list(export_openrlhf(eager).args))
    assert again.plan.rollout == eager.plan.rollout


def test_lora_rank_trains_adapters_on_the_actor_and_critic_and_round_trips() -> None:
    # ppo_actor / ppo_critic give --lora_rank (--ds.lora.rank) to their models; the reference and
    # reward model stay whole. It was listed as unsupported and costed as full fine-tuning.
    args = f"{BASE} --init_kl_coef 0.01 --colocate_actor_ref --lora_rank 64"
    spec, rep = import_openrlhf(args)
    assert spec.plan.layouts["actor"].lora_rank == 64 and spec.plan.layout_for("ref").lora_rank == 0
    assert "--lora_rank" in keys(rep.mapped) and "--lora_rank" not in keys(rep.unsupported)
    dotted, _ = import_openrlhf(args.replace("--lora_rank", "--ds.lora.rank"))
    assert dotted.plan.layouts["actor"].lora_rank == 64
    exported = export_openrlhf(spec)
    assert not [m for m in exported.not_expressible if "LoRA" in m]
    again, _ = import_openrlhf(list(exported.args))
    assert again.plan == spec.plan
    _, rep = import_openrlhf(f"{args} --target_modules q_proj v_proj")
    assert "--target_modules" in keys(rep.unsupported)

"""verl import and export: example configs (written from verl's documented options), field by
field; round trips import -> export -> import; every key lands in exactly one bucket."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import rlperf.frameworks
from rlperf.errors import SpecError
from rlperf.frameworks import export_verl, import_verl, load_framework_config, read_overrides
from rlperf.frameworks.config_tree import apply_overrides, flatten, resolve_interpolations
from rlperf.frameworks.report import ImportReport
from rlperf.scenario import ScenarioSpec, load_scenario_spec, list_scenarios, resolve_workload

EX = Path(rlperf.frameworks.__file__).parent / "examples"
GRPO = EX / "verl_grpo_qwen2.5_7b.yaml"
GRPO_OVERRIDES = read_overrides(EX / "verl_grpo_qwen2.5_7b.overrides")
PPO = EX / "verl_ppo_megatron_qwen2.5_32b.yaml"
ASYNC = EX / "verl_grpo_fully_async.yaml"
ONE_STEP = EX / "verl_one_step_off.overrides"


def keys(notes: tuple) -> set[str]:  # type: ignore[type-arg]
    return {n.key for n in notes}


def buckets(r: ImportReport) -> list[set[str]]:
    return [keys(r.mapped), keys(r.ignored), keys(r.unsupported), keys(r.unknown), keys(r.defaulted)]


# ---------------------------------------------------------------------- the examples
def test_grpo_fsdp_colocated_field_by_field() -> None:
    spec, rep = import_verl(GRPO, GRPO_OVERRIDES)
    assert spec.name == "verl-grpo-qwen2.5-7b"
    assert spec.model == "Qwen2.5-7B"  # /models/Qwen2.5-7B-Instruct
    assert (spec.cluster.gpu, spec.cluster.num_nodes, spec.cluster.gpus_per_node) == ("H100", 2, 8)
    w = resolve_workload(spec.workload)
    assert (w.prompts_per_step, w.group_size) == (512, 8)
    assert (w.max_prompt_tokens, w.max_response_tokens) == (1024, 8192)  # response cap from the override
    a = spec.algorithm
    assert (a.name, a.epochs, a.minibatches, a.reward.kind) == ("GRPO", 1, 8, "rule")  # 512 / 64 (override)
    p = spec.plan
    assert p.placement.kind == "colocated" and p.mode.kind == "sync"
    assert (p.rollout.tp, p.rollout.replicas) == (1, 16)  # tp from the override
    assert (p.rollout.gpu_memory_utilization, p.rollout.max_num_seqs, p.rollout.max_num_batched_tokens) == (0.6, 512, 8192)
    assert p.rollout.prefix_sharing
    actor = p.layouts["actor"]
    assert (actor.dp, actor.tp, actor.pp, actor.cp, actor.cp_kind, actor.zero_stage) == (16, 1, 1, 1, "ulysses", 3)
    assert (actor.micro_batch_size, actor.max_tokens_per_microbatch, actor.recompute) == (4, 24576, "full")
    ref = p.layouts["ref"]
    assert (ref.micro_batch_size, ref.max_tokens_per_microbatch) == (8, 24576)  # ref budget follows the actor's
    assert set(p.layouts) == {"actor", "ref"}
    # ref.fsdp_config.param_offload: the reference streams its weights from host in its pass;
    # it does not turn on plan-wide offload (the actor's switches are false)
    assert ref.offload_params and not actor.offload_params and not p.offload_between_phases
    assert keys(rep.unknown) == {"trainer.my_custom_flag"}
    # old-policy log-probs follow the actor's dynamic batching (log_prob_use_dynamic_bsz defaults
    # to it): the fixed log-prob micro-batch is read and unused
    assert "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu" in keys(rep.mapped)
    assert actor.forward_micro_batch_size is None and actor.forward_max_tokens_per_microbatch is None
    ignored = {n.key: n.note for n in rep.ignored}
    assert "optimizer" in ignored["actor_rollout_ref.actor.optim.lr"]
    assert "trainer.logger" in ignored and "data.train_files" in ignored


def test_ppo_megatron_with_critic_and_reward_model() -> None:
    spec, rep = import_verl(PPO)
    a = spec.algorithm
    assert (a.name, a.epochs, a.minibatches) == ("PPO", 2, 4)
    assert a.critic_model == "Qwen2.5-7B" and (a.reward.kind, a.reward.model) == ("model", "Qwen2.5-1.5B")
    p = spec.plan
    actor = p.layouts["actor"]
    assert (actor.tp, actor.pp, actor.dp, actor.zero_stage) == (4, 2, 4, 1)
    assert (actor.pp_schedule, actor.virtual_stages, actor.cp_kind, actor.recompute) == ("interleaved", 2, "ring", "full")
    assert (p.layouts["critic"].tp, p.layouts["critic"].dp, p.layouts["critic"].micro_batch_size) == (2, 16, 2)
    ref = p.layouts["ref"]  # inherits the actor's Megatron layout, own micro-batch
    assert (ref.tp, ref.pp, ref.virtual_stages, ref.micro_batch_size) == (4, 2, 2, 2)
    rm = p.layouts["reward_model"]
    assert (rm.zero_stage, rm.dp, rm.micro_batch_size) == (3, 32, 4)
    assert p.offload_between_phases
    assert (p.rollout.tp, p.rollout.replicas) == (4, 8)
    # uniform recompute of 1-layer chunks is every layer: what "full" costs
    assert "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method" in keys(rep.ignored)
    assert p.layouts["actor"].forward_micro_batch_size == 2 and p.layouts["actor"].backend == "megatron"
    assert not rep.unknown


def test_fully_async_recipe() -> None:
    spec, rep = import_verl(ASYNC)
    p = spec.plan
    assert (p.placement.kind, p.placement.rollout_gpus) == ("disaggregated", 32)
    assert (spec.cluster.num_nodes, spec.cluster.gpus_per_node) == (8, 8)
    assert (p.mode.kind, p.mode.staleness_threshold) == ("streaming", 0.5)  # partial_rollout=True
    w = resolve_workload(spec.workload)
    assert (w.prompts_per_step, w.group_size) == (8 * 1 * 32, 16)  # trigger x require x mini-batch
    assert spec.algorithm.minibatches == 8
    actor = p.layouts["actor"]
    assert (actor.dp, actor.cp, actor.cp_kind, actor.max_tokens_per_microbatch) == (16, 2, "ulysses", 36864)
    assert (p.rollout.tp, p.rollout.replicas) == (2, 16)
    unsupported = keys(rep.unsupported)
    assert "async_training.partial_rollout" not in unsupported  # interrupt-and-resume: streaming
    assert "actor_rollout_ref.actor.use_kl_loss" not in unsupported  # GRPO without KL: no reference pass
    assert spec.algorithm.kl == "none"
    assert "data.train_batch_size" in unsupported


def test_one_step_off_from_overrides_only() -> None:
    spec, rep = load_framework_config("verl", ONE_STEP, [])
    assert spec.model == "Qwen3-8B"
    assert (spec.cluster.num_nodes, spec.cluster.gpus_per_node) == (1, 8)  # 6 + 2 GPUs on one node
    assert (spec.plan.placement.kind, spec.plan.placement.rollout_gpus) == ("disaggregated", 2)
    assert spec.plan.mode.kind == "one_step_off"
    assert spec.plan.layouts["actor"].dp == 6 and spec.algorithm.minibatches == 2
    assert not rep.unknown and not rep.unsupported


@pytest.mark.parametrize("config,overrides", [(GRPO, GRPO_OVERRIDES), (PPO, []), (ASYNC, []), (None, read_overrides(ONE_STEP))])
def test_every_key_in_exactly_one_bucket(config: Path | None, overrides: list[str]) -> None:
    from rlperf.frameworks.config_tree import load_yaml_tree

    _, rep = import_verl(config, overrides)
    tree = load_yaml_tree(config) if config else {}
    given = set(resolve_interpolations(apply_overrides(flatten(tree), overrides)))
    b = buckets(rep)
    seen = set().union(*b[:4])
    assert given == seen  # every key of the config is listed (defaulted keys are not in it)
    for i in range(5):
        for j in range(i + 1, 5):
            assert not b[i] & b[j], (i, j, b[i] & b[j])


# ---------------------------------------------------------------------- round trips
@pytest.mark.parametrize("config,overrides", [(GRPO, GRPO_OVERRIDES), (PPO, []), (ASYNC, []), (None, read_overrides(ONE_STEP))])
def test_import_export_import_is_identity(config: Path | None, overrides: list[str]) -> None:
    spec, _ = import_verl(config, overrides, gpu="H200")
    exported = export_verl(spec)
    again, report = import_verl(None, list(exported.args), gpu="H200")
    assert again == spec
    assert not report.unknown
    assert all(n.startswith("workload") is False for n in exported.not_expressible)


def test_round_trip_keeps_a_given_mean_response_length() -> None:
    spec, _ = import_verl(GRPO, GRPO_OVERRIDES, mean_response_tokens=3000)
    again, _ = import_verl(None, list(export_verl(spec).args), mean_response_tokens=3000)
    assert again == spec
    assert resolve_workload(spec.workload).response_length.mean_tokens() == pytest.approx(3000, rel=1e-6)


@pytest.mark.parametrize("name", list_scenarios())
def test_export_of_shipped_scenarios_is_stable(name: str) -> None:
    """Exporting any scenario gives overrides verl accepts; re-exporting their import is a fixed
    point (what verl cannot express is lost once, then stays put)."""
    try:
        spec = load_scenario_spec(name)
    except SpecError:
        pytest.skip(f"{name} does not load")
    first = export_verl(spec)
    once, report = import_verl(None, list(first.args), gpu=spec.cluster.gpu)
    assert not report.unknown
    twice, _ = import_verl(None, list(export_verl(once).args), gpu=spec.cluster.gpu)
    assert twice == once
    # what the import reads back differently: the algorithm, or a forward-only role's weights kept
    # on GPU (verl's FSDP workers stream them from host)
    lost = [m for m in first.not_expressible if m.startswith("algorithm") or "stream a" in m]
    if not lost:
        assert export_verl(once).args == first.args


def test_not_expressible_parts_are_listed() -> None:
    hybrid = export_verl(load_scenario_spec("ppo-qwen2.5-7b-hybrid"))
    assert any("hybrid pools" in m for m in hybrid.not_expressible)
    partial = export_verl(load_scenario_spec("grpo-qwen2.5-7b-partial-rollout"))
    assert any("partial rollout" in m or "mode partial_rollout" in m for m in partial.not_expressible)
    fusion = export_verl(load_scenario_spec("ppo-qwen2.5-7b-fusion"))
    assert any("stage fusion" in m for m in fusion.not_expressible)
    spec = load_scenario_spec("grpo-qwen2.5-7b-colocated-sync")
    gpipe = spec.plan.layouts["actor"].model_copy(update={"tp": 2, "pp": 2, "zero_stage": 3, "pp_schedule": "gpipe"})
    odd = spec.model_copy(update={"plan": spec.plan.model_copy(update={"layouts": {"actor": gpipe}})})
    missing = " | ".join(export_verl(odd).not_expressible)
    assert "ZeRO-3" in missing and "GPipe" in missing
    # gathers without prefetch (DeepSpeed-Chat's live-parameter cap) are not a verl setting
    unprefetched = spec.plan.layouts["actor"].model_copy(update={"prefetch_gathers": False})
    plain = spec.model_copy(update={"plan": spec.plan.model_copy(update={"layouts": {"actor": unprefetched}})})
    assert "prefetch_gathers" in " | ".join(export_verl(plain).not_expressible)
    assert "prefetch_gathers" not in " | ".join(export_verl(spec).not_expressible)


# ---------------------------------------------------------------------- Hydra syntax and errors
def test_hydra_override_forms() -> None:
    flat = flatten({"a": {"b": 1, "c": {"d": 2}}, "x": "${a.b}", "y": "${oc.select:a.zz,7}", "s": {"t": "${.u}", "u": 5}})
    flat = apply_overrides(flat, ["+a.new=True", "++a.b=3", "~a.c", "e={f: 1, g: [1,2]}"])
    flat = resolve_interpolations(flat)
    assert flat == {"a.b": 3, "a.new": True, "x": 3, "y": 7, "s.t": 5, "s.u": 5, "e.f": 1, "e.g": [1, 2]}


def test_errors_name_the_key() -> None:
    with pytest.raises(SpecError, match=r"actor_rollout_ref\.model\.path: missing"):
        import_verl(None, ["data.train_batch_size=8"])
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B"]
    with pytest.raises(SpecError, match=r"ppo_mini_batch_size: 48 does not divide data\.train_batch_size \(100\)"):
        import_verl(None, [*base, "data.train_batch_size=100", "actor_rollout_ref.actor.ppo_mini_batch_size=48"])
    with pytest.raises(SpecError, match=r"algorithm\.adv_estimator: 'opo' has no rlperf algorithm; allowed: gae, grpo"):
        import_verl(None, [*base, "algorithm.adv_estimator=opo"])
    with pytest.raises(SpecError, match=r"actor_rollout_ref\.model\.path: '/m/MyModel' is not in the model catalog"):
        import_verl(None, ["actor_rollout_ref.model.path=/m/MyModel"])
    with pytest.raises(SpecError, match="overrides: 'novalue' is not key=value"):
        import_verl(None, [*base, "novalue"])


def test_algorithm_variants() -> None:
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "algorithm.adv_estimator=grpo"]
    cases = {
        ("algorithm.norm_adv_by_std_in_grpo=False",): "Dr.GRPO",
        ("++algorithm.filter_groups.enable=True", "++data.gen_batch_size=3072"): "DAPO",
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gspo",): "GSPO",
    }
    for extra, name in cases.items():
        spec, rep = import_verl(None, [*base, *extra])
        assert spec.algorithm.name == name
        assert not rep.unknown
    for est, name in (("rloo", "RLOO"), ("remax", "ReMax"), ("reinforce_plus_plus", "REINFORCE++"), ("gae", "PPO")):
        spec, _ = import_verl(None, ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", f"algorithm.adv_estimator={est}"])
        assert spec.algorithm.name == name


def test_defaults_are_verls() -> None:
    spec, rep = import_verl(None, ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B"])
    w = resolve_workload(spec.workload)
    assert (w.prompts_per_step, w.group_size, w.max_prompt_tokens, w.max_response_tokens) == (1024, 1, 512, 512)
    assert (spec.plan.rollout.tp, spec.plan.rollout.gpu_memory_utilization, spec.plan.rollout.max_num_seqs) == (2, 0.5, 1024)
    assert spec.algorithm.name == "PPO" and spec.algorithm.minibatches == 4  # 1024 / 256
    defaulted = {n.key: n.value for n in rep.defaulted}
    assert defaulted["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "2"
    assert isinstance(spec, ScenarioSpec)
    # verl >= 0.7 (#4461) packs the actor's model by default; the critic's stays padded
    assert spec.plan.layouts["actor"].packing and not spec.plan.layout_for("critic").packing
    assert defaulted["actor_rollout_ref.model.use_remove_padding"] == "True"


def test_remove_padding_maps_to_packing_and_round_trips() -> None:
    packed, _ = load_framework_config("verl", GRPO, [])
    padded, rep = load_framework_config("verl", GRPO, ["actor_rollout_ref.model.use_remove_padding=false"])
    assert packed.plan.layouts["actor"].packing and not padded.plan.layouts["actor"].packing
    assert "actor_rollout_ref.model.use_remove_padding" in {n.key for n in rep.mapped}
    for spec in (packed, padded):
        again, _ = load_framework_config("verl", None, export_verl(spec).args)
        assert again.plan.layouts["actor"].packing == spec.plan.layouts["actor"].packing


def test_engine_name_and_eager_mode_map_to_the_engine_model_and_round_trip() -> None:
    """rollout.name=sglang runs SGLang's overlap scheduler; enforce_eager turns CUDA graphs off."""
    plain, _ = load_framework_config("verl", GRPO, [])
    sgl, _ = load_framework_config("verl", GRPO, ["actor_rollout_ref.rollout.name=sglang",
                                                  "actor_rollout_ref.rollout.enforce_eager=true"])
    assert not plain.plan.rollout.overlap_scheduling and plain.plan.rollout.cuda_graphs
    assert sgl.plan.rollout.overlap_scheduling and not sgl.plan.rollout.cuda_graphs
    again, _ = load_framework_config("verl", None, export_verl(sgl).args)
    assert again.plan.rollout == sgl.plan.rollout


def test_rollout_data_parallel_experts_are_data_parallel_attention() -> None:
    # verl: ep = tp·dp over one server (RolloutConfig asserts it). It was refused as
    # "verl import.plan.rollout: ep must equal tp*pp", a field the script does not have.
    base = ["actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]
    spec, rep = import_verl(None, [*base, "actor_rollout_ref.rollout.data_parallel_size=4",
                                   "actor_rollout_ref.rollout.expert_parallel_size=4"])
    e = spec.plan.rollout
    assert (e.tp, e.ep, e.dp_attention, e.replicas) == (4, 4, True, 2)
    assert any(n.key.endswith("rollout.data_parallel_size") and "data-parallel attention" in n.note for n in rep.mapped)
    again, _ = import_verl(None, list(export_verl(spec).args))
    assert again.plan.rollout == e
    with pytest.raises(SpecError, match=r"^actor_rollout_ref\.rollout\.expert_parallel_size: 8 with tensor_model_parallel_size 1, "
                                        r"data_parallel_size 4 .*allowed: tp·dp = 4"):
        import_verl(None, [*base, "actor_rollout_ref.rollout.data_parallel_size=4", "actor_rollout_ref.rollout.expert_parallel_size=8"])


@pytest.mark.parametrize("entry", ["verl.trainer.fsdp_sft_trainer", "verl.trainer.main_generation"])
def test_a_script_that_runs_another_verl_entry_names_it(tmp_path: Path, entry: str) -> None:
    # SFT was "no trainer invocation found"; generation was read as a trainer and refused for a
    # missing actor_rollout_ref.model.path.
    script = tmp_path / "run.sh"
    script.write_text(f"torchrun --nproc_per_node=8 -m {entry} model.path=Qwen/Qwen2.5-7B data.batch_size=8\n")
    with pytest.raises(SpecError, match=rf"^script: runs {entry}, not one of verl's RL trainers"):
        load_framework_config("verl", script)


@pytest.mark.parametrize("override, key", [
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=3", "actor_rollout_ref.actor.ulysses_sequence_parallel_size"),
    ("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3", "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size"),
])
def test_a_layout_that_does_not_divide_its_pool_names_the_degree(override: str, key: str) -> None:
    # It named actor_rollout_ref.actor.strategy, a key the script may not set at all.
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16"]
    if "megatron" in override:
        base.append("actor_rollout_ref.actor.strategy=megatron")
    with pytest.raises(SpecError, match=rf"^{re.escape(key)}: tp·pp·cp = 3 does not divide the 8 GPUs of the actor pool"):
        import_verl(None, [*base, override])


def test_a_version_written_with_an_underscore_finds_its_catalog_entry() -> None:
    # A local folder "Qwen2_5-7B" was "not in the model catalog".
    spec, rep = import_verl(None, ["actor_rollout_ref.model.path=../../models/Qwen2_5-7B", "trainer.n_gpus_per_node=8",
                                   "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=16"])
    assert spec.model == "Qwen2.5-7B"
    assert any("read as Qwen2.5-7B (the version written with '_')" in a for a in rep.assumptions)


def test_rollout_max_model_len_is_the_joint_cap_and_round_trips() -> None:
    # It was "unsupported" (any value but null), and a model whose positions the caps exceed was
    # refused even where max_model_len kept every sequence within them.
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16", "data.max_prompt_length=1024", "data.max_response_length=8192"]
    spec, rep = import_verl(None, [*base, "actor_rollout_ref.rollout.max_model_len=4096"])
    assert resolve_workload(spec.workload).max_total_tokens == 4096
    assert any(n.key.endswith("rollout.max_model_len") and "max_total_tokens" in n.note for n in rep.mapped)
    again, _ = import_verl(None, list(export_verl(spec).args))
    assert resolve_workload(again.workload).max_total_tokens == 4096
    with pytest.raises(SpecError, match=r"^actor_rollout_ref\.rollout\.max_model_len: 1,024 leaves no room"):
        import_verl(None, [*base, "actor_rollout_ref.rollout.max_model_len=1024"])


def _repo(tmp_path: Path, config_rel: str, script_rel: str, command: str) -> Path:
    config = tmp_path / config_rel
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("actor_rollout_ref:\n  rollout:\n    n: 6\n")
    script = tmp_path / script_rel
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(command + " actor_rollout_ref.model.path=Qwen/Qwen2.5-7B trainer.n_gpus_per_node=8 "
                      "data.train_batch_size=64 actor_rollout_ref.actor.ppo_mini_batch_size=16\n")
    return script


@pytest.mark.parametrize("config_rel, script_rel, command", [
    # a path the script computes: looked up by its tail above the script (verl examples/sglang_multiturn)
    ("examples/mt/config/mt_grpo.yaml", "examples/mt/run.sh",
     'python3 -m verl.trainer.main_ppo --config-path="$(pwd)/examples/mt/config" --config-name=mt_grpo'),
    # a relative path is Hydra's: beside the entry module (verl recipe/fully_async_policy/shell/*.sh)
    ("recipe/fa/config/fa_trainer.yaml", "recipe/fa/shell/run.sh",
     "python3 -m recipe.fa.main_ppo --config-path=config --config-name=fa_trainer"),
    # no --config-path: the entry point's @hydra.main(config_path="config")
    ("recipe/fa/config/fa_trainer.yaml", "recipe/fa/run.sh", "python3 -m recipe.fa.main_ppo --config-name=fa_trainer"),
])
def test_a_named_config_is_found_where_hydra_finds_it(tmp_path: Path, config_rel: str, script_rel: str, command: str) -> None:
    # Each was not found and its settings were dropped without a word (rollout.n 1, not 6).
    spec, rep = load_framework_config("verl", _repo(tmp_path, config_rel, script_rel, command))
    assert resolve_workload(spec.workload).group_size == 6
    assert not any("--config-name" in w for w in rep.warnings)


def test_a_named_config_that_is_not_found_is_warned_about(tmp_path: Path) -> None:
    script = _repo(tmp_path, "elsewhere/x.yaml", "run.sh", "python3 -m verl.trainer.main_ppo --config-path=cfg --config-name=mine")
    spec, rep = load_framework_config("verl", script)
    assert resolve_workload(spec.workload).group_size == 1
    assert any(w.startswith("--config-name mine: no mine.yaml in cfg; its settings are not read") for w in rep.warnings)
    # verl's own configs are read by their name: no warning
    script = _repo(tmp_path, "elsewhere/x.yaml", "run.sh", "python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer")
    assert not load_framework_config("verl", script)[1].warnings


def test_python_none_written_in_a_megatron_setting_is_null() -> None:
    # verl 0.4's ppo_megatron_trainer.yaml sets the reference's expert_tensor_parallel_size: None
    # (a string in YAML); it was refused as "expected an integer, got 'None'".
    spec, _ = import_verl({"actor_rollout_ref": {"actor": {"strategy": "megatron"}, "ref": {"strategy": "megatron",
                           "megatron": {"expert_tensor_parallel_size": "None"}}}},
                          ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8",
                           "data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=16"])
    assert spec.plan.layout_for("ref").etp is None


def test_megatron_cpu_optimizer_is_offload_optimizer_and_round_trips() -> None:
    # verl passes <role>.optim.override_optimizer_config into Megatron-Core's OptimizerConfig;
    # optimizer_cpu_offload with optimizer_offload_fraction 1 keeps the optimizer on host during
    # the update. It was ignored as an optimizer hyperparameter (verl's *_96gb MoE scripts).
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.strategy=megatron"]
    opt = "+actor_rollout_ref.actor.optim.override_optimizer_config"
    on, rep = import_verl(None, [*base, f"{opt}.optimizer_cpu_offload=True", f"{opt}.optimizer_offload_fraction=1."])
    assert on.plan.layouts["actor"].offload_optimizer and not on.plan.offload_between_phases
    assert f"{opt[1:]}.optimizer_cpu_offload" in {n.key for n in rep.mapped}
    again, _ = import_verl(None, list(export_verl(on).args))
    assert again.plan.layouts["actor"] == on.plan.layouts["actor"]
    # Megatron's default fraction is 0.0 (nothing offloaded); a part is listed, costed on GPU
    for extra in ([f"{opt}.optimizer_cpu_offload=True"], [f"{opt}.optimizer_cpu_offload=True", f"{opt}.optimizer_offload_fraction=0.5"]):
        spec, rep = import_verl(None, [*base, *extra])
        assert not spec.plan.layouts["actor"].offload_optimizer
        assert (f"{opt[1:]}.optimizer_offload_fraction" in {n.key for n in rep.unsupported}) == (len(extra) == 2)
    with pytest.raises(SpecError, match=r"optimizer_offload_fraction: 2 is out of range; allowed: 0 to 1"):
        import_verl(None, [*base, f"{opt}.optimizer_cpu_offload=True", f"{opt}.optimizer_offload_fraction=2"])


def test_the_96gb_moe_scripts_offload_their_optimizer_to_host() -> None:
    corpus = Path(__file__).parent / "data" / "framework_corpus" / "verl" / "examples" / "grpo_trainer"
    for name in ("run_qwen3moe-30b_megatron_96gb.sh", "run_qwen3-235b_megatron_96gb.sh"):
        spec, _ = load_framework_config("verl", corpus / name)
        assert spec.plan.layouts["actor"].offload_optimizer, name


@pytest.mark.parametrize("extra, key, allowed", [
    (["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192"], "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "9,216"),
    (["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096", "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "4,608"),
    (["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096"], "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", "9,216"),
    (["actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.actor.megatron.context_parallel_size=2",
      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4000"], "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "4,608"),
])
def test_a_token_budget_below_the_padded_sequence_is_refused_as_verl_asserts(extra: list[str], key: str, allowed: str) -> None:
    # verl's legacy workers (the default) cut micro-batches of the batch padded to prompt cap +
    # response cap; rearrange_micro_batches asserts the budget x cp covers that width. It was
    # accepted, and rlperf costed each over-long sequence alone in its micro-batch.
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16", "data.max_prompt_length=1024", "data.max_response_length=8192",
            "actor_rollout_ref.actor.use_dynamic_bsz=True"]
    with pytest.raises(SpecError, match=rf"^{re.escape(key)}: .* fewer than the 9,216-token padded sequences .*; allowed: >= {allowed}$"):
        import_verl(None, [*base, *extra])
    import_verl(None, [*base, f"{key}=9216"])  # the caps' sum fits
    # the new engine unpads first and asserts on actual lengths: listed, not refused
    _, rep = import_verl(None, [*base, *extra, "trainer.use_legacy_worker_impl=disable"])
    assert key in {n.key for n in rep.unsupported}


def test_export_raises_a_token_budget_below_the_padded_sequence_to_what_verl_takes() -> None:
    # an rlperf plan may hold a budget below the longest sequence (that sequence alone in its
    # micro-batch: the planner's rescue halves budgets); verl would assert on it
    spec, _ = import_verl(None, ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "data.train_batch_size=64",
                                 "actor_rollout_ref.actor.ppo_mini_batch_size=16", "data.max_prompt_length=1024",
                                 "data.max_response_length=8192", "actor_rollout_ref.actor.use_dynamic_bsz=True"])
    actor = spec.plan.layouts["actor"].model_copy(update={"max_tokens_per_microbatch": 4096})
    small = spec.model_copy(update={"plan": spec.plan.model_copy(update={"layouts": {**spec.plan.layouts, "actor": actor}})})
    exported = export_verl(small)
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=9216" in exported.args
    assert any("token budget 4,096" in m and "written as 9,216" in m for m in exported.not_expressible)
    assert not any("token budget" in m for m in export_verl(spec).not_expressible)


def test_rollout_correction_bypass_mode_drops_the_old_logprob_pass_and_round_trips() -> None:
    # verl >= 0.6 (ray_trainer.apply_bypass_mode): old_log_probs = rollout_log_probs, the
    # old_log_prob pass skipped; it was an unknown key and the pass was costed
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16", "algorithm.adv_estimator=grpo"]
    bypass = ["algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.calculate_log_probs=True",
              "algorithm.rollout_correction.rollout_is=sequence"]
    spec, rep = import_verl(None, [*base, *bypass])
    assert spec.algorithm.old_logprob == "rollout" and not rep.unknown
    assert "algorithm.rollout_correction.bypass_mode" in keys(rep.mapped)
    again, _ = import_verl(None, list(export_verl(spec).args))
    assert again.algorithm == spec.algorithm
    off, _ = import_verl(None, [*base, "algorithm.rollout_correction.bypass_mode=false"])
    assert off.algorithm.old_logprob == "when_needed"
    _, rep = import_verl(None, [*base, "algorithm.rollout_correction.bypass_mode=true"])  # no rollout log-probs
    assert any("calculate_log_probs=True" in a for a in rep.assumptions)


def test_deprecated_global_micro_batches_are_divided_by_the_data_parallel_size() -> None:
    # verl's workers divide ppo_micro_batch_size / log_prob_micro_batch_size by the dp size
    # (world / ulysses sp) and use that per GPU; they were listed as unsupported and rlperf
    # costed 1 sequence per micro-batch (verl's tuning scripts set 16 to 128 per GPU this way)
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True"]
    legacy = ["actor_rollout_ref.actor.ppo_micro_batch_size=32", "actor_rollout_ref.rollout.log_prob_micro_batch_size=64",
              "actor_rollout_ref.ref.log_prob_micro_batch_size=128"]
    spec, rep = import_verl(None, [*base, *legacy])
    actor, ref = spec.plan.layouts["actor"], spec.plan.layout_for("ref")
    assert (actor.micro_batch_size, actor.forward_micro_batch_size, ref.micro_batch_size) == (4, 8, 16)  # / dp 8
    assert not rep.unsupported and "actor_rollout_ref.actor.ppo_micro_batch_size" in keys(rep.mapped)
    sp2, _ = import_verl(None, [*base, *legacy, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                                "actor_rollout_ref.model.use_remove_padding=True"])
    assert sp2.plan.layouts["actor"].micro_batch_size == 8  # dp = 8 / sp 2
    again, _ = import_verl(None, list(export_verl(spec).args))
    assert again.plan == spec.plan
    with pytest.raises(SpecError, match=r"^actor_rollout_ref\.actor\.ppo_micro_batch_size: set beside .*_per_gpu; verl refuses both"):
        import_verl(None, [*base, *legacy, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])
    with pytest.raises(SpecError, match=r"^actor_rollout_ref\.actor\.ppo_micro_batch_size: 4 sequences over 8 data-parallel ranks.*allowed: >= 8"):
        import_verl(None, [*base, "actor_rollout_ref.actor.ppo_micro_batch_size=4"])


def test_an_fsdp_mini_batch_per_gpu_that_the_micro_batch_does_not_divide_is_refused() -> None:
    # fsdp_workers normalizes ppo_mini_batch_size x rollout.n by the dp size and asserts the
    # per-GPU micro-batch divides it; verl's own examples/rollout_correction/run_with_rollout_corr.sh
    # (32 prompts, n 1, 8 GPUs, micro 8 per GPU: 4 sequences per GPU) fails there
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=128",
            "actor_rollout_ref.actor.ppo_mini_batch_size=32", "algorithm.adv_estimator=rloo"]
    with pytest.raises(SpecError, match=r"^actor_rollout_ref\.actor\.ppo_micro_batch_size_per_gpu: 8 per GPU does not divide "
                                        r"the 4 sequences .*; allowed: a divisor of 4$"):
        import_verl(None, [*base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"])
    assert import_verl(None, [*base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "actor_rollout_ref.rollout.n=4"])
    assert import_verl(None, [*base, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])
    with pytest.raises(SpecError, match=r"^actor_rollout_ref\.actor\.ppo_mini_batch_size: 4 sequences .* over 8 data-parallel"):
        import_verl(None, [*base, "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.train_batch_size=4"])


def test_rollout_fp8_quantization_is_an_fp8_engine_and_round_trips() -> None:
    # verl's vLLM / SGLang servers load FP8 block-quantized weights with rollout.quantization=fp8
    # (the KV cache stays in the model dtype); the key was unknown and the engine costed in bf16
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64", "algorithm.adv_estimator=grpo"]
    spec, rep = import_verl(None, [*base, "+actor_rollout_ref.rollout.quantization=fp8"])
    assert (spec.plan.rollout.dtype, spec.plan.rollout.kv_dtype) == ("fp8", "bf16") and not rep.unknown
    again, _ = import_verl(None, list(export_verl(spec).args))
    assert again.plan.rollout == spec.plan.rollout
    spec, rep = import_verl(None, [*base, "+actor_rollout_ref.rollout.quantization=torchao"])
    assert spec.plan.rollout.dtype == "bf16" and "actor_rollout_ref.rollout.quantization" in keys(rep.unsupported)
    with pytest.raises(SpecError, match=r"^actor_rollout_ref\.rollout\.quantization: 'int4' is not .*; allowed: fp8, torchao"):
        import_verl(None, [*base, "+actor_rollout_ref.rollout.quantization=int4"])


def test_lora_rank_is_read_where_the_roles_backend_reads_it() -> None:
    # verl's Megatron workers build their PEFT from model.lora (model.lora.rank, verl #4063) and
    # ignore model.lora_rank, which the FSDP workers read: examples/grpo_trainer/
    # run_qwen2-7b_math_megatron_lora.sh (lora.rank=256) was costed as full fine-tuning
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64", "algorithm.adv_estimator=grpo"]
    megatron = [*base, "actor_rollout_ref.actor.strategy=megatron"]
    spec, rep = import_verl(None, [*megatron, "+actor_rollout_ref.model.lora.rank=256", "+actor_rollout_ref.model.lora.alpha=512"])
    assert spec.plan.layouts["actor"].lora_rank == 256 and not rep.unknown
    again, _ = import_verl(None, list(export_verl(spec).args))
    assert again.plan.layouts["actor"] == spec.plan.layouts["actor"]
    spec, rep = import_verl(None, [*megatron, "actor_rollout_ref.model.lora_rank=64"])
    assert spec.plan.layouts["actor"].lora_rank == 0 and "actor_rollout_ref.model.lora_rank" in keys(rep.unsupported)
    spec, rep = import_verl(None, [*base, "+actor_rollout_ref.model.lora.rank=64"])
    assert spec.plan.layouts["actor"].lora_rank == 0 and "actor_rollout_ref.model.lora.rank" in keys(rep.unsupported)
    assert import_verl(None, [*base, "actor_rollout_ref.model.lora_rank=64"])[0].plan.layouts["actor"].lora_rank == 64


def test_newer_verl_keys_are_classified_not_unknown() -> None:
    # keys of verl 0.6 / 0.7 configs that were listed as unknown: no effect on step time or
    # memory (ignored), or a feature rlperf does not model at a value that changes nothing
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64", "algorithm.adv_estimator=grpo"]
    quiet = ["+actor_rollout_ref.rollout.prometheus.enable=False", "+actor_rollout_ref.actor.data_loader_seed=42",
             "+actor_rollout_ref.actor.fsdp_config.use_orig_params=False", "+actor_rollout_ref.actor.tau_pos=1.0",
             "+actor_rollout_ref.model.tiled_mlp.enabled=False", "+actor_rollout_ref.model.mtp.enable=False",
             "+actor_rollout_ref.model.mtp.num_speculative_tokens=1", "+transfer_queue.enable=False",
             "+actor_rollout_ref.actor.router_replay.mode=disabled", "+trainer.profile_steps=[1]"]
    _, rep = import_verl(None, [*base, *quiet])
    assert not rep.unknown and not rep.unsupported
    _, rep = import_verl(None, [*base, "+actor_rollout_ref.model.mtp.enable=True", "+actor_rollout_ref.model.tiled_mlp.enabled=True"])
    assert {"actor_rollout_ref.model.mtp.enable", "actor_rollout_ref.model.tiled_mlp.enabled"} <= keys(rep.unsupported)
    _, rep = import_verl(None, [*base, "actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.model.enable_gradient_checkpointing=True"])
    assert any(n.key == "actor_rollout_ref.model.enable_gradient_checkpointing" and "not read" in n.note for n in rep.mapped)


def test_fsdp_reference_and_reward_models_keep_their_weights_on_host() -> None:
    # verl's FSDP workers wrap the reference (and the reward model) in CPUOffload(offload_params
    # =True) whatever ref.fsdp_config.param_offload says ("We force reference policy to use
    # CPUOffload to save memory", #121); it was costed on GPU unless param_offload was set
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True"]
    for extra in ([], ["actor_rollout_ref.ref.fsdp_config.param_offload=False"], ["actor_rollout_ref.ref.fsdp_config.param_offload=True"]):
        spec, rep = import_verl(None, [*base, *extra])
        assert spec.plan.layout_for("ref").offload_params and not spec.plan.layouts["actor"].offload_params
        assert any("force CPUOffload" in a for a in rep.assumptions)
    megatron, _ = import_verl(None, [*base, "actor_rollout_ref.actor.strategy=megatron"])
    assert not megatron.plan.layout_for("ref").offload_params  # Megatron's reference: its param_offload only


def test_a_megatron_reference_with_param_offload_is_loaded_whole_for_its_pass() -> None:
    # megatron_workers.compute_ref_log_prob loads the whole reference before its pass and offloads
    # it after: its weights are on GPU during the pass (they were costed as streamed from host per
    # micro-batch: no weights in its memory, a PCIe copy in every micro-batch)
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-7B", "trainer.n_gpus_per_node=8", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64", "algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.strategy=megatron", "actor_rollout_ref.ref.megatron.param_offload=True"]
    spec, rep = import_verl(None, base)
    assert not spec.plan.layout_for("ref").offload_params
    assert any(n.key == "actor_rollout_ref.ref.megatron.param_offload" and "loaded whole" in n.note for n in rep.mapped)
    streamed = spec.plan.layout_for("ref").model_copy(update={"offload_params": True})
    plan = spec.plan.model_copy(update={"layouts": {**spec.plan.layouts, "ref": streamed}})
    assert any("load a ref whole" in m for m in export_verl(spec.model_copy(update={"plan": plan})).not_expressible)

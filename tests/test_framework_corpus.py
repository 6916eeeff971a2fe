"""Published verl and OpenRLHF launch scripts and configs, imported as they are.

tests/data/framework_corpus holds them unmodified (MANIFEST.tsv: repository, commit, path;
both projects are Apache-2.0, their LICENSE files ship beside them). Vision-language scripts
are counted apart: rlperf reads Qwen2.5-VL (language tower + vision encoder), not Qwen3.5.
"""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from rlperf.errors import SpecError
from rlperf.frameworks.load import load_framework_config
from rlperf.frameworks.report import ImportReport
from rlperf.scenario import ScenarioSpec

CORPUS = Path(__file__).resolve().parent / "data" / "framework_corpus"
# Scripts whose actor is a vision-language model (its name says so: -VL-, vlm, Qwen3.5).
VISION = ("run_qwen2_5_vl-7b.sh", "train_vlm_math_hybrid_engine.sh")
# Top-level configs of the corpus (the rest of the YAML files are their Hydra defaults).
YAML_CONFIGS = (
    "verl/verl/trainer/config/ppo_trainer.yaml",
    "verl/verl/trainer/config/ppo_megatron_trainer.yaml",
    "verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml",
    "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml",
    "verl/recipe/dapo/config/dapo_trainer.yaml",
)


def _kind(rel: str) -> str:
    return "openrlhf" if rel.startswith("openrlhf/") else "verl"


def corpus_files() -> list[str]:
    scripts = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*.sh"))
    return scripts + list(YAML_CONFIGS)


@cache
def imported(rel: str) -> tuple[ScenarioSpec, ImportReport]:
    return load_framework_config(_kind(rel), CORPUS / rel)


def test_corpus_is_shipped_with_provenance_and_licences() -> None:
    rows = list(csv.DictReader((CORPUS / "MANIFEST.tsv").open(), delimiter="\t"))
    listed = {r["file"] for r in rows}
    assert all(len(r["commit"]) == 40 and r["repository"] in ("volcengine/verl", "OpenRLHF/OpenRLHF") for r in rows)
    assert set(corpus_files()) <= listed
    assert all((CORPUS / f).is_file() for f in listed)
    assert len(corpus_files()) >= 40
    for project in ("verl", "openrlhf"):
        assert "Apache License" in (CORPUS / project / "LICENSE").read_text()


def test_at_least_90_percent_of_text_model_configs_import_as_they_are() -> None:
    text_models = [f for f in corpus_files() if not f.endswith(VISION)]
    failures: dict[str, str] = {}
    for rel in text_models:
        try:
            imported(rel)
        except SpecError as err:
            failures[rel] = str(err)
    rate = 1 - len(failures) / len(text_models)
    print(f"imported {len(text_models) - len(failures)}/{len(text_models)} text-model configs ({rate:.0%})")
    for rel, why in failures.items():
        print(f"  {rel}: {why}")
    assert rate >= 0.9, failures


def test_qwen2_5_vl_script_imports_with_its_vision_tower() -> None:
    """Qwen2.5-VL is in the catalog (language tower + vision encoder, docs/models.md)."""
    from rlperf.scenario import resolve

    path = next(CORPUS.rglob(VISION[0]))
    spec, _ = load_framework_config(_kind(str(path.relative_to(CORPUS))), path)
    actor = resolve(spec).models["actor"]
    assert actor.architecture == "qwen2_5_vl" and actor.vision is not None


def test_other_vision_models_fail_with_one_line_naming_the_model() -> None:
    path = next(CORPUS.rglob(VISION[1]))  # Qwen3.5: not read by rlperf
    with pytest.raises(SpecError) as err:
        load_framework_config(_kind(str(path.relative_to(CORPUS))), path)
    assert "\n" not in str(err.value) and "--model-config" in str(err.value)


# ---------------------------------------------------------------------- hand-checked mappings
# (file, model, (nodes, gpus per node), algorithm, kl, (prompts, n, prompt cap, response cap),
#  mini-batches, placement (kind, rollout GPUs), mode (kind, staleness), engine (tp, replicas),
#  actor (dp, tp, pp, cp, ep, micro-batch, token budget), offload between phases)
# Each row was read off the script by hand; the comments say from where.
HAND_CHECKED = [
    # python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer: tp 2, pp 2 on 8 GPUs,
    # use_kl_loss=True (GRPO's own k3), train_batch_size 1024 / mini 256, micro 4, rollout tp 2
    ("verl/examples/grpo_trainer/run_qwen2-7b_math_megatron.sh", "Qwen2-7B", (1, 8), "GRPO", None,
     (1024, 5, 1024, 1024), 4, ("colocated", None), ("sync", 0), (2, 4), (2, 2, 2, 1, 1, 4, None), False),
    # Megatron MoE on 4 nodes: pp 8, tp 4, ep 4 (etp 1), dynamic bsz with 11680 tokens/GPU,
    # actor param/grad/optimizer offload -> between phases
    ("verl/examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh", "Qwen3-235B-A22B", (4, 8), "GRPO", None,
     (32, 8, 2048, 9632), 2, ("colocated", None), ("sync", 0), (8, 4), (1, 4, 8, 1, 4, 2, 11680), True),
    # PPO with Ulysses sp 2; use_kl_in_reward=False and no KL loss: no reference pass
    ("verl/examples/ppo_trainer/run_deepseek7b_llm_sp2.sh", "deepseek-llm-7b-chat", (1, 8), "PPO", "none",
     (1024, 1, 512, 512), 4, ("colocated", None), ("sync", 0), (4, 2), (4, 1, 1, 2, 1, 32, None), False),
    # PPO with a reward model (FsfairX-LLaMA3-RM, Llama-3-8B shapes)
    ("verl/examples/ppo_trainer/run_qwen2-7b_rm.sh", "Qwen2-7B", (1, 8), "PPO", "none",
     (1024, 1, 1024, 512), 4, ("colocated", None), ("sync", 0), (1, 8), (8, 1, 1, 1, 1, 16, None), False),
    # LoRA on 2 GPUs (lora_rank listed as unsupported below), ref param_offload only
    ("verl/examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh", "Qwen2.5-3B", (1, 2), "GRPO", None,
     (16, 5, 512, 1024), 1, ("colocated", None), ("sync", 0), (2, 1), (2, 1, 1, 1, 1, 40, None), False),
    # recipe.dapo.main_dapo: filter_groups -> DAPO, sp 8, 16 nodes, offload=True for the actor
    ("verl/recipe/dapo/run_dapo_qwen2.5_32b.sh", "Qwen2.5-32B", (16, 8), "DAPO", None,
     (512, 16, 2048, 20480), 16, ("colocated", None), ("sync", 0), (4, 32), (16, 1, 1, 8, 1, 1, 22528), True),
    # one-step-off entry point: 2 rollout + 6 training GPUs (n_gpus_rollout=2 on 8)
    ("verl/experimental/one_step_off_policy/shell/grpo_3b_gsm8k_fsdp2_2_6.sh", "Qwen2.5-3B", (1, 8), "GRPO", None,
     (1152, 5, 512, 1024), 6, ("disaggregated", 2), ("one_step_off", 0), (2, 1), (6, 1, 1, 1, 1, 32, None), False),
    # fully-async: 1 rollout node + 1 training node; a step = 4 sync steps x 4 batches x 32 prompts;
    # staleness_threshold 0.1 with partial_rollout=True -> streaming (0.1 of a batch in flight)
    ("verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_8_8.sh", "Qwen2.5-Math-7B", (2, 8), "GRPO", "none",
     (512, 16, 2048, 8192), 16, ("disaggregated", 8), ("streaming", 0), (1, 8), (8, 1, 1, 1, 1, 1, 20480), False),
    # OpenRLHF 0.9.1: separate groups of 2 GPUs (ref with actor, reward with critic) + 2 engines
    # of tp 2 = 8 GPUs on one node (num_gpus_per_node is each group's share, not the node size)
    ("openrlhf/v0.9.1/train_ppo_llama_ray.sh", "Llama-3-8B", (1, 8), "PPO", None,
     (1024, 1, 1024, 1024), 8, ("hybrid", None), ("sync", 0), (2, 2), (2, 1, 1, 1, 1, 16, None), False),
    # OpenRLHF HEAD dotted flags: --train.colocate_all, --vllm.enable_sleep, --ds.enable_sleep,
    # dynamic batch with 16384 tokens, --data.max_len 2048 (prompt + response)
    ("openrlhf/head/train_ppo_ray_hybrid_engine.sh", "Llama-3-8B", (1, 8), "PPO", None,
     (1024, 1, 1024, 1024), 8, ("colocated", None), ("sync", 0), (2, 4), (8, 1, 1, 1, 1, 1, 16384), True),
    # --async_train with the default queue of 1: one-step off-policy; --use_kl_loss: k3 in the loss
    ("openrlhf/v0.9.1/train_reinforce_baseline_llama_ray_async.sh", "Llama-3-8B", (1, 8), "REINFORCE++", "k3_loss",
     (128, 8, 1024, 1024), 8, ("hybrid", None), ("one_step_off", 0), (1, 2), (4, 1, 1, 1, 1, 8, None), False),
    # GRPO (group_norm) colocated with sleep on both engines
    ("openrlhf/v0.9.1/train_grpo_ray_hybrid_engine.sh", "Llama-3-8B", (1, 8), "GRPO", None,
     (128, 8, 1024, 1024), 8, ("colocated", None), ("sync", 0), (2, 4), (8, 1, 1, 1, 1, 8, None), True),
]


@pytest.mark.parametrize("row", HAND_CHECKED, ids=[r[0].rsplit("/", 1)[-1] for r in HAND_CHECKED])
def test_hand_checked_mappings(row: tuple) -> None:  # type: ignore[type-arg]
    from rlperf.scenario import resolve_workload

    rel, model, cluster, algo, kl, work, minibatches, placement, mode, engine, actor, offload = row
    spec, _ = imported(rel)
    assert spec.model == model
    assert (spec.cluster.num_nodes, spec.cluster.gpus_per_node) == cluster
    assert (spec.algorithm.name, spec.algorithm.kl, spec.algorithm.minibatches) == (algo, kl, minibatches)
    w = resolve_workload(spec.workload)
    assert (w.prompts_per_step, w.group_size, w.max_prompt_tokens, w.max_response_tokens) == work
    p = spec.plan
    assert (p.placement.kind, p.placement.rollout_gpus) == placement
    assert (p.mode.kind, p.mode.staleness) == mode
    assert (p.rollout.tp, p.rollout.replicas) == engine
    a = p.layouts["actor"]
    assert (a.dp, a.tp, a.pp, a.cp, a.ep, a.micro_batch_size, a.max_tokens_per_microbatch) == actor
    assert p.offload_between_phases == offload


def test_switches_read_from_the_scripts() -> None:
    """Details of the hand-checked scripts that the table above does not hold."""
    spec, rep = imported("verl/examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh")
    assert spec.plan.layouts["actor"].lora_rank == 64  # model.lora_rank=64: frozen base, adapters trained
    assert spec.plan.layouts["ref"].lora_rank == 0  # the reference is the base model
    assert spec.plan.layouts["ref"].offload_params  # ref.fsdp_config.param_offload=True
    spec, _ = imported("verl/examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh")
    actor = spec.plan.layouts["actor"]
    assert (actor.etp, actor.backend, actor.sequence_parallel, actor.forward_max_tokens_per_microbatch) == (1, "megatron", True, 11680)
    spec, rep = imported("verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_8_8.sh")
    assert spec.plan.mode.staleness_threshold == 0.1 and "async_training.partial_rollout" in {n.key for n in rep.mapped}
    assert "actor_rollout_ref.actor.fsdp_config.fsdp_size" in {n.key for n in rep.unsupported}
    spec, _ = imported("openrlhf/v0.9.1/train_ppo_llama_ray.sh")
    assert dict(spec.plan.placement.assign)["reward_model"] == "critic"  # --colocate_critic_reward
    assert spec.plan.layouts["actor"].offload_optimizer  # --adam_offload


# ---------------------------------------------------------------------- round trips
@pytest.mark.parametrize("rel", [f for f in corpus_files() if f.endswith(".sh") and not f.endswith(VISION)])
def test_export_reimports_unchanged(rel: str, tmp_path: Path) -> None:
    """import -> export -> the export as a shell script -> import gives the same scenario."""
    from rlperf.frameworks import export_openrlhf, export_verl

    try:
        spec, _ = imported(rel)
    except SpecError:
        pytest.skip("not importable (see the rate test)")
    kind = _kind(rel)
    exported = (export_verl if kind == "verl" else export_openrlhf)(spec)
    script = tmp_path / "run.sh"
    script.write_text("#!/usr/bin/env bash\nset -x\n" + exported.command_line() + "\n")
    if shutil.which("bash"):  # a valid shell script
        subprocess.run(["bash", "-n", str(script)], check=True, timeout=10)
    again, report = load_framework_config(kind, script)
    assert again == spec
    assert not report.warnings and not report.unknown


# ---------------------------------------------------------------------- pieces of the readers
def test_hydra_defaults_are_composed() -> None:
    """ppo_megatron_trainer.yaml's defaults list brings the Megatron actor, ref and critic."""
    from rlperf.frameworks.hydra_compose import compose

    tree = compose(CORPUS / "verl/verl/trainer/config/ppo_megatron_trainer.yaml")
    aro = tree["actor_rollout_ref"]
    assert aro["actor"]["strategy"] == "megatron" and aro["ref"]["strategy"] == "megatron"
    assert "optim" in aro["actor"] and "lr" in aro["actor"]["optim"]  # ../optim@optim inside actor/
    assert tree["critic"]["strategy"] == "megatron"
    # the one-step-off config finds ppo_trainer through hydra.searchpath
    tree = compose(CORPUS / "verl/experimental/one_step_off_policy/config/one_step_off_ppo_trainer.yaml")
    assert tree["rollout"]["n_gpus_per_node"] == 8 and tree["actor_rollout_ref"]["actor"]["strategy"] == "fsdp"


def test_bracketed_override_values_stay_whole(tmp_path: Path) -> None:
    from rlperf.frameworks.load import read_overrides

    f = tmp_path / "x.overrides"
    f.write_text("trainer.logger=[console, wandb] data.max_prompt_length=512  # comment\n")
    assert read_overrides(f) == ["trainer.logger=[console, wandb]", "data.max_prompt_length=512"]


def test_unknown_hub_id_needs_model_config(tmp_path: Path) -> None:
    script = CORPUS / "verl/examples/grpo_trainer/run_mistral13b_skyworkrm_hhrlhf.sh"
    with pytest.raises(SpecError, match=re.escape("'mistralai/Mistral-Nemo-Instruct-2407' is not in the model catalog: pass its config.json with --model-config")):
        load_framework_config("verl", script)
    from rlperf.catalog import load_config

    (tmp_path / "config.json").write_text(__import__("json").dumps(load_config("Qwen2.5-3B")))
    spec, report = load_framework_config("verl", script, model_config=str(tmp_path))
    assert spec.model == str(tmp_path) and any("--model-config" in n.note for n in report.mapped)


def test_openrlhf_multi_valued_and_environment() -> None:
    from rlperf.frameworks.openrlhf_import import parse_args

    values = parse_args(["--vllm_is_truncated_threshold", "0.5", "5.0", "--zero_stage", "3", "--algo.advantage.is_correction_threshold", "0.5", "2"])
    assert values["vllm_is_truncated_threshold"] == ["0.5", "2"] and values["zero_stage"] == "3"
    spec, _ = load_framework_config("verl", CORPUS / "verl/recipe/dapo/run_dapo_qwen2.5_32b.sh", env={"NNODES": "4"})
    assert spec.cluster.num_nodes == 4  # NNODES=${NNODES:-16}

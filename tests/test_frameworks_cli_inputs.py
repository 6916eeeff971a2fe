"""Import, export and `plan --from` inputs a fuzzing pass found misread: each bad one is one
`error:` line (exit 2) naming what the user wrote, before the work; an explicit option is never
silently ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlperf.catalog import load_config
from rlperf.errors import SpecError
from rlperf.frameworks import load_framework_config
from rlperf.scenario import resolve
from tests.helpers.cli import assert_one_line_error, invoke

SCRIPT = """python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo data.train_batch_size=16 \\
    data.max_prompt_length=512 data.max_response_length=1024 \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \\
    actor_rollout_ref.rollout.n=4 trainer.n_gpus_per_node=8 trainer.nnodes=1 $@
"""
SCENARIO = """name: small
model: Qwen2.5-0.5B
cluster: {gpu: H100, num_nodes: 1, gpus_per_node: 4}
workload:
  prompts_per_step: 16
  group_size: 4
  prompt_length: {kind: uniform, min_tokens: 64, max_tokens: 512}
  response_length: {kind: lognormal, median_tokens: 300, sigma: 0.9, cap_tokens: 1024}
algorithm: {name: GRPO}
plan:
  placement: {kind: colocated}
  rollout: {tp: ROLLOUT_TP}
  layouts:
    actor: {tp: 1, pp: ACTOR_PP, backend: BACKEND}
  mode: {kind: sync}
"""


def one_error(args: list[str]) -> str:
    return assert_one_line_error(invoke(args))


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "run.sh"
    path.write_text(SCRIPT)
    return path


def edited(script: Path, old: str, new: str) -> Path:
    text = script.read_text()
    assert old in text
    out = script.with_name(f"edited-{abs(hash(new))}.sh")
    out.write_text(text.replace(old, new))
    return out


# ---------------------------------------------------------------------- 1. export
@pytest.mark.parametrize("tp, pp, backend, field", [
    (3, 1, "fsdp", "plan.rollout.tp: 3 GPUs cannot share"),  # the KV heads: simulate refuses it
    (1, 5, "megatron", "plan.placement (actor): needs at least 5 GPUs"),  # 5 stages on 4 GPUs
])
@pytest.mark.parametrize("to", ["verl", "openrlhf"])
def test_export_refuses_a_plan_simulate_refuses(tp: int, pp: int, backend: str, field: str, to: str, tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("ROLLOUT_TP", str(tp)).replace("ACTOR_PP", str(pp)).replace("BACKEND", backend))
    line = one_error(["export", str(path), "--to", to])
    assert line.startswith(f"error: {path}:") and field in line
    path.write_text(SCENARIO.replace("ROLLOUT_TP", "1").replace("ACTOR_PP", "1").replace("BACKEND", backend))
    res = invoke(["export", str(path), "--to", to])
    assert res.code == 0 and res.out.strip()


def test_export_of_a_cap_too_short_for_the_generic_rule_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    text = SCENARIO.replace("ROLLOUT_TP", "1").replace("ACTOR_PP", "1").replace("BACKEND", "fsdp")
    path.write_text(text.replace("median_tokens: 300, sigma: 0.9, cap_tokens: 1024", "median_tokens: 2, sigma: 0.9, cap_tokens: 3"))
    res = invoke(["export", str(path), "--to", "verl"])  # was an error about the cap/3 rule's mean
    assert res.code == 0 and "pass mean_response_tokens=2 to keep the mean" in " ".join(res.out.split())


# ---------------------------------------------------------------------- 2, 3. --model-config
def test_model_config_wins_over_the_catalog(script: Path, tmp_path: Path) -> None:
    deep = {**load_config("Qwen2.5-0.5B"), "num_hidden_layers": 96}
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(deep))
    spec, report = load_framework_config("verl", script, model_config=str(path))
    assert spec.model == str(path) and resolve(spec).models["actor"].num_layers == 96
    assert any("(--model-config, which wins over the catalog)" in a for a in report.assumptions)
    plain, _ = load_framework_config("verl", script)
    assert plain.model == "Qwen2.5-0.5B"


@pytest.mark.parametrize("given, problem", [
    ("/nonexistent/config.json", "--model-config: file not found: '/nonexistent/config.json'"),
    (".", "--model-config: no config.json in the folder '.'"),
])
def test_model_config_that_is_not_there_names_the_option(given: str, problem: str, script: Path) -> None:
    for args in (["plan", "--from", "verl", str(script)], ["import", "verl", str(script)]):
        assert problem in one_error([*args, "--model-config", given])


# ---------------------------------------------------------------------- 4. --set, -o
def test_a_set_variable_the_script_never_reads_is_refused(script: Path) -> None:
    line = one_error(["plan", "--from", "verl", str(script), "--set", "BS=16"])
    assert line.startswith("error: --set: BS: the script never reads $BS")
    first = edited(script, "data.train_batch_size=16", "data.train_batch_size=$BS")
    assigned = first.with_name("assigned.sh")
    assigned.write_text("BS=32\n" + first.read_text())
    line = one_error(["import", "verl", str(assigned), "--set", "BS=16"])
    assert line.startswith("error: --set: BS: the script assigns BS before it reads it")
    spec, _ = load_framework_config("verl", first, env={"BS": "32"})  # read: used, no error
    assert spec.workload["prompts_per_step"] == 32


@pytest.mark.parametrize("item, problem", [("", "-o: is empty"), ("=5", "-o: '=5' names no key"),
                                           ("~", "-o: '~' names no key")])
def test_an_override_that_says_nothing_is_refused(item: str, problem: str, script: Path) -> None:
    assert problem in one_error(["plan", "--from", "verl", str(script), "-o", item])
    assert problem.replace("-o:", "overrides:") in one_error(["import", "verl", str(script), item])


# ---------------------------------------------------------------------- 5. --out
@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc, a folder nothing can be created in")
def test_out_in_a_folder_nothing_can_be_written_in(script: Path) -> None:
    res = invoke(["import", "verl", str(script), "--out", "/proc/x.yaml"])
    line = assert_one_line_error(res, contains="--out: cannot write in '/proc'")
    assert ".tmp" not in line  # not the temporary file of the atomic write
    assert "assumed" not in res.out + res.err  # refused before the import


def test_empty_out_is_refused(script: Path) -> None:
    assert "--out: is empty" in one_error(["import", "verl", str(script), "--out", ""])


# ---------------------------------------------------------------------- 6. the response cap and its mean
def test_a_short_cap_blames_the_cap_and_a_bad_mean_the_option(script: Path) -> None:
    short = edited(script, "data.max_response_length=1024", "data.max_response_length=2")
    line = one_error(["plan", "--from", "verl", str(short)])
    assert line.startswith("error: data.max_response_length: 2 tokens gives an assumed mean") and "--mean" not in line
    line = one_error(["import", "verl", str(script), "--mean-response-tokens", "1"])
    assert line.startswith("error: --mean-response-tokens: 1 tokens is not strictly between 1 and the response cap")
    line = one_error(["plan", "--from", "verl", str(script), "--mean-response", "1"])
    assert line.startswith("error: --mean-response: 1 tokens")
    with pytest.raises(SpecError, match=r"^--generate_max_len: 2 tokens gives an assumed mean"):
        load_framework_config("openrlhf", "--pretrain Qwen/Qwen2.5-0.5B --remote_rm_url http://rm --generate_max_len 2")


# ---------------------------------------------------------------------- 7. verl's rounding, said
def test_an_uneven_mini_batch_split_says_how_verl_rounds(script: Path) -> None:
    three = edited(script, "trainer.n_gpus_per_node=8", "trainer.n_gpus_per_node=3")
    with pytest.raises(SpecError) as err:
        load_framework_config("verl", three)
    assert "the 21 sequences of a mini-batch per GPU (64 (ppo_mini_batch_size x rollout.n) // 3 data-parallel ranks, " \
        "rounded down as verl does)" in str(err.value)

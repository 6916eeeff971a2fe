"""A workload longer than the model positions: an error naming both figures and the fields; a
warning where the config's rope_scaling reaches that far; verl's override_config lifts it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rlperf.catalog import load_config, load_model
from rlperf.errors import SpecError
from rlperf.frameworks import export_verl, import_verl
from rlperf.frameworks.load import load_framework_config
from rlperf.scenario import load_scenario

MATH = "Qwen2.5-Math-7B"  # max_position_embeddings 4,096, no rope_scaling


def scenario(model: str, prompt_cap: int, response_cap: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "cluster": {"gpu": "H100", "num_nodes": 1, "gpus_per_node": 8},
        "workload": {"prompts_per_step": 64, "group_size": 8,
                     "prompt_length": {"kind": "fixed", "tokens": prompt_cap},
                     "response_length": {"kind": "lognormal", "median_tokens": 500, "sigma": 1.0,
                                         "cap_tokens": response_cap}},
        "plan": {"rollout": {"tp": 1}, "layouts": {"actor": {"tp": 1, "zero_stage": 3}}},
        **extra,
    }


def yarn_config(tmp_path: Path) -> str:
    """Qwen2.5-7B's config with its documented YaRN extension (factor 4 over 32,768)."""
    cfg = load_config("Qwen2.5-7B")
    cfg.update(max_position_embeddings=32768,
               rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_past_the_positions_without_rope_scaling_is_an_error_naming_both_figures() -> None:
    with pytest.raises(SpecError) as err:
        load_scenario(scenario(MATH, 1024, 8192))
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("workload: sequences of up to 9,216 tokens (prompt cap 1,024 + response cap 8,192) "
                           "exceed the 4,096 positions of Qwen2.5-Math-7B (max_position_embeddings 4,096, no rope_scaling)")
    assert "model_overrides.max_position_embeddings >= 9,216" in line


def test_within_the_positions_or_lifted_or_capped_is_accepted() -> None:
    load_scenario(scenario(MATH, 1024, 3072))  # exactly 4,096
    load_scenario(scenario(MATH, 1024, 8192, model_overrides={"max_position_embeddings": 32768}))
    capped = scenario(MATH, 1024, 8192)
    capped["workload"]["max_total_tokens"] = 4096  # responses stop at the context
    load_scenario(capped)
    with pytest.raises(SpecError, match="exceed the 4,096 positions"):
        load_scenario(scenario(MATH, 1024, 3073))


def test_rope_scaling_turns_the_error_into_a_warning_up_to_its_reach(tmp_path: Path) -> None:
    cfg = yarn_config(tmp_path)
    assert load_model(cfg).rope_scaled_positions == 131072
    with pytest.warns(UserWarning, match=r"pass the max_position_embeddings 32,768 of .* rope_scaling \(up to 131,072\)"):
        load_scenario(scenario(cfg, 1024, 40960))
    with pytest.raises(SpecError, match=r"exceed the 131,072 positions .*rope_scaling to 131,072"):
        load_scenario(scenario(cfg, 1024, 131072))


def test_rope_scaling_that_does_not_extend_is_not_an_extension() -> None:
    # Llama-3.1: max_position_embeddings is already the extended length; Qwen2.5-VL: mrope sections
    assert load_model("Llama-3.1-8B").trained_positions == 131072
    assert load_model("Llama-3.2-1B").rope_scaled_positions is None  # llama3: 131,072 is already the extended length
    assert load_model("Qwen2.5-VL-7B-Instruct").rope_scaled_positions is None


def test_an_alias_keeps_its_own_context() -> None:
    assert load_model("Qwen3-4B").max_position_embeddings == 40960
    assert load_model("Qwen/Qwen3-4B-Thinking-2507").max_position_embeddings == 262144
    assert load_model("Qwen3-30B-A3B").max_position_embeddings == 40960
    assert load_model("Qwen/Qwen3-30B-A3B-Instruct-2507").max_position_embeddings == 262144
    assert load_model("Qwen/Qwen3-235B-A22B-Thinking-2507").max_position_embeddings == 262144
    # Qwen2.5-7B-Instruct's config.json: 32,768 positions, no rope_scaling (the base: 131,072)
    assert load_model("Qwen2.5-7B").max_position_embeddings == 131072
    assert load_model("Qwen/Qwen2.5-7B-Instruct").max_position_embeddings == 32768
    assert load_model("Qwen2.5-72B-Instruct").max_position_embeddings == 32768
    # 0.5B and 3B: Instruct and base config.json both say 32,768 (no alias entry needed)
    for size in ("0.5B", "3B"):
        assert load_model(f"Qwen/Qwen2.5-{size}-Instruct").max_position_embeddings == 32768
        assert load_model(f"Qwen2.5-{size}").max_position_embeddings == 32768


def test_verl_override_config_lifts_the_limit_and_round_trips(tmp_path: Path) -> None:
    base = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-7B", "data.max_prompt_length=2048",
            "data.max_response_length=8192", "data.train_batch_size=256", "trainer.n_gpus_per_node=8"]
    with pytest.raises(SpecError) as err:
        import_verl(None, base)
    assert str(err.value).startswith("data.max_prompt_length + data.max_response_length: sequences of up to 10,240")
    assert "+actor_rollout_ref.model.override_config.max_position_embeddings >= 10,240" in str(err.value)
    spec, rep = import_verl(None, [*base, "+actor_rollout_ref.model.override_config.max_position_embeddings=32768"])
    assert spec.model_overrides.max_position_embeddings == 32768
    assert any(n.key.endswith("override_config.max_position_embeddings") for n in rep.mapped)
    again, _ = import_verl(None, list(export_verl(spec).args))
    assert again.model_overrides == spec.model_overrides


def test_openrlhf_names_its_flags(tmp_path: Path) -> None:
    cmd = ("python3 -m openrlhf.cli.train_ppo_ray --pretrain Qwen/Qwen2.5-Math-7B --remote_rm_url http://rm "
           "--actor_num_nodes 1 --actor_num_gpus_per_node 8 --prompt_max_len 1024 --generate_max_len 8192\n")
    with pytest.raises(SpecError, match=r"^--prompt_max_len \+ --generate_max_len: sequences of up to 9,216"):
        load_framework_config("openrlhf", cmd)


@pytest.mark.parametrize("scaling, contains", [
    ("yarn", "model.config.rope_scaling: must be a mapping or null, got 'yarn'"),
    ({"type": "yarn", "factor": "4"}, "model.config.rope_scaling.factor: must be a number >= 1, got '4'"),
    ({"type": "linear", "factor": 0.5}, "model.config.rope_scaling.factor: must be a number >= 1, got 0.5"),
    ({"type": "yarn", "factor": 4, "original_max_position_embeddings": "x"},
     "model.config.rope_scaling.original_max_position_embeddings: must be an integer, got 'x'"),
])
def test_a_malformed_rope_scaling_is_refused(tmp_path: Path, scaling: Any, contains: str) -> None:
    # It was ignored: the position check then took the config's own limit without a word.
    cfg = {**load_config("Qwen2.5-0.5B"), "rope_scaling": scaling}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match=re.escape(contains)):
        load_model(str(path))

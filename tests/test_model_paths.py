"""A model given as a config.json path: in a scenario file (relative to that file), on the CLI,
and refused in one line when its model_type is not one rlperf reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlperf.catalog import load_config
from rlperf.errors import SpecError
from rlperf.scenario import load_scenario, read_scenario_data


def _scenario(tmp_path: Path, model: str) -> Path:
    data = read_scenario_data("grpo-qwen2.5-7b-colocated-sync")
    path = tmp_path / "run" / "scenario.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**data, "model": model}))
    return path


def test_scenario_reads_a_relative_config_path_from_its_own_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "run" / "models" / "my-pythia"
    folder.mkdir(parents=True)
    # positions for the example's 9,216-token sequences (Pythia's own config says 2,048)
    (folder / "config.json").write_text(json.dumps({**load_config("pythia-1.4b"), "max_position_embeddings": 16384}))
    monkeypatch.chdir(tmp_path)  # not the scenario's folder
    for ref in ("models/my-pythia/config.json", "models/my-pythia"):
        sc = load_scenario(_scenario(tmp_path, ref))
        assert sc.models["actor"].name == "my-pythia"
        assert sc.models["actor"].num_params == 1_414_647_808


def test_unsupported_model_type_in_a_scenario_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "run" / "bloom.json"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(json.dumps({"model_type": "bloom", "hidden_size": 64}))
    with pytest.raises(SpecError) as err:
        load_scenario(_scenario(tmp_path, "bloom.json"))
    msg = str(err.value)
    assert "\n" not in msg and "model.config.model_type: unsupported 'bloom'" in msg
    assert "gpt2" in msg and "gemma2" in msg


def test_learned_positions_cap_the_workload_length(tmp_path: Path) -> None:
    # the example's responses reach 8192 tokens; GPT-2 has 1024 positions, StarCoder 8192
    with pytest.raises(SpecError) as err:
        load_scenario(_scenario(tmp_path, "gpt2"))
    assert "workload.max_total_tokens" in str(err.value) and "1024 learned positions" in str(err.value)
    data = read_scenario_data("grpo-qwen2.5-7b-colocated-sync")
    prompts = {"kind": "uniform", "min_tokens": 64, "max_tokens": 512}
    capped = {**data, "model": "gpt2"}
    capped["workload"] = {**data["workload"], "prompt_length": prompts, "max_total_tokens": 1024}
    assert load_scenario(capped).models["actor"].max_sequence_tokens == 1024

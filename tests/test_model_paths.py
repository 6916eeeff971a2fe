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
    folder = tmp_path / "run" / "models" / "my-gpt2"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(load_config("gpt2")))
    monkeypatch.chdir(tmp_path)  # not the scenario's folder
    for ref in ("models/my-gpt2/config.json", "models/my-gpt2"):
        sc = load_scenario(_scenario(tmp_path, ref))
        assert sc.models["actor"].name == "my-gpt2"
        assert sc.models["actor"].num_params == 124_439_808


def test_unsupported_model_type_in_a_scenario_is_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "run" / "bloom.json"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(json.dumps({"model_type": "bloom", "hidden_size": 64}))
    with pytest.raises(SpecError) as err:
        load_scenario(_scenario(tmp_path, "bloom.json"))
    msg = str(err.value)
    assert "\n" not in msg and "model.config.model_type: unsupported 'bloom'" in msg
    assert "gpt2" in msg and "gemma2" in msg

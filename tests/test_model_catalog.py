"""The model catalog: every entry loads, names resolve, published sizes hold, the CLI behaves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlperf.catalog import ALIASES, list_models, load_config, load_model, resolve_name
from rlperf.cli.app import main
from rlperf.errors import SpecError


@pytest.mark.parametrize("name", list_models())
def test_every_catalog_model_loads_under_its_own_name(name: str) -> None:
    spec = load_model(name)
    assert spec.name == name
    assert spec.architecture == load_config(name)["model_type"]


def test_catalog_is_big_enough_and_names_are_unique_ignoring_case() -> None:
    names = list_models()
    assert len(names) >= 15
    assert len({n.lower() for n in names}) == len(names)
    assert all(target in names for target in ALIASES.values())
    assert not {a.lower() for a in ALIASES} & {n.lower() for n in names}


@pytest.mark.parametrize(
    ("asked", "entry"),
    [
        ("qwen2.5-7b", "Qwen2.5-7B"),
        ("Qwen/Qwen2.5-7B-Instruct", "Qwen2.5-7B"),
        ("Qwen/Qwen3-8B-Base", "Qwen3-8B"),
        ("deepseek-ai/DeepSeek-V3", "DeepSeek-R1"),
        ("DEEPSEEK-R1", "DeepSeek-R1"),
        ("meta-llama/Meta-Llama-3.1-70B-Instruct", "Llama-3.1-70B"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "Mixtral-8x7B-v0.1"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B"),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507", "Qwen3-235B-A22B"),
        ("google/gemma-2-2b-it", "gemma-2-2b"),
    ],
)
def test_names_resolve_through_case_org_prefix_aliases_and_variants(asked: str, entry: str) -> None:
    assert resolve_name(asked) == entry
    spec, base = load_model(asked), load_model(entry)
    if spec.max_position_embeddings == base.max_position_embeddings:
        assert spec is base  # one cached spec per entry
    else:  # an alias that declares its own context (ALIAS_POSITIONS): the entry's shapes otherwise
        assert spec.model_copy(update={"max_position_embeddings": base.max_position_embeddings}) == base


@pytest.mark.parametrize(
    ("asked", "suggested"), [("Qwen2.5-8B", "Qwen2.5-7B"), ("llama-3.1-7b", "Llama-3.1-8B")]
)
def test_unknown_names_suggest_close_ones(asked: str, suggested: str) -> None:
    with pytest.raises(SpecError) as ei:
        load_model(asked)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("model: unknown name")
    assert f"did you mean {suggested}" in msg or f", {suggested}" in msg


def test_paths_to_a_config_or_its_folder_load(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    cfg = {**load_config("tiny-qwen2"), "num_hidden_layers": 3}
    (folder / "config.json").write_text(json.dumps(cfg))
    by_folder, by_file = load_model(folder), load_model(str(folder / "config.json"))
    assert by_folder.name == by_file.name == "my-model"
    assert by_folder.num_layers == 3
    (folder / "config.json").write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        load_model(folder)
    with pytest.raises(SpecError, match=r"no config\.json"):
        load_model(tmp_path / "missing" / "config.json")


# Published sizes (model cards / reports), in parameters.
PUBLISHED = [
    # name, total, active, relative tolerance
    ("Llama-3.1-405B", 405e9, 405e9, 0.01),
    ("Llama-3.1-70B", 70.6e9, 70.6e9, 0.01),
    ("Llama-3.1-8B", 8.03e9, 8.03e9, 0.01),
    ("DeepSeek-V3", 671e9, 37e9, 0.02),  # DeepSeek-V3 report: 671B total, 37B activated
    ("Qwen3-235B-A22B", 235e9, 22e9, 0.02),
    ("Qwen3-30B-A3B", 30.5e9, 3.3e9, 0.02),
    ("Qwen3-8B", 8.2e9, 8.2e9, 0.01),
    ("Mixtral-8x7B", 46.7e9, 12.9e9, 0.01),  # Mistral: 46.7B total, 12.9B per token
    ("Qwen2.5-72B", 72.7e9, 72.7e9, 0.01),
    ("Qwen2.5-7B", 7.61e9, 7.61e9, 0.01),
    ("Qwen2.5-0.5B", 0.49e9, 0.49e9, 0.02),
]


@pytest.mark.parametrize(
    ("name", "total", "active", "rel"), PUBLISHED, ids=[p[0] for p in PUBLISHED]
)
def test_published_parameter_counts_roughly_hold(
    name: str, total: float, active: float, rel: float
) -> None:
    spec = load_model(name)
    assert spec.num_params == pytest.approx(total, rel=rel)
    assert spec.num_active_params == pytest.approx(active, rel=rel)


def test_mla_caches_the_latent_not_per_head_keys() -> None:
    """DeepSeek-V3 caches kv_lora_rank + qk_rope_head_dim = 576 values per layer and token."""
    assert load_model("DeepSeek-V3").kv_bytes_per_token("bf16") == 61 * 576 * 2


# ---- CLI -------------------------------------------------------------------------------------


def test_cli_models_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    main(["models"])
    out = capsys.readouterr().out
    assert all(name in out for name in list_models())


def test_cli_model_show_json_carries_the_spec_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    main(["model", "show", "DeepSeek-V3", "--json"])
    data = json.loads(capsys.readouterr().out)
    spec = load_model("DeepSeek-V3")
    assert data["num_params"] == spec.num_params
    assert data["num_active_params"] == spec.num_active_params
    assert sum(data["params_by_kind"].values()) == spec.num_params
    assert [f["num_tokens"] for f in data["flops"]] == [1024, 8192, 32768]
    assert data["flops"][0]["decode_flops_per_token"] == spec.forward_flops(1, 1024)


def test_cli_model_show_renders_tables(capsys: pytest.CaptureFixture[str]) -> None:
    main(["model", "show", "Qwen3-30B-A3B"])
    out = capsys.readouterr().out
    assert "30,532,122,624" in out and "FLOPs per token" in out


def test_cli_unknown_model_is_one_error_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        main(["model", "show", "nosuch"])
    assert ei.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: model: unknown name 'nosuch'") and "\n" not in err

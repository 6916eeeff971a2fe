"""Published verl and OpenRLHF launch scripts and configs, imported as they are.

tests/data/framework_corpus holds them unmodified (MANIFEST.tsv: repository, commit, path;
both projects are Apache-2.0, their LICENSE files ship beside them). Vision-language scripts
are counted apart: rlperf has no vision tower yet.
"""

from __future__ import annotations

import csv
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


@pytest.mark.parametrize("rel", VISION)
def test_vision_models_fail_with_one_line_naming_the_model(rel: str) -> None:
    path = next(CORPUS.rglob(rel))
    with pytest.raises(SpecError) as err:
        load_framework_config(_kind(str(path.relative_to(CORPUS))), path)
    assert "\n" not in str(err.value) and "--model-config" in str(err.value)

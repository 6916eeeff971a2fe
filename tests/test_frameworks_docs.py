"""docs/frameworks.md embeds the support matrix as the presets produce it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlperf.frameworks.presets import matrix_markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "frameworks.md"


@pytest.mark.skipif(not DOC.exists(), reason="docs are not installed with the package")
def test_doc_matrix_is_current() -> None:
    assert matrix_markdown() in DOC.read_text()


def _table_tokens(heading: str) -> list[str]:
    """Backticked tokens in the first column of the mapping table after ``heading``."""
    import re

    text = DOC.read_text()
    start = text.index(heading)
    rows = []
    for line in text[start:].splitlines()[1:]:
        if rows and not line.startswith("|"):
            break
        if line.startswith("| `") or line.startswith("| actor") or line.startswith("| reference"):
            rows.append(line.split("|")[1])
    tokens = [t.split()[0] for row in rows for t in re.findall(r"`([^`]+)`", row)]
    assert all(t.strip("*.-") for t in tokens), "a bare wildcard would match every key"
    return tokens


def _verl_pattern(token: str) -> str:
    token = token.replace("ROLE.", "*.").replace("FSDP.", "*fsdp_config.")
    return "*" + token if token.startswith((".", "*")) else token


@pytest.mark.skipif(not DOC.exists(), reason="docs are not installed with the package")
def test_every_mapped_key_is_in_the_docs() -> None:
    """Each key an import maps (over the shipped examples and part of the corpus) has a row in
    docs/frameworks.md, and each OpenRLHF flag a row names is one the importer knows."""
    import fnmatch

    from rlperf.frameworks.load import load_framework_config
    from rlperf.frameworks.openrlhf_args import DOTTED, IGNORED, READ, UNSUPPORTED

    examples = Path(__file__).resolve().parent.parent / "src" / "rlperf" / "frameworks" / "examples"
    corpus = Path(__file__).resolve().parent / "data" / "framework_corpus"
    # (an .overrides file next to a YAML of the same name applies to that YAML)
    files = sorted(p for p in examples.iterdir() if not p.with_suffix(".yaml").is_file() or p.suffix == ".yaml")
    files += [corpus / f for f in (
        "verl/examples/grpo_trainer/run_qwen3-235b_megatron_96gb.sh",
        "verl/examples/ppo_trainer/run_qwen2-7b_rm.sh",
        "verl/examples/ppo_trainer/run_deepseek7b_llm_sandbox_fusion.sh",
        "verl/recipe/dapo/run_dapo_qwen2.5_32b.sh",
        "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_12.sh",
        "verl/verl/trainer/config/ppo_megatron_trainer.yaml",
        "openrlhf/head/train_ppo_ray_hybrid_engine.sh",
        "openrlhf/head/train_dapo_ray_hybrid_engine.sh",
        "openrlhf/v0.9.1/train_ppo_llama_ray.sh",
        "openrlhf/v0.9.1/train_reinforce_baseline_llama_ray_async.sh",
    )]
    verl = [_verl_pattern(t) for t in _table_tokens("| verl | rlperf |")]
    openrlhf = _table_tokens("| OpenRLHF (flat / dotted) | rlperf |")
    undocumented: set[str] = set()
    for f in files:
        kind = "openrlhf" if "openrlhf" in str(f) else "verl"
        _, report = load_framework_config(kind, f)
        for note in report.mapped:
            patterns = verl if kind == "verl" else openrlhf
            if not any(fnmatch.fnmatchcase(note.key, p) for p in patterns):
                undocumented.add(f"{kind}: {note.key}")
    assert not undocumented, sorted(undocumented)
    known = set(READ) | set(DOTTED) | set(IGNORED) | set(UNSUPPORTED)
    unknown = [t for t in openrlhf if not any(fnmatch.fnmatchcase(f"--{k}", t) for k in known)]
    assert not unknown, unknown

"""ModelSpec.num_weight_tensors against the parameters ``transformers`` builds (meta device).

transformers 5 keeps every projection, bias and norm as its own parameter but fuses each MoE
layer's routed experts into two 3-D tensors (``experts.gate_up_proj`` of E x 2I x d and
``experts.down_proj`` of E x d x I); the checkpoint layout a weight sync sends has a gate, up and
down projection per expert. So the count here unfuses them: 2E + E tensors per MoE layer.
Empty parameters (a shared MLP of width 0) are left out: a checkpoint holds none.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText  # noqa: E402
from transformers import logging as hf_logging  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from rlperf.catalog import list_models, load_config  # noqa: E402
from rlperf.specs.model import ModelSpec  # noqa: E402
from tests.helpers.hf_configs import gpt_family_configs, hf_configs  # noqa: E402

hf_logging.set_verbosity_error()


def checkpoint_tensors(cfg: dict[str, Any]) -> int:
    hf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in ("quantization_config", "auto_map")})
    auto = AutoModelForImageTextToText if "vision_config" in cfg else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(hf)
    count = 0
    for name, p in model.named_parameters():
        if p.numel() == 0:  # e.g. a shared expert of width 0: no tensor in a checkpoint
            continue
        if name.endswith("experts.gate_up_proj"):
            count += 2 * p.shape[0]  # gate and up per expert
        elif name.endswith("experts.down_proj"):
            count += p.shape[0]
        else:
            assert p.dim() <= 2 or name.endswith("patch_embed.proj.weight"), name  # no other fused tensor
            count += 1
    return count


@pytest.mark.parametrize("name", ["Qwen2.5-Math-7B", "Qwen3-8B", "Qwen3-30B-A3B", "Mixtral-8x7B-v0.1", "DeepSeek-R1",
                                  "gpt2", "pythia-1.4b", "opt-350m", "opt-1.3b", "phi-2", "starcoder",
                                  "gemma-2-9b", "gemma-3-1b-pt", "Phi-3-mini-4k-instruct",
                                  "Qwen2.5-VL-7B-Instruct"])
def test_catalog_tensor_count_equals_transformers(name: str) -> None:
    cfg = load_config(name)
    assert ModelSpec.from_hf_config(cfg, name).num_weight_tensors == checkpoint_tensors(cfg)


def test_tensor_counts_of_the_weight_sync_cases() -> None:
    # the counts verl's checkpoint-engine doc gives for its sync measurements: ~340, ~18.9k, ~37k
    counts = {n: ModelSpec.from_hf_config(load_config(n), n).num_weight_tensors
              for n in ("Qwen2.5-Math-7B", "Qwen3-30B-A3B", "Qwen3-235B-A22B")}
    assert counts == {"Qwen2.5-Math-7B": 339, "Qwen3-30B-A3B": 48 * 393 + 3, "Qwen3-235B-A22B": 94 * 393 + 3}


@pytest.mark.parametrize("name", list_models())
def test_dense_catalog_models_have_one_tensor_per_parameter(name: str) -> None:
    cfg = load_config(name)
    spec = ModelSpec.from_hf_config(cfg, name)
    if spec.moe is not None or cfg["model_type"] not in CONFIG_MAPPING:
        pytest.skip("MoE (fused experts) or not in transformers")
    assert spec.num_weight_tensors == checkpoint_tensors(cfg)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=hf_configs(max_dim=32))
def test_random_config_tensor_count_equals_transformers(cfg: dict[str, Any]) -> None:
    assert ModelSpec.from_hf_config(cfg, "random").num_weight_tensors == checkpoint_tensors(cfg)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=gpt_family_configs(max_dim=32))
def test_random_gpt_family_tensor_count_equals_transformers(cfg: dict[str, Any]) -> None:
    assert ModelSpec.from_hf_config(cfg, "random").num_weight_tensors == checkpoint_tensors(cfg)

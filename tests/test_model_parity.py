"""ModelSpec against the real thing: parameter counts against the modules ``transformers`` builds,
forward FLOPs against ``torch.utils.flop_counter.FlopCounterMode``.

Attention count. Models run with ``attn_implementation="eager"``: scores are a dense ``Q @ K^T``
over all ``T x T`` (query, key) pairs and the causal mask is added afterwards, so torch computes
(and counts) ``attention="full"``. SDPA is no better for counting: the CPU flash kernel has no FLOP
formula (FlopCounterMode reports zero attention FLOPs for it) and the CUDA formulas ignore
``is_causal``. ``attention="causal"`` (about half the pairs) is the work a FlashAttention kernel
that skips masked tiles actually does, and what rlperf's cost models use; both counts are
checked here, the causal one through its closed-form gap to the full one.

MoE routing. On the meta device expert weights have no values, so the default (eager) experts
loop, which indexes by the routed tokens, cannot run there. Full-size MoE layers are therefore
counted with transformers' ``batched_mm`` experts implementation (one matmul per routed
(token, expert) pair: exactly the active-expert work), and shrunken MoE models are also run on
CPU with random weights, a fixed seed and the eager experts loop (one matmul per expert over the
tokens routed to it), so the routed-token FLOPs are the ones the model really computes. The
experts implementation is always named: transformers' default on CPU is ``grouped_mm``, which
FlopCounterMode does not count at all.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText  # noqa: E402
from transformers import logging as hf_logging  # noqa: E402
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402

from rlperf.catalog import list_models, load_config  # noqa: E402
from rlperf.specs.model import ModelSpec  # noqa: E402
from tests.helpers.hf_configs import gpt_family_configs, hf_configs  # noqa: E402

hf_logging.set_verbosity_error()

# Published keys that are not part of the bf16 module structure: an fp8 quantization_config would
# add per-block scale tensors, and auto_map points at remote code. Parity is against the plain,
# in-library implementation.
NOT_STRUCTURE = ("quantization_config", "auto_map")
# FlopCounterMode also counts a few tiny matmuls ModelSpec leaves out (e.g. a RoPE frequency
# outer product where a model computes it with @); they are below 1e-6 of the total.
FLOP_RTOL = 1e-4


def build(cfg: dict[str, Any], device: str = "meta", **kwargs: Any) -> Any:
    hf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in NOT_STRUCTURE})
    # A vision-language model is built whole (vision encoder included) by its own auto class.
    auto = AutoModelForImageTextToText if "vision_config" in cfg else AutoModelForCausalLM
    with torch.device(device):
        return auto.from_config(hf, **kwargs)


def num_parameters(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def counted_forward_flops(model: Any, num_tokens: int, device: str, vocab_size: int) -> int:
    if device == "meta":
        ids = torch.zeros(1, num_tokens, dtype=torch.long, device="meta")
    else:
        ids = torch.randint(
            0, vocab_size, (1, num_tokens), generator=torch.Generator().manual_seed(1)
        )
    # An explicit mask keeps transformers from inspecting position ids (.item() fails on meta).
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return int(counter.get_total_flops())


# ---- parameter counts ------------------------------------------------------------------------


@pytest.mark.parametrize("name", list_models())
def test_catalog_param_count_equals_transformers(name: str) -> None:
    cfg = load_config(name)
    if cfg["model_type"] not in CONFIG_MAPPING:
        pytest.skip(f"transformers has no {cfg['model_type']!r}")
    spec = ModelSpec.from_hf_config(cfg, name)
    assert num_parameters(build(cfg)) == spec.num_params


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=hf_configs(max_dim=48))
def test_random_config_param_count_equals_transformers(cfg: dict[str, Any]) -> None:
    spec = ModelSpec.from_hf_config(cfg, "random")
    assert num_parameters(build(cfg)) == spec.num_params


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=gpt_family_configs())
def test_random_gpt_family_param_count_equals_transformers(cfg: dict[str, Any]) -> None:
    spec = ModelSpec.from_hf_config(cfg, "random")
    assert num_parameters(build(cfg)) == spec.num_params


# ---- forward FLOPs ---------------------------------------------------------------------------

# (catalog model, config overrides): fewer layers keep the meta forward fast; shapes stay real.
META_CASES = [
    ("Qwen2.5-0.5B", {}),  # dense, QKV bias, tied embeddings, all 24 layers
    ("Qwen2.5-7B", {"num_hidden_layers": 2}),  # dense, GQA 28/4
    ("Llama-3.1-8B", {"num_hidden_layers": 2}),  # GQA 32/8
    ("Qwen3-8B", {"num_hidden_layers": 2}),  # QK-norm, explicit head_dim
    ("Qwen3-30B-A3B", {"num_hidden_layers": 2}),  # 128 experts, top-8
    ("Mixtral-8x7B-v0.1", {"num_hidden_layers": 2}),  # 8 experts, top-2
    ("DeepSeek-R1", {"num_hidden_layers": 2, "first_k_dense_replace": 1}),  # MLA, shared expert
    ("gpt2", {}),  # plain gelu_new MLP, LayerNorm, learned positions, fused qkv (Conv1D), tied
    ("pythia-1.4b", {"num_hidden_layers": 2}),  # parallel residual, partial rotary, untied
    ("opt-350m", {"num_hidden_layers": 2}),  # relu, post-norm, project_in/out, offset positions
    ("opt-1.3b", {"num_hidden_layers": 2}),  # pre-norm, final norm
    ("phi-2", {"num_hidden_layers": 2}),  # parallel block, one LayerNorm, LM head bias
    ("starcoderbase-1b", {"n_layer": 2}),  # multi-query attention, learned positions
    ("gemma-2b", {"num_hidden_layers": 2}),  # GeGLU, head_dim 256 != hidden / heads, MQA
    ("gemma-2-2b", {"num_hidden_layers": 2}),  # sandwich norms, sliding + global layers
    ("gemma-3-1b-pt", {"num_hidden_layers": 7}),  # QK-norm; window 512 < the 1024 tokens
    ("Phi-3-mini-4k-instruct", {"num_hidden_layers": 2}),  # fused qkv and gate_up
    ("Mistral-7B-v0.1", {"num_hidden_layers": 2}),  # every layer sliding (4096)
    ("Qwen2.5-VL-3B-Instruct", {"num_hidden_layers": 2}),  # language tower of a VLM (text only)
]

SMALL = {"num_hidden_layers": 2, "vocab_size": 2048, "num_attention_heads": 4}
CPU_CASES = [
    (
        "Qwen3-30B-A3B",
        {**SMALL, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128}
        | {"num_key_value_heads": 2, "head_dim": 64, "num_experts": 16},
    ),
    (
        "Mixtral-8x7B-v0.1",
        {**SMALL, "hidden_size": 256, "intermediate_size": 512, "num_key_value_heads": 2},
    ),
    (
        "DeepSeek-R1",  # group-limited routing: 16 experts in 4 groups, top-2 groups, top-4 experts
        {**SMALL, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64}
        | {"num_key_value_heads": 4, "first_k_dense_replace": 1, "n_routed_experts": 16}
        | {"n_group": 4, "topk_group": 2, "num_experts_per_tok": 4, "q_lora_rank": 64}
        | {"kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32},
    ),
]
QWEN2_MOE = {  # no Qwen2-MoE checkpoint in the catalog: a small one with a gated shared expert
    "model_type": "qwen2_moe",
    **SMALL,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_key_value_heads": 4,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 256,
    "decoder_sparse_step": 1,
}


def _check_flops(
    cfg: dict[str, Any], name: str, device: str, num_tokens: int, **kwargs: Any
) -> None:
    spec = ModelSpec.from_hf_config(cfg, name)
    torch.manual_seed(0)
    model = build(cfg, device, attn_implementation="eager", **kwargs)
    got = counted_forward_flops(model, num_tokens, device, cfg["vocab_size"])
    assert spec.forward_flops(num_tokens, attention="full") == pytest.approx(got, rel=FLOP_RTOL)
    # The causal count drops exactly the masked (query, key) pairs: T(T-1)/2 per layer and head,
    # and on a sliding layer also the keys more than a window behind (query n sees min(n, W)).
    masked = num_tokens * (num_tokens - 1) / 2
    window = spec.sliding_window or num_tokens
    masked_sliding = num_tokens**2 - sum(min(n, window) for n in range(1, num_tokens + 1))
    layers_masked = (spec.num_layers - spec.num_sliding_layers) * masked
    layers_masked += spec.num_sliding_layers * masked_sliding
    gap = 2 * spec.num_heads * (spec.q_head_dim + spec.v_head_dim) * layers_masked
    assert spec.forward_flops(num_tokens, attention="causal") == pytest.approx(
        got - gap, rel=FLOP_RTOL
    )


@pytest.mark.parametrize(("name", "overrides"), META_CASES, ids=[c[0] for c in META_CASES])
def test_forward_flops_match_flop_counter_on_meta(name: str, overrides: dict[str, Any]) -> None:
    cfg = {**load_config(name), **overrides}
    moe = ModelSpec.from_hf_config(cfg, name).moe is not None
    kwargs = {"experts_implementation": "batched_mm"} if moe else {}
    _check_flops(cfg, name, "meta", 1024, **kwargs)


@pytest.mark.parametrize(("name", "overrides"), CPU_CASES, ids=[c[0] for c in CPU_CASES])
def test_moe_forward_flops_match_flop_counter_with_real_routing(
    name: str, overrides: dict[str, Any]
) -> None:
    _check_flops(
        {**load_config(name), **overrides}, name, "cpu", 256, experts_implementation="eager"
    )


def test_qwen2_moe_shared_expert_flops_match_flop_counter() -> None:
    _check_flops(QWEN2_MOE, "qwen2-moe-small", "cpu", 256, experts_implementation="eager")


def test_vision_encoder_flops_match_flop_counter() -> None:
    """Qwen2.5-VL's vision tower on CPU over one 16 x 16-patch image: two window blocks
    (8 x 8-patch windows) and two full-attention blocks."""
    cfg = load_config("Qwen2.5-VL-3B-Instruct")
    vision = {"depth": 4, "hidden_size": 64, "num_heads": 4, "intermediate_size": 96, "out_hidden_size": 64}
    text = {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 64, "vocab_size": 256}
    text |= {"num_attention_heads": 2, "num_key_value_heads": 1, "rope_scaling": None}
    cfg = {**cfg, **text, "vision_config": {**cfg["vision_config"], **vision}}
    cfg["vision_config"]["fullatt_block_indexes"] = [1, 3]
    spec = ModelSpec.from_hf_config(cfg, "qwen2.5-vl-small")
    assert spec.vision is not None
    torch.manual_seed(0)
    model = build(cfg, "cpu", attn_implementation="eager")
    pixels = torch.randn(256, 3 * 2 * 14 * 14)  # 256 patches of 3 channels x 2 frames x 14 x 14
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model.model.visual(pixels, grid_thw=torch.tensor([[1, 16, 16]]))
    assert spec.vision.flops(1, 256) == pytest.approx(counter.get_total_flops(), rel=FLOP_RTOL)

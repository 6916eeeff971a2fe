"""Hypothesis strategies for Hugging Face ``config.json`` dicts of every supported model type.

``hf_configs(max_dim=...)`` draws valid configs: small ones (``max_dim`` ~ 64) can be built by
transformers in milliseconds for parity tests; large ones exercise the closed forms.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from rlperf.specs.hf_config import LLAMA_LIKE_TYPES


@st.composite
def _moe_keys(draw: st.DrawFn, mtype: str, num_layers: int, max_dim: int) -> dict[str, Any]:
    experts = draw(st.integers(1, 8))
    top_k = draw(st.integers(1, experts))
    width = draw(st.integers(1, max_dim))
    layer_ids = st.lists(st.integers(0, num_layers - 1), unique=True, max_size=num_layers)
    if mtype in ("qwen2_moe", "qwen3_moe"):
        keys = {
            "num_experts": experts,
            "num_experts_per_tok": top_k,
            "moe_intermediate_size": width,
            "decoder_sparse_step": draw(st.integers(1, 3)),
            "mlp_only_layers": sorted(draw(layer_ids)),
        }
        if mtype == "qwen2_moe":
            keys["shared_expert_intermediate_size"] = draw(st.integers(0, max_dim))
            keys["qkv_bias"] = draw(st.booleans())
        return keys
    if mtype == "mixtral":
        return {"num_local_experts": experts, "num_experts_per_tok": top_k}
    # deepseek_v2 / deepseek_v3: one routing group keeps group-limited routing valid.
    return {
        "n_routed_experts": experts,
        "num_experts_per_tok": top_k,
        "moe_intermediate_size": width,
        "n_shared_experts": draw(st.integers(0, 2)),
        "first_k_dense_replace": draw(st.integers(0, num_layers)),
        "n_group": 1,
        "topk_group": 1,
    }


@st.composite
def _mla_keys(draw: st.DrawFn, max_dim: int) -> dict[str, Any]:
    small = st.integers(1, max(1, max_dim // 2))
    return {
        "q_lora_rank": draw(st.none() | small),
        "kv_lora_rank": draw(small),
        "qk_nope_head_dim": draw(small),
        "qk_rope_head_dim": 2 * draw(st.integers(1, max(1, max_dim // 8))),  # RoPE needs even
        "v_head_dim": draw(small),
    }


@st.composite
def hf_configs(draw: st.DrawFn, max_dim: int = 64, max_layers: int = 3) -> dict[str, Any]:
    """A valid config.json dict of any Llama-style ``model_type``."""
    mtype = draw(st.sampled_from(LLAMA_LIKE_TYPES))
    kv_heads = draw(st.integers(1, 4))
    heads = kv_heads * draw(st.integers(1, 3))
    head_dim = 2 * draw(st.integers(1, max(1, max_dim // 8)))
    num_layers = draw(st.integers(1, max_layers))
    cfg: dict[str, Any] = {
        "model_type": mtype,
        "hidden_size": heads * head_dim,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": draw(st.integers(1, max_dim)),
        "vocab_size": draw(st.integers(2, 4 * max_dim)),
        "tie_word_embeddings": draw(st.booleans()),
        "pad_token_id": 0,  # Phi-3's default pad id (32000) lies outside a small vocabulary
    }
    if draw(st.booleans()):  # an explicit head_dim that need not equal hidden // heads
        cfg["head_dim"] = head_dim * draw(st.integers(1, 2))
    if mtype in ("llama", "deepseek_v2"):
        cfg["mlp_bias"] = draw(st.booleans())
    if mtype in ("llama", "qwen3", "qwen3_moe", "deepseek_v2", "deepseek_v3"):
        cfg["attention_bias"] = draw(st.booleans())
    if mtype in ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v2", "deepseek_v3"):
        cfg.update(draw(_moe_keys(mtype, num_layers, max_dim)))
    if mtype in ("deepseek_v2", "deepseek_v3"):
        cfg["num_key_value_heads"] = heads  # MLA: every head has its own (latent-derived) K and V
        cfg.update(draw(_mla_keys(max_dim)))
    return cfg


@st.composite
def gpt_family_configs(draw: st.DrawFn, max_dim: int = 48, max_layers: int = 3) -> dict[str, Any]:
    """A small valid config.json of a GPT-style family, every structural switch drawn."""
    mtype = draw(st.sampled_from(("gpt2", "gpt_bigcode", "gpt_neox", "opt", "phi")))
    heads = draw(st.integers(1, 4))
    d = heads * 2 * draw(st.integers(1, max(1, max_dim // 8)))
    layers, width = draw(st.integers(1, max_layers)), draw(st.integers(1, max_dim))
    vocab, tied = draw(st.integers(2, 4 * max_dim)), draw(st.booleans())
    if mtype in ("gpt2", "gpt_bigcode"):
        cfg: dict[str, Any] = {"n_embd": d, "n_layer": layers, "n_head": heads, "n_inner": width,
                               "n_positions": draw(st.integers(1, 64))}
        if mtype == "gpt_bigcode":
            cfg["multi_query"] = draw(st.booleans())
    else:
        cfg = {"hidden_size": d, "num_hidden_layers": layers, "num_attention_heads": heads,
               "max_position_embeddings": draw(st.integers(1, 64))}
        if mtype == "opt":
            cfg |= {"ffn_dim": width, "enable_bias": draw(st.booleans()),
                    "layer_norm_elementwise_affine": draw(st.booleans()),
                    "do_layer_norm_before": draw(st.booleans()),
                    "word_embed_proj_dim": draw(st.sampled_from((d, 2 * d, max(1, d // 2))))}
        else:
            cfg["intermediate_size"] = width
        if mtype == "gpt_neox":
            cfg |= {"attention_bias": draw(st.booleans()), "use_parallel_residual": draw(st.booleans()),
                    "rotary_pct": draw(st.sampled_from((0.25, 0.5, 1.0)))}
        if mtype == "phi":
            kv = draw(st.sampled_from([k for k in range(1, heads + 1) if heads % k == 0]))
            cfg |= {"num_key_value_heads": kv, "qk_layernorm": draw(st.booleans()), "partial_rotary_factor": 0.5}
    return {"model_type": mtype, **cfg, "vocab_size": vocab, "tie_word_embeddings": tied, "pad_token_id": 0,
            "bos_token_id": 0, "eos_token_id": 0}

"""Readers for the GPT-style families: GPT-2, GPT-BigCode (StarCoder), GPT-NeoX (Pythia), OPT, Phi.

Each maps a ``config.json`` onto :class:`ModelSpec` fields with the key names and defaults of its
``transformers`` (5.x) configuration class, and with the module structure its modeling file
builds:

- ``gpt2``: ``c_attn`` (fused q, k, v with bias), ``c_proj`` (bias), plain MLP ``c_fc``/``c_proj``
  (biases), LayerNorm with bias before attention and MLP and at the end, learned positions of
  ``n_positions`` rows, LM head tied to the token table. Inner width ``n_inner`` or ``4 d``.
- ``gpt_bigcode``: GPT-2's layout with multi-query attention (``multi_query``: one K/V head).
- ``gpt_neox``: fused ``query_key_value`` and ``dense`` (biases when ``attention_bias``), plain MLP
  with biases, two LayerNorms per layer (parallel residual when ``use_parallel_residual``),
  rotary on ``rotary_pct`` of each head, untied ``embed_out``.
- ``opt``: separate q/k/v/out projections and plain MLP, biases when ``enable_bias``; LayerNorms
  with a scale and shift unless ``layer_norm_elementwise_affine`` is off; no final norm when
  ``do_layer_norm_before`` is off; learned positions with 2 extra rows (OPT's offset); a token
  table ``word_embed_proj_dim`` wide with ``project_in``/``project_out`` when that differs from
  ``hidden_size``; tied LM head.
- ``phi`` (Phi-1/1.5/2): separate q/k/v and ``dense`` with biases, plain MLP with biases, one
  LayerNorm per layer shared by the parallel attention and MLP, rotary on
  ``partial_rotary_factor`` of each head, an LM head with a bias.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlperf.errors import SpecError
from rlperf.specs.hf_keys import flag, fraction, opt, pos, text, where

Reader = Callable[[dict[str, Any]], dict[str, Any]]

_LAYERNORM = {"kind": "layernorm", "bias": True}


def _first(cfg: dict[str, Any], *keys: str) -> str:
    """The first of ``keys`` present in the config (GPT-2 style ``n_embd`` or ``hidden_size``)."""
    for key in keys:
        if cfg.get(key) is not None:
            return key
    return keys[0]


def _head_dim(d: int, heads: int) -> int:
    if d % heads:
        raise SpecError(where("num_attention_heads"), f"{heads} does not divide hidden_size={d}")
    return d // heads


def _shape(d: int, layers: int, heads: int, kv_heads: int) -> dict[str, int]:
    return {
        "hidden_size": d,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": _head_dim(d, heads),
    }


def _rotary_fraction(cfg: dict[str, Any], default: float) -> float:
    """``partial_rotary_factor`` (transformers 5, also inside ``rope_parameters``) or NeoX's
    older ``rotary_pct``."""
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("partial_rotary_factor") is not None:
        return fraction(rope, "partial_rotary_factor", default)
    return fraction(cfg, _first(cfg, "partial_rotary_factor", "rotary_pct"), default)


def _gpt2_like(cfg: dict[str, Any], kv_heads_one: bool, act: str) -> dict[str, Any]:
    if flag(cfg, "add_cross_attention", False):
        raise SpecError(where("add_cross_attention"), "cross-attention layers are not modelled", "false")
    d = pos(cfg, _first(cfg, "n_embd", "hidden_size"))
    heads = pos(cfg, _first(cfg, "n_head", "num_attention_heads"))
    positions = opt(cfg, _first(cfg, "n_positions", "max_position_embeddings"), 1024)
    layers = pos(cfg, _first(cfg, "n_layer", "num_hidden_layers"))
    return {
        **_shape(d, layers, heads, 1 if kv_heads_one else heads),
        "intermediate_size": opt(cfg, _first(cfg, "n_inner", "intermediate_size"), 4 * d),
        "vocab_size": opt(cfg, "vocab_size", 50257),
        "tie_word_embeddings": flag(cfg, "tie_word_embeddings", True),
        "max_position_embeddings": positions,
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "fused_qkv": True,
        "mlp": {"gated": False, "activation": text(cfg, "activation_function", act)},
        "norm": _LAYERNORM,
        "position": {"kind": "learned", "num_embeddings": positions},
    }


def gpt2_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return _gpt2_like(cfg, False, "gelu_new")


def gpt_bigcode_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    return _gpt2_like(cfg, flag(cfg, "multi_query", True), "gelu_pytorch_tanh")


def gpt_neox_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    d, heads = pos(cfg, "hidden_size"), pos(cfg, "num_attention_heads")
    bias = flag(cfg, "attention_bias", True)
    return {
        **_shape(d, pos(cfg, "num_hidden_layers"), heads, heads),
        "intermediate_size": pos(cfg, "intermediate_size"),
        "vocab_size": pos(cfg, "vocab_size"),
        "tie_word_embeddings": flag(cfg, "tie_word_embeddings", False),
        "max_position_embeddings": opt(cfg, "max_position_embeddings", 2048),
        "qkv_bias": bias,
        "o_bias": bias,
        "mlp_bias": True,
        "fused_qkv": True,
        "parallel_residual": flag(cfg, "use_parallel_residual", True),
        "mlp": {"gated": False, "activation": text(cfg, "hidden_act", "gelu")},
        "norm": _LAYERNORM,
        "position": {"kind": "rotary", "rotary_fraction": _rotary_fraction(cfg, 0.25)},
    }


def opt_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    d, heads = pos(cfg, "hidden_size"), pos(cfg, "num_attention_heads")
    bias = flag(cfg, "enable_bias", True)
    positions = opt(cfg, "max_position_embeddings", 2048)
    embed = opt(cfg, "word_embed_proj_dim", d)
    pre_norm = flag(cfg, "do_layer_norm_before", True)
    return {
        **_shape(d, pos(cfg, "num_hidden_layers"), heads, heads),
        "intermediate_size": opt(cfg, "ffn_dim", 3072),
        "vocab_size": opt(cfg, "vocab_size", 50272),
        "tie_word_embeddings": flag(cfg, "tie_word_embeddings", True),
        "max_position_embeddings": positions,
        "qkv_bias": bias,
        "o_bias": bias,
        "mlp_bias": bias,
        "embedding_size": None if embed == d else embed,
        "mlp": {"gated": False, "activation": text(cfg, "activation_function", "relu")},
        "norm": {
            **_LAYERNORM,
            "elementwise_affine": flag(cfg, "layer_norm_elementwise_affine", True),
            "final": pre_norm and not flag(cfg, "_remove_final_layer_norm", False),
        },
        # OPTLearnedPositionalEmbedding keeps two rows before position 0.
        "position": {"kind": "learned", "num_embeddings": positions + 2},
    }


def phi_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    d, heads = pos(cfg, "hidden_size"), pos(cfg, "num_attention_heads")
    kv_heads = opt(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise SpecError(
            where("num_key_value_heads"), f"{kv_heads} does not divide num_attention_heads={heads}"
        )
    return {
        **_shape(d, pos(cfg, "num_hidden_layers"), heads, kv_heads),
        "intermediate_size": pos(cfg, "intermediate_size"),
        "vocab_size": pos(cfg, "vocab_size"),
        "tie_word_embeddings": flag(cfg, "tie_word_embeddings", False),
        "max_position_embeddings": opt(cfg, "max_position_embeddings", 2048),
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "qk_norm": flag(cfg, "qk_layernorm", False),
        "lm_head_bias": True,
        "parallel_residual": True,
        "mlp": {"gated": False, "activation": text(cfg, "hidden_act", "gelu_new")},
        "norm": {**_LAYERNORM, "per_layer": 1},
        "position": {"kind": "rotary", "rotary_fraction": _rotary_fraction(cfg, 0.5)},
    }


GPT_READERS: dict[str, Reader] = {
    "gpt2": gpt2_fields,
    "gpt_bigcode": gpt_bigcode_fields,
    "gpt_neox": gpt_neox_fields,
    "opt": opt_fields,
    "phi": phi_fields,
}

"""Llama-style families whose blocks differ in a few switches: Gemma 1/2/3, Phi-3/Phi-4, Mistral.

They share Llama's module layout (q/k/v/o projections, a gated MLP, RMSNorm, rotary), so
:mod:`rlperf.specs.hf_config` reads their shapes; this module adds what differs, with the key
names and defaults of each ``transformers`` (5.x) configuration class:

- ``gemma``: GeGLU (``gelu_pytorch_tanh``), ``head_dim`` 256 by default (decoupled from
  ``hidden_size / heads``), tied embeddings by default. Gemma's RMSNorm scales by ``1 + w``: the
  same ``d`` parameters.
- ``gemma2``: Gemma plus four norms per layer (before and after attention and MLP) and
  alternating sliding-window (even layers) and global layers unless ``layer_types`` says
  otherwise; window ``sliding_window`` (4096).
- ``gemma3_text``: Gemma 2 plus RMSNorm on q and k; every ``sliding_window_pattern``-th
  (6th) layer global, the others sliding.
- ``phi3`` (Phi-3, Phi-4): fused ``qkv_proj`` and ``gate_up_proj`` tensors, no biases, rotary on
  ``partial_rotary_factor`` of each head, every layer sliding when ``sliding_window`` is set.
- ``mistral``: every layer sliding when ``sliding_window`` is set (4096 by default; v0.3 sets
  null).

A sliding layer's query sees the ``sliding_window`` most recent keys, itself included
(transformers' ``sliding_window_causal`` mask: ``q - k < window``).
"""

from __future__ import annotations

from typing import Any

from rlperf.errors import SpecError
from rlperf.specs.hf_keys import flag, fraction, opt, text, where

VARIANT_TYPES = ("gemma", "gemma2", "gemma3_text", "phi3")
# head_dim when the config does not give one (others: hidden_size // heads).
DEFAULT_HEAD_DIM = {"qwen3": 128, "gemma": 256, "gemma2": 256, "gemma3_text": 256}
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3_text")
_GEMMA = ("gemma", "gemma2", "gemma3_text")
_LAYER_KINDS = ("full_attention", "sliding_attention")


def _layer_types(cfg: dict[str, Any], num_layers: int, every: int) -> tuple[str, ...]:
    """``layer_types`` as given, else every ``every``-th layer global and the rest sliding."""
    given = cfg.get("layer_types")
    if given is None:
        return tuple("sliding_attention" if (i + 1) % every else "full_attention" for i in range(num_layers))
    if not isinstance(given, list) or len(given) != num_layers or any(k not in _LAYER_KINDS for k in given):
        raise SpecError(
            where("layer_types"),
            f"must list one kind per layer ({num_layers}), got {given!r}",
            ", ".join(_LAYER_KINDS),
        )
    return tuple(given)


def _windowed(cfg: dict[str, Any], layer_types: tuple[str, ...], default: int | None) -> dict[str, Any]:
    """``layer_types`` and the window; an explicit ``"sliding_window": null`` (Mistral v0.3) or
    an absent key without a class default means no window."""
    if "sliding_attention" not in layer_types:
        return {"layer_types": layer_types}
    given = cfg.get("sliding_window")
    if given is None and ("sliding_window" in cfg or default is None):
        return {}
    return {"layer_types": layer_types, "sliding_window": opt(cfg, "sliding_window", default or 1)}


def variant_fields(cfg: dict[str, Any], mtype: str, num_layers: int) -> dict[str, Any]:
    """The block fields where ``mtype`` differs from Llama (empty for Llama itself)."""
    fields: dict[str, Any] = {}
    if mtype in _GEMMA:
        act_key = "hidden_activation" if cfg.get("hidden_activation") is not None else "hidden_act"
        act = text(cfg, act_key, "gelu_pytorch_tanh")
        # GemmaConfig maps the legacy "gelu" of the released configs to the tanh approximation.
        fields["mlp"] = {"activation": "gelu_pytorch_tanh" if act == "gelu" else act}
        bias = flag(cfg, "attention_bias", False)
        fields |= {"qkv_bias": bias, "o_bias": bias}
    if mtype in ("gemma2", "gemma3_text"):
        fields["norm"] = {"per_layer": 4}
        every = 2 if mtype == "gemma2" else opt(cfg, "sliding_window_pattern", 6)
        fields |= _windowed(cfg, _layer_types(cfg, num_layers, every), 4096)
    if mtype == "gemma3_text":
        fields["qk_norm"] = True
    if mtype == "phi3":
        fields["fused_qkv"] = True
        fields["mlp"] = {"fused_gate_up": True, "activation": text(cfg, "hidden_act", "silu")}
        fields["position"] = {"rotary_fraction": _rotary_fraction(cfg)}
    if mtype in ("phi3", "mistral"):
        all_sliding = ("sliding_attention",) * num_layers
        fields |= _windowed(cfg, all_sliding, 4096 if mtype == "mistral" else None)
    return fields


def _rotary_fraction(cfg: dict[str, Any]) -> float:
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("partial_rotary_factor") is not None:
        return fraction(rope, "partial_rotary_factor", 1.0)
    return fraction(cfg, "partial_rotary_factor", 1.0)

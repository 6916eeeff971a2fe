"""Vision-language models: the language tower read as its text family, the vision tower as a
:class:`~rlperf.specs.model_blocks.VisionTowerSpec`.

Qwen2.5-VL (``qwen2_5_vl``; transformers ``Qwen2_5_VisionTransformerPretrainedModel``), with
vision width ``e``, MLP width ``i``, ``c`` input channels, patches ``t x p x p`` and merge size
``m`` (``m^2`` patches become one language token of width ``o``):

- patch embedding: a bias-free Conv3d, ``c t p^2 e``;
- each of ``depth`` blocks: two RMSNorms ``2e``, fused qkv ``3e^2 + 3e`` and proj ``e^2 + e``
  (biases), a gated SiLU MLP with biases ``3 e i + 2i + e``;
- the merger: RMSNorm ``e``, ``Linear(e m^2, e m^2)`` and ``Linear(e m^2, o)`` with biases.

Blocks listed in ``fullatt_block_indexes`` attend over the whole image; the others within
windows ``window_size`` pixels wide: ``(window_size / p)^2`` patches.
"""

from __future__ import annotations

from typing import Any

from rlperf.errors import SpecError
from rlperf.specs.hf_keys import opt, where

# model_type -> the text family its language tower is read as
VLM_TEXT_TYPES = {"qwen2_5_vl": "qwen2"}


def _vision_key(v: dict[str, Any], key: str, default: int) -> int:
    """An integer of ``vision_config`` (a per-axis list of equal sizes counts as one)."""
    value = v.get(key)
    if isinstance(value, list):  # patch sizes may be given per axis
        if not value or any(x != value[0] for x in value):
            raise SpecError(where(f"vision_config.{key}"), f"must be one size for all axes, got {value!r}")
        value = value[0]
    try:
        return opt({key: value}, key, default)
    except SpecError as err:
        raise SpecError(where(f"vision_config.{key}"), err.problem, err.allowed) from None


def qwen2_5_vl_vision(cfg: dict[str, Any]) -> dict[str, Any]:
    v = cfg.get("vision_config")
    if not isinstance(v, dict):
        raise SpecError(where("vision_config"), "missing from config.json (a Qwen2.5-VL needs it)")
    e, i = _vision_key(v, "hidden_size", 3584), _vision_key(v, "intermediate_size", 3420)
    depth, heads = _vision_key(v, "depth", 32), _vision_key(v, "num_heads", 16)
    c = _vision_key(v, "in_channels", _vision_key(v, "in_chans", 3))
    t, p = _vision_key(v, "temporal_patch_size", 2), _vision_key(v, "patch_size", 14)
    m, o = _vision_key(v, "spatial_merge_size", 2), _vision_key(v, "out_hidden_size", 3584)
    window = _vision_key(v, "window_size", 112)
    full = v.get("fullatt_block_indexes", [7, 15, 23, 31])
    if not isinstance(full, list) or any(type(k) is not int or not 0 <= k < depth for k in full):
        raise SpecError(where("vision_config.fullatt_block_indexes"), f"must list block indices below {depth}")
    if e % heads:
        raise SpecError(where("vision_config.num_heads"), f"{heads} does not divide hidden_size={e}")
    patch = c * t * p * p * e
    block_mm = 4 * e * e + 3 * e * i
    block = 2 * e + block_mm + 3 * e + e + 2 * i + e
    merged = e * m * m
    merger_mm = merged * merged + merged * o
    merger = e + merger_mm + merged + o
    return {
        "num_params": patch + depth * block + merger,
        "num_weight_tensors": 1 + 12 * depth + 5,
        "matmul_params_per_patch": patch + depth * block_mm + merger_mm / (m * m),
        "num_layers": depth,
        "num_heads": heads,
        "head_dim": e // heads,
        "num_full_attention_layers": len(set(full)),
        "window_patches": max(1, (window // p) ** 2),
        "patches_per_token": m * m,
    }


def text_tower(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The language tower's config keys (nested ``text_config`` or, in older files, the top
    level) and the text family to read them as."""
    mtype = str(cfg["model_type"])
    text = cfg.get("text_config")
    keys = {**cfg, **text} if isinstance(text, dict) else dict(cfg)
    # transformers 5 keeps tie_word_embeddings on the outer config.
    if "tie_word_embeddings" in cfg:
        keys["tie_word_embeddings"] = cfg["tie_word_embeddings"]
    keys["model_type"] = VLM_TEXT_TYPES[mtype]
    return keys, mtype

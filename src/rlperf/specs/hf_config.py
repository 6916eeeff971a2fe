"""Map a Hugging Face ``config.json`` onto :class:`ModelSpec` fields.

Each supported ``model_type`` is read by the key names, and with the defaults, that its
``transformers`` (5.x) configuration and modeling classes use. Unknown model types are rejected
with the list of supported ones rather than guessed at. Every problem is a one-line
``SpecError`` naming the config key (``model.config.<key>``).
"""

from __future__ import annotations

from typing import Any

from rlperf.errors import SpecError
from rlperf.specs.hf_gpt import GPT_READERS
from rlperf.specs.hf_keys import as_int, flag, opt, pos, where
from rlperf.specs.hf_vision import VLM_TEXT_TYPES, qwen2_5_vl_vision, text_tower
from rlperf.specs.hf_variants import DEFAULT_HEAD_DIM, TIED_BY_DEFAULT, VARIANT_TYPES, variant_fields

# Llama-style blocks (SwiGLU MLP, RMSNorm, rotary), read by this module.
DENSE_TYPES = ("llama", "qwen2", "qwen3", "mistral", *VARIANT_TYPES)
MOE_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "deepseek_v2")
LLAMA_LIKE_TYPES = DENSE_TYPES + MOE_TYPES
# Families with other blocks, each read by its own function.
FAMILY_READERS = {**GPT_READERS}
SUPPORTED_TYPES = LLAMA_LIKE_TYPES + tuple(FAMILY_READERS) + tuple(VLM_TEXT_TYPES)


def _heads(cfg: dict[str, Any], mtype: str, d: int) -> tuple[int, int, int]:
    heads = pos(cfg, "num_attention_heads")
    kv_heads = opt(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise SpecError(
            where("num_key_value_heads"), f"{kv_heads} does not divide num_attention_heads={heads}"
        )
    if cfg.get("head_dim") is not None:
        return heads, kv_heads, as_int("head_dim", cfg["head_dim"], 1)
    if mtype in DEFAULT_HEAD_DIM:
        return heads, kv_heads, DEFAULT_HEAD_DIM[mtype]
    if d % heads:
        raise SpecError(
            where("num_attention_heads"),
            f"{heads} does not divide hidden_size={d} (and no head_dim given)",
        )
    return heads, kv_heads, d // heads


def _moe_fields(cfg: dict[str, Any], mtype: str) -> dict[str, Any] | None:
    if mtype in ("qwen2_moe", "qwen3_moe"):
        moe: dict[str, Any] = {
            "num_experts": pos(cfg, "num_experts"),
            "experts_per_token": pos(cfg, "num_experts_per_tok"),
            "expert_intermediate_size": pos(cfg, "moe_intermediate_size"),
            "dense_layers": tuple(_layer_list(cfg, "mlp_only_layers")),
            "sparse_step": opt(cfg, "decoder_sparse_step", 1),
        }
        if mtype == "qwen2_moe":  # one shared MLP plus its sigmoid gate, built even at width 0
            moe["shared_intermediate_size"] = opt(cfg, "shared_expert_intermediate_size", 0, 0)
            moe["shared_expert_gate"] = True
    elif mtype == "mixtral":
        moe = {
            "num_experts": pos(cfg, "num_local_experts"),
            "experts_per_token": pos(cfg, "num_experts_per_tok"),
            "expert_intermediate_size": pos(cfg, "intermediate_size"),
        }
    elif cfg.get("n_routed_experts") is not None:  # deepseek_v2 / deepseek_v3
        width = pos(cfg, "moe_intermediate_size")
        # transformers makes layer i an MoE layer iff i >= first_k_dense_replace (moe_layer_freq is
        # not read by its DeepSeek modeling code).
        moe = {
            "num_experts": pos(cfg, "n_routed_experts"),
            "experts_per_token": pos(cfg, "num_experts_per_tok"),
            "expert_intermediate_size": width,
            "shared_intermediate_size": opt(cfg, "n_shared_experts", 0, 0) * width,
            "first_dense_layers": opt(cfg, "first_k_dense_replace", 0, 0),
            "routing": "grouped",  # vLLM's DeepseekV2MoE: FusedMoE(use_grouped_topk=True)
        }
    else:
        return None
    if moe["experts_per_token"] > moe["num_experts"]:
        key = "num_experts_per_tok"
        raise SpecError(
            where(key),
            f"{moe['experts_per_token']} exceeds the number of experts {moe['num_experts']}",
        )
    return moe


def _layer_list(cfg: dict[str, Any], key: str) -> list[int]:
    value = cfg.get(key) or []
    if not isinstance(value, list):
        raise SpecError(where(key), f"must be a list of layer indices, got {value!r}")
    return [as_int(key, v, 0) for v in value]


def _mla_fields(cfg: dict[str, Any]) -> dict[str, Any]:
    q_lora = cfg.get("q_lora_rank")
    return {
        "q_lora_rank": None if q_lora is None else as_int("q_lora_rank", q_lora, 1),
        "kv_lora_rank": pos(cfg, "kv_lora_rank"),
        "qk_nope_head_dim": pos(cfg, "qk_nope_head_dim"),
        "qk_rope_head_dim": pos(cfg, "qk_rope_head_dim"),
        "v_head_dim": pos(cfg, "v_head_dim"),
    }


def _bias_fields(cfg: dict[str, Any], mtype: str) -> dict[str, Any]:
    """Bias and norm switches, as each modeling file wires them."""
    if mtype == "qwen2":  # q/k/v biases are hard-wired on, o_proj has none
        return {"qkv_bias": True}
    if mtype == "qwen2_moe":
        return {"qkv_bias": flag(cfg, "qkv_bias", True)}
    if mtype in ("qwen3", "qwen3_moe"):
        bias = flag(cfg, "attention_bias", False)
        return {"qkv_bias": bias, "o_bias": bias, "qk_norm": True}
    if mtype == "llama":
        bias = flag(cfg, "attention_bias", False)
        return {"qkv_bias": bias, "o_bias": bias, "mlp_bias": flag(cfg, "mlp_bias", False)}
    if mtype in ("deepseek_v2", "deepseek_v3"):
        bias = flag(cfg, "attention_bias", False)
        mlp_bias = flag(cfg, "mlp_bias", False) if mtype == "deepseek_v2" else False
        return {"qkv_bias": bias, "o_bias": bias, "mlp_bias": mlp_bias}
    return {}  # mistral, mixtral, phi3: no biases; gemma: see hf_variants


# rope types that reach max_position_embeddings itself (Llama 3.1/3.2: 131,072 = the extended
# length; Phi-3 longrope/su likewise): their factor extends nothing beyond it
_WITHIN_MAX_POSITIONS = ("llama3", "longrope", "su")


def _rope_scaled_positions(cfg: dict[str, Any]) -> int | None:
    """Positions a length-extending ``rope_scaling`` reaches: ``original_max_position_embeddings
    x factor`` (the config's own ``max_position_embeddings`` where the original is not given);
    None without one (no ``rope_scaling``, ``factor`` 1, or mrope's sections). A malformed one is
    refused, as transformers' rope validation refuses it (a factor must be a number >= 1)."""
    scaling = cfg.get("rope_scaling")
    if scaling is None:
        return None
    if not isinstance(scaling, dict):
        raise SpecError(where("rope_scaling"), f"must be a mapping or null, got {scaling!r}")
    factor = scaling.get("factor")
    if factor is None or scaling.get("rope_type", scaling.get("type")) in _WITHIN_MAX_POSITIONS:
        return None  # mrope sections; a type whose max_position_embeddings is the extended length
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 1 <= factor <= 2**20:
        raise SpecError(where("rope_scaling.factor"), f"must be a number >= 1, got {factor!r}", "1 to 1,048,576")
    original = scaling.get("original_max_position_embeddings")
    base = opt(cfg, "max_position_embeddings", 32768) if original is None else as_int(
        "rope_scaling.original_max_position_embeddings", original, 1)
    return None if factor == 1 else min(int(base * factor), 2**30)


def spec_fields_from_hf(cfg: dict[str, Any], name: str | None) -> dict[str, Any]:
    if not isinstance(cfg, dict):
        raise SpecError("model.config", "config.json must hold a JSON object")
    if str(cfg.get("model_type")) in VLM_TEXT_TYPES:  # language tower + vision encoder
        text, vlm = text_tower(cfg)
        tower = spec_fields_from_hf(text, name or str(cfg.get("_name_or_path") or vlm))
        return {**tower, "architecture": vlm, "vision": qwen2_5_vl_vision(cfg)}
    # Other multimodal wrappers keep the language model under text_config.
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path")}
    mtype = cfg.get("model_type")
    if mtype not in SUPPORTED_TYPES:
        raise SpecError(where("model_type"), f"unsupported {mtype!r}", ", ".join(SUPPORTED_TYPES))
    label = {"name": name or str(cfg.get("_name_or_path") or mtype), "architecture": mtype}
    reader = FAMILY_READERS.get(mtype)
    if reader is not None:
        return {**label, **reader(cfg)}
    d = pos(cfg, "hidden_size")
    num_layers = pos(cfg, "num_hidden_layers")
    heads, kv_heads, head_dim = _heads(cfg, mtype, d)
    fields: dict[str, Any] = {
        **label,
        "hidden_size": d,
        "num_layers": num_layers,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": pos(cfg, "intermediate_size"),
        "vocab_size": pos(cfg, "vocab_size"),
        "tie_word_embeddings": flag(cfg, "tie_word_embeddings", mtype in TIED_BY_DEFAULT),
        "max_position_embeddings": opt(cfg, "max_position_embeddings", 32768),
        "rope_scaled_positions": _rope_scaled_positions(cfg),
        **_bias_fields(cfg, mtype),
        **variant_fields(cfg, mtype, num_layers),
    }
    moe = _moe_fields(cfg, mtype)
    if moe is not None:
        fields["moe"] = moe
    if mtype in ("deepseek_v3", "deepseek_v2"):
        fields["mla"] = _mla_fields(cfg)
        fields["head_dim"] = fields["mla"]["qk_nope_head_dim"] + fields["mla"]["qk_rope_head_dim"]
    return fields

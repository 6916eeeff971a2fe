"""Map a Hugging Face ``config.json`` onto :class:`ModelSpec` fields.

Each supported ``model_type`` is read by the key names its ``transformers`` configuration
class uses. Unknown model types are rejected with the list of supported ones rather than
guessed at.
"""

from __future__ import annotations

from typing import Any

from rlperf.errors import SpecError

DENSE_TYPES = ("llama", "qwen2", "qwen3", "mistral")
MOE_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral", "deepseek_v3", "deepseek_v2")
SUPPORTED_TYPES = DENSE_TYPES + MOE_TYPES


def _req(cfg: dict[str, Any], key: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise SpecError(f"model.config.{key}", "missing from config.json")
    return cfg[key]


def spec_fields_from_hf(cfg: dict[str, Any], name: str | None) -> dict[str, Any]:
    if not isinstance(cfg, dict):
        raise SpecError("model.config", "config.json must hold a JSON object")
    # Multimodal wrappers keep the language model under text_config.
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path")}
    mtype = cfg.get("model_type")
    if mtype not in SUPPORTED_TYPES:
        raise SpecError("model.config.model_type", f"unsupported {mtype!r}", ", ".join(SUPPORTED_TYPES))
    d = int(_req(cfg, "hidden_size"))
    heads = int(_req(cfg, "num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = cfg.get("head_dim") or d // heads
    fields: dict[str, Any] = {
        "name": name or str(cfg.get("_name_or_path") or mtype),
        "architecture": mtype,
        "hidden_size": d,
        "num_layers": int(_req(cfg, "num_hidden_layers")),
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": int(head_dim),
        "intermediate_size": int(_req(cfg, "intermediate_size")),
        "vocab_size": int(_req(cfg, "vocab_size")),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "max_position_embeddings": int(cfg.get("max_position_embeddings") or 32768),
    }
    if mtype in ("llama", "mistral"):
        fields["qkv_bias"] = bool(cfg.get("attention_bias", False))
        fields["o_bias"] = bool(cfg.get("attention_bias", False))
        fields["mlp_bias"] = bool(cfg.get("mlp_bias", False))
    elif mtype in ("qwen2", "qwen2_moe"):
        fields["qkv_bias"] = True  # Qwen2 always has q/k/v biases, no o bias
    elif mtype in ("qwen3", "qwen3_moe"):
        fields["qkv_bias"] = bool(cfg.get("attention_bias", False))
        fields["o_bias"] = bool(cfg.get("attention_bias", False))
        fields["qk_norm"] = True

    if mtype == "qwen2_moe":
        fields["moe"] = {
            "num_experts": int(_req(cfg, "num_experts")),
            "experts_per_token": int(_req(cfg, "num_experts_per_tok")),
            "expert_intermediate_size": int(_req(cfg, "moe_intermediate_size")),
            "shared_intermediate_size": int(cfg.get("shared_expert_intermediate_size") or 0),
            "shared_expert_gate": bool(cfg.get("shared_expert_intermediate_size")),
            "dense_layers": tuple(cfg.get("mlp_only_layers") or ()),
            "sparse_step": int(cfg.get("decoder_sparse_step") or 1),
        }
    elif mtype == "qwen3_moe":
        fields["moe"] = {
            "num_experts": int(_req(cfg, "num_experts")),
            "experts_per_token": int(_req(cfg, "num_experts_per_tok")),
            "expert_intermediate_size": int(_req(cfg, "moe_intermediate_size")),
            "dense_layers": tuple(cfg.get("mlp_only_layers") or ()),
            "sparse_step": int(cfg.get("decoder_sparse_step") or 1),
        }
    elif mtype == "mixtral":
        fields["moe"] = {
            "num_experts": int(_req(cfg, "num_local_experts")),
            "experts_per_token": int(_req(cfg, "num_experts_per_tok")),
            "expert_intermediate_size": int(_req(cfg, "intermediate_size")),
        }
    elif mtype in ("deepseek_v3", "deepseek_v2"):
        n_routed = cfg.get("n_routed_experts")
        if n_routed:
            moe_ffn = int(_req(cfg, "moe_intermediate_size"))
            fields["moe"] = {
                "num_experts": int(n_routed),
                "experts_per_token": int(_req(cfg, "num_experts_per_tok")),
                "expert_intermediate_size": moe_ffn,
                "shared_intermediate_size": int(cfg.get("n_shared_experts") or 0) * moe_ffn,
                "router_bias": mtype == "deepseek_v3",
                "first_dense_layers": int(cfg.get("first_k_dense_replace") or 0),
                "sparse_step": int(cfg.get("moe_layer_freq") or 1),
            }
        fields["mla"] = {
            "q_lora_rank": cfg.get("q_lora_rank"),
            "kv_lora_rank": int(_req(cfg, "kv_lora_rank")),
            "qk_nope_head_dim": int(_req(cfg, "qk_nope_head_dim")),
            "qk_rope_head_dim": int(_req(cfg, "qk_rope_head_dim")),
            "v_head_dim": int(_req(cfg, "v_head_dim")),
        }
        fields["head_dim"] = int(cfg["qk_nope_head_dim"]) + int(cfg["qk_rope_head_dim"])
        fields["qkv_bias"] = bool(cfg.get("attention_bias", False))
    return fields

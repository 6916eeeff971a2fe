"""A model's headline numbers (what ``rlperf model show`` prints), as a frozen record."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rlperf.specs.model import ModelSpec

DEFAULT_LENGTHS = (1024, 8192, 32768)


@dataclass(frozen=True)
class FlopsAtLength:
    """Per-token FLOPs of one sequence of ``num_tokens`` tokens (causal attention count)."""

    num_tokens: int
    decode_flops_per_token: float  # one new token after num_tokens cached ones
    prefill_flops_per_token: float  # forward over the whole sequence, divided by its length
    train_flops_per_token: float  # forward + backward, no recompute
    train_selective_recompute_flops_per_token: float
    train_full_recompute_flops_per_token: float


@dataclass(frozen=True)
class ModelSummary:
    name: str
    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    blocks: str  # MLP, norm and position kinds in words (ModelSpec.blocks_text)
    num_experts: int  # 0 for dense models
    experts_per_token: int
    num_params: int
    num_active_params: int
    params_by_kind: tuple[tuple[str, int], ...]
    weight_bytes_bf16: float
    weight_bytes_fp8: float
    kv_bytes_per_token_bf16: float
    flops: tuple[FlopsAtLength, ...]

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["params_by_kind"] = dict(self.params_by_kind)
        return out


def flops_at_length(spec: ModelSpec, num_tokens: int) -> FlopsAtLength:
    t = num_tokens
    return FlopsAtLength(
        num_tokens=t,
        decode_flops_per_token=spec.forward_flops(1, t),
        prefill_flops_per_token=spec.forward_flops(t) / t,
        train_flops_per_token=spec.train_flops(t, "none") / t,
        train_selective_recompute_flops_per_token=spec.train_flops(t, "selective") / t,
        train_full_recompute_flops_per_token=spec.train_flops(t, "full") / t,
    )


def summarize(spec: ModelSpec, lengths: tuple[int, ...] = DEFAULT_LENGTHS) -> ModelSummary:
    b = spec.breakdown
    kinds = (
        "embedding",
        "lm_head",
        "attention",
        "dense_mlp",
        "experts",
        "shared_experts",
        "router",
        "norms",
    )
    moe = spec.moe
    return ModelSummary(
        name=spec.name,
        architecture=spec.architecture,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        intermediate_size=spec.intermediate_size,
        vocab_size=spec.vocab_size,
        tie_word_embeddings=spec.tie_word_embeddings,
        blocks=spec.blocks_text,
        num_experts=moe.num_experts if moe else 0,
        experts_per_token=moe.experts_per_token if moe else 0,
        num_params=spec.num_params,
        num_active_params=spec.num_active_params,
        params_by_kind=tuple((k, getattr(b, k)) for k in kinds),
        weight_bytes_bf16=spec.weight_bytes("bf16"),
        weight_bytes_fp8=spec.weight_bytes("fp8"),
        kv_bytes_per_token_bf16=spec.kv_bytes_per_token("bf16"),
        flops=tuple(flops_at_length(spec, t) for t in lengths),
    )

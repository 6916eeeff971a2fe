"""ModelSpec: a decoder-only transformer, read from a Hugging Face ``config.json``.

Covers dense Llama / Qwen2 / Qwen2.5 / Qwen3 (GQA, QKV bias, QK-norm, tied embeddings), MoE
(Qwen2-MoE / Qwen3-MoE, Mixtral, DeepSeek-V3 with shared experts, dense first layers and MLA
attention) and the GPT families (GPT-2, GPT-NeoX/Pythia, OPT: plain MLPs, LayerNorm with biases,
learned positions, parallel blocks), whose blocks are described by :mod:`rlperf.specs.model_blocks`. Parameter counts follow the module structure ``transformers`` builds, so they can be
checked against ``AutoModelForCausalLM.from_config`` on the meta device (tests/test_model_parity.py).

FLOP conventions (one multiply-add = 2 FLOPs):
- every matmul with a weight of ``n`` parameters costs ``2·n`` FLOPs per token (Kaplan et al.
  2020, "Scaling Laws", Table 1); embedding lookups cost nothing, norms, bias adds and
  activations are not counted (``torch.utils.flop_counter`` counts none of them either);
- attention scores ``Q·Kᵀ`` and ``A·V`` cost ``2·h·d_qk`` and ``2·h·d_v`` FLOPs per
  (query, key) pair. A causal pass over ``T`` new tokens after ``c`` cached ones touches
  ``T·c + T(T+1)/2`` pairs (the work a causal kernel must do; FlashAttention skips masked
  tiles and gets close to it). ``attention="full"`` counts ``T·(c+T)`` pairs: what a dense,
  masked kernel (eager attention) computes and what ``torch.utils.flop_counter`` reports, also
  for SDPA, whose formula ignores ``is_causal``.
- sliding-window layers (Mistral, Gemma 2/3, Phi-3): a query at position ``p`` sees keys
  ``p-W+1..p``, so ``min(p+1, W)`` pairs under the causal count, and such a layer caches only the
  last ``W`` tokens (vLLM frees older blocks). The ``"full"`` count stays ``T·(c+T)``: an eager
  kernel computes the whole score matrix and masks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from rlperf.errors import SpecError, parse
from rlperf.inputs.ranges import NumExperts, NumHeads, NumLayers, VocabSize, Width
from rlperf.specs.base import Spec
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.model_blocks import LayerKind, MLPSpec, NormSpec, PositionSpec, VisionTowerSpec

AttentionCount = Literal["causal", "full"]
Recompute = Literal["none", "selective", "full"]


class MoESpec(Spec):
    """Mixture-of-experts feed-forward blocks."""

    num_experts: NumExperts
    experts_per_token: NumExperts
    expert_intermediate_size: Width
    # Shared (always-on) experts: DeepSeek-V3 has n_shared_experts of expert width, fused into one
    # MLP; Qwen2-MoE has one shared MLP of its own width plus a sigmoid gate (d -> 1).
    shared_intermediate_size: int = Field(default=0, ge=0)
    shared_expert_gate: bool = False
    # How the router picks experts: a plain top-k over the experts (Qwen, Mixtral), or
    # DeepSeek's grouped top-k (the best experts within the best groups; vLLM's DeepseekV2MoE
    # always routes with grouped_topk). Only the rollout engine's op count reads it.
    routing: Literal["topk", "grouped"] = "topk"
    # Layers that stay dense: the first ``first_dense_layers`` layers and any in ``dense_layers``.
    first_dense_layers: int = Field(default=0, ge=0)
    dense_layers: tuple[int, ...] = ()
    # A layer ``i`` (not dense) is sparse when ``(i + 1) % sparse_step == 0`` (Qwen MoE).
    sparse_step: int = Field(default=1, gt=0)

    @model_validator(mode="after")
    def _check(self) -> MoESpec:
        if self.experts_per_token > self.num_experts:
            raise ValueError("experts_per_token must be <= num_experts")
        return self


class MLASpec(Spec):
    """Multi-head latent attention (DeepSeek-V2/V3)."""

    q_lora_rank: int | None = Field(default=None, gt=0)
    kv_lora_rank: Width
    qk_nope_head_dim: Width
    qk_rope_head_dim: Width
    v_head_dim: Width


@dataclass(frozen=True)
class ParamBreakdown:
    """Parameter counts by kind (all layers summed)."""

    embedding: int
    lm_head: int
    attention: int
    dense_mlp: int
    experts: int  # routed experts, all of them
    shared_experts: int
    router: int
    norms: int
    vision: int = 0  # a VLM's vision encoder (not part of the per-token work)

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.dense_mlp
            + self.experts
            + self.shared_experts
            + self.router
            + self.norms
            + self.vision
        )


class ModelSpec(Spec):
    """A decoder-only transformer. Build with :meth:`from_hf_config` or :func:`load_model`."""

    name: str = Field(min_length=1)
    architecture: str = Field(min_length=1)  # HF model_type, e.g. "qwen2", "llama", "deepseek_v3"
    hidden_size: Width
    num_layers: NumLayers
    num_heads: NumHeads
    num_kv_heads: NumHeads
    head_dim: Width
    intermediate_size: Width  # dense MLP width
    vocab_size: VocabSize
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = (
        False  # biases on dense and shared-expert MLPs (routed experts never have them)
    )
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k
    max_position_embeddings: int = Field(default=32768, gt=0, le=2**30)
    # Positions the config's rope_scaling extends rotary positions to (yarn, linear, dynamic:
    # ``original_max_position_embeddings x factor``); None: no scaling past max_position_embeddings
    # (none, mrope, or llama3/longrope, whose max_position_embeddings is the extended length).
    rope_scaled_positions: int | None = Field(default=None, gt=0, le=2**30)
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    # Block structure; the defaults are Llama's (see rlperf.specs.model_blocks).
    mlp: MLPSpec = Field(default_factory=MLPSpec)
    norm: NormSpec = Field(default_factory=NormSpec)
    position: PositionSpec = Field(default_factory=PositionSpec)
    parallel_residual: bool = False  # attention and MLP both read the layer input (NeoX, Phi-2)
    fused_qkv: bool = False  # q, k and v stored as one tensor (GPT-2 c_attn, NeoX query_key_value)
    lm_head_bias: bool = False  # Phi-2's LM head has a bias
    # Width of the token embedding when it differs from hidden_size (OPT-350m's
    # word_embed_proj_dim): project_in (e -> d) and project_out (d -> e) matrices, no biases.
    embedding_size: int | None = Field(default=None, gt=0)
    # Per-layer token mixer; empty means every layer is full attention.
    layer_types: tuple[LayerKind, ...] = ()
    sliding_window: int | None = Field(default=None, gt=0)  # keys a sliding layer sees
    # A VLM's vision encoder; the fields above describe its language tower.
    vision: VisionTowerSpec | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.mla is None and self.num_heads % self.num_kv_heads != 0:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.embedding_size == self.hidden_size:
            raise ValueError("embedding_size is only set when it differs from hidden_size")
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError("layer_types must list one kind per layer")
        if ("sliding_attention" in self.layer_types) != (self.sliding_window is not None):
            raise ValueError("sliding_window is set exactly when some layer is sliding_attention")
        return self

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str | None = None) -> ModelSpec:
        """Build from a parsed HF ``config.json`` dict."""
        from rlperf.specs.hf_config import spec_fields_from_hf

        fields = spec_fields_from_hf(config, name)
        return parse(cls, fields, where="model")

    @classmethod
    def from_path(cls, path: str | Path) -> ModelSpec:
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        from rlperf.errors import show_path
        from rlperf.inputs import load_json

        data = load_json(p, "model")
        if not isinstance(data, dict):
            raise SpecError("<root>", "not a JSON object", "an HF config.json object", show_path(p))
        stem = p.parent.name if p.name == "config.json" else p.stem
        try:
            return cls.from_hf_config(data, name=stem)
        except SpecError as err:
            raise err.in_source(p) from None

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> ModelSpec:
        """A validated copy. pydantic's copy would carry over the cached derived values
        (``breakdown``, ``num_params``...) of the original, which an update makes stale."""
        return type(self).model_validate({**self.model_dump(), **(update or {})})

    # ------------------------------------------------------------------ structure
    def is_moe_layer(self, layer: int) -> bool:
        m = self.moe
        if m is None:
            return False
        if layer < m.first_dense_layers or layer in m.dense_layers:
            return False
        return (layer + 1) % m.sparse_step == 0

    @cached_property
    def num_sliding_layers(self) -> int:
        """Layers whose attention sees only the last ``sliding_window`` tokens."""
        return sum(1 for k in self.layer_types if k == "sliding_attention")

    @cached_property
    def num_moe_layers(self) -> int:
        return sum(1 for i in range(self.num_layers) if self.is_moe_layer(i))

    @property
    def blocks_text(self) -> str:
        """The block structure in a few words, e.g. ``gated silu MLP, rmsnorm, rotary``."""
        mlp = f"{'gated' if self.mlp.gated else 'plain'} {self.mlp.activation} MLP"
        norm = self.norm.kind + (" with bias" if self.norm.bias else "")
        p = self.position
        pos = {
            "rotary": "rotary" if p.rotary_fraction == 1 else f"rotary on {p.rotary_fraction:g} of each head",
            "learned": f"learned positions ({p.num_embeddings})",
            "none": "no positions",
        }[p.kind]
        parts = [mlp, norm, pos] + (["parallel attention+MLP"] if self.parallel_residual else [])
        if self.num_sliding_layers:
            parts.append(f"{self.num_sliding_layers}/{self.num_layers} layers sliding window {self.sliding_window}")
        if self.vision is not None:
            parts.append(f"vision encoder {self.vision.num_params / 1e6:.0f} M params, {self.vision.num_layers} blocks")
        return ", ".join(parts)

    @property
    def max_sequence_tokens(self) -> int | None:
        """The longest sequence the model can position: a learned table has one row per
        position (OPT's two offset rows aside); rotary positions have no hard limit (None)."""
        return self.max_position_embeddings if self.position.kind == "learned" else None

    @property
    def trained_positions(self) -> int:
        """The longest sequence the model's config declares (rotary: ``max_position_embeddings``,
        or what its rope_scaling extends it to). vLLM derives its ``max_model_len`` from it and
        refuses a longer one; verl's rollout checks against ``max_position_embeddings``."""
        return max(self.max_position_embeddings, self.rope_scaled_positions or 0)

    @property
    def token_embedding_size(self) -> int:
        """Width of the token embedding and of the LM head's input."""
        return self.embedding_size or self.hidden_size

    @property
    def embedding_projection_params(self) -> int:
        """OPT's project_in and project_out (0 when the embedding is ``hidden_size`` wide)."""
        return 0 if self.embedding_size is None else 2 * self.hidden_size * self.embedding_size

    @property
    def q_head_dim(self) -> int:
        """Per-head width of queries and keys."""
        if self.mla is not None:
            return self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim
        return self.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla is not None else self.head_dim

    @cached_property
    def attention_matmul_weights_per_layer(self) -> int:
        """Weights of the attention projections of one layer (no biases, no norms). MLA is counted
        as ``transformers`` runs it: the latent is up-projected to per-head keys and values for
        every token (no weight absorption)."""
        d, h = self.hidden_size, self.num_heads
        if self.mla is not None:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = d * h * qk if m.q_lora_rank is None else d * m.q_lora_rank + m.q_lora_rank * h * qk
            kv = d * (m.kv_lora_rank + m.qk_rope_head_dim)
            kv += m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + h * m.v_head_dim * d
        hd, kv_h = self.head_dim, self.num_kv_heads
        return 2 * d * h * hd + 2 * d * kv_h * hd

    @cached_property
    def attention_params_per_layer(self) -> int:
        """Attention parameters of one layer: projections, their biases and inner norms."""
        d, h = self.hidden_size, self.num_heads
        extra = d if self.o_bias else 0
        if self.mla is not None:
            m = self.mla
            # q_a_layernorm / kv_a_layernorm over the latents; biases sit on the down-projections.
            extra += m.kv_lora_rank + (m.q_lora_rank or 0)
            if self.qkv_bias:
                extra += (m.q_lora_rank or 0) + m.kv_lora_rank + m.qk_rope_head_dim
        else:
            if self.qkv_bias:
                extra += (h + 2 * self.num_kv_heads) * self.head_dim
            if self.qk_norm:
                extra += 2 * self.norm.params(self.head_dim)
        return self.attention_matmul_weights_per_layer + extra

    def _mlp_params(self, width: int, bias: bool) -> int:
        return self.mlp.params(self.hidden_size, width, bias)

    @cached_property
    def breakdown(self) -> ParamBreakdown:
        """Parameter counts by kind. DeepSeek-V3's router correction bias
        (``e_score_correction_bias``) is a buffer in transformers 5, not a parameter, so it is not
        counted; neither are multi-token-prediction layers, which transformers does not build."""
        d, e = self.hidden_size, self.token_embedding_size
        # project_in is counted with the embedding, project_out with the LM head.
        half_proj = self.embedding_projection_params // 2
        emb = self.vocab_size * e + self.position.params(d) + half_proj
        head = (0 if self.tie_word_embeddings else self.vocab_size * e) + half_proj
        head += self.vocab_size if self.lm_head_bias else 0
        attn = self.num_layers * self.attention_params_per_layer
        dense = experts = shared = router = 0
        m = self.moe
        for i in range(self.num_layers):
            if m is not None and self.is_moe_layer(i):
                experts += m.num_experts * self._mlp_params(m.expert_intermediate_size, False)
                router += d * m.num_experts
                # DeepSeek builds its shared MLP even at width 0 (n_shared_experts=0); only its
                # biases (DeepSeek-V2 mlp_bias) then hold parameters.
                if m.shared_intermediate_size or self.mlp_bias:
                    shared += self._mlp_params(m.shared_intermediate_size, self.mlp_bias)
                shared += d if m.shared_expert_gate else 0
            else:
                dense += self._mlp_params(self.intermediate_size, self.mlp_bias)
        per_norm = self.norm.params(d)
        norms = self.num_layers * self.norm.per_layer * per_norm + (per_norm if self.norm.final else 0)
        vision = self.vision.num_params if self.vision is not None else 0
        return ParamBreakdown(emb, head, attn, dense, experts, shared, router, norms, vision)

    @cached_property
    def num_params(self) -> int:
        """Total parameters, as ``sum(p.numel() for p in model.parameters())`` in transformers."""
        return self.breakdown.total

    @cached_property
    def num_active_params(self) -> int:
        """Parameters touched per token (routed experts counted ``experts_per_token`` times)."""
        b = self.breakdown
        if self.moe is None:
            return b.total
        per_expert = self._mlp_params(self.moe.expert_intermediate_size, False)
        active_experts = self.num_moe_layers * self.moe.experts_per_token * per_expert
        return b.total - b.experts + active_experts

    @cached_property
    def num_weight_tensors(self) -> int:
        """Weight tensors of the checkpoint layout: what a tensor-by-tensor weight sync sends
        (verl gathers, broadcasts and ``load_weights`` each one). One tensor per projection,
        bias and norm as ``transformers`` builds them, except routed experts: the checkpoint (and
        vLLM) keeps a gate, up and down projection per expert, where transformers 5 fuses each
        layer's experts into two 3-D tensors (``experts.gate_up_proj``, ``experts.down_proj``).
        Empty tensors (a shared MLP of width 0, which transformers still builds) are not counted."""
        m = self.moe
        qkv = 1 if self.fused_qkv else 3
        per_layer_attn = qkv * (2 if self.qkv_bias else 1) + 1
        per_layer_attn += 2 * self.norm.tensors_per_norm if self.qk_norm else 0
        if self.mla is not None:
            lora = self.mla.q_lora_rank is not None  # q_a_proj, q_a_layernorm, q_b_proj vs q_proj
            per_layer_attn = (3 if lora else 1) + 3 + 1  # q; kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj; o
            per_layer_attn += ((1 if lora else 0) + 1) if self.qkv_bias else 0  # on the down-projections
        per_layer_attn += 1 if self.o_bias else 0
        mlp = self.mlp.num_tensors(self.mlp_bias)
        norm = self.norm.tensors_per_norm
        total = 1 + (1 if self.position.kind == "learned" else 0)  # token (and position) table
        total += 2 if self.embedding_size is not None else 0  # project_in, project_out
        total += norm if self.norm.final else 0
        total += (0 if self.tie_word_embeddings else 1) + (1 if self.lm_head_bias else 0)
        total += self.vision.num_weight_tensors if self.vision is not None else 0
        for i in range(self.num_layers):
            total += self.norm.per_layer * norm + per_layer_attn
            if m is not None and self.is_moe_layer(i):
                total += 1 + self.mlp.num_matrices * m.num_experts  # router
                if m.shared_intermediate_size:
                    total += mlp
                elif self.mlp_bias:  # a width-0 shared MLP (built, empty) keeps its down bias
                    total += 1
                total += 1 if m.shared_expert_gate else 0
            else:
                total += mlp
        return total

    @cached_property
    def matmul_params_per_token(self) -> int:
        """Weights that multiply each token in a forward pass: attention and MLP projections of
        the active experts, routers and the LM head (counted even when tied). Biases, norms and
        the embedding lookup are not matmuls and are left out."""
        d, mats = self.hidden_size, self.mlp.num_matrices
        total = self.num_layers * self.attention_matmul_weights_per_layer
        total += self.vocab_size * self.token_embedding_size + self.embedding_projection_params
        m = self.moe
        for i in range(self.num_layers):
            if m is not None and self.is_moe_layer(i):
                total += (
                    d * m.num_experts + m.experts_per_token * mats * d * m.expert_intermediate_size
                )
                total += mats * d * m.shared_intermediate_size + (d if m.shared_expert_gate else 0)
            else:
                total += mats * d * self.intermediate_size
        return total

    # ------------------------------------------------------------------ FLOPs
    def attention_pairs(
        self,
        num_tokens: int,
        context_tokens: int = 0,
        attention: AttentionCount = "causal",
        window: int | None = None,
    ) -> float:
        """(query, key) pairs per layer and head for ``num_tokens`` new tokens after
        ``context_tokens`` cached ones; ``window`` bounds the keys of each query (causal count)."""
        t, c = float(num_tokens), float(context_tokens)
        if attention == "full":
            return t * (c + t)
        if window is None or c + t <= window:
            return t * c + t * (t + 1.0) / 2.0
        # Query n (1-based position c+1..c+t) sees min(n, W) keys.
        w, first = float(window), c + 1.0
        if first > w:
            return t * w
        ramp = (first + w) * (w - first + 1.0) / 2.0  # queries c+1..W see all before them
        return ramp + (c + t - w) * w

    def attention_flops(
        self, num_tokens: int, context_tokens: int = 0, attention: AttentionCount = "causal"
    ) -> float:
        """Score and value FLOPs (QKᵀ and AV) over all layers, forward."""
        per_pair = 2.0 * self.num_heads * (self.q_head_dim + self.v_head_dim)
        full = self.attention_pairs(num_tokens, context_tokens, attention)
        flops = (self.num_layers - self.num_sliding_layers) * per_pair * full
        if self.num_sliding_layers:
            windowed = self.attention_pairs(num_tokens, context_tokens, attention, self.sliding_window)
            flops += self.num_sliding_layers * per_pair * windowed
        return flops

    def linear_flops(self, num_tokens: int) -> float:
        """Weight-matmul FLOPs of a forward pass over ``num_tokens`` tokens (incl. LM head)."""
        return 2.0 * self.matmul_params_per_token * num_tokens

    def forward_flops(
        self, num_tokens: int, context_tokens: int = 0, attention: AttentionCount = "causal"
    ) -> float:
        """Forward FLOPs for ``num_tokens`` new tokens of one sequence after ``context_tokens``
        cached tokens (``context_tokens=0`` is a prefill / teacher-forced pass)."""
        if num_tokens < 0 or context_tokens < 0:
            raise SpecError("num_tokens", "must be >= 0")
        return self.linear_flops(num_tokens) + self.attention_flops(
            num_tokens, context_tokens, attention
        )

    def train_flops(
        self, num_tokens: int, recompute: Recompute = "none", attention: AttentionCount = "causal"
    ) -> float:
        """Forward + backward FLOPs for one sequence of ``num_tokens`` tokens.

        Backward costs twice the forward (gradients w.r.t. activations and weights). Full
        recompute replays the forward once more (8·P·T instead of 6·P·T); selective recompute
        replays only the attention core (Korthikanti et al. 2022, "Reducing Activation
        Recomputation in Large Transformer Models", §4)."""
        fwd = self.forward_flops(num_tokens, 0, attention)
        extra = {
            "none": 0.0,
            "selective": self.attention_flops(num_tokens, 0, attention),
            "full": fwd,
        }[recompute]
        return 3.0 * fwd + extra

    # ------------------------------------------------------------------ bytes
    def kv_bytes_per_token(self, dtype: str = "bf16") -> float:
        """KV-cache bytes per token over all layers. MLA caches the compressed latent plus the
        shared RoPE key (DeepSeek-V2 paper §2.1.2), as vLLM/SGLang do. Sliding-window layers are
        counted as if they kept every token: the bound for sequences up to ``sliding_window``
        long; :meth:`kv_bytes` gives one sequence's cache with the window applied."""
        b = bytes_per(dtype)
        if self.mla is not None:
            return self.num_layers * (self.mla.kv_lora_rank + self.mla.qk_rope_head_dim) * b
        return 2.0 * self.num_layers * self.num_kv_heads * self.head_dim * b

    def kv_bytes(self, num_tokens: int, dtype: str = "bf16") -> float:
        """KV-cache bytes of one sequence of ``num_tokens`` tokens: full-attention layers keep
        every token, sliding layers at most ``sliding_window``."""
        per_layer_token = self.kv_bytes_per_token(dtype) / self.num_layers
        full = self.num_layers - self.num_sliding_layers
        kept = full * num_tokens
        if self.sliding_window is not None:
            kept += self.num_sliding_layers * min(num_tokens, self.sliding_window)
        return per_layer_token * kept

    def kv_bytes_per_token_at(self, num_tokens: int, dtype: str = "bf16") -> float:
        """Average KV-cache bytes per token of a sequence ``num_tokens`` long (window applied)."""
        return self.kv_bytes(num_tokens, dtype) / max(num_tokens, 1)

    def weight_bytes(self, dtype: str = "bf16") -> float:
        return self.num_params * bytes_per(dtype)

    def active_weight_bytes(self, dtype: str = "bf16") -> float:
        return self.num_active_params * bytes_per(dtype)

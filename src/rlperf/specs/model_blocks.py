"""The building blocks a decoder layer is made of, as small value objects of :class:`ModelSpec`.

Each block owns the shape facts the cost code needs and nothing else; the defaults are the
Llama block (SwiGLU MLP, RMSNorm with a scale only, rotary positions), so a spec that names none
of them is a Llama-style model. The reader (:mod:`rlperf.specs.hf_config`) maps each Hugging Face
``model_type`` onto these fields; the cost code reads the fields, never the model type.

- :class:`MLPSpec`: gated (SwiGLU, GeGLU: ``down(act(gate x) * up x)``, three matrices) or plain
  (GPT-2, NeoX, OPT, Phi-2: ``down(act(up x))``, two matrices). The activation is an elementwise
  op: it costs no matmul FLOPs and is kept as a name only.
- :class:`NormSpec`: RMSNorm (a scale of ``d``) or LayerNorm (a scale and a shift, ``2d``, or
  neither when ``elementwise_affine`` is off, as OPT allows); how many per layer (1 in a parallel
  block that shares one norm, 2 pre-norm, 4 in Gemma 2/3's sandwich) and whether a final norm
  follows the last layer.
- :class:`PositionSpec`: rotary (on ``rotary_fraction`` of each head; NeoX and Phi rotate a part),
  a learned absolute table of ``num_embeddings`` rows (GPT-2, OPT), or none.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlperf.specs.base import Spec

NormKind = Literal["rmsnorm", "layernorm"]
PositionKind = Literal["rotary", "learned", "none"]
# What a layer's token mixer is: attention over every earlier token, or over a sliding window.
LayerKind = Literal["full_attention", "sliding_attention"]


class MLPSpec(Spec):
    """The feed-forward block (dense MLPs and every expert of an MoE layer)."""

    gated: bool = True  # gate and up projections multiplied (SwiGLU/GeGLU) vs one up projection
    activation: str = Field(default="silu", min_length=1)  # HF hidden_act; elementwise, not costed
    fused_gate_up: bool = False  # gate and up stored as one tensor (Phi-3's gate_up_proj)

    @property
    def num_matrices(self) -> int:
        """Weight matrices of one MLP: gate, up, down (gated) or up, down (plain)."""
        return 3 if self.gated else 2

    @property
    def num_up_matrices(self) -> int:
        """Matrices from ``d`` to the MLP width."""
        return self.num_matrices - 1

    def params(self, hidden_size: int, width: int, bias: bool) -> int:
        """Weights (and biases) of one MLP of ``width`` over ``hidden_size``."""
        ups = self.num_up_matrices
        return self.num_matrices * hidden_size * width + ((ups * width + hidden_size) if bias else 0)

    def num_tensors(self, bias: bool) -> int:
        """Checkpoint tensors of one MLP (weights, plus biases when present)."""
        weights = 2 if (self.gated and self.fused_gate_up) else self.num_matrices
        return weights * (2 if bias else 1)


class NormSpec(Spec):
    """The normalization layers of the model."""

    kind: NormKind = "rmsnorm"
    elementwise_affine: bool = True  # a learned scale (and shift): OPT can turn both off
    bias: bool = False  # LayerNorm's learned shift
    per_layer: int = Field(default=2, ge=1)  # 1: parallel block, 2: pre-norm, 4: Gemma 2/3 sandwich
    final: bool = True  # a norm after the last layer

    @model_validator(mode="after")
    def _check(self) -> NormSpec:
        if self.bias and self.kind == "rmsnorm":
            raise ValueError("an RMSNorm has no bias")
        return self

    @property
    def tensors_per_norm(self) -> int:
        if not self.elementwise_affine:
            return 0
        return 2 if self.bias else 1

    def params(self, width: int) -> int:
        """Parameters of one norm over ``width`` features."""
        return self.tensors_per_norm * width


class PositionSpec(Spec):
    """How token positions enter the model."""

    kind: PositionKind = "rotary"
    num_embeddings: int = Field(default=0, ge=0)  # rows of a learned table (OPT: max + 2 offset)
    rotary_fraction: float = Field(default=1.0, gt=0.0, le=1.0)  # share of head_dim rotated

    @model_validator(mode="after")
    def _check(self) -> PositionSpec:
        if (self.kind == "learned") != (self.num_embeddings > 0):
            raise ValueError("num_embeddings must be > 0 for learned positions and 0 otherwise")
        return self

    @property
    def rotary(self) -> bool:
        return self.kind == "rotary"

    def params(self, hidden_size: int) -> int:
        return self.num_embeddings * hidden_size


class VisionTowerSpec(Spec):
    """The vision encoder of a vision-language model (Qwen2.5-VL): image patches in, language
    model tokens out. Its cost is a prefill term: it runs once over each image's patches.

    ``matmul_params_per_patch`` are the weights that multiply each patch: the patch embedding,
    every block's attention and MLP projections and the patch merger's share (the merger runs
    once per ``patches_per_token`` patches). Attention is bidirectional within an image: the
    ``num_full_attention_layers`` blocks see the whole image, the others a window of
    ``window_patches`` patches."""

    num_params: int = Field(ge=0)
    num_weight_tensors: int = Field(ge=0)
    matmul_params_per_patch: float = Field(ge=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    num_full_attention_layers: int = Field(ge=0)
    window_patches: int = Field(gt=0)
    patches_per_token: int = Field(gt=0)  # spatial_merge_size ** 2

    def flops(self, num_images: int, patches_per_image: int) -> float:
        """Forward FLOPs of encoding ``num_images`` images of ``patches_per_image`` patches."""
        patches = float(num_images) * patches_per_image
        per_pair = 4.0 * self.num_heads * self.head_dim  # QKᵀ and AV
        full_pairs = patches * patches_per_image
        window_pairs = patches * min(self.window_patches, patches_per_image)
        windowed = self.num_layers - self.num_full_attention_layers
        attn = per_pair * (self.num_full_attention_layers * full_pairs + windowed * window_pairs)
        return 2.0 * self.matmul_params_per_patch * patches + attn

"""A layer's memory-bound elementwise kernels as each training backend runs them.

Per token and layer, one forward reads and writes (bytes per element of the named width, bf16
activations at 2 bytes, fp32 at 4):

- **norm** (per normalized feature), **residual add** (per hidden feature: read 2, write 1),
  **rotary** (per rotated feature of q and k), **QK-norm** (per q and k feature), **gated
  activation** (per feature of the MLP width: gate and up read, product written) and **plain
  activation** (per MLP feature: read and write).

Two kernel sets:

- ``FUSED`` (Megatron-LM / Megatron-Core: Transformer Engine or Apex fused norms, fused rotary,
  ``bias_swiglu`` / ``bias_gelu`` fusions): one kernel per op that reads its inputs once and
  writes its output once: norm 4, residual 6, rotary 4, QK-norm 4, gated 6, plain 4 bytes.
- ``EAGER`` (Hugging Face ``transformers`` modules run op by op, as FSDP and DeepSpeed trainers
  such as verl, OpenRLHF and DeepSpeed-Chat run them without Liger or fused kernels), counted
  from the modeling code (``LlamaRMSNorm``, ``apply_rotary_pos_emb``/``rotate_half`` and
  ``LlamaMLP`` in ``transformers/models/llama/modeling_llama.py``; Qwen2/Qwen3/Mistral copy them):

  - RMSNorm: ``x.to(float32)`` (read 2, write 4), ``pow(2)`` (4, 4), ``mean(-1)`` (4),
    ``x * rsqrt(var + eps)`` (4, 4), ``.to(bf16)`` (4, 2), ``weight * x`` (2, 2): 36 bytes per
    element in 6 kernels (the per-token ``+ eps`` and ``rsqrt`` on one value per token are two
    more kernels and no traffic). LayerNorm is ``F.layer_norm``, one kernel: 4 bytes.
  - rotary: ``q * cos`` (2, 2), ``rotate_half``: ``-x2`` on half the features (1, 1 per
    feature), ``cat`` (2, 2), ``* sin`` (2, 2), ``+`` (4, 2): 20 bytes per element in 5 kernels,
    for q and for k (10 kernels a layer).
  - gated MLP: ``act_fn(gate)`` (2, 2), ``* up`` (4, 2): 10 bytes per width feature, 2 kernels.
  - residual adds and a plain activation (``nn.functional.gelu``, one kernel) are as fused.

The backward (autograd of the same ops, or the fused kernels' backward) is taken as twice the
forward's traffic for both sets (:mod:`rlperf.stages.pass_cost`).

Each set also says how the backend runs an MoE layer's local experts (``expert_gemm_streams``,
:mod:`rlperf.stages.shard`): Megatron-Core's ``TEGroupedMLP`` (``moe_grouped_gemm``, the
Transformer Engine layer spec) calls Transformer Engine's ``GroupedLinear``, which launches one
cuBLAS GEMM per local expert, round-robin on 4 compute streams (TE ``v2.5``
``nvte_multi_stream_cublas_gemm`` in ``common/gemm/cublaslt_gemm.cu``, ``num_compute_streams =
4`` in ``common/util/multi_stream.cpp``); ``EAGER``: not counted per expert (one grouped GEMM
per projection, as before).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import TrainBackend


@dataclass(frozen=True)
class ElementwiseKernels:
    """Bytes per element and kernels of each elementwise op of a layer's forward."""

    rmsnorm_bytes: float
    rmsnorm_kernels: int
    layernorm_bytes: float
    residual_bytes: float
    rotary_bytes: float  # per rotated feature of q or k
    rotary_kernels: int  # per layer (q and k)
    gated_bytes: float  # per MLP-width feature
    gated_kernels: int
    plain_bytes: float  # per MLP-width feature
    qk_norm_bytes: float  # per q and k feature
    # local experts' GEMMs of one projection run at once (one GEMM each, this many streams);
    # None: one grouped GEMM over the local experts
    expert_gemm_streams: int | None = None

    def norm_bytes(self, model: ModelSpec) -> float:
        """Bytes per normalized feature of the model's norm."""
        return self.rmsnorm_bytes if model.norm.kind == "rmsnorm" else self.layernorm_bytes

    def norm_kernels(self, model: ModelSpec) -> int:
        return self.rmsnorm_kernels if model.norm.kind == "rmsnorm" else 1

    def layer_kernels(self, model: ModelSpec) -> int:
        """Non-matmul kernels of one dense layer's forward: norms, rotary on q and k (if any),
        the attention core, the activation, two residual adds."""
        rotary = self.rotary_kernels if model.position.rotary else 0
        act = self.gated_kernels if model.mlp.gated else 1
        return model.norm.per_layer * self.norm_kernels(model) + rotary + 1 + act + 2


FUSED = ElementwiseKernels(
    rmsnorm_bytes=4.0, rmsnorm_kernels=1, layernorm_bytes=4.0, residual_bytes=6.0, rotary_bytes=4.0,
    rotary_kernels=1, gated_bytes=6.0, gated_kernels=1, plain_bytes=4.0, qk_norm_bytes=4.0,
    expert_gemm_streams=4,
)
EAGER = ElementwiseKernels(
    rmsnorm_bytes=36.0, rmsnorm_kernels=8, layernorm_bytes=4.0, residual_bytes=6.0, rotary_bytes=20.0,
    rotary_kernels=10, gated_bytes=10.0, gated_kernels=2, plain_bytes=4.0, qk_norm_bytes=36.0,
)


def kernels_for(backend: TrainBackend) -> ElementwiseKernels:
    """The elementwise kernel set of a training backend: Megatron's fused kernels, or the Hugging
    Face modules' eager ops under FSDP / DeepSpeed."""
    return FUSED if backend == "megatron" else EAGER

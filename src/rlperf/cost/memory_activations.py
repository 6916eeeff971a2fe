"""Activation memory of one decoder layer, derived from the model's shapes.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(Table 2, §4) count the tensors a GPT layer keeps for its backward pass: per layer
``s·b·h·(34 + 5·a·s/h)`` bytes with 2-byte activations and 1-byte dropout masks, ``/t`` with
tensor + sequence parallelism. Here the same count is made tensor by tensor from the actual
widths, so GQA, SwiGLU, QK-norm, MLA and MoE come out right. Every saved tensor is the one
PyTorch autograd keeps in eager mode:

attention (per token; ``a`` query heads, ``g`` KV heads, head width ``c``)
  - QKV-projection input (the norm output): ``2h``
  - Q, K, V after RoPE, kept by the attention kernel: ``2ac + 2gc + 2gc``
  - QK-norm inputs (Qwen3): ``2ac + 2gc``
  - attention output = o-projection input: ``2ac``
  - without flash attention: softmax output ``2as`` (+ dropout mask ``as`` and dropout output
    ``2as``); with flash attention: only the fp32 log-sum-exp, ``4a``
  - dropout mask after the o-projection: ``h``
dense SwiGLU MLP (width ``f``)
  - input ``2h``; gate output (SiLU input) ``2f``; SiLU output and up output (both kept by the
    product) ``4f``; product (down-projection input) ``2f``; dropout mask ``h``
  - a GeLU MLP instead keeps GeLU input and output, ``4f`` (Korthikanti's ``8sbh + 8sbh`` at
    ``f = 4h``)
MoE layer (``E`` experts, ``k`` per token, expert width ``f_e``, shared width ``f_s``)
  - input ``2h`` (router, shared expert and dispatch share it); router probabilities in fp32 ``4E``
  - per routed copy (``k`` per token; never ``E``: an expert keeps only the tokens routed to it):
    its input ``2h`` (the dispatched/permuted row, the first expert GEMM's input) and the
    expert's SwiGLU; then
    - Hugging Face (``Qwen3MoeSparseMoeBlock``): SwiGLU ``8f_e`` and the expert output ``2h``,
      kept by the multiply with the routing weight;
    - Megatron-Core (``TEGroupedMLP``): the routing weight is applied inside the activation,
      before the second GEMM, so the expert output is not kept; the weight itself, fp32, ``4``.
      With ``bias_activation_fusion`` (``weighted_bias_swiglu_impl``, megatron/core/fusions/
      fused_bias_swiglu.py) only the first GEMM's output ``4f_e`` and the weighted product
      ``2f_e`` (the second GEMM's input) are kept: ``6f_e``; unfused, SiLU output and the
      unweighted product too: ``10f_e``. The permute/unpermute kernels (``moe_permute_fusion``)
      and the all-to-all or DeepEP dispatch keep only index maps.
  - shared expert: a dense SwiGLU of width ``f_s``
dense SwiGLU under Megatron with ``bias_activation_fusion`` (``bias_swiglu_impl``): the fused
kernel keeps its input, so ``4f`` (first GEMM output) + ``2f`` (product) = ``6f`` instead of ``8f``.
norms: each keeps its input, ``2h``, twice per layer (four in Gemma 2/3's sandwich). In a
parallel block (NeoX, Phi-2) attention and MLP read the same layer input: its norms keep it once,
and a single shared norm (Phi-2) hands both the same normed input.

Sharding: ``h``-wide tensors (norms, projection inputs, masks) are split by ``t`` only under
sequence parallelism; head- and width-split tensors are split by ``t`` always. Routed copies:
Megatron runs MoE with tp only under sequence parallelism; each tp rank routes its ``s/t``
tokens, and the dispatcher gathers them over the expert-tensor-parallel group (``etp``) before
the experts, whose width is split by ``etp``. A device therefore holds ``k·etp/t`` routed copies
per token, each ``f_e/etp`` wide: the ``f_e``-wide part splits by ``t`` always, the ``h``-wide
part by ``t/etp`` (not at all when ``etp = t``, fully when ``etp = 1``). With Korthikanti's GPT
(``a·c = h``, GeLU, ``f = 4h``, dropout) this gives exactly ``34h + 5as`` per token, which
``tests/test_memory.py`` checks, as it checks a small MoE layer against bytes derived by hand.
Routing is assumed balanced.

The count assumes fused norm and RoPE kernels (Megatron/Transformer Engine, Liger), which keep
only the bf16 input. Hugging Face eager modules keep more: fp32 copies of the norm inputs and
the pre-RoPE q and k, and, with eager attention, the fp32 softmax next to its bf16 copy. Summing
the tensors autograd saves for one layer of a tiny Qwen2 (h 256, 4 heads, 2 KV heads, f 1024,
s 512, bf16, CPU) gave 1.20x this count with SDPA and 1.69x with eager attention.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlperf.cost.memory_params import kv_heads_per_device
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.model import ModelSpec

ACTIVATION_DTYPE = "bf16"  # compute dtype under mixed precision (activations, gathered weights)
_A = bytes_per(ACTIVATION_DTYPE)
_MASK = 1.0  # a dropout mask element (torch.bool)
_FP32 = bytes_per("fp32")


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one decoder layer keeps for its backward pass, per token, on one device."""

    linear_bytes: float  # tensors that grow with the tokens only (Korthikanti's 34h part)
    score_bytes: float  # attention score tensors (the 5as part; 0 with flash attention)
    input_bytes: float  # the layer's input, all that full recompute keeps

    @property
    def total_bytes(self) -> float:
        return self.linear_bytes + self.score_bytes


def layer_activations(
    model: ModelSpec,
    layer: int,
    *,
    tp: int = 1,
    sequence_parallel: bool = True,
    seq_len: float = 1.0,
    flash_attention: bool = True,
    dropout: bool = False,
    gated_mlp: bool | None = None,
    etp: int | None = None,
    megatron_experts: bool = False,
    fused_activation: bool = False,
) -> LayerActivations:
    """Per-token activation bytes of decoder layer ``layer`` on one tp rank (derivation in the
    module docstring). ``seq_len`` is the attention span behind the score term; ``gated_mlp``
    (default: the model's MLP) and ``dropout`` exist so the GPT form of Korthikanti et al. can
    be reproduced on any model. ``etp`` is the expert tensor parallel degree (default ``tp``);
    ``megatron_experts`` applies the routing weight inside the experts (Megatron-Core) instead
    of on their output (Hugging Face); ``fused_activation`` is Megatron's
    ``bias_activation_fusion`` SwiGLU, which keeps only its input."""
    h = float(model.hidden_size)
    seq_split = tp if sequence_parallel else 1
    heads = model.num_heads / tp
    attn, scores = _attention(model, tp, heads, flash_attention, dropout, seq_len)
    attn_h = h * _A + (h * _MASK if dropout else 0.0)  # norm output + o-proj dropout mask
    gated = model.mlp.gated if gated_mlp is None else gated_mlp
    mlp = _Mlp(gated, dropout, fused_activation and gated, megatron_experts)
    mlp_h, mlp_split, routed = mlp.per_token(model, layer, tp, tp if etp is None else etp)
    if model.parallel_residual and model.norm.per_layer == 1:
        mlp_h -= h * _A  # the MLP reads the attention's normed input
    norms = (1 if model.parallel_residual else model.norm.per_layer) * h * _A  # norm inputs
    linear = (attn_h + mlp_h + norms) / seq_split + attn + mlp_split + routed
    return LayerActivations(linear, scores, h * _A / seq_split)


def _attention(
    model: ModelSpec, tp: int, heads: float, flash: bool, dropout: bool, seq_len: float
) -> tuple[float, float]:
    """(head-split tensors, score tensors) of the attention block, per token."""
    m = model.mla
    if m is None:
        c = model.head_dim
        kv = kv_heads_per_device(model, tp) * c
        split = (heads * c + 2 * kv) * _A  # Q, K, V
        split += (heads * c + kv) * _A if model.qk_norm else 0.0
        split += heads * c * _A  # attention output
    else:
        qk, v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
        split = heads * (2 * qk + 2 * v) * _A  # Q, K (shared RoPE key broadcast), V, output
        # Replicated low-rank latents: each is a norm input and (normed) an up-projection input.
        split += 2 * (m.kv_lora_rank + (m.q_lora_rank or 0)) * _A + m.qk_rope_head_dim * _A
    if flash:
        return split + heads * _FP32, 0.0  # flash keeps only the log-sum-exp per head
    per_key = _A + ((_MASK + _A) if dropout else 0.0)  # softmax out (+ mask, dropout out)
    return split, heads * seq_len * per_key


@dataclass(frozen=True)
class _Mlp:
    """How an MLP block's kernels keep their tensors (module docstring, MLP and MoE parts)."""

    gated: bool
    dropout: bool
    fused_activation: bool  # Megatron's fused (weighted) SwiGLU keeps only its input
    weights_in_experts: bool  # Megatron: routing weight applied before the second expert GEMM

    @property
    def per_width(self) -> float:
        """Bytes kept per unit of MLP width: SwiGLU gate, SiLU, up, product (``8``) or, fused,
        the gate-up output and the product (``6``); GeLU input and output (``4``)."""
        if not self.gated:
            return 2 * _A
        return (3 if self.fused_activation else 4) * _A

    def per_token(
        self, model: ModelSpec, layer: int, tp: int, etp: int
    ) -> tuple[float, float, float]:
        """(h-wide, width-split, routed) MLP tensors of a layer, per token; the routed part is
        already per device (``k·etp/tp`` copies of ``f_e/etp`` width each)."""
        h = model.hidden_size
        h_wide = h * _A + (h * _MASK if self.dropout else 0.0)
        moe = model.moe
        if moe is None or not model.is_moe_layer(layer):
            return h_wide, self.per_width * model.intermediate_size / tp, 0.0
        h_wide += moe.num_experts * _FP32  # router probabilities
        shared = self.per_width * moe.shared_intermediate_size / tp
        expert_width = moe.expert_intermediate_size / etp
        per_copy = h * _A + self.per_width * expert_width  # expert input, its SwiGLU
        if not self.weights_in_experts:
            per_copy += h * _A  # expert output, kept by the multiply with the routing weight
        else:
            per_copy += _FP32  # the routing weight
            if self.gated and not self.fused_activation:
                per_copy += expert_width * _A  # weighted product, a tensor of its own unfused
        copies = moe.experts_per_token * etp / tp  # routed copies per token on this device
        return h_wide, shared, copies * per_copy


def forward_workspace_bytes_per_token(model: ModelSpec, tp: int, experts_split: bool) -> float:
    """Peak transient bytes per token of an inference forward pass (nothing kept for backward).

    Live at the widest point of a layer: the residual stream and the normed input (``2h`` each)
    plus that layer's widest intermediates -- attention: fused QKV output and attention output;
    dense MLP: fused gate-up output ``2f`` and SiLU-and-mul output ``f``; MoE: router logits
    (fp32) and, per routed copy, the fused-MoE caches (gate-up ``2f_e``, activation ``f_e``,
    down output ``h``; vLLM ``fused_moe``), with ``f_e`` split by tp unless experts are whole
    (``experts_split=False``, expert parallelism), plus the shared expert."""
    h = model.hidden_size
    heads = model.num_heads / tp
    m = model.mla
    if m is None:
        kv = kv_heads_per_device(model, tp) * model.head_dim
        attn = (heads * model.head_dim * 2 + 2 * kv) * _A
    else:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        attn = (heads * (2 * qk + 2 * m.v_head_dim) + m.kv_lora_rank + m.qk_rope_head_dim) * _A
    mats = model.mlp.num_matrices  # gated: gate-up 2f and product f; plain: up f and activation f
    widest = max(attn, mats * model.intermediate_size / tp * _A)
    moe = model.moe
    if moe is not None and model.num_moe_layers:
        f_e = moe.expert_intermediate_size / (tp if experts_split else 1)
        routed = moe.experts_per_token * (mats * f_e + h) * _A
        widest = max(
            widest, moe.num_experts * _FP32 + routed + mats * moe.shared_intermediate_size / tp * _A
        )
    return 2 * h * _A + widest

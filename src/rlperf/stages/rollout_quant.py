"""What a weight-quantized rollout engine changes in a step: vLLM's block-quantized FP8 (w8a8).

An engine whose ``EngineLayout.dtype`` is a quantized type (``fp8``: verl's
``rollout.quantization=fp8``, vLLM's ``Fp8Config`` with 128 x 128 weight blocks, as DeepSeek-V3's
checkpoints) quantizes only some weights and runs everything else in the model's dtype:

    quantized (dtype)           : every ``LinearBase`` and ``FusedMoE`` weight (QKV, output,
                                  gate-up and down projections, routed experts)
    activation dtype (bf16)     : the LM head and the embedding (``ParallelLMHead`` is a
                                  ``VocabParallelEmbedding``: ``Fp8Config.get_quant_method``
                                  returns no method for it), attention and the KV cache (an
                                  ``Attention`` layer gets ``Fp8KVCacheMethod``, whose FP8 cache
                                  needs ``kv_cache_dtype=fp8``: ``EngineLayout.kv_dtype``), norms,
                                  rotary, the activations between layers, the logits

The weights are block-scaled but the activations are quantized at run time: before each
quantized GEMM, vLLM (0.10, the version verl's FP8 recipe names) runs
``per_token_group_quant_fp8`` over its input (``apply_w8a8_block_fp8_linear``: one scale per
token and 128 channels), and the block-FP8 fused MoE quantizes the input of each of its two
grouped GEMMs (``fused_experts``: ``moe_kernel_quantize_input``). Per step that is

    quant kernels  = quantized linears per layer + 2 per routed-expert layer       (launch floor)
    quant bytes    = tokens · Σ_layers (input widths per GPU) · (2 + 1 + 4/128)    (bf16 read,
                     FP8 write, one fp32 scale per 128), streamed at hbm_efficiency (a copy-like
                     pass; added to the step: a kernel of its own between the norm and the GEMM)

Input widths per GPU: a column-parallel GEMM (QKV, gate-up; MLA's q/kv down-projections) reads
the whole hidden vector ``d`` on every tp rank, a row-parallel one (output, down; MLA's q
up-projection) its ``1/tp`` share; the fused MoE quantizes each token's ``d`` once and each
routed copy's ``I_e / tp`` intermediate. The router GEMM is unquantized (vLLM 0.10.0's MoE models build
the gate with ``quant_config=None``; vllm#22017 later passes Qwen3-MoE's the config) and is left
as it is costed for any dtype. Counted from vLLM's
code, not fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlperf.specs.dtypes import bytes_per
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import EngineLayout

# Engine dtypes whose GEMMs take run-time quantized activations (vLLM: block FP8 and INT8
# w8a8 quantize per token (group); NVFP4 per 16-element group).
_W8A8 = frozenset({"fp8", "int8", "fp4"})
_ACT_DTYPE = "bf16"  # the model dtype a quantized engine keeps (verl's rollout.dtype default)
_GROUP = 128  # activation channels per fp32 scale (vLLM's block-FP8 group, weight_block_size[1])
_SCALE_BYTES = 4


@dataclass(frozen=True)
class EngineQuant:
    """Which parts of an engine's step run in its weight dtype and which in the activation dtype."""

    weight_dtype: str  # quantized linear and expert weights, and their GEMMs
    act_dtype: str  # activations, attention, LM head, embedding
    quantizes_activations: bool  # a per-token-group quantization kernel before every quantized GEMM

    @classmethod
    def of(cls, layout: EngineLayout) -> EngineQuant:
        if layout.dtype in _W8A8:
            return cls(layout.dtype, _ACT_DTYPE, True)
        return cls(layout.dtype, layout.dtype, False)

    @property
    def weight_bytes(self) -> float:
        return bytes_per(self.weight_dtype)

    @property
    def act_bytes(self) -> float:
        return bytes_per(self.act_dtype)

    def kernels_per_layer(self, model: ModelSpec, moe_layer: bool) -> int:
        """Activation-quantization kernels of one decoder layer (module docstring); 0 unquantized."""
        if not self.quantizes_activations:
            return 0
        return sum(1 for _ in _quantized_inputs(model, 1, moe_layer))

    def bytes_per_token(self, model: ModelSpec, tp: int) -> float:
        """HBM bytes one GPU's activation quantization reads and writes per token of a step, over
        all layers (module docstring); 0 unquantized."""
        if not self.quantizes_activations:
            return 0.0
        per_elem = self.act_bytes + self.weight_bytes + _SCALE_BYTES / _GROUP
        moe_layers = model.num_moe_layers
        dense_layers = model.num_layers - moe_layers
        width = (dense_layers * sum(_quantized_inputs(model, tp, False))
                 + moe_layers * sum(_quantized_inputs(model, tp, True)))
        return width * per_elem


def _quantized_inputs(model: ModelSpec, tp: int, moe_layer: bool) -> list[float]:
    """Input width per GPU of every activation quantization of one layer, per token."""
    d = float(model.hidden_size)
    mla = model.mla
    widths: list[float]
    if mla is None:  # QKV (column-parallel), output (row-parallel)
        widths = [d, model.num_heads * model.head_dim / tp]
    else:  # q (or q down) and kv down-projections read d, q up its rank; output the heads' values
        widths = [d, d] + ([float(mla.q_lora_rank)] if mla.q_lora_rank is not None else [])
        widths += [model.num_heads * mla.v_head_dim / tp]
    moe = model.moe
    if moe_layer and moe is not None:  # fused MoE: each token's d, each routed copy's intermediate
        widths += [d, moe.experts_per_token * moe.expert_intermediate_size / tp]
        if moe.shared_intermediate_size:
            widths += [d, moe.shared_intermediate_size / tp]
    else:  # gate-up (column-parallel), down (row-parallel)
        widths += [d, model.intermediate_size / tp]
    return widths

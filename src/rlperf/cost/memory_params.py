"""Parameters each device holds under tensor, pipeline and expert parallelism.

This is the first half of the memory model (:mod:`rlperf.cost.memory`): it answers "how many
parameters sit on one GPU of pipeline stage ``i``" before ZeRO/FSDP shards them further over the
data-parallel group.

Conventions (Megatron-LM / vLLM):

- Layers are split into contiguous pipeline stages; when ``pp`` does not divide the layer count
  the extra layers go to the stages just before the last one (vLLM ``get_pp_indices``; Megatron
  requires divisibility, where both rules agree).
- The embedding sits on the first stage, the final norm and the LM head on the last. With tied
  embeddings and ``pp > 1`` the last stage keeps its own copy of the embedding matrix for the LM
  head (Megatron's shared embedding, vLLM's ``ParallelLMHead`` on the last rank).
- Tensor parallelism splits the attention projections by heads, the MLPs by width and the
  embedding/LM head by vocabulary. Norms, the MoE router, the Qwen2-MoE shared-expert gate and
  MLA's low-rank down-projections are replicated on every tp rank. When ``tp > num_kv_heads``
  each KV head is replicated ``tp / num_kv_heads`` times, so a rank holds ``ceil(kv_heads/tp)``
  KV heads (vLLM ``QKVParallelLinear``).
- Routed experts are split over ``expert_shards`` ranks. For training this is ``ep * tp``:
  Megatron-Core shards experts by expert parallelism *and* expert-tensor parallelism, and
  ``expert_tensor_parallel_size`` defaults to ``tensor_model_parallel_size``
  (``megatron/training/arguments.py``). For a vLLM engine it is ``tp`` inside a stage: with expert
  parallelism (``ep == tp * pp``) a stage's tp ranks each hold ``1/tp`` of its layers' experts
  whole; without it every expert is tp-sliced; the bytes per GPU are the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from rlperf.specs.model import ModelSpec


@dataclass(frozen=True)
class StageParams:
    """Parameters on one device of pipeline stage ``stage`` (after tp/pp/ep, before ZeRO)."""

    stage: int
    layers: range  # decoder layers on this stage
    dense_params: float  # everything but routed experts (ZeRO shards it over dp*cp)
    expert_params: float  # routed experts (ZeRO shards it over the expert-data-parallel group)
    largest_unit_params: float  # biggest FSDP unit on the device: one layer, embedding or LM head

    @property
    def total_params(self) -> float:
        return self.dense_params + self.expert_params


def stage_layers(num_layers: int, pp: int) -> tuple[range, ...]:
    """Contiguous layer ranges of the ``pp`` stages (extra layers before the last stage)."""
    assert 1 <= pp <= num_layers, (pp, num_layers)
    sizes = [num_layers // pp] * pp
    for i in range(num_layers % pp):
        sizes[-2 - i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return tuple(range(s, s + n) for s, n in zip(starts, sizes))


def kv_heads_per_device(model: ModelSpec, tp: int) -> int:
    """KV heads one tp rank holds: split when ``tp <= num_kv_heads``, else replicated (>= 1).
    MLA caches one latent per token shared by all heads, so every rank holds it whole (1)."""
    if model.mla is not None:
        return 1
    return math.ceil(model.num_kv_heads / tp)


def attention_params_on_device(model: ModelSpec, tp: int) -> float:
    """One layer's attention parameters on one tp rank (see the module docstring)."""
    d, h = model.hidden_size, model.num_heads
    m = model.mla
    if m is not None:
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank is None:
            replicated, q_up = 0, d * h * qk
        else:  # q_a_proj + q_a_layernorm replicated, q_b_proj split by heads
            replicated, q_up = d * m.q_lora_rank + m.q_lora_rank, m.q_lora_rank * h * qk
        # kv_a_proj_with_mqa + kv_a_layernorm replicated; kv_b_proj and o_proj split by heads.
        replicated += d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank
        split = (
            q_up + m.kv_lora_rank * h * (m.qk_nope_head_dim + m.v_head_dim) + h * m.v_head_dim * d
        )
        return split / tp + replicated
    hd = model.head_dim
    bias = 1 if model.qkv_bias else 0
    q = h * hd * (d + bias)
    o = h * hd * d
    kv_per_head = 2 * hd * (d + bias)
    replicated = (d if model.o_bias else 0) + (2 * model.norm.params(hd) if model.qk_norm else 0)
    return (q + o) / tp + kv_per_head * kv_heads_per_device(model, tp) + replicated


def layer_params_on_device(
    model: ModelSpec, layer: int, tp: int, expert_shards: int
) -> tuple[float, float]:
    """``(dense, expert)`` parameters of decoder layer ``layer`` on one device.

    MLP sizes are read from ``model.breakdown`` (per layer = total / number of such layers), so
    they count exactly what :class:`ModelSpec` counts."""
    d = model.hidden_size
    b = model.breakdown
    dense = attention_params_on_device(model, tp) + model.norm.per_layer * model.norm.params(d)
    moe = model.moe
    if moe is None or not model.is_moe_layer(layer):
        return dense + b.dense_mlp / (model.num_layers - model.num_moe_layers) / tp, 0.0
    n = model.num_moe_layers
    gate = d if moe.shared_expert_gate else 0  # Qwen2-MoE shared-expert gate, replicated
    dense += b.router / n + (b.shared_experts / n - gate) / tp + gate
    return dense, b.experts / n / expert_shards


# Memoized: the memory checks and stage models of a planner ask for the same (model, tp, pp,
# ep) stages at every dp degree and micro-batch plan; the result is frozen (specs hash).
@lru_cache(maxsize=256)
def stage_params(model: ModelSpec, tp: int, pp: int, expert_shards: int) -> tuple[StageParams, ...]:
    """Per-device parameters of every pipeline stage (index = stage)."""
    vocab_rows = model.vocab_size * model.token_embedding_size / tp  # embedding or LM head, vocab-parallel
    # Replicated next to them: a learned position table and OPT's project_in on the first
    # stage; the final norm, OPT's project_out and the LM head's bias (vocab-split) on the last.
    first_extra = model.position.params(model.hidden_size) + model.embedding_projection_params / 2
    first_extra += model.breakdown.vision / tp  # a VLM's vision encoder, tp-split like vLLM's
    last_extra = model.embedding_projection_params / 2
    last_extra += model.norm.params(model.hidden_size) if model.norm.final else 0
    head_bias = model.vocab_size / tp if model.lm_head_bias else 0.0
    stages = []
    for i, layers in enumerate(stage_layers(model.num_layers, pp)):
        per_layer = [layer_params_on_device(model, j, tp, expert_shards) for j in layers]
        dense = sum(p[0] for p in per_layer)
        expert = sum(p[1] for p in per_layer)
        units = [p[0] + p[1] for p in per_layer]
        if i == 0:
            dense += vocab_rows + first_extra
            units.append(vocab_rows + first_extra)
        if i == pp - 1:
            dense += last_extra + head_bias
            if not model.tie_word_embeddings or pp > 1:
                dense += vocab_rows
                units.append(vocab_rows + head_bias)
        stages.append(StageParams(i, layers, dense, expert, max(units)))
    return tuple(stages)

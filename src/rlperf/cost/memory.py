"""Memory per device: training, forward-only passes and the rollout engine.

Every function returns the bytes on one GPU of the fullest pipeline stage, so a plan that does
not fit is rejected by :func:`check_fits` / :func:`check_kv_capacity` with the reason.
Parameter placement is in :mod:`rlperf.cost.memory_params`, activations per layer in
:mod:`rlperf.cost.memory_activations`.

Model states (Rajbhandari et al. 2020, "ZeRO", §3.1): with mixed-precision Adam a parameter
costs its weight (``param_dtype``), its gradient (``grad_dtype``) and 12 bytes of optimizer state
(fp32 master copy, Adam m and v); 2 + 2 + 12 = 16 bytes with bf16 weights and grads. When the
weights are already fp32 there is no separate master copy (8 bytes: m and v) -- verl's FSDP
keeps fp32 weights and fp32 gradients, 4 + 4 + 8 = 16 bytes. ZeRO-1 shards the optimizer
states over the data-parallel group (``dp * cp`` ranks), ZeRO-2 also the gradients, ZeRO-3
(FSDP) also the weights. Routed experts are replicated only over the expert-data-parallel group
(``dp * cp / ep``), so ZeRO shards them over that many ranks.

Working buffers: ZeRO-3 (or offloaded weights) gathers one FSDP unit (a decoder layer, or the
embedding / LM head when bigger) in the compute dtype; ZeRO-2 and ZeRO-3 hold that unit's
unsharded gradient (``grad_dtype``) until it is reduce-scattered. Prefetching the next unit
(FSDP's default) can double the gather buffer; that is not counted.

Offload (DeepSpeed ZeRO-Offload / FSDP ``CPUOffload`` semantics, during the step itself):
``offload_params`` keeps the weight and gradient shards in host memory, ``offload_optimizer``
the optimizer states, and under ZeRO-2/3 also the gradient shards: ZeRO-Offload copies each
reduced gradient partition to the host, where the optimizer step runs, and the GPU keeps only
the reduce buckets (Ren et al. 2021, "ZeRO-Offload", §4.1: gradients, optimizer states and
the optimizer computation on the CPU; parameters and forward/backward on the GPU). Host bytes
are reported separately. (verl's ``param_offload`` instead
moves states off the GPU *between* phases; that shapes a colocated timeline, not the peak of
the training step, and is the placement layer's business.)
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import math
from dataclasses import dataclass
from functools import lru_cache

from rlperf.cost.lora import stage_adapter_params
from rlperf.cost.memory_activations import (
    ACTIVATION_DTYPE,
    LayerActivations,
    forward_workspace_bytes_per_token,
    layer_activations,
)
from rlperf.cost.memory_engine import non_torch_bytes
from rlperf.cost.memory_params import StageParams, kv_heads_per_device, stage_params
from rlperf.errors import SpecError
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import EngineLayout, TrainLayout, check_engine_layout, check_train_layout

_ADAM_MOMENTS_BYTES = 2 * bytes_per("fp32")  # Adam m and v per parameter
_MASTER_BYTES = bytes_per("fp32")  # fp32 master weight, when the weights are lower precision
_LOGIT_BYTES = bytes_per("fp32")  # log-probs are computed from fp32 logits
_SAMPLER_BYTES = 2 * bytes_per("fp32")  # sampler: fp32 logits and fp32 probabilities

_HINTS = {
    "weights": "try more tp/pp, zero_stage=3 or offload_params",
    "grads": "try zero_stage>=2 or more dp",
    "optimizer": "try zero_stage=3 or more dp, or offload_optimizer",
    "activations": "try recompute='full', fewer tokens per micro-batch, or more tp/cp",
    "logits": "try chunked log-probs (logits_chunk_tokens) or more tp",
    "buffers": "try more tp/pp",
}


# ---------------------------------------------------------------------------- results
class _DeviceBytes(ABC):
    """Named device-memory components and their sum."""

    @abstractmethod
    def components(self) -> tuple[tuple[str, float], ...]:
        """(name, bytes) of every device-memory component."""

    @property
    def total_bytes(self) -> float:
        """Device bytes (host bytes excluded)."""
        return sum(v for _, v in self.components())


@dataclass(frozen=True)
class TrainMemory(_DeviceBytes):
    """Bytes on one GPU of the fullest pipeline stage during a training step."""

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float  # kept for backward, all micro-batches in flight
    logits_bytes: float  # the fp32 logits of one micro-batch (last stage)
    buffers_bytes: float  # ZeRO gather / reduce-scatter working buffers
    host_bytes: float  # offloaded states in host memory (not in total_bytes)
    pp_stage: int = 0  # which pipeline stage these numbers are for

    @property
    def model_states_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes

    def components(self) -> tuple[tuple[str, float], ...]:
        return (
            ("weights", self.weights_bytes),
            ("grads", self.grads_bytes),
            ("optimizer", self.optimizer_bytes),
            ("activations", self.activations_bytes),
            ("logits", self.logits_bytes),
            ("buffers", self.buffers_bytes),
        )


@dataclass(frozen=True)
class ForwardMemory(_DeviceBytes):
    """Bytes on one GPU of the fullest stage during a forward-only pass (ref / reward model,
    old-policy log-probs): no gradients, no optimizer, no activations kept for backward."""

    weights_bytes: float
    activations_bytes: float  # one layer's working set for one micro-batch
    logits_bytes: float
    buffers_bytes: float  # ZeRO-3 gathered unit
    host_bytes: float
    pp_stage: int = 0

    def components(self) -> tuple[tuple[str, float], ...]:
        return (
            ("weights", self.weights_bytes),
            ("activations", self.activations_bytes),
            ("logits", self.logits_bytes),
            ("buffers", self.buffers_bytes),
        )


@dataclass(frozen=True)
class InferenceMemory:
    """One GPU of a rollout engine (its fullest stage): what the weights and the step workspace
    leave of the ``gpu_memory_utilization`` budget for the KV cache."""

    weights_bytes: float
    workspace_bytes: float  # activations of one scheduler step + sampler + non-torch (``reserved_bytes``)
    budget_bytes: float  # gpu_memory_utilization x the device memory CUDA reports
    kv_bytes_per_token: float  # KV-cache bytes one token costs on this GPU
    pp_stage: int = 0

    @property
    def kv_capacity_bytes(self) -> float:
        """Budget left for the KV cache (negative: weights and workspace alone do not fit)."""
        return self.budget_bytes - self.weights_bytes - self.workspace_bytes

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens of KV cache the engine holds (every GPU holds its share of every token)."""
        return math.floor(max(self.kv_capacity_bytes, 0.0) / self.kv_bytes_per_token)


# ---------------------------------------------------------------------------- training
def train_memory(
    model: ModelSpec,
    layout: TrainLayout,
    micro_batch_tokens: int,
    *,
    seq_len: int | None = None,
    flash_attention: bool = True,
    logits_chunk_tokens: int | None = None,
    num_microbatches: int | None = None,
    value_head: bool = False,
) -> TrainMemory:
    """Peak bytes per GPU of a training step (the fullest pipeline stage).

    Args:
        model: the trained model.
        layout: its training layout (validated against the model here).
        micro_batch_tokens: tokens in one micro-batch over the whole cp group (``b*s``, or the
            token budget with packing).
        seq_len: the longest sequence in a micro-batch, which sets the attention-score term
            without flash attention; defaults to ``micro_batch_tokens`` (one sequence).
        flash_attention: no ``s^2`` score tensors are kept (FlashAttention).
        logits_chunk_tokens: log-probs computed in chunks of this many tokens (fused/chunked
            kernels); ``None`` materializes the logits of the whole micro-batch.
        num_microbatches: micro-batches per step; ``None`` means enough to fill the pipeline.
        value_head: the model ends in a scalar head (critic values, reward scores: verl's
            ``AutoModelForTokenClassification`` with one label), so no vocabulary logits.
    """
    check_train_layout(model, layout)
    tokens, span = _tokens(layout, micro_batch_tokens, seq_len)
    _positive("num_microbatches", num_microbatches)
    _positive("logits_chunk_tokens", logits_chunk_tokens)
    stages = stage_params(model, layout.tp, layout.pp, layout.expert_shards)
    mems = [
        _train_stage(
            model, layout, st, tokens, span, flash_attention, logits_chunk_tokens, num_microbatches,
            value_head,
        )
        for st in stages
    ]
    return max(mems, key=lambda m: m.total_bytes)


def _train_stage(
    model: ModelSpec,
    lay: TrainLayout,
    st: StageParams,
    tokens: float,
    span: float,
    flash: bool,
    chunk: int | None,
    num_mb: int | None,
    value_head: bool,
) -> TrainMemory:
    p_bytes, g_bytes = bytes_per(lay.param_dtype), bytes_per(lay.grad_dtype)
    opt_per_param = _ADAM_MOMENTS_BYTES + (0.0 if lay.param_dtype == "fp32" else _MASTER_BYTES)
    # FP8 training (Transformer Engine) keeps the param_dtype weights and caches one FP8 copy
    # of each (1 byte per parameter, sharded like the weights) across micro-batches.
    fp8_cache = 1.0 if lay.compute_dtype == "fp8" else 0.0
    weights = _state_bytes(st, lay, p_bytes + fp8_cache, lay.zero_stage >= 3)
    grads = _state_bytes(st, lay, g_bytes, lay.zero_stage >= 2)
    optimizer = _state_bytes(st, lay, opt_per_param, lay.zero_stage >= 1)
    if lay.lora_rank:  # frozen weights: gradients and optimizer states of the adapters only
        adapters = stage_adapter_params(model, lay, len(st.layers))
        weights += adapters * p_bytes / (lay.shard_degree if lay.zero_stage >= 3 else 1)
        grads = adapters * g_bytes / (lay.shard_degree if lay.zero_stage >= 2 else 1)
        optimizer = adapters * opt_per_param / (lay.shard_degree if lay.zero_stage >= 1 else 1)
    gathers = lay.zero_stage >= 3 or lay.offload_params
    buffers = st.largest_unit_params * (
        (bytes_per(ACTIVATION_DTYPE) if gathers else 0.0)
        + (g_bytes if lay.zero_stage >= 2 or lay.offload_params else 0.0)
    )
    grads_to_host = lay.offload_params or (lay.offload_optimizer and lay.zero_stage >= 2)
    host = (weights if lay.offload_params else 0.0) + (grads if grads_to_host else 0.0) + (
        optimizer if lay.offload_optimizer else 0.0
    )
    if lay.offload_params:
        weights = 0.0
    if grads_to_host:
        grads = 0.0
    if lay.offload_optimizer:
        optimizer = 0.0
    in_flight = microbatches_in_flight(lay, st.stage, num_mb)
    acts = _stage_activations(model, lay, st, tokens, span, flash, in_flight)
    logits = 0.0 if value_head else _logits_bytes(model, lay, st, tokens, chunk)
    return TrainMemory(weights, grads, optimizer, acts, logits, buffers, host, st.stage)


def _state_bytes(st: StageParams, lay: TrainLayout, per_param_bytes: float, shard: bool) -> float:
    """A per-parameter state on one device: whole, or ZeRO-sharded -- dense parameters over the
    ``dp * cp`` ranks, each rank's experts over the ``dp * cp / ep`` ranks that replicate them."""
    if not shard:
        return st.total_params * per_param_bytes
    dense = st.dense_params / lay.shard_degree
    return (dense + st.expert_params / lay.expert_shard_degree) * per_param_bytes


def _layer_activations(
    model: ModelSpec, lay: TrainLayout, st: StageParams, span: float, flash: bool
) -> tuple[LayerActivations, ...]:
    # Megatron-Core's experts apply the routing weight before their second GEMM (TEGroupedMLP),
    # Hugging Face's MoE blocks multiply the expert output (memory_activations' docstring).
    kernels = _MlpKernels(lay.expert_tp, lay.backend == "megatron", lay.fused_activation)
    return _stage_layer_activations(model, st.layers, lay.tp, lay.sequence_parallel, span, flash, kernels)


@dataclass(frozen=True)
class _MlpKernels:
    """The layout's choices that decide which MLP tensors are kept (a memo key)."""

    etp: int
    megatron_experts: bool
    fused_activation: bool


# Memoized per stage (one key per stage, not per layer): a planner's memory checks ask for the
# same stages of the same model under many layouts and pool sizes; the result is frozen.
@lru_cache(maxsize=1024)
def _stage_layer_activations(
    model: ModelSpec,
    layers: range,
    tp: int,
    sequence_parallel: bool,
    span: float,
    flash: bool,
    kernels: _MlpKernels,
) -> tuple[LayerActivations, ...]:
    return tuple(
        layer_activations(
            model,
            i,
            tp=tp,
            sequence_parallel=sequence_parallel,
            seq_len=span,
            flash_attention=flash,
            etp=kernels.etp,
            megatron_experts=kernels.megatron_experts,
            fused_activation=kernels.fused_activation,
        )
        for i in layers
    )


def microbatches_in_flight(
    layout: TrainLayout, stage: int, num_microbatches: int | None = None
) -> float:
    """Micro-batches whose activations pipeline stage ``stage`` holds at its peak.

    - no pipeline: 1; GPipe: all ``m`` (all forwards before any backward);
    - 1F1B (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
      Clusters", §2.2): stage ``i`` runs ``pp - i - 1`` warm-up forwards, so holds
      ``min(pp - i, m)``;
    - interleaved with ``v`` chunks per rank: Megatron warms up ``2(pp - i - 1) + (v - 1)pp``
      chunk-forwards, plus the one in steady state, each ``1/v`` of the stage's layers. On the
      first stage that is ``pp(1 + (pp - 1)/(pp v))`` micro-batches, Megatron's
      ``report_theoretical_memory`` penalty; capped at all ``m * v`` chunks.
    """
    pp, v = layout.pp, layout.virtual_stages
    m = num_microbatches or pp
    if pp == 1:
        return 1.0
    if layout.pp_schedule == "gpipe":
        return float(m)
    if layout.pp_schedule == "1f1b":
        return float(min(pp - stage, m))
    chunks = min(2 * (pp - stage - 1) + (v - 1) * pp + 1, m * v)
    return chunks / v


def _stage_activations(
    model: ModelSpec,
    lay: TrainLayout,
    st: StageParams,
    tokens: float,
    span: float,
    flash: bool,
    in_flight: float,
) -> float:
    """Activations kept for backward on one stage (Korthikanti et al. 2022, Table 2):
    none keeps every layer's tensors, selective drops the attention scores, full keeps only
    each layer's input plus one layer's tensors while that layer is recomputed."""
    per_layer = _layer_activations(model, lay, st, span, flash)
    if lay.recompute == "full":
        kept = sum(a.input_bytes for a in per_layer) * in_flight + max(
            a.total_bytes for a in per_layer
        )
    elif lay.recompute == "selective":
        kept = sum(a.linear_bytes for a in per_layer) * in_flight
    else:
        kept = sum(a.total_bytes for a in per_layer) * in_flight
    if st.stage == lay.pp - 1:  # final-norm input and LM-head input, never recomputed
        head = 2 * model.hidden_size * bytes_per(ACTIVATION_DTYPE)
        kept += in_flight * head / (lay.tp if lay.sequence_parallel else 1)
    return kept * tokens


def _logits_bytes(
    model: ModelSpec,
    lay: TrainLayout,
    st: StageParams,
    tokens: float,
    chunk: int | None,
    per_element_bytes: float = _LOGIT_BYTES,
) -> float:
    """Logits of one micro-batch on the last stage, vocab split by tp (``T * V * bytes / tp``),
    fp32 unless told. One copy is counted; unfused code may hold more (softmax, gradient)."""
    if st.stage != lay.pp - 1:
        return 0.0
    rows = min(tokens, chunk) if chunk else tokens
    return rows * model.vocab_size / lay.tp * per_element_bytes


def _tokens(
    layout: TrainLayout, micro_batch_tokens: int, seq_len: int | None
) -> tuple[float, float]:
    """Tokens per device and the attention span behind the score term, after context parallelism.
    Ring attention splits the span by cp; Ulysses gathers the whole sequence for a head subset."""
    _positive("micro_batch_tokens", micro_batch_tokens)
    _positive("seq_len", seq_len)
    s = seq_len if seq_len is not None else micro_batch_tokens
    span = s / layout.cp if layout.ring_attention else float(s)
    return micro_batch_tokens / layout.cp, span


def _positive(field: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise SpecError(field, f"must be > 0, got {value}")


# ---------------------------------------------------------------------------- forward only
def forward_memory(
    model: ModelSpec,
    layout: TrainLayout,
    micro_batch_tokens: int,
    *,
    seq_len: int | None = None,
    flash_attention: bool = True,
    logits_chunk_tokens: int | None = None,
    value_head: bool = False,
) -> ForwardMemory:
    """Peak bytes per GPU of a forward-only pass (frozen reference or reward model, old-policy
    log-probs) on a training layout: the weights as the layout shards them (``param_dtype``;
    ZeRO-3 shards them and gathers one unit at a time), one layer's working set for one
    micro-batch (the tensors a training pass would keep for that layer, freed as the forward
    moves on), and one copy of the logits in ``layout.forward_logits_dtype`` (verl with
    remove-padding keeps the model's bf16 logits: ``dp_actor._forward_micro_batch`` divides them
    by the temperature in place, takes log-probs with flash-attn's in-place cross-entropy and the
    entropy through a ``torch.compile``d function, whose softmax feeds only row reductions;
    the default, fp32, counts an upcast copy); none with ``value_head``. Pipeline stages hold only boundary tensors between layers,
    which are not counted. Arguments as in :func:`train_memory`."""
    check_train_layout(model, layout)
    tokens, span = _tokens(layout, micro_batch_tokens, seq_len)
    _positive("logits_chunk_tokens", logits_chunk_tokens)
    p_bytes = bytes_per(layout.param_dtype)
    mems = []
    for st in stage_params(model, layout.tp, layout.pp, layout.expert_shards):
        weights = _state_bytes(st, layout, p_bytes, layout.zero_stage >= 3)
        gathers = layout.zero_stage >= 3 or layout.offload_params
        buffers = st.largest_unit_params * bytes_per(ACTIVATION_DTYPE) if gathers else 0.0
        host = weights if layout.offload_params else 0.0
        if layout.offload_params:
            weights = 0.0
        working = max(
            a.total_bytes for a in _layer_activations(model, layout, st, span, flash_attention)
        )
        logits = 0.0 if value_head else _logits_bytes(
            model, layout, st, tokens, logits_chunk_tokens, bytes_per(layout.forward_logits_dtype)
        )
        mems.append(ForwardMemory(weights, working * tokens, logits, buffers, host, st.stage))
    return max(mems, key=lambda m: m.total_bytes)


# ---------------------------------------------------------------------------- rollout engine
def inference_memory(
    model: ModelSpec,
    engine: EngineLayout,
    device_memory_bytes: float,
    *,
    reserved_bytes: float | None = None,
) -> InferenceMemory:
    """Weights, step workspace and KV-cache capacity per GPU of a vLLM/SGLang-style engine.

    vLLM sizes its KV cache as ``gpu_memory_utilization * total`` minus the weights minus the
    peak of a profiling forward pass over ``max_num_batched_tokens`` tokens and a sampler pass
    over ``max_num_seqs`` rows (``Worker.determine_available_memory``), where ``total`` is the
    device total ``torch.cuda.mem_get_info()`` reports (``MemorySnapshot.total_memory``), not
    the datasheet figure: pass ``Accelerator.device_memory_bytes``. The same is done here
    in closed form: weights in ``engine.dtype`` split by tp and pp (experts: see
    :mod:`rlperf.cost.memory_params`), workspace = ``max_num_batched_tokens`` x the forward peak
    per token (:func:`forward_workspace_bytes_per_token`) plus, on the last stage, fp32 logits
    and probabilities over the whole vocabulary for ``max_num_seqs`` rows, plus
    ``reserved_bytes``: memory outside torch that vLLM also subtracts (its measured non-torch
    increase: NCCL and all-reduce buffers). ``None`` takes vLLM v0.19.0's measured figure for
    the engine's tp and pp (:func:`rlperf.cost.memory_engine.non_torch_bytes`, whose docstring
    gives the source and the releases it describes); pass a measurement of another engine to
    replace it (0: none).

    KV per token per GPU: the stage's layers x ``2 * kv_heads_on_gpu * head_dim`` x bytes of
    ``kv_dtype``, where ``kv_heads_on_gpu = ceil(num_kv_heads / tp)``: with ``tp >
    num_kv_heads`` KV heads are replicated, not split further (MLA's latent is replicated on
    every tp rank).

    Data-parallel attention (``engine.dp_attention``): every GPU holds the dense weights whole
    and ``1/ep`` of the experts, its workspace is a tp-1 forward's, and it keeps the whole KV of
    its own ``1/tp`` of the replica's tokens: per token of the replica that is ``1/tp`` of a
    token's KV (the replica's capacity is ``tp`` times one GPU's, assuming balanced ranks).
    """
    check_engine_layout(model, engine)
    _positive("device_memory_bytes", device_memory_bytes)
    if reserved_bytes is None:
        reserved_bytes = non_torch_bytes(engine)
    if reserved_bytes < 0:
        raise SpecError("reserved_bytes", f"must be >= 0, got {reserved_bytes}")
    budget = engine.gpu_memory_utilization * device_memory_bytes
    dp = engine.dp_attention
    dense_tp = 1 if dp else engine.tp
    per_token_fwd = forward_workspace_bytes_per_token(
        model, dense_tp, experts_split=engine.ep == 1
    )
    kv_layer = model.kv_bytes_per_token(engine.kv_dtype) / model.num_layers
    kv_share = 1 / engine.tp if dp else kv_heads_per_device(model, engine.tp) / (
        1 if model.mla is not None else model.num_kv_heads
    )
    mems = []
    for st in stage_params(model, dense_tp, engine.pp, engine.tp):
        workspace = engine.max_num_batched_tokens * per_token_fwd + reserved_bytes
        if st.stage == engine.pp - 1:
            workspace += engine.max_num_seqs * model.vocab_size * _SAMPLER_BYTES
        weights = st.total_params * bytes_per(engine.dtype)
        kv = len(st.layers) * kv_layer * kv_share
        mems.append(InferenceMemory(weights, workspace, budget, kv, st.stage))
    return min(mems, key=lambda m: m.kv_capacity_bytes / m.kv_bytes_per_token)


# ---------------------------------------------------------------------------- checks
def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def check_fits(mem: TrainMemory | ForwardMemory, capacity_bytes: float, what: str) -> None:
    """Raise SpecError naming the largest component when ``mem`` exceeds ``capacity_bytes``."""
    assert capacity_bytes > 0, capacity_bytes
    if mem.total_bytes <= capacity_bytes:
        return
    name, size = max(mem.components(), key=lambda c: c[1])
    raise SpecError(
        what,
        f"needs {_gb(mem.total_bytes)} per GPU > {_gb(capacity_bytes)} device memory ({name} {_gb(size)}: {_HINTS[name]})",
    )


def check_kv_capacity(mem: InferenceMemory, what: str, min_tokens: int = 1) -> None:
    """Raise SpecError when the engine has no room for the KV cache of ``min_tokens`` tokens
    (e.g. one sequence of the longest prompt + response)."""
    left = mem.kv_capacity_bytes
    if left <= 0:
        raise SpecError(
            what,
            f"weights {_gb(mem.weights_bytes)} + workspace {_gb(mem.workspace_bytes)} per GPU exceed the "
            f"{_gb(mem.budget_bytes)} gpu_memory_utilization budget: try more tp/pp or a higher gpu_memory_utilization",
        )
    if mem.kv_capacity_tokens < min_tokens:
        raise SpecError(
            what,
            f"KV cache holds {mem.kv_capacity_tokens:,} tokens < {min_tokens:,} needed: "
            "try more tp/pp, a higher gpu_memory_utilization or kv_dtype='fp8'",
        )

"""What one device of each pipeline stage holds and touches per token under a training layout.

Parameter placement (which layers sit on which stage, tp/ep splits, the embedding on the first
stage and the LM head on the last) is :mod:`rlperf.cost.memory_params`'s; this module adds
the per-token work of a forward pass on one device of each stage:

- **matmul FLOPs**: ``2 x`` the weights that multiply each token (attention projections, the
  dense MLP or the router + shared expert + ``k`` routed experts, the LM head on the last
  stage). Expert parallelism does not change them: an ep group of ``ep`` ranks processes its
  ``ep x T`` tokens' ``k`` expert copies, ``k T`` per rank under balanced routing.
- **activation traffic** of a weight matmul: its input plus its output, ``k + n`` elements per
  token for a ``k x n`` weight; the tp-split side is divided by tp, the ``hidden_size`` side is
  not (a column-parallel matmul reads the whole token, a row-parallel one writes it).
  Flash attention reads q, k, v and writes o once per token.
- **elementwise traffic** (memory bound): the layer's norms (two in a pre-norm block, one in
  Phi's parallel block, four in Gemma 2's sandwich; over ``d`` each), two residual adds (over
  ``d``), rotary embedding on q and k (the rotated part; none with learned positions), QK-norm
  where present (q and k), the activation (gated: gate and up in, their product out; plain: one
  width), each at the bytes per element of the backend's kernel set
  (:mod:`rlperf.stages.elementwise`: fused, or Hugging Face's eager ops). Under sequence
  parallelism the ``d``-wide ones run on ``1/tp`` of the tokens.
- **kernels** of a forward through the stage, for the launch term (a layer's norms, rotary,
  attention core, activation and two residual adds as the kernel set counts them, plus one
  kernel per weight matmul; an MoE block adds top-k, permute and unpermute around grouped GEMMs).
- **GEMM shapes**, for the GEMM rate's size dependence (:func:`rlperf.cost.roofline.
  matmul_size_factor`): each weight matmul as (weight elements ``k x n`` on this device, rows per
  token of the micro-batch, count per forward). Rows are the micro-batch's tokens on the device,
  except for routed experts: the ``ep x tokens x k`` routed copies of the ep group land on the
  ``L = E / ep`` local experts, ``ep k / E`` rows per token for each expert's weights (balanced
  routing). Megatron-Core's ``TEGroupedMLP`` runs them through Transformer Engine's
  ``GroupedLinear``: one cuBLAS GEMM per local expert and projection, issued round-robin on
  ``s = 4`` compute streams (``ElementwiseKernels.expert_gemm_streams``,
  :mod:`rlperf.stages.elementwise`). Those on different streams run at once, so the ``L``
  GEMMs are costed as ``ceil(L / s)`` waves, each one GEMM of ``L / ceil(L / s)`` experts'
  weights (an assumption: concurrent GEMMs that each leave the device part idle fill it as one
  GEMM of their summed work would; no measurement of TE's concurrency); the ``L - 1`` launches
  per projection beyond the one counted in **kernels** are ``expert_gemm_launches``. A kernel
  set without ``expert_gemm_streams`` runs one grouped GEMM over the local experts' weights.
  Summed, count x rows x weight is ``matmul_params_per_token``.
- **host-device synchronizations** of a forward through the stage: one per MoE layer
  (``DISPATCH_SYNCS_PER_MOE_LAYER``). Megatron-Core's token dispatchers need the number of
  tokens each expert receives on the host (split sizes of the all-to-all, sizes of the
  grouped GEMM) and wait for the device to produce it, in every forward of a dropless MoE
  layer: ``MoEAlltoAllTokenDispatcher`` copies the counts to the CPU on a side stream and
  waits on its event (``self.d2h_event.synchronize()`` at ``cuda_sync_point``:
  ``before_ep_alltoall`` with ep or tp > 1, ``before_finish`` without),
  ``MoEAllGatherTokenDispatcher`` calls ``.cpu()`` on them, and the flex dispatcher's DeepEP
  dispatch spins on the host until the notify kernel has written the receive counts ("the CPU
  will wait for GPU's signal to arrive"; DeepEP ``Buffer::intranode_dispatch`` /
  ``internode_dispatch``, ``while (true)`` on ``moe_recv_counter``). The backward reuses the
  counts the forward left on the host (``_AllToAll.backward`` swaps the saved splits; DeepEP's
  backward passes run in cached mode, without the wait), so only forwards synchronize, a
  recomputed forward included (Megatron-Core ``core_v0.13.0``
  ``megatron/core/transformer/moe/token_dispatcher.py``, ``fused_a2a.py``; DeepEP ``b7fef49``
  ``csrc/deep_ep.cpp``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from rlperf.cost.memory_params import kv_heads_per_device, stage_params
from rlperf.specs.model import ModelSpec
from rlperf.stages.elementwise import FUSED, ElementwiseKernels

Head = Literal["logprobs", "value"]  # LM head + log-softmax over the vocab, or a scalar value head


def head_of(role: str) -> Head:
    """The head a role's passes end in: the critic and the reward model score with a scalar
    head (verl's ``AutoModelForTokenClassification`` with one label), the others take
    log-probs over the vocabulary."""
    return "value" if role in ("critic", "reward_model") else "logprobs"

ROUTING_KERNELS = 3  # top-k, permute, unpermute
# Host waits on the device per MoE layer and forward: the dispatcher's tokens-per-expert counts
# (module docstring; dropless routing: with capacity padding Megatron's alltoall dispatcher knows
# the sizes in advance and does not wait)
DISPATCH_SYNCS_PER_MOE_LAYER = 1


@dataclass(frozen=True)
class StageShard:
    """One device of pipeline stage ``stage`` (after tp/pp/ep, before ZeRO sharding)."""

    stage: int
    num_layers: int
    num_moe_layers: int
    dense_params: float  # non-expert parameters (ZeRO shards them over dp*cp)
    expert_params: float  # routed experts (ZeRO shards them over dp*cp/ep)
    largest_unit_params: float  # biggest FSDP unit (a layer, the embedding or the LM head)
    matmul_params_per_token: float  # weights multiplying each token on this device
    matmul_io_per_token: float  # activation elements in + out of those matmuls
    attention_io_per_token: float  # q, k, v, o elements per token, all layers of the stage
    elementwise_bytes_per_token: float  # norms, residual adds, rotary, activation: all layers
    ring_kv_per_token: float  # k and v elements per token and layer (what ring attention passes)
    vocab_per_device: float  # logits per token on this device (0 without an LM head here)
    kernels: int  # kernels of one forward through the stage
    # distinct weight matmuls of one forward: weight elements, rows per micro-batch token, count
    gemm_weights: tuple[float, ...] = ()
    gemm_rows_per_token: tuple[float, ...] = ()
    gemm_counts: tuple[int, ...] = ()
    # GEMM kernels the routed experts' grouped GEMMs launch beyond one per projection (one forward)
    expert_gemm_launches: int = 0

    @property
    def params(self) -> float:
        return self.dense_params + self.expert_params

    @property
    def host_syncs(self) -> int:
        """Host-device synchronizations in one forward through the stage (module docstring):
        ``DISPATCH_SYNCS_PER_MOE_LAYER`` per MoE layer, none in a dense layer."""
        return DISPATCH_SYNCS_PER_MOE_LAYER * self.num_moe_layers


def _attention(model: ModelSpec, tp: int) -> tuple[float, float, float, float]:
    """(matmul weights, matmul io, core io, ring kv) per token of one layer on one tp rank.

    Weights as :attr:`ModelSpec.attention_matmul_weights_per_layer` counts them (no biases or
    norms), split by heads over tp; KV heads are replicated once tp exceeds them and MLA's
    down-projections stay whole on every rank (:mod:`rlperf.cost.memory_params`)."""
    d, h = model.hidden_size, model.num_heads / tp
    m = model.mla
    if m is None:
        hd, kv = model.head_dim, kv_heads_per_device(model, tp)
        weights = 2 * d * h * hd + 2 * d * kv * hd  # q, o split; k, v per KV head held
        proj = 3 * d + h * hd + 2 * kv * hd + (h * hd + d)  # q, k, v (column), o (row)
        core = 2 * h * hd + 2 * kv * hd
        return weights, proj, core, 2 * kv * hd
    qk, v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    if m.q_lora_rank is None:
        q_w, q = d * h * qk, d + h * qk
    else:
        q_w = d * m.q_lora_rank + m.q_lora_rank * h * qk
        q = (d + m.q_lora_rank) + (m.q_lora_rank + h * qk)
    kv_w = d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * h * (m.qk_nope_head_dim + v)
    kv_a = d + m.kv_lora_rank + m.qk_rope_head_dim
    kv_b = m.kv_lora_rank + h * (m.qk_nope_head_dim + v)
    proj = q + kv_a + kv_b + (h * v + d)
    core = h * (2 * qk + 2 * v)  # decompressed per-head keys and values in a teacher-forced pass
    return q_w + kv_w + h * v * d, proj, core, h * (qk + v)


Gemms = dict[tuple[float, float], int]  # (weight elements, rows per token) -> count


def _add(gemms: Gemms, weight: float, rows_per_token: float = 1.0, count: int = 1) -> None:
    if weight > 0 and count > 0:
        key = (float(weight), float(rows_per_token))
        gemms[key] = gemms.get(key, 0) + count


def _attention_gemms(model: ModelSpec, tp: int, gemms: Gemms) -> None:
    """One layer's attention projections on one tp rank (the weights of :func:`_attention`)."""
    d, h = model.hidden_size, model.num_heads / tp
    m = model.mla
    if m is None:
        hd, kv = model.head_dim, kv_heads_per_device(model, tp)
        for w in (d * h * hd, d * kv * hd, d * kv * hd, h * hd * d):  # q, k, v, o
            _add(gemms, w)
        return
    qk, v = m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    if m.q_lora_rank is None:
        _add(gemms, d * h * qk)
    else:
        _add(gemms, d * m.q_lora_rank)
        _add(gemms, m.q_lora_rank * h * qk)
    _add(gemms, d * (m.kv_lora_rank + m.qk_rope_head_dim))
    _add(gemms, m.kv_lora_rank * h * (m.qk_nope_head_dim + v))
    _add(gemms, h * v * d)


def _mlp_gemms(model: ModelSpec, layer: int, tp: int, ep: int, gemms: Gemms, etp: int | None = None,
               streams: int | None = None) -> int:
    """One layer's MLP matmuls on one tp rank (the weights of :func:`_mlp`); returns the GEMM
    launches of the routed experts beyond one per projection. Routed experts are split ``etp``
    ways (default ``tp``); with ``etp < tp`` each rank holds ``tp / etp`` times wider expert
    shards for ``etp / tp`` of the routed rows (same FLOPs). ``streams``: the local experts'
    GEMMs run one per expert, this many at once (module docstring); None: one grouped GEMM."""
    etp = tp if etp is None else etp
    d = model.hidden_size
    moe = model.moe
    if moe is None or not model.is_moe_layer(layer):
        _add(gemms, d * model.intermediate_size / tp, count=model.mlp.num_matrices)
        return 0
    _add(gemms, d * moe.num_experts)  # router
    if moe.shared_expert_gate:
        _add(gemms, d)
    rows = ep * moe.experts_per_token / moe.num_experts * etp / tp
    mats = model.mlp.num_matrices
    launches = 0
    if streams is None:  # one grouped GEMM per projection over the local experts
        _add(gemms, moe.num_experts / ep * d * moe.expert_intermediate_size / etp, rows, count=mats)
    else:  # one GEMM per local expert, ``streams`` at once: ceil(L / streams) waves
        local = moe.num_experts // ep
        waves = -(-local // streams)
        _add(gemms, local / waves * d * moe.expert_intermediate_size / etp, rows, count=mats * waves)
        launches = mats * (local - 1)
    _add(gemms, d * moe.shared_intermediate_size / tp, count=mats)
    return launches


def _elementwise(model: ModelSpec, layer: int, tp: int, sequence_parallel: bool, ops: ElementwiseKernels) -> float:
    """Bytes read + written per token by one layer's elementwise kernels on one tp rank, as
    ``ops`` runs them (:mod:`rlperf.stages.elementwise`)."""
    d, h = model.hidden_size, model.num_heads / tp
    norms = model.norm.per_layer * d * ops.norm_bytes(model)
    wide = (norms + 2 * d * ops.residual_bytes) / (tp if sequence_parallel else 1)  # norms, 2 adds
    if model.mla is not None:
        rope = model.mla.qk_rope_head_dim
        qk = (h * rope + rope) * ops.rotary_bytes  # q's rope part per head, the shared rope key
    else:
        kv = kv_heads_per_device(model, tp)
        features = (h + kv) * model.head_dim
        rotated = model.position.rotary_fraction if model.position.rotary else 0.0
        qk = features * (rotated * ops.rotary_bytes + (ops.qk_norm_bytes if model.qk_norm else 0.0))
    moe = model.moe
    if moe is None or not model.is_moe_layer(layer):
        width = model.intermediate_size / tp
    else:
        width = (moe.experts_per_token * moe.expert_intermediate_size + moe.shared_intermediate_size) / tp
    act = width * (ops.gated_bytes if model.mlp.gated else ops.plain_bytes)
    return wide + qk + act


def _mlp(model: ModelSpec, layer: int, tp: int) -> tuple[float, float, int]:
    """(matmul weights per token, io per token, kernels) of one layer's MLP on one tp rank,
    counted as :attr:`ModelSpec.matmul_params_per_token` does (router and the Qwen2-MoE
    shared-expert gate whole on every rank)."""
    d, mats = model.hidden_size, model.mlp.num_matrices
    moe = model.moe
    if moe is None or not model.is_moe_layer(layer):
        w = model.intermediate_size
        return mats * d * w / tp, mats * d + mats * w / tp, mats
    weights: float = d * moe.num_experts + (d if moe.shared_expert_gate else 0)
    weights += mats * d * (moe.experts_per_token * moe.expert_intermediate_size + moe.shared_intermediate_size) / tp
    io = d + moe.num_experts + moe.experts_per_token * (mats * d + mats * moe.expert_intermediate_size / tp)
    kernels = 1 + ROUTING_KERNELS + mats
    if moe.shared_intermediate_size:
        io += mats * d + mats * moe.shared_intermediate_size / tp
        kernels += mats
    return weights, io, kernels


# Memoized: a planner builds the stage models of one (model, tp, pp, ep) for every dp degree,
# GPU count and micro-batch plan it costs, and the shards are frozen (specs are hashable).
@lru_cache(maxsize=256)
def stage_shards(
    model: ModelSpec, tp: int, pp: int, ep: int, head: Head = "logprobs", sequence_parallel: bool = True,
    etp: int | None = None, ops: ElementwiseKernels = FUSED,
) -> tuple[StageShard, ...]:
    """Per-device shards of all ``pp`` stages (see the module docstring); routed experts are
    split over ``ep x etp`` ranks (``etp`` default ``tp``); elementwise ops as ``ops`` runs
    them (default: fused)."""
    etp = tp if etp is None else etp
    attn_params, attn_proj, attn_core, ring_kv = _attention(model, tp)
    attn_kernels = 5 if model.mla is not None else 4
    d, vocab, e = model.hidden_size, model.vocab_size, model.token_embedding_size
    layer_kernels = ops.layer_kernels(model)
    shards = []
    for st in stage_params(model, tp, pp, ep * etp):
        params = io = elementwise = 0.0
        kernels = expert_launches = 0
        gemms: Gemms = {}
        for layer in st.layers:
            _attention_gemms(model, tp, gemms)
            expert_launches += _mlp_gemms(model, layer, tp, ep, gemms, etp, ops.expert_gemm_streams)
            mlp_params, mlp_io, mlp_kernels = _mlp(model, layer, tp)
            params += attn_params + mlp_params
            io += attn_proj + mlp_io
            elementwise += _elementwise(model, layer, tp, sequence_parallel, ops)
            kernels += layer_kernels + attn_kernels + mlp_kernels
        if model.embedding_size is not None:
            # OPT's project_in (first stage) and project_out (last), replicated over tp.
            ends = int(st.stage == 0) + int(st.stage == pp - 1)
            params += ends * d * e
            io += ends * (d + e)
            _add(gemms, d * e, count=ends)
            kernels += ends
        vocab_here = 0.0
        if st.stage == pp - 1:
            if head == "logprobs":
                vocab_here = vocab / tp
                params += e * vocab_here
                io += e + vocab_here
                _add(gemms, e * vocab_here)
            else:
                params += d  # value head d -> 1
                io += d + 1
                _add(gemms, d)
            kernels += 2  # final norm, head
        n = len(st.layers)
        shards.append(
            StageShard(
                stage=st.stage,
                num_layers=n,
                num_moe_layers=sum(1 for i in st.layers if model.is_moe_layer(i)),
                dense_params=st.dense_params,
                expert_params=st.expert_params,
                largest_unit_params=st.largest_unit_params,
                matmul_params_per_token=params,
                matmul_io_per_token=io,
                attention_io_per_token=n * attn_core,
                elementwise_bytes_per_token=elementwise,
                ring_kv_per_token=ring_kv,
                vocab_per_device=vocab_here,
                kernels=kernels,
                gemm_weights=tuple(w for w, _ in gemms),
                gemm_rows_per_token=tuple(r for _, r in gemms),
                gemm_counts=tuple(gemms.values()),
                expert_gemm_launches=expert_launches,
            )
        )
    return tuple(shards)

"""Micro-batches through one pipeline stage on one device: compute and exposed communication.

Every cost here is taken over all micro-batches of a mini-batch at once: the fields of
:class:`MicroBatchShapes` and :class:`PassCost` are numpy arrays with one entry per
micro-batch, and each entry is the formula below evaluated for that micro-batch alone (the
stage models take sums and maxima over them).

Forward (per device of stage ``s``, ``t = tokens / cp`` tokens of the micro-batch):

- weight matmuls: ``2 x matmul_params x t`` FLOPs; the stage's weights read once in the compute
  dtype plus the activation traffic (:mod:`rlperf.stages.shard`); each GEMM of the stage (its
  shape from :mod:`rlperf.stages.shard`, ``m`` = its rows for these ``t`` tokens) at the profile's
  large-GEMM rate times :func:`rlperf.cost.roofline.matmul_size_factor` of its ``2mnk``;
- attention, as ``TrainLayout.attention_kernel`` says:
  flash: ``2 h (d_qk + d_v)`` FLOPs per causal (query, key) pair and layer, heads split by
  tp, pairs by cp (ring attention with the zig-zag split that balances the causal mask);
  FlashAttention IO; profile attention efficiency; the backward recomputes the scores in every
  tile (Dao et al. 2022, FlashAttention §3.1) and runs ``2 h (3 d_qk + 2 d_v)`` FLOPs per pair
  (QK^T again, dV, dP, dQ, dK: 2.5x the forward at ``d_qk = d_v``, as flash-attn's own
  ``benchmark_flash_attention.py`` counts it) at the same efficiency; its FLOPs are reported as
  the model's (twice the forward: no recomputation, as FlopCounterMode counts them).
  unfused (Megatron's core attention): ``S = layers x h / tp x sum L^2`` score elements (the full
  padded square, ``L^2 = 2 pairs - L``), each kernel at its own roofline
  ``max(flops / matmul FLOP/s, bytes / HBM bytes/s)``: forward QK^T (``2 d_qk`` FLOPs, 2 bytes
  per score), scale-mask-softmax (4), dropout with its 1-byte mask (5), PV (``2 d_v``, 2);
  backward dP, dV (``2 d_v`` each, 2 + 2), dropout (5), softmax (6), dQ, dK (``2 d_qk`` each,
  2 + 2): 13 bytes per score forward, 19 backward; plus q, k, v, o once per pass. Under the
  FSDP / DeepSpeed backends, Hugging Face's eager attention (transformers 4.28 ``OPTAttention``):
  QK^T (2), the mask add (4), the ``finfo.min`` clamp (4), the softmax upcast to fp32 (6), the
  cast back (6), PV (2); backward dP, dV (2 + 2), the cast (6), softmax (10), the clamp's
  ``maximum`` backward (22), dQ, dK (2 + 2): 24 bytes per score forward, 46 backward; and, per
  feature, the heads-first layout copies of q, k, v (``_shape``: ``transpose(1, 2).contiguous()``)
  and of the output back (``transpose(1, 2).reshape``), 4 bytes each, and the query scaling
  (``q_proj(x) * scaling``, 4 bytes per q feature): five kernels a layer, the same traffic again
  in the backward (the scaling's gradient, and each view's gradient reshaped out of the
  transposed layout);
- memory-bound elementwise kernels: the layers' norms, residual adds, rotary and activation
  (:mod:`rlperf.stages.shard`; bytes per element as the backend runs them,
  :mod:`rlperf.stages.elementwise`: Megatron's fused kernels, Hugging Face's eager ops under
  FSDP) and, on the last stage, the log-softmax over the logits (cast
  to fp32 once, as :mod:`rlperf.cost.memory` keeps them, then read twice: max, log-sum-exp);
- one kernel launch per kernel of the stage (roofline's additive launch term), a routed
  expert's GEMMs one per local expert (:attr:`StageShard.expert_gemm_launches`);
- the training backend's host time (``HardwareProfile.train_layer_overhead_s``, per layer
  and pass; the embedding and the LM head with its loss count as one layer each on their
  stages): ``host = (layers + [first stage] + [last stage]) x overhead``. The host issues the
  pass while the device runs it, so a pass takes ``max(host, device)`` with ``device = compute +
  tp/cp/ep communication``, or, with the profile's ``host_overlap_exponent`` ``k``, the smooth
  maximum ``(host^k + device^k)^(1/k)`` (the host runs ahead only between synchronizations, so
  near ``host = device`` each waits on the other part of the time), and then its pipeline send,
  which synchronizes the two (Megatron's p2p waits for the device);
- the host-device synchronizations inside the pass (:attr:`StageShard.host_syncs`: one per MoE
  layer and forward, where Megatron-Core's token dispatcher waits for the tokens-per-expert
  counts, :mod:`rlperf.stages.shard`): at a synchronization the host has caught up with the
  device, so the op it issues next reaches an idle device, and the host time of that op adds
  to the device time instead of hiding under it. With ``s`` synchronizations and the host's time
  per op ``h_op`` (the backend's per-layer figure spread evenly over the stage's kernels, as for
  the softmax fallback's ops), ``serial = s x h_op`` of the pass's host time is taken out of the
  overlap: ``(max or smooth max)(host - serial, device) + serial``. Device-bound, the pass takes
  ``device + serial``; host-bound, still ``host`` (each op waits for the host anyway); no MoE
  layer, no change. A backward has no synchronization of its own (it reuses the counts the
  forward left on the host); with full recompute its replayed forward has the forward's. Not
  counted: the device time the host waits on at the synchronization (the count copy's PCIe
  round trip: no figure).

Backward (host time: twice the forward's with full recompute, the forward's without) is twice
the forward (gradients w.r.t. inputs and weights, the ``3x`` of
:meth:`ModelSpec.train_flops`; both backward GEMMs of a weight have its forward's ``2mnk``, so
the same size factor); its weight traffic reads the weights once more and
read-modify-writes the gradient accumulators in ``grad_dtype``. Full recompute replays the
forward, selective recompute the attention core (Korthikanti et al. 2022).

Communication per micro-batch, each collective timed by :mod:`rlperf.cost.collectives` on the
group the rank order implies (tp innermost, then cp, then dp; ep carved from cp x dp; pp
outermost, as Megatron-Core orders its process groups):

- TP (Shoeybi et al. 2019, Megatron-LM §3): 2 all-reduces of the ``t x hidden`` activations per
  layer forward, 2 backward; with sequence parallelism each becomes a reduce-scatter plus an
  all-gather of the same size (Korthikanti et al. 2022 §4.2.2; same bytes on a ring); not
  overlapped. Vocab-parallel log-softmax adds 2 small all-reduces (max and sum, fp32 per token).
- CP ring (Liu et al. 2023, "Ring Attention"; Megatron-Core CP): per layer, ``cp - 1`` steps each
  passing a K/V block of ``t`` tokens to the next rank while attending to the current block; each
  step exposes ``max(0, send - attention_step)``. Backward passes K/V and dK/dV (twice the bytes).
  Ulysses (Jacobs et al. 2023, DeepSpeed-Ulysses): 4 all-to-alls per layer (q, k, v in; o out),
  the same 4 backward, not overlapped; k and v repeated up to ``cp`` heads where the model has
  fewer KV heads, and each tensor copied into send buffers and out of the received chunks
  (``ULYSSES_COPY_BYTES`` per element, memory bound, once per pass).
- EP (Megatron-Core MoE alltoall dispatcher): per MoE layer a dispatch and a combine all-to-all of
  the ``k`` routed copies, ``t x k x hidden`` per rank, not overlapped; same backward.
- PP: one send of the ``t x hidden`` boundary activations per micro-batch and model chunk
  (``/ tp`` with sequence parallelism); backward sends the gradient back.
- ZeRO-3 / FSDP: all-gather the stage's weights (compute dtype) once per forward and once per
  backward of every micro-batch, unit by unit (each layer, and the root unit), one collective of
  the unit's size each (its own latency; the stage's weights split evenly over its units;
  DeepSpeed's coordinator gathers submodule by submodule, ``gather_unit="module"``: one
  all-gather per linear projection, :meth:`LayoutCosts.gather_units`; under full recompute it
  releases a module after its recomputed forward unless the trace reuses it within
  ``stage3_max_reuse_distance`` parameters, and gathers it again for the backward,
  :meth:`LayoutCosts.regathered_modules`);
  reduce-scatter its gradients (``grad_dtype``) after every backward the same way (FSDP without
  ``no_sync``, as verl's actor does); ZeRO-2 under the FSDP / DeepSpeed backend reduce-scatters
  after every backward too (DeepSpeed reduces at every micro-step from stage 2; with
  ZeRO-Offload each micro-batch's gradient partition then crosses PCIe down and, to accumulate
  on the GPU, up), Megatron's distributed optimizer once per step. CPU-offloaded weights (ZeRO-Offload /
  FSDP ``CPUOffload``) cross PCIe on every pass the same way. Gathers are prefetched one unit
  (layer) ahead: the first unit's gather is exposed, the rest only where it outlasts the pass's
  compute; without ``prefetch_gathers`` every gather is exposed (DeepSpeed's coordinator
  prefetches at most ``min(stage3_max_live_parameters - parameters already gathered,
  stage3_prefetch_bucket_size)`` parameters, none once the live limit is below a module's
  parameters: ``PartitionedParameterCoordinator.fetch_sub_module``); the gradient
  reduce-scatter overlaps the backward the same way when ``overlap_grad_comm`` (its last
  bucket exposed), and is fully exposed otherwise.
- DeepSpeed's coalesced gathers (``gather_unit="module"``, ZeRO-3 over ``N > 1`` ranks;
  DeepSpeed ``v0.9.0`` ``partition_parameters.py``, the same at its master of February 2025,
  ``38327e07f``; :meth:`LayoutCosts.gather_copy_bytes`): a
  module with two or more partitioned parameters (a weight and a bias above
  ``persistence_threshold_params``, or LoRA's ``A`` and ``B`` beside the weight) is gathered
  through one flat buffer: ``all_gather_coalesced`` first ``torch.cat``'s the rank's shards into
  its slice of the buffer (read and write ``1/N`` of the module's elements), and the handle's
  ``wait()`` ``torch.cat``'s every parameter out of the gathered buffer into a tensor of its own
  (read and write all of them); a module with one partitioned parameter is gathered in place. Per
  gathered element ``2 b (1 + 1/N)`` HBM bytes (``b`` the compute dtype's), one kernel per
  parameter and one for the shards, at the elementwise roof, on the pass's own time: the
  coordinator waits on the handle when the module is needed, prefetched or not, and the compute
  stream waits for it (``fetch_sub_module``: ``current_stream().wait_stream``). A forward
  copies once and a backward once (under full recompute its replayed forward's copy is that
  one), plus what :meth:`LayoutCosts.regathered_modules` gathers again. Dense layers only (MoE
  and MLA modules are not listed, as for the re-gathers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from rlperf.memo import BoundedMemo
from rlperf.cost.lora import adapted_widths_per_layer, stage_adapter_params
from rlperf.cost.collectives import (
    CollectiveCost,
    CollectiveCosts,
    CommGroup,
    all_gather,
    all_reduce,
    costs_each,
    group_for,
    p2p_each,
    reduce_scatter,
)
from rlperf.cost.memory_activations import ACTIVATION_DTYPE
from rlperf.cost.memory_params import kv_heads_per_device
from rlperf.cost.roofline import ceilings, matmul_size_factor
from rlperf.errors import SpecError
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.hardware import Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.elementwise import kernels_for
from rlperf.stages.microbatch import MicroBatches
from rlperf.stages.shard import Head, StageShard, stage_shards
from rlperf.stages.softmax import FALLBACK_BYTES, FALLBACK_EXTRA_KERNELS, FUSED_BYTES, fused_softmax_available

COMPUTE_DTYPE = ACTIVATION_DTYPE  # mixed precision: matmuls and activations in bf16
_C = bytes_per(COMPUTE_DTYPE)
_FP32 = bytes_per("fp32")
LOGIT_PASSES_FORWARD = 3  # the fp32 logits are written once (cast) and read twice (max, log-sum-exp)
LOGIT_PASSES_BACKWARD = 2  # read the logits, write their gradient
LOGIT_FLOPS = 4  # per logit: compare, subtract, exp, add
# Ulysses (verl's ulysses.py, DeepSpeed-Ulysses): each tensor of an all-to-all is split along
# its head dimension into contiguous send buffers and the received chunks are concatenated: two
# copies, each reading and writing the bf16 element (2 x 4 bytes)
ULYSSES_COPY_BYTES = 8.0
# Unfused attention (Megatron core attention), HBM bytes per score element of each kernel.
# Forward: QK^T writes the scores (2); fused scale-mask-softmax reads and writes them (4); dropout
# reads, writes and stores its 1-byte mask (5); PV reads the probabilities (2).
UNFUSED_FORWARD_BYTES = np.array([2.0, 4.0, 5.0, 2.0])
# Backward: dP = dO V^T writes (2); dV = P^T dO reads P (2); dropout backward reads dP and the mask,
# writes (5); softmax backward reads the gradient and its output, writes (6); dQ = dS K and
# dK = dS^T Q each read dS (2 + 2).
UNFUSED_BACKWARD_BYTES = np.array([2.0, 2.0, 5.0, 6.0, 2.0, 2.0])
# Unfused attention under the FSDP / DeepSpeed backends: Hugging Face's eager attention
# (transformers 4.28 ``OPTAttention.forward``, the code DeepSpeed-Chat's release trains; Llama's
# eager attention of the time runs the same ops after scaling the scores), per score element.
# Forward: QK^T writes (2); ``+ attention_mask`` reads and writes (4); ``torch.max(.., finfo.min)``
# reads and writes (4); ``softmax(dtype=float32)`` reads fp16, writes fp32 (6); ``.to(float16)``
# reads fp32, writes fp16 (6); dropout at the config's ``attention_dropout`` 0 returns its input;
# PV reads the probabilities (2).
HF_EAGER_FORWARD_BYTES = np.array([2.0, 4.0, 4.0, 6.0, 6.0, 2.0])
# Backward (autograd, one node per forward op): dP writes (2); dV reads P (2); the cast's backward
# reads fp16, writes fp32 (6); softmax backward reads the fp32 gradient and output, writes fp16
# (10); ``maximum``'s backward (PyTorch derivatives.yaml: ``where(self == other, grad / 2,
# grad).masked_fill_(self < other, 0)``: compare 3, divide 4, where 7, compare 3, masked fill 5)
# 22; the mask add passes its gradient through (no kernel); dQ, dK read dS (2 + 2).
HF_EAGER_BACKWARD_BYTES = np.array([2.0, 2.0, 6.0, 10.0, 22.0, 2.0, 2.0])
# The same attention per feature of q, k, v and o (``OPTAttention``): ``_shape`` copies q, k and v
# into the heads-first layout (``view(...).transpose(1, 2).contiguous()``: read 2, write 2) and the
# output is copied back (``transpose(1, 2).reshape(bsz, tgt_len, embed_dim)``: 4); the query is
# scaled first (``q_proj(hidden_states) * self.scaling``: 4 more per q feature). Backward: the
# scaling's gradient (4 per q feature) and, for each copy, its view's gradient reshaped out of the
# transposed layout (4): the forward's bytes again. Five kernels a layer each way.
HF_EAGER_COPY_BYTES = 4.0
HF_EAGER_QUERY_SCALE_BYTES = 4.0
HF_EAGER_LAYOUT_KERNELS = 5
# The LoRA adapter path of an adapted linear (rlperf.cost.lora): HBM bytes per element of its
# input and of its output, ((GEMMs: in, out), (elementwise: in, out)); the rank-r intermediates
# (r per token) are left out. Forward: A reads x (2), B writes its output (2); ``* scaling`` reads
# and writes it (4), the add reads it and the frozen linear's output and writes the sum (6).
# Backward: the scaling's backward reads and writes the output gradient (4); B's data and weight
# gradients each read it (2 + 2); A's data gradient writes the input gradient (2) and its weight
# gradient reads x (2); the input gradient is added to the frozen linear's (6).
LORA_FORWARD_BYTES = ((2.0, 2.0), (0.0, 10.0))
LORA_BACKWARD_BYTES = ((4.0, 4.0), (6.0, 4.0))

Collective = Callable[[Cluster, float, CommGroup], CollectiveCost]


@dataclass(frozen=True)
class MicroBatchShapes:
    """What each micro-batch's cost depends on: its tokens and its causal attention pairs."""

    tokens: np.ndarray  # all sequences, before the cp split
    pairs: np.ndarray  # sum over sequences of L (L + 1) / 2 (per layer and head)
    sequences: np.ndarray  # sequences in the micro-batch
    longest: np.ndarray  # its longest sequence (the padded score matrix is longest x longest)

    @classmethod
    def of(cls, plan: MicroBatches, padded: bool = False) -> MicroBatchShapes:
        """Every micro-batch of ``plan``, in its order; ``padded``: each sequence as long as the
        micro-batch's longest ``L`` (``L`` tokens and ``L (L + 1) / 2`` causal pairs each).
        One instance per plan (by identity; plans are immutable): a batch's forward passes and
        its update cost the same plan, and a layout's passes are kept by their shapes
        (:meth:`LayoutCosts.forward`)."""
        key = (id(plan), padded)
        hit = _SHAPES.get(key)
        if hit is not None and hit[0] is plan:
            return hit[1]
        shapes = cls._of(plan, padded)
        _SHAPES.put(key, (plan, shapes))
        return shapes

    @classmethod
    def _of(cls, plan: MicroBatches, padded: bool) -> MicroBatchShapes:
        if plan.sizes.size == 0:
            return cls(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64))
        most = plan.microbatch_longest()
        if padded:
            longest = most.astype(np.float64)
            return cls(plan.microbatch_tokens(padded=True), plan.sizes * longest * (longest + 1) / 2, plan.sizes, most)
        lengths = plan.lengths.astype(np.float64)
        # Integer-valued pair counts: exact in float64 (and in any order) below 2^53.
        pairs = np.add.reduceat(lengths * (lengths + 1) / 2, plan.starts)
        return cls(plan.microbatch_tokens(), pairs, plan.sizes, most)

    @classmethod
    def joined(cls, parts: Sequence[MicroBatchShapes]) -> MicroBatchShapes:
        """The micro-batches of ``parts`` one after the other (part after part, in order)."""
        return cls(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("tokens", "pairs", "sequences", "longest")))

    @cached_property
    def distinct_tokens(self) -> tuple[np.ndarray, np.ndarray]:
        """(the distinct token counts, sorted; the index of each micro-batch's among them)."""
        distinct, where = np.unique(self.tokens, return_inverse=True)
        return distinct, where

    @classmethod
    def single(cls, seq_tokens: np.ndarray) -> MicroBatchShapes:
        """One micro-batch of the sequences ``seq_tokens``."""
        lengths = seq_tokens.astype(np.float64)
        return cls(np.array([seq_tokens.sum()]), np.array([(lengths * (lengths + 1) / 2).sum()]),
                   np.array([seq_tokens.size]), np.array([seq_tokens.max()]))


@dataclass(frozen=True)
class PassCost:
    """One pass (forward, or backward incl. recompute) of each micro-batch on one device of a
    stage (arrays, one entry per micro-batch)."""

    flops: np.ndarray
    hbm_bytes: np.ndarray
    body_s: np.ndarray  # roofline time of the kernels, no launch cost (what work counts)
    launch_s: np.ndarray  # kernel launches
    host_s: np.ndarray  # the backend's host time for the pass (layers x HardwareProfile.train_layer_overhead_s)
    host_serial_s: np.ndarray  # the part of host_s issued right after a host-device synchronization (not overlapped)
    host_overlap: float | None  # HardwareProfile.host_overlap_exponent (None: max(host, device))
    attention_s: np.ndarray  # the attention part of body_s
    tp_s: np.ndarray
    cp_s: np.ndarray
    ep_s: np.ndarray
    pp_s: np.ndarray
    comm_bytes: np.ndarray  # sent by this device

    # The derived times below are read several times per pass (a stage model sums them, the
    # gathers overlap the compute): computed once each (the fields are never reassigned).

    @cached_property
    def compute_s(self) -> np.ndarray:
        compute: np.ndarray = self.body_s + self.launch_s
        return compute

    @cached_property
    def device_s(self) -> np.ndarray:
        """The pass's kernels and in-stage collectives (tp, cp, ep) on the device, back to back."""
        device: np.ndarray = self.compute_s + self.tp_s + self.cp_s + self.ep_s
        return device

    @cached_property
    def host_exposed_s(self) -> np.ndarray:
        """Host time the device waits for: the host issues the pass while the device runs it
        (the collectives are asynchronous to it), so only what it needs beyond that shows:
        ``max(host, device) - device``, or with the profile's overlap exponent ``k`` the smooth
        maximum ``(host^k + device^k)^(1/k) - device``; the host time issued right after a
        synchronization (``host_serial_s``) is not overlapped: ``max(host - serial, device) +
        serial - device`` (smooth: ``((host - serial)^k + device^k)^(1/k) + serial - device``)."""
        device = self.device_s
        if not np.any(self.host_s > 0):
            return np.zeros(device.shape)
        serial = self.host_serial_s
        free = self.host_s - serial  # the host time that can run ahead of the device
        if self.host_overlap is None:
            exposed: np.ndarray = np.maximum(0.0, free - device) + serial
            return exposed
        k = self.host_overlap
        blended: np.ndarray = np.maximum(0.0, (free**k + device**k) ** (1.0 / k) + serial - device)
        return blended

    @cached_property
    def time_s(self) -> np.ndarray:
        """``max(host, device)`` (or its smooth form), then the pipeline send, which
        synchronizes host and device."""
        time: np.ndarray = self.device_s + self.host_exposed_s + self.pp_s
        return time


@dataclass(frozen=True)
class Roof:
    """Kernels of one kind for each micro-batch: FLOPs, HBM bytes, roofline time (no launch)."""

    flops: np.ndarray
    bytes: np.ndarray
    time_s: np.ndarray


@dataclass(frozen=True)
class Exposed:
    """A communication's full time, the part not hidden behind compute (per micro-batch when
    the compute is), and its bytes/device."""

    time_s: float
    exposed_s: np.ndarray  # shaped as the compute it hides behind (0-d for a scalar)
    bytes_sent: float


# The kinds of a pass's communication: tp (the layers' activations), tp_head (vocab-parallel
# log-softmax, forward only), ring (one ring-attention step of one layer: its exposure depends on
# the attention time), a2a (Ulysses), ep, pp.
COMM_KINDS = ("tp", "tp_head", "ring", "a2a", "ep", "pp")


@dataclass(frozen=True)
class CommUnits:
    """(time, bytes sent) of one pass's communication per kind, for one device, at each of
    several per-device token counts: ``table[k]`` is kind ``COMM_KINDS[k]``'s rows (time,
    bytes), one column per count (one table, so that spreading it over micro-batches is one
    indexing)."""

    table: np.ndarray  # (kind, time | bytes, count)

    def at(self, index: np.ndarray) -> CommUnits:
        """The columns ``index`` (counts, in that order)."""
        return CommUnits(self.table[:, :, index])

    def by_kind(self) -> dict[str, np.ndarray]:
        return dict(zip(COMM_KINDS, self.table))


def _total(ops: list[CollectiveCosts], times: float) -> np.ndarray:
    """(time, bytes) rows of running ``ops`` in sequence, ``times`` times, at each size."""
    return np.stack((times * sum(o.time_s for o in ops), times * sum(o.bytes_sent_per_rank for o in ops)))


def overlap(comm_s: float, compute_s: np.ndarray | float, units: int, bytes_sent: float) -> Exposed:
    """Prefetched/bucketed communication under compute: the first (or last) of ``units`` equal
    pieces cannot overlap, the rest hides behind ``compute_s`` (one entry per micro-batch)."""
    if comm_s <= 0:
        return Exposed(0.0, np.zeros(np.shape(compute_s)), bytes_sent)
    first = comm_s / max(units, 1)
    return Exposed(comm_s, np.asarray(first + np.maximum(0.0, comm_s - first - compute_s)), bytes_sent)


class LayoutCosts:
    """Cost functions of a model under a training layout on a cluster (groups resolved once)."""

    @classmethod
    def of(cls, model: ModelSpec, cluster: Cluster, layout: TrainLayout, head: Head = "logprobs") -> LayoutCosts:
        """The shared instance for these arguments (built on first use). A planner costs one
        layout on one pool for many batches (the fast estimate's, every simulated iteration's,
        the what-ifs'), and an instance keeps the collectives it has costed: its caches are pure
        functions of its arguments, so sharing it changes no result."""
        ident = (id(model), id(cluster), id(layout), head)
        hit = _BY_IDENTITY.get(ident)
        if hit is not None and hit[0] is model and hit[1] is cluster and hit[2] is layout:
            return hit[3]
        key = (model, cluster.model_dump_json(), layout, head)
        costs = _LAYOUT_COSTS.get_or_make(key, lambda: cls(model, cluster, layout, head))
        _BY_IDENTITY.put(ident, (model, cluster, layout, costs))
        return costs

    def __init__(self, model: ModelSpec, cluster: Cluster, layout: TrainLayout, head: Head = "logprobs") -> None:
        if layout.world_size > cluster.num_gpus:
            raise SpecError(
                "layout", f"needs {layout.world_size} GPUs (dp*tp*pp*cp), the cluster has {cluster.num_gpus}"
            )
        self.model, self.cluster, self.layout = model, cluster, layout
        self.shards = stage_shards(model, layout.tp, layout.pp, layout.ep, head, layout.sequence_parallel, layout.expert_tp,
                                   kernels_for(layout.backend))
        tp, cp, dp, ep = layout.tp, layout.cp, layout.dp, layout.ep
        self.tp_group = group_for(cluster, tp)
        self.cp_group = group_for(cluster, cp, tp)
        self.ep_group = group_for(cluster, ep, layout.expert_tp)  # etp innermost, then ep
        self.shard_group = group_for(cluster, dp * cp, tp)
        self.expert_shard_group = group_for(cluster, layout.expert_shard_degree, layout.expert_shards)
        self.pp_same_node = group_for(cluster, layout.pp, tp * cp * dp).num_nodes == 1
        self.cp_same_node = self.cp_group.num_nodes == 1
        per_pair = 2.0 * model.num_heads * (model.q_head_dim + model.v_head_dim) / tp
        self._attn_flops_per_pair_layer = per_pair
        # FlashAttention's backward recomputes the scores (QK^T) in every tile, then dV, dP, dQ, dK:
        # 3 GEMMs over d_qk and 2 over d_v (forward: 1 and 1), 2.5x the forward at d_qk = d_v
        self._flash_backward_flops_per_pair_layer = 2.0 * model.num_heads * (3 * model.q_head_dim + 2 * model.v_head_dim) / tp
        self._comm_cache: dict[tuple[int, bytes], CommUnits] = {}
        # per stage, the last micro-batch plan's spread collectives and GEMM time (its backward follows)
        self._spread_memo: dict[int, tuple[MicroBatchShapes, dict[str, np.ndarray]]] = {}
        self._gemm_memo: dict[int, tuple[MicroBatchShapes, np.ndarray]] = {}
        self._tokens_memo: tuple[MicroBatchShapes | None, np.ndarray] = (None, np.zeros(0))
        self._forwards: BoundedMemo[tuple[int, int], tuple[MicroBatchShapes, PassCost]] = BoundedMemo(4)
        self._dp_comm: dict[tuple[int, str], tuple[float, float]] = {}
        self._copy_memo: dict[tuple[int, bool], tuple[float, int]] = {}  # gather_copy_bytes per (stage, regathered)
        self._matmul = ceilings(cluster, layout.compute_dtype, "matmul")  # fp8 training: FP8 GEMMs
        self._gemms = {  # per stage: weight, rows per token, count of each distinct GEMM (columns)
            sh.stage: tuple(np.asarray(x, dtype=np.float64)[:, None]
                            for x in (sh.gemm_weights, sh.gemm_rows_per_token, sh.gemm_counts))
            for sh in self.shards
        }
        # LoRA adapters per device of each stage (0 without LoRA: rlperf.cost.lora)
        self._adapters = {sh.stage: stage_adapter_params(model, layout, sh.num_layers) for sh in self.shards}
        # and the input and output widths of the stage's adapted linears, summed (per token)
        widths = adapted_widths_per_layer(model, layout.tp) if layout.lora_rank else (0.0, 0.0)
        self._adapter_widths = {sh.stage: (sh.num_layers * widths[0], sh.num_layers * widths[1]) for sh in self.shards}
        self._attention_roof = ceilings(cluster, COMPUTE_DTYPE, "attention")
        self._elementwise_roof = ceilings(cluster, COMPUTE_DTYPE, "elementwise")
        self._host_per_layer_s = cluster.profile.train_layer_overhead_s(layout.backend)
        # unfused attention under FSDP / DeepSpeed: Hugging Face's eager attention module
        self._hf_eager_copies = layout.attention_kernel == "unfused" and layout.backend != "megatron"
        # unfused attention: FLOPs per score element of each forward / backward kernel (below)
        qk, v = 2.0 * model.q_head_dim, 2.0 * model.v_head_dim
        self._unfused = {
            False: (np.array([qk, 0.0, 0.0, v]), UNFUSED_FORWARD_BYTES),
            True: (np.array([v, v, 0.0, 0.0, qk, qk]), UNFUSED_BACKWARD_BYTES),
        } if layout.backend == "megatron" else {
            False: (np.array([qk, 0.0, 0.0, 0.0, 0.0, v]), HF_EAGER_FORWARD_BYTES),
            True: (np.array([v, v, 0.0, 0.0, 0.0, qk, qk]), HF_EAGER_BACKWARD_BYTES),
        }

    # ------------------------------------------------------------------ compute
    def _tokens(self, mb: MicroBatchShapes) -> np.ndarray:
        """Tokens per device of each of ``mb`` (a pass asks several times: the last one kept)."""
        if self._tokens_memo[0] is not mb:
            self._tokens_memo = (mb, mb.tokens / self.layout.cp)
        return self._tokens_memo[1]

    def forward(self, shard: StageShard, mb: MicroBatchShapes, comm_too: bool = True) -> PassCost:
        """Forward of each of ``mb`` on one device of ``shard``'s stage, with its communication
        (``comm_too=False``: none, its fields zero; a depth reads only the compute). The last few
        with communication are kept by the shapes' identity: a batch's forward-only pass and its update run the
        same forward (a PassCost is never changed once made)."""
        if not comm_too:  # a depth's sequence alone: asked once
            return self._forward(shard, mb, comm_too)
        key = (shard.stage, id(mb))
        hit = self._forwards.get(key)
        if hit is not None and hit[0] is mb:
            return hit[1]
        cost = self._forward(shard, mb, comm_too)
        self._forwards.put(key, (mb, cost))
        return cost

    def _forward(self, shard: StageShard, mb: MicroBatchShapes, comm_too: bool) -> PassCost:
        cl, t = self.cluster, self._tokens(mb)
        weights = shard.params * _C
        lin = self._linear(shard, mb, 1, weights + shard.matmul_io_per_token * t * _C)
        lin = self._with_adapters(shard, lin, t, backward=False)
        attn = self._attention(shard, mb, backward=False)
        elem = self._elementwise(shard, t, LOGIT_PASSES_FORWARD, 1)
        copy_bytes, copy_kernels = self.gather_copy_bytes(shard)
        body = lin.time_s + attn.time_s + elem.time_s + copy_bytes / self._elementwise_roof[1]
        launch, host = self._dispatch(shard, mb)
        launch = launch + copy_kernels * cl.profile.kernel_launch_s
        comm = self._comm(shard, mb, attn.time_s, forward=True, tp_passes=1, ring_passes=1,
                          a2a_passes=1) if comm_too else _no_comm(t)
        return PassCost(
            flops=lin.flops + attn.flops + elem.flops,
            hbm_bytes=lin.bytes + attn.bytes + elem.bytes + copy_bytes,
            body_s=body, launch_s=launch, host_s=host, host_serial_s=np.full(t.shape, self._sync_host_s(shard)),
            host_overlap=cl.profile.host_overlap_exponent,
            attention_s=attn.time_s, **comm,
        )

    def backward(self, shard: StageShard, mb: MicroBatchShapes, fwd: PassCost, comm_too: bool = True) -> PassCost:
        """Backward of each of ``mb`` (2x the forward's work; the layout's recompute replayed
        first); ``fwd`` is their forward (``comm_too``: as in :meth:`forward`)."""
        cl, t, lay = self.cluster, self._tokens(mb), self.layout
        g = bytes_per(lay.grad_dtype)
        frozen = self._adapters[shard.stage] > 0  # LoRA: no weight gradients for the base weights
        weights = shard.params * (_C + (0 if frozen else 2 * g))  # read weights for dgrad; accumulate weight grads
        lin = self._linear(shard, mb, 1 if frozen else 2, weights + (1 if frozen else 2) * shard.matmul_io_per_token * t * _C)
        lin = self._with_adapters(shard, lin, t, backward=True)
        attn = self._attention(shard, mb, backward=True)
        elem = self._elementwise(shard, t, LOGIT_PASSES_BACKWARD, 2)
        flops = lin.flops + attn.flops + elem.flops
        hbm = lin.bytes + attn.bytes + elem.bytes
        body = lin.time_s + attn.time_s + elem.time_s
        # the backward's gather copies out (under full recompute the replayed forward's copy, in
        # fwd, is that one), and the modules gathered again after the recomputed forward
        copy_bytes, copy_kernels = self.gather_copy_bytes(shard, regathered=lay.recompute == "full")
        hbm, body = hbm + copy_bytes, body + copy_bytes / self._elementwise_roof[1]
        launch, host = self._dispatch(shard, mb)
        launch = 2 * launch + copy_kernels * cl.profile.kernel_launch_s
        attention_s = attn.time_s
        serial = np.zeros(t.shape)  # the backward's own ops wait on nothing (shard.host_syncs)
        if lay.recompute == "full":
            flops, hbm, body, launch = flops + fwd.flops, hbm + fwd.hbm_bytes, body + fwd.body_s, launch + fwd.launch_s
            host += fwd.host_s
            serial = fwd.host_serial_s  # the replayed forward synchronizes as the forward did
            attention_s = attention_s + fwd.attention_s
        elif lay.recompute == "selective":
            attn_f = self._attention(shard, mb, backward=False)
            flops, hbm, body = flops + attn_f.flops, hbm + attn_f.bytes, body + attn_f.time_s
            attention_s = attention_s + attn_f.time_s
        replay = 1 if lay.recompute == "full" else 0
        comm = self._comm(
            shard, mb, attention_s, forward=False, tp_passes=1 + replay,
            ring_passes=2 + (1 if lay.recompute != "none" else 0), a2a_passes=1 + replay,
        ) if comm_too else _no_comm(t)
        return PassCost(
            flops=flops, hbm_bytes=hbm, body_s=body, launch_s=launch, host_s=host, host_serial_s=serial,
            host_overlap=cl.profile.host_overlap_exponent, attention_s=attention_s, **comm
        )

    def _host_units(self, shard: StageShard) -> int:
        """Layer-equivalents the host dispatches in one pass of ``shard``'s stage: its layers, plus
        the embedding on the first stage and the LM head with its loss on the last."""
        return shard.num_layers + (1 if shard.stage == 0 else 0) + (1 if shard.stage == self.layout.pp - 1 else 0)

    def _kernels(self, shard: StageShard) -> int:
        """Kernels of one forward through ``shard``'s stage with the fused softmax: the shard's
        count (attention core as one kernel), plus the unfused core's others in every layer."""
        core = len(self._unfused[False][1]) - 1 if self.layout.attention_kernel == "unfused" else 0
        if self._hf_eager_copies:
            core += HF_EAGER_LAYOUT_KERNELS
        return shard.kernels + core * shard.num_layers

    def _fallback(self, mb: MicroBatchShapes) -> np.ndarray:
        """1.0 for each micro-batch whose unfused attention falls back to the backend's
        unfused softmax (:mod:`rlperf.stages.softmax`), else 0.0."""
        if self.layout.attention_kernel != "unfused":
            return np.zeros(mb.tokens.shape)
        heads = self.model.num_heads // self.layout.tp
        fused = fused_softmax_available(self.layout.backend, mb.sequences, heads, mb.longest)
        return np.where(fused, 0.0, 1.0)

    def _host_per_kernel_s(self, shard: StageShard) -> float:
        """The host's time per op in ``shard``'s stage: the backend's per-layer overhead spread
        evenly over the layers' kernels (0 without layers or a figure); a grouped GEMM is one op
        (Transformer Engine launches its per-expert GEMMs from one C++ call)."""
        kernels = self._kernels(shard)
        return self._host_per_layer_s * shard.num_layers / kernels if kernels else 0.0

    def _sync_host_s(self, shard: StageShard) -> float:
        """Host time of one forward through ``shard``'s stage that cannot overlap the device:
        the op issued after each of its host-device synchronizations (module docstring),
        ``host_syncs x`` :meth:`_host_per_kernel_s`."""
        return shard.host_syncs * self._host_per_kernel_s(shard)

    def _dispatch(self, shard: StageShard, mb: MicroBatchShapes) -> tuple[np.ndarray, np.ndarray]:
        """(launch, host) time of one forward of each of ``mb`` through ``shard``'s stage: its
        kernels, and the routed experts' GEMMs one per local expert, at ``kernel_launch_s``; the
        backend's host time per layer-equivalent, plus, where
        the softmax falls back, its extra ops at the host's time per kernel of a layer (the
        layer's overhead spread evenly over its kernels)."""
        prof, n = self.cluster.profile, shard.num_layers
        kernels = self._kernels(shard)
        extra = FALLBACK_EXTRA_KERNELS * n * self._fallback(mb)
        launch: np.ndarray = (kernels + extra + shard.expert_gemm_launches) * prof.kernel_launch_s
        host: np.ndarray = self._host_units(shard) * self._host_per_layer_s + extra * self._host_per_kernel_s(shard)
        return launch, host

    def _linear(self, shard: StageShard, mb: MicroBatchShapes, passes: int, num_bytes: np.ndarray) -> Roof:
        """The stage's weight matmuls over ``t`` tokens per device, ``passes`` times (1 forward;
        2 backward: data and weight gradients): each distinct GEMM ``g`` (``count_g`` of them,
        ``rows_g = rows per token x t``, weight ``w_g``) takes ``2 rows_g w_g / (C f(2 rows_g w_g))``
        of compute, ``C`` the large-GEMM FLOP/s; the traffic ``num_bytes`` at HBM bandwidth
        (``t``: the tokens per device of ``mb``)."""
        t = self._tokens(mb)
        flops = 2 * passes * shard.matmul_params_per_token * t
        compute_s = passes * self._gemm_flops_at_rate(shard, mb) / self._matmul[0]
        return Roof(flops, num_bytes, np.maximum(compute_s, num_bytes / self._matmul[1]))

    def _gemm_flops_at_rate(self, shard: StageShard, mb: MicroBatchShapes) -> np.ndarray:
        """``sum_g count_g work_g / f(work_g)`` for each of ``mb`` (one pass of the stage's
        GEMMs, in large-GEMM FLOPs): forward and backward share it (memoized by ``mb``)."""
        hit = self._gemm_memo.get(shard.stage)
        if hit is not None and hit[0] is mb:
            return hit[1]
        w, rows_per_token, count = self._gemms[shard.stage]
        work = 2 * w * rows_per_token * self._tokens(mb)[None, :]  # (gemm, micro-batch)
        total: np.ndarray = (count * work / matmul_size_factor(self.cluster.profile, work)).sum(axis=0)
        self._gemm_memo[shard.stage] = (mb, total)
        return total

    def _with_adapters(self, shard: StageShard, lin: Roof, t: np.ndarray, backward: bool) -> Roof:
        """``lin`` plus the LoRA adapter path of every adapted linear, op by op (rlperf.cost.lora):
        its two rank-``r`` GEMMs (2 FLOPs per adapter parameter and token forward, 4 backward) at
        ``max(FLOPs / matmul rate, their activation bytes / HBM)``, and the scaling and the add as
        elementwise passes (``LORA_*_BYTES`` per input and output element)."""
        adapters = self._adapters[shard.stage]
        if not adapters:
            return lin
        flops = (4.0 if backward else 2.0) * adapters * t
        w_in, w_out = self._adapter_widths[shard.stage]
        (g_in, g_out), (e_in, e_out) = LORA_BACKWARD_BYTES if backward else LORA_FORWARD_BYTES
        gemm_bytes = (g_in * w_in + g_out * w_out) * t
        elem_bytes = (e_in * w_in + e_out * w_out) * t
        gemm_s = np.maximum(flops / self._matmul[0], gemm_bytes / self._matmul[1])
        return Roof(lin.flops + flops, lin.bytes + gemm_bytes + elem_bytes,
                    lin.time_s + gemm_s + elem_bytes / self._elementwise_roof[1])

    def _elementwise(self, shard: StageShard, t: np.ndarray, logit_passes: int, layer_factor: int) -> Roof:
        """Memory-bound kernels: the layers' norms, residual adds, rotary and activation
        (``layer_factor`` x their forward traffic), ``logit_passes`` over the fp32 logits, and
        Ulysses' copies around its all-to-alls (one set per pass: the backward's all-to-alls move
        the gradients of the same tensors)."""
        logits = t * shard.vocab_per_device
        copies = ULYSSES_COPY_BYTES * self._ulysses_elements(shard) * shard.num_layers
        num_bytes = logit_passes * logits * _FP32 + (layer_factor * shard.elementwise_bytes_per_token + copies) * t
        return _roof(LOGIT_FLOPS * logits, num_bytes, self._elementwise_roof)

    def _ulysses_elements(self, shard: StageShard) -> float:
        """Features of q, k, v and o per token that one Ulysses layer moves through its
        all-to-alls (0 without Ulysses): k and v are repeated up to ``cp`` heads where the model
        has fewer KV heads per rank (verl's Ulysses patch repeats them so that each rank gets
        whole heads); MLA's per-head keys and values as the stage's attention traffic."""
        lay, m = self.layout, self.model
        if not lay.ulysses or not shard.num_layers:
            return 0.0
        if m.mla is not None:
            return shard.attention_io_per_token / shard.num_layers
        kv = kv_heads_per_device(m, lay.tp)
        kv_moved = kv * max(lay.cp // kv, 1)
        return (2 * m.num_heads / lay.tp + 2 * kv_moved) * m.head_dim

    def _attention(self, shard: StageShard, mb: MicroBatchShapes, backward: bool) -> Roof:
        """The stage's attention core for each of ``mb``, forward or backward (module docstring):
        flash at the attention roof (backward twice the forward), or unfused kernel by kernel."""
        t = self._tokens(mb)
        if self.layout.attention_kernel == "flash":
            flops = shard.num_layers * self._attn_flops_per_pair_layer * mb.pairs / self.layout.cp
            passes = 2 if backward else 1  # backward: reads q, k, v, o, dO, writes dq, dk, dv
            num_bytes = passes * shard.attention_io_per_token * t * _C
            if not backward:
                return _roof(flops, num_bytes, self._attention_roof)
            # the model's FLOPs (2x the forward, as FlopCounterMode counts them); the time also
            # runs the scores' recomputation
            run = shard.num_layers * self._flash_backward_flops_per_pair_layer * mb.pairs / self.layout.cp
            return Roof(2 * flops, num_bytes, _roof(run, num_bytes, self._attention_roof).time_s)
        # score elements: every (query, key) of the padded square, per head on this device and layer
        scores = shard.num_layers * self.model.num_heads / self.layout.tp * (2 * mb.pairs - mb.tokens) / self.layout.cp
        flops_per, bytes_per_score = self._unfused[backward]
        flops = flops_per[:, None] * scores[None, :]  # (kernel, micro-batch)
        num_bytes = bytes_per_score[:, None] * scores[None, :]
        time = np.maximum(flops / self._matmul[0], num_bytes / self._matmul[1]).sum(axis=0)
        io = shard.attention_io_per_token * t * _C * (2 if backward else 1)  # q, k, v, o (and grads)
        if self._hf_eager_copies:  # Hugging Face's layout copies and query scaling, each pass
            q = shard.num_layers * self.model.num_heads / self.layout.tp * self.model.q_head_dim
            io = io + (HF_EAGER_COPY_BYTES * shard.attention_io_per_token + HF_EAGER_QUERY_SCALE_BYTES * q) * t
        # the softmax's PyTorch fallback where the fused kernel is unavailable (memory bound)
        io = io + (FALLBACK_BYTES[backward] - FUSED_BYTES[backward]) * scores * self._fallback(mb)
        return Roof(flops.sum(axis=0), num_bytes.sum(axis=0) + io, time + io / self._matmul[1])

    # ------------------------------------------------------------------ communication
    def _units(self, shard: StageShard, t: np.ndarray) -> CommUnits:
        """Per-pass communication of ``t`` tokens per device (each of them) on ``shard``'s stage,
        every collective costed at all sizes in one pass (cached: it depends on nothing else,
        and forward and backward share it)."""
        key = (shard.stage, t.tobytes())
        hit = self._comm_cache.get(key)
        if hit is not None:
            return hit
        lay, cl, d = self.layout, self.cluster, self.model.hidden_size
        tp = head = ring = a2a = ep = pp = np.zeros((2, t.size))
        if lay.tp > 1:
            act = t * d * _C
            if lay.sequence_parallel:
                ops = [costs_each("reduce_scatter", cl, act, self.tp_group), costs_each("all_gather", cl, act, self.tp_group)]
            else:
                ops = [costs_each("all_reduce", cl, act, self.tp_group)] * 2
            tp = _total(ops, shard.num_layers)  # two per layer
            if shard.vocab_per_device:  # vocab-parallel log-softmax: max and sum, fp32 per token
                head = _total([costs_each("all_reduce", cl, t * _FP32, self.tp_group)], 2)
        if shard.num_layers:
            if lay.ring_attention:
                send = p2p_each(cl, t * shard.ring_kv_per_token * _C, self.cp_same_node)
                ring = np.stack((send.time_s, send.bytes_sent_per_rank))
            elif lay.ulysses:
                moved = self._ulysses_elements(shard)  # q, k, v in and o out: 4 all-to-alls a layer
                a2a = _total([costs_each("all_to_all", cl, t * moved / 4 * _C, self.cp_group)], 4 * shard.num_layers)
        if lay.ep > 1 and shard.num_moe_layers:
            moe = self.model.moe
            assert moe is not None
            ep = _total([costs_each("all_to_all", cl, t * moe.experts_per_token * d * _C, self.ep_group)],
                        2 * shard.num_moe_layers)
        if lay.pp > 1:
            boundary = t * d * _C / (lay.tp if lay.sequence_parallel else 1)
            pp = _total([p2p_each(cl, boundary, self.pp_same_node)], lay.virtual_stages)
        units = CommUnits(np.stack((tp, head, ring, a2a, ep, pp)))
        self._comm_cache[key] = units
        return units

    def prime(self, plans: Sequence[MicroBatchShapes]) -> None:
        """Cost every shard's collectives at all the distinct token counts of ``plans`` in one
        pass per shard and file each plan's share where its passes look for it: a stage model
        costs several micro-batch plans (a step's mini-batches, the longest sequence alone), and
        each collective's cost at one size does not depend on the other sizes costed with it
        (elementwise formulas), so this changes no figure, only the number of passes."""
        lay = self.layout
        if lay.tp == lay.cp == lay.ep == lay.pp == 1:  # _comm costs nothing per size here
            return
        sizes = [mb.distinct_tokens[0] / lay.cp for mb in plans]
        union = np.unique(np.concatenate(sizes)) if sizes else np.zeros(0)
        if union.size == 0:
            return
        for shard in self.shards:
            units = self._units(shard, union)
            for t in sizes:
                key = (shard.stage, t.tobytes())
                if key not in self._comm_cache:
                    self._comm_cache[key] = units.at(np.searchsorted(union, t))

    def _spread(self, shard: StageShard, mb: MicroBatchShapes) -> dict[str, np.ndarray]:
        """Per kind of :class:`CommUnits`: rows (time, bytes), one column per micro-batch of
        ``mb``. The collectives' times are not linear in the bytes (algorithm choice): each
        distinct per-device token count is costed (all at once), then spread over the
        micro-batches; a pass's forward and backward share it (memoized by ``mb``)."""
        hit = self._spread_memo.get(shard.stage)
        if hit is not None and hit[0] is mb:
            return hit[1]
        tokens, where = mb.distinct_tokens
        u = self._units(shard, tokens / self.layout.cp).at(where).by_kind()
        self._spread_memo[shard.stage] = (mb, u)
        return u

    def _comm(
        self, shard: StageShard, mb: MicroBatchShapes, attention_s: np.ndarray, *, forward: bool, tp_passes: int,
        ring_passes: int, a2a_passes: int,
    ) -> dict[str, np.ndarray]:
        """Per-micro-batch communication times and bytes of one pass (``tp_s``, ``cp_s``,
        ``ep_s``, ``pp_s``, ``comm_bytes``: PassCost's fields)."""
        lay, n = self.layout, shard.num_layers
        t = self._tokens(mb)
        if lay.tp == lay.cp == lay.ep == lay.pp == 1:  # nothing to send: skip the per-size units
            return _no_comm(t)
        u = self._spread(shard, mb)
        cp_s = cp_b = np.zeros(t.shape)
        if lay.cp > 1 and n:
            if lay.ring_attention:
                # each of the cp - 1 steps hides its send behind one block of attention
                step = np.maximum(0.0, u["ring"][0] - attention_s / n / lay.cp)
                cp_s = ring_passes * n * (lay.cp - 1) * step
                cp_b = ring_passes * n * (lay.cp - 1) * u["ring"][1]
            else:
                cp_s, cp_b = a2a_passes * u["a2a"][0], a2a_passes * u["a2a"][1]
        head = 1 if forward else 0
        sent = tp_passes * u["tp"][1] + head * u["tp_head"][1] + cp_b + a2a_passes * u["ep"][1] + u["pp"][1]
        return {
            "tp_s": tp_passes * u["tp"][0] + head * u["tp_head"][0], "cp_s": cp_s, "ep_s": a2a_passes * u["ep"][0],
            "pp_s": u["pp"][0], "comm_bytes": sent,
        }

    # ------------------------------------------------------------------ ZeRO / offload
    def resident_params(self, shard: StageShard) -> float:
        """Parameters of ``shard`` whose states live on one device under ZeRO (any stage >= 1)."""
        lay = self.layout
        return shard.dense_params / lay.shard_degree + shard.expert_params / lay.expert_shard_degree

    def trained_params(self, shard: StageShard) -> float:
        """Parameters of ``shard`` the optimizer updates on one device: all of them, ZeRO-sharded
        from stage 1 (:meth:`resident_params`), or the LoRA adapters only."""
        lay, adapters = self.layout, self._adapters[shard.stage]
        if adapters:
            return adapters / (lay.shard_degree if lay.zero_stage >= 1 else 1)
        return self.resident_params(shard) if lay.zero_stage >= 1 else shard.params

    def weight_gather(self, shard: StageShard, compute_s: np.ndarray, backward: bool = False) -> Exposed:
        """ZeRO-3 all-gather (and/or CPU-offload upload) of the stage's weights for one pass of
        each micro-batch (``compute_s``: that pass's compute); a ``backward`` pass also gathers
        again what DeepSpeed released after the recomputed forward (:meth:`regathered_modules`)."""
        t, sent = self._dp_traffic(shard, "weight_gather")
        units = self.gather_units(shard)
        if backward and self.regathered_modules(shard)[0]:
            t2, sent2 = self._dp_traffic(shard, "regather")
            t, sent, units = t + t2, sent + sent2, units + self.regathered_modules(shard)[0] * shard.num_layers
        if not self.layout.prefetch_gathers and self.layout.zero_stage >= 3:
            return Exposed(t, np.full(np.shape(compute_s), t), sent)
        return overlap(t, compute_s, units, sent)

    def regathered_modules(self, shard: StageShard) -> tuple[int, float]:
        """(modules, parameters on the rank) of one layer that DeepSpeed's coordinator gathers a
        second time in a backward with full recompute (``gather_unit="module"``, ZeRO-3; else
        (0, 0)). The recomputed forward of a layer fetches its modules ``m_1 .. m_k`` in order
        and the backward then fetches ``m_k .. m_1``; after each use the coordinator keeps a
        module's parameters only if the trace uses them again within ``max_reuse_distance_params``
        parameters (``__params_to_release``: it walks the trace from the next module, adding
        each module's parameters, and stops once the sum reaches the limit). Between ``m_j``'s
        recomputed forward and its backward lie ``m_(j+1) .. m_k`` twice, so ``m_j`` is gathered
        again iff ``2 x (parameters of m_(j+1) .. m_k) >= max_reuse_distance_params``. Modules:
        q, k, v (or a fused qkv), o, then the MLP's matrices in call order (gate, up, down; or
        fc1, fc2), weights only, split by tp. Dense models without MLA; MoE and MLA models are
        not modelled (no re-gather counted)."""
        again = self._regathered
        if again is None:
            return 0, 0.0
        sizes = self._linear_modules[0]
        return int(again.sum()), float(sizes[again].sum())

    @cached_property
    def _regathered(self) -> np.ndarray | None:
        """Which linear modules of a layer :meth:`regathered_modules` gathers again (None where
        nothing is)."""
        lay, mods = self.layout, self._linear_modules
        if lay.zero_stage < 3 or lay.gather_unit != "module" or lay.recompute != "full" or mods.size == 0:
            return None
        sizes = mods[0]
        later = np.cumsum(sizes[::-1])[::-1] - sizes  # parameters of the modules after each one
        again: np.ndarray = 2 * later >= lay.max_reuse_distance_params
        return again

    @cached_property
    def _linear_modules(self) -> np.ndarray:
        """The tensors of each linear module of one dense decoder layer on a rank, in call order
        (q, k, v, o or a fused qkv and o; the MLP's matrices, as :meth:`regathered_modules`
        lists them), as rows of elements: the weight (``d_in d_out / tp``), its bias (0
        without; split by tp on a column-parallel linear), LoRA's ``A`` and ``B`` (0 without
        LoRA; split by tp as :mod:`rlperf.cost.lora` splits them; a fused qkv is one linear with
        one pair). Empty (shape (4, 0)) for MoE and MLA models."""
        lay, m = self.layout, self.model
        if m.mla is not None or m.moe is not None:
            return np.zeros((4, 0))
        d, f, tp, r = m.hidden_size, m.intermediate_size, lay.tp, lay.lora_rank
        q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
        # (d_in, d_out, column-parallel, has a bias)
        attn = [(d, q + 2 * kv, True, m.qkv_bias)] if m.fused_qkv else [(d, w, True, m.qkv_bias) for w in (q, kv, kv)]
        shapes = attn + [(q, d, False, m.o_bias)] + [(d, f, True, m.mlp_bias)] * (m.mlp.num_matrices - 1)
        shapes.append((f, d, False, m.mlp_bias))
        rows: list[tuple[float, float, float, float]] = []
        for d_in, d_out, column, bias in shapes:
            local_in, local_out = (d_in, d_out / tp) if column else (d_in / tp, d_out)
            rows.append((d_in * d_out / tp, local_out if bias else 0.0, r * local_in, r * local_out))
        tensors: np.ndarray = np.asarray(rows, dtype=np.float64).T
        return tensors

    def gather_copy_bytes(self, shard: StageShard, regathered: bool = False) -> tuple[float, int]:
        """(HBM bytes, kernels) per device of the copies around DeepSpeed's coalesced all-gathers
        in one gather of ``shard``'s stage (module docstring): over the modules whose tensors
        above ``persistence_threshold_params`` (DeepSpeed partitions a parameter of more elements
        than the threshold) are two or more, ``2 b (1 + 1/N)`` bytes per such element and one
        kernel per tensor plus one; ``regathered``: only the modules gathered again in a
        full-recompute backward. (0, 0) without ZeRO-3's per-module gathers over ``N > 1``."""
        key = (shard.stage, regathered)
        hit = self._copy_memo.get(key)
        if hit is None:
            hit = self._copy_memo[key] = self._gather_copy(shard, regathered)
        return hit

    def _gather_copy(self, shard: StageShard, regathered: bool) -> tuple[float, int]:
        lay, mods = self.layout, self._linear_modules
        if lay.zero_stage < 3 or lay.gather_unit != "module" or lay.shard_degree == 1 or not shard.num_layers:
            return 0.0, 0
        partitioned = mods > lay.persistence_threshold_params
        count = partitioned.sum(axis=0)
        coalesced = count >= 2
        if regathered:
            again = self._regathered
            coalesced = coalesced & again if again is not None else np.zeros_like(coalesced)
        if not coalesced.any():
            return 0.0, 0
        elements = float(np.where(partitioned, mods, 0.0).sum(axis=0)[coalesced].sum())
        per_layer = 2 * _C * (1 + 1 / lay.shard_degree) * elements
        return shard.num_layers * per_layer, shard.num_layers * int((count[coalesced] + 1).sum())

    def gather_units(self, shard: StageShard) -> int:
        """ZeRO-3 all-gathers per pass over the stage: one per decoder layer and one for the root
        (embedding, final norm, head) as FSDP wraps them; under DeepSpeed's per-module fetch
        (``gather_unit="module"``) one per linear projection of each layer (q, k, v, o or a fused
        qkv and o, and the MLP's matrices; a MoE layer's router and every expert's matrices)."""
        if self.layout.gather_unit == "layer":
            return shard.num_layers + 1
        m = self.model
        dense = (2 if m.fused_qkv else 4) + m.mlp.num_matrices
        moe = m.moe
        if moe is None:
            return shard.num_layers * dense + 1
        routed = (2 if m.fused_qkv else 4) + 1 + moe.num_experts * m.mlp.num_matrices
        share = m.num_moe_layers / m.num_layers
        return round(shard.num_layers * ((1 - share) * dense + share * routed)) + 1

    @property
    def reduces_every_microbatch(self) -> bool:
        """Whether the gradients are reduce-scattered after every micro-batch's backward: ZeRO-3 /
        FSDP, and ZeRO-2 as DeepSpeed and FSDP's ``SHARD_GRAD_OP`` run it (a rank keeps only its
        partition of the gradients, so each backward's are reduced at once: DeepSpeed's
        ``engine.allreduce_gradients`` "communicates during non gradient accumulation boundaries
        as well" from stage 2). Megatron's distributed optimizer (ZeRO-1/2 here) and ZeRO-0/1
        reduce once per optimizer step."""
        lay = self.layout
        return lay.zero_stage >= 3 or (lay.zero_stage == 2 and lay.backend == "fsdp")

    def grad_reduce(
        self, shard: StageShard, backward_s: np.ndarray | float, collective: Literal["reduce_scatter", "all_reduce"]
    ) -> Exposed:
        """Gradient reduction of the stage over its data-parallel groups: ``"reduce_scatter"``
        (ZeRO >= 1) or ``"all_reduce"`` (ZeRO-0), overlapped with ``backward_s`` (per
        micro-batch, or the step's last backward) when the layout says so; offloaded gradients
        also cross PCIe."""
        t, sent = self._dp_traffic(shard, collective)
        if not self.layout.overlap_grad_comm:
            return Exposed(t, np.full(np.shape(backward_s), t), sent)
        return overlap(t, backward_s, shard.num_layers + 1, sent)

    def param_gather(self, shard: StageShard) -> Exposed:
        """ZeRO-1/2: all-gather of the updated weights after the optimizer step (not overlapped)."""
        t, sent = self._dp_traffic(shard, "param_gather")
        return Exposed(t, np.asarray(t), sent)

    def _dp_traffic(self, shard: StageShard, kind: str) -> tuple[float, float]:
        """(time, bytes sent per device) of one data-parallel transfer of the stage (cached)."""
        key = (shard.stage, kind)
        hit = self._dp_comm.get(key)
        if hit is not None:
            return hit
        lay, pcie = self.layout, self.cluster.accelerator.pcie_bandwidth_bytes_per_s
        g = bytes_per(lay.grad_dtype)
        t = sent = 0.0
        ops: list[CollectiveCost] = []
        # ZeRO-3 / FSDP gathers and reduce-scatters unit by unit (a layer, or the root with the
        # embedding and head): one collective per unit at its own size, each paying its latency
        units = shard.num_layers + 1 if lay.zero_stage >= 3 else 1
        if kind == "weight_gather":
            if lay.zero_stage >= 3:
                ops = self._gathers(shard, all_gather, _C, self.gather_units(shard))
            if lay.offload_params:
                on_device = self.resident_params(shard) if lay.zero_stage >= 3 else shard.params
                t += on_device * bytes_per(lay.param_dtype) / pcie
        elif kind == "regather":  # one all-gather per module gathered again, at its mean size
            count, params = self.regathered_modules(shard)
            calls = count * shard.num_layers
            ops = [all_gather(self.cluster, params / count * _C, self.shard_group)] * calls if calls else []
        elif kind == "param_gather":
            ops = self._gathers(shard, all_gather, bytes_per(lay.param_dtype))
        elif self._adapters[shard.stage]:  # LoRA: only the adapters have gradients
            fn = reduce_scatter if kind == "reduce_scatter" else all_reduce
            ops = [fn(self.cluster, self._adapters[shard.stage] * g, self.shard_group)]
        else:
            ops = self._gathers(shard, reduce_scatter if kind == "reduce_scatter" else all_reduce, g,
                                units if kind == "reduce_scatter" else 1)
            if lay.offload_params or lay.offload_optimizer:
                # DeepSpeed ZeRO-2 with offload accumulates each micro-batch's partition on the GPU
                # (stage_1_and_2.py, async_accumulate_grad_in_cpu_via_gpu): the host's sum comes
                # up and goes back down; otherwise the partition goes down once
                both_ways = self.reduces_every_microbatch and lay.zero_stage == 2 and lay.offload_optimizer
                t += (2 if both_ways else 1) * self.resident_params(shard) * g / pcie
        t += sum(c.time_s for c in ops)
        sent += sum(c.bytes_sent_per_rank for c in ops)
        self._dp_comm[key] = (t, sent)
        return t, sent

    def _gathers(self, shard: StageShard, fn: Collective, elem_bytes: float, units: int = 1) -> list[CollectiveCost]:
        """``fn`` over the stage's dense and expert weights, each in ``units`` equal messages."""
        groups: list[tuple[float, CommGroup]] = [(shard.dense_params, self.shard_group)]
        if shard.expert_params:
            groups.append((shard.expert_params, self.expert_shard_group))
        # the units of a group are equal messages: cost one, repeat it (the sums add the same terms)
        return [c for params, group in groups for c in [fn(self.cluster, params * elem_bytes / units, group)] * units]


_LAYOUT_COSTS: BoundedMemo[tuple[ModelSpec, str, TrainLayout, str], LayoutCosts] = BoundedMemo(256)
# Shapes by their plan's identity (MicroBatchShapes.of); an entry holds its plan.
_SHAPES: BoundedMemo[tuple[int, bool], tuple[MicroBatches, MicroBatchShapes]] = BoundedMemo(64)
# The same spec objects ask again and again (a simulation costs one layout on batch after batch):
# found by identity first, without hashing the specs (a pydantic model hashes every field at each
# call) or writing the cluster's JSON. An entry holds its specs, so their ids are not reused
# while it is kept.
_BY_IDENTITY: BoundedMemo[tuple[int, int, int, str], tuple[ModelSpec, Cluster, TrainLayout, LayoutCosts]] = BoundedMemo(256)


def _no_comm(t: np.ndarray) -> dict[str, np.ndarray]:
    """:meth:`LayoutCosts._comm`'s fields of a pass that sends nothing (zeros shaped as ``t``)."""
    zero = np.zeros(t.shape)
    return {"tp_s": zero, "cp_s": zero, "ep_s": zero, "pp_s": zero, "comm_bytes": zero}


def _roof(flops: np.ndarray, num_bytes: np.ndarray, ceiling: tuple[float, float]) -> Roof:
    """:func:`rlperf.cost.roofline.op_time` of one kernel per micro-batch, without launch:
    ``max(flops / FLOP/s, bytes / bytes/s)`` elementwise."""
    return Roof(flops, num_bytes, np.maximum(flops / ceiling[0], num_bytes / ceiling[1]))


@dataclass
class Tally:
    """Running totals over all devices (internal accumulator of a stage model)."""

    flops: float = 0.0
    hbm_bytes: float = 0.0
    comm_bytes: float = 0.0
    work_s: float = 0.0  # device-seconds at the roofline, no launches, no communication

    def add(self, p: PassCost, devices: int, extra_comm_bytes: float = 0.0, part: slice = slice(None)) -> None:
        """Every micro-batch of ``p`` (``part``: those of that slice) ran on each of ``devices``
        devices (the tp x cp ranks of a stage); ``extra_comm_bytes`` more were sent per
        micro-batch."""
        comm = p.comm_bytes[part]
        self.flops += float(p.flops[part].sum()) * devices
        self.hbm_bytes += float(p.hbm_bytes[part].sum()) * devices
        self.comm_bytes += (float(comm.sum()) + extra_comm_bytes * comm.size) * devices
        self.work_s += float(p.body_s[part].sum()) * devices


def components(busy: dict[str, float], bubble_s: float) -> tuple[tuple[str, float], ...]:
    """Breakdown in a fixed order, zero entries dropped, bubble last."""
    order = ("compute", "host", "tp_comm", "cp_comm", "ep_comm", "pp_comm", "zero_gather", "grad_comm",
             "param_gather", "optimizer")
    assert set(busy) <= set(order), busy
    out = tuple((k, busy[k]) for k in order if busy.get(k, 0.0) > 0)
    return out + ((("bubble", bubble_s),) if bubble_s > 0 else ())

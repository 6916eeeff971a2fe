"""Moving weights between the trainer and the rollout engine, and on/off the GPU between phases.

(a) and (b) below follow how the frameworks' syncs run (verl's ``per_tensor_generator`` and
fully-async ``sync_rollout_weights`` / ``CheckpointEngine.update_checkpoint``; OpenRLHF and
slime broadcast the same way), tensor by tensor through one loop on every rank:

1. **Gather** each checkpoint tensor whole on every trainer rank, from the training layout
   (:func:`gather_full_tensors`): with pipeline parallelism the owning stage broadcasts the
   tensor's name, then the tensor, to the other stages (two broadcasts per Megatron tensor over
   the ``pp`` group); tensor-parallel pieces are all-gathered over ``tp`` (one call per dense
   tensor); routed experts are all-gathered over ``ep`` (one call per local expert matrix, each
   bringing ``ep`` experts), then over ``etp``; ZeRO-3/FSDP shards are all-gathered over the
   ``dp x cp`` ranks (``DTensor.full_tensor``, one call per tensor). Each call is an alpha-beta
   collective of :mod:`rlperf.cost.collectives` at the tensor's mean size, so a checkpoint of
   many small tensors pays the latency of every call.
2. **Convert** to the engine's names, layout and dtype (QKV / gate-up splits, fp32 -> bf16): one
   HBM read of the gathered tensor in the training ``param_dtype`` and one write in the engine's.
   With a LoRA actor and ``WeightSync.lora_merge``, each rank first merges the adapters into the
   gathered weights (``W += scaling x A B`` per adapted linear, :func:`rlperf.cost.lora.merge_cost`:
   DeepSpeed's hybrid engine fuses them on every rank before its tensor-parallel copy).
3. **Transfer** (disaggregated pools only, (b)): one NCCL broadcast of the *whole* tensor from
   trainer rank 0 to every rank of verl's ``actor_rollout`` group (all trainer and all engine
   GPUs; each engine GPU keeps its slice when it loads), a pipelined chain through the group
   (:func:`rlperf.cost.collectives.broadcast`): per call, one latency per hop plus its bytes
   over the slowest link. ``per_tensor`` sends one call per checkpoint tensor; ``bucketed``
   (checkpoint-engine) packs the tensors into ``bucket_bytes`` buckets, one call each, after
   staging each trainer rank's share of the gathered tensors in pinned host memory (one copy
   down and one back over PCIe). On shared GPUs (a) the engine reads the gathered tensors in
   place (the same process, or CUDA IPC handles): no transfer.
4. **Reload**: the engine's ``load_weights`` copies its slice of each tensor into its buffers
   (one HBM read and write of its shard) and pays a host cost per tensor (name mapping, the
   MoE expert loader per expert matrix). Every ``load_weights`` call first rebuilds
   ``params_dict = dict(self.named_parameters())`` over the engine's whole module tree (the
   pattern of vLLM's and SGLang's model files; sglang#30848 names it as a cost of RL weight
   sync), so a call costs in proportion to the engine's parameter tensors
   (:attr:`Checkpoint.num_engine_params`: q/k/v and gate/up fused, a layer's experts in two
   fused tensors). verl's loops call it once per tensor (per_tensor, disaggregated), once per
   bucket (bucketed), once with a generator of all tensors (colocated hybrid engine).

Host costs that follow the number of calls, not the bytes, are profile figures, one per path
because the paths do different host work per call. The per-call and per-tensor figures are None
in every shipped profile (no source publishes them; ``rlperf validate --calibrate`` fits each on
the calibration split); the walk per engine parameter is measured by bench/bench_param_walk.py
(``dict(named_parameters())`` on vLLM-shaped module trees, 1.83 us, a host-CPU figure):

    calls_per_tensor = N x weight_sync_tensor_overhead_s   (per_tensor: a Python step, an NCCL
                                                           launch and a sync per tensor)
    calls_bucketed   = ceil(bytes / bucket_bytes) x weight_sync_bucket_overhead_s
    reload           = N x engine_load_tensor_overhead_s   (both paths: load_weights per tensor)
                     + load_calls x P x engine_load_param_walk_s   (P engine parameter tensors)

    sync = gather + merge + convert + transfer + staging + calls + reload + copy   (nothing overlaps:
           verl's loop runs each step of a tensor, or a bucket, after the previous one)

with ``N = ModelSpec.num_weight_tensors`` (an MoE checkpoint holds a gate, up and down matrix per
expert: 18.9k tensors for Qwen3-30B-A3B, 44.5k for DeepSeek-V3). Stage semantics: the sync is
one chain on the iteration's critical path, ``depth_s = time_s``; its work is the device-memory
copies only (communication and host time are not work).

(c) :func:`offload_states` / :func:`engine_sleep` -- model states cross PCIe between phases:
    verl's ``param_offload`` / ``optimizer_offload`` (weights, gradients and optimizer states of
    a training layout, sizes from :func:`rlperf.cost.memory.train_memory`), and vLLM's sleep
    mode (level 1 moves the weights to host memory and drops the KV cache; waking up moves them
    back; level 2 drops the weights too, which a weight sync then refills). One call is one
    direction; offload and onload cost the same: ``bytes / PCIe bandwidth`` per GPU, all GPUs
    in parallel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from rlperf.cost.collectives import CommGroup, all_gather, broadcast, group_for
from rlperf.cost.lora import merge_cost
from rlperf.cost.memory import inference_memory, train_memory
from rlperf.cost.memory_params import stage_params
from rlperf.cost.roofline import elementwise
from rlperf.errors import SpecError
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.hardware import Cluster
from rlperf.specs.model import ModelSpec
from rlperf.specs.parallel import EngineLayout, TrainLayout, check_engine_layout, check_train_layout
from rlperf.specs.plan import WeightSync
from rlperf.stages.base import StageCost

NAME_BYTES = 256.0
"""A pickled tensor name broadcast over the pipeline stages (latency-bound whatever its size)."""

MEGATRON_EXPERT_MATRICES = 2
"""Megatron keeps a routed expert as two matrices (``linear_fc1`` with gate and up fused,
``linear_fc2``): the gather loop iterates over these, the checkpoint holds three."""


@dataclass(frozen=True)
class Checkpoint:
    """What a sync moves: the checkpoint's tensors (the layout ``load_weights`` reads)."""

    num_tensors: int
    num_expert_tensors: int  # routed-expert matrices (a gate, up and down per expert)
    params: float
    expert_params: float

    @classmethod
    def of(cls, model: ModelSpec) -> Checkpoint:
        moe = model.moe
        experts = 0 if moe is None else model.num_moe_layers * moe.num_experts * model.mlp.num_matrices
        # vLLM/SGLang fuse q, k, v (and their biases) into qkv_proj, gate and up into
        # gate_up_proj, and a layer's routed experts into w13 and w2 (FusedMoE).
        layers, moe_layers = model.num_layers, model.num_moe_layers
        fused = 0 if model.fused_qkv or model.mla is not None else 2 * (2 if model.qkv_bias else 1) * layers
        if model.mlp.gated and not model.mlp.fused_gate_up:
            mlps = layers - moe_layers + (moe_layers if moe is not None and moe.shared_intermediate_size else 0)
            fused += mlps * (2 if model.mlp_bias else 1)
        engine = model.num_weight_tensors - experts - fused + 2 * moe_layers
        return cls(model.num_weight_tensors, experts, float(model.num_params), float(model.breakdown.experts), engine)

    num_engine_params: int  # parameter tensors of the engine's module tree (named_parameters)

    @property
    def num_dense_tensors(self) -> int:
        return self.num_tensors - self.num_expert_tensors

    @property
    def dense_params(self) -> float:
        return self.params - self.expert_params


@dataclass(frozen=True)
class Gather:
    """Assembling every checkpoint tensor whole on each trainer rank (step 1)."""

    time_s: float
    bytes_sent_per_rank: float
    calls: int
    terms: tuple[tuple[str, float], ...]  # (group, seconds): pp_broadcast, tp_gather, ep_gather, ...


@dataclass(frozen=True)
class _Collectives:
    """One kind of gather call of the loop, over one group: how many, and what they cost."""

    name: str
    time_s: float
    bytes_sent_per_rank: float
    calls: int


def _calls(cluster: Cluster, name: str, calls: int, total_bytes: float, group: CommGroup,
           kind: Literal["gather", "broadcast"]) -> _Collectives:
    """``calls`` collectives over ``group`` moving ``total_bytes`` in all, at their mean size."""
    if calls == 0 or group.size == 1:
        return _Collectives(name, 0.0, 0.0, 0)
    each = total_bytes / calls
    cost = all_gather(cluster, each, group) if kind == "gather" else broadcast(cluster, each, group)
    return _Collectives(name, calls * cost.time_s, calls * cost.bytes_sent_per_rank, calls)


def gather_full_tensors(model: ModelSpec, cluster: Cluster, layout: TrainLayout) -> Gather:
    """Step 1 of the module docstring: the collectives of a per-tensor generator under ``layout``
    (ranks numbered tp innermost, then cp and dp, pp outermost, as Megatron orders them)."""
    ck = Checkpoint.of(model)
    b = bytes_per(layout.param_dtype)
    tp, pp, ep, etp = layout.tp, layout.pp, layout.ep, layout.expert_tp
    dense_b, expert_b = ck.dense_params * b, ck.expert_params * b
    moe_layers = model.num_moe_layers if model.moe is not None else 0
    num_experts = model.moe.num_experts if model.moe is not None else 0
    # Expert matrices the loop visits on each rank (Megatron's fused fc1, fc2 per local expert).
    local_expert_mats = moe_layers * (num_experts // ep) * MEGATRON_EXPERT_MATRICES
    megatron_tensors = ck.num_dense_tensors + local_expert_mats
    stage = layout.world_size // pp
    rows = [
        # pp: the owner broadcasts the name, then its (tp/ep-sharded) tensor, to the other stages
        _calls(cluster, "pp_name", megatron_tensors if pp > 1 else 0, NAME_BYTES * megatron_tensors,
               group_for(cluster, pp, stride=stage), "broadcast"),
        _calls(cluster, "pp_broadcast", megatron_tensors if pp > 1 else 0,
               dense_b / tp + expert_b / (ep * etp), group_for(cluster, pp, stride=stage), "broadcast"),
        # tp: dense tensors (and experts when they are split like the dense MLP, ep = 1)
        _calls(cluster, "tp_gather", (ck.num_dense_tensors + (local_expert_mats if ep == 1 else 0)) if tp > 1 else 0,
               dense_b + (expert_b if ep == 1 else 0.0), group_for(cluster, tp), "gather"),
        # ep: one all-gather per local expert matrix brings the same matrix of ep experts
        _calls(cluster, "ep_gather", local_expert_mats if ep > 1 else 0, expert_b / etp,
               group_for(cluster, ep, stride=etp), "gather"),
        _calls(cluster, "etp_gather", local_expert_mats * ep if ep > 1 and etp > 1 else 0, expert_b,
               group_for(cluster, etp), "gather"),
    ]
    if layout.zero_stage >= 3 and layout.shard_degree > 1:
        # FSDP/ZeRO-3: full_tensor() per parameter over the data-parallel ranks
        rows.append(_calls(cluster, "zero3_gather", ck.num_tensors, ck.params * b,
                           group_for(cluster, layout.shard_degree, stride=tp), "gather"))
    terms = tuple((r.name, r.time_s) for r in rows if r.time_s > 0)
    return Gather(sum(r.time_s for r in rows), sum(r.bytes_sent_per_rank for r in rows), sum(r.calls for r in rows), terms)


def _engine_shard_params(model: ModelSpec, engine: EngineLayout) -> float:
    """Parameters on one GPU of the engine's fullest stage."""
    return max(s.total_params for s in stage_params(model, engine.tp, engine.pp, engine.tp))


def _elementwise_s(cluster: Cluster, num_bytes: float) -> tuple[float, float]:
    op = elementwise(cluster, num_bytes)
    return op.time_s, op.bytes


@dataclass(frozen=True)
class _Sync:
    """The steps of one sync, each a named term of the stage's breakdown (module docstring)."""

    gather: Gather
    merge_s: float
    convert_s: float
    transfer_s: float
    staging_s: float
    calls_name: str
    calls_s: float
    reload_s: float
    copy_s: float
    copy_bytes: float

    @property
    def time_s(self) -> float:
        return (self.gather.time_s + self.merge_s + self.convert_s + self.transfer_s + self.staging_s
                + self.calls_s + self.reload_s + self.copy_s)

    def breakdown(self) -> tuple[tuple[str, float], ...]:
        terms = (*self.gather.terms, ("lora_merge", self.merge_s), ("convert", self.convert_s),
                 ("broadcast", self.transfer_s),
                 ("host_staging", self.staging_s), (self.calls_name, self.calls_s), ("reload", self.reload_s),
                 ("copy", self.copy_s))
        return tuple((k, v) for k, v in terms if v > 0)


def _sync_steps(model: ModelSpec, cluster: Cluster, layout: TrainLayout, engine: EngineLayout, sync: WeightSync,
                transfer_group: CommGroup | None) -> _Sync:
    """Every step of the module docstring; ``transfer_group`` None: shared GPUs, no transfer."""
    ck = Checkpoint.of(model)
    prof = cluster.profile
    gather = gather_full_tensors(model, cluster, layout)
    merge_s = merge_cost(model, cluster, layout.lora_rank, layout.param_dtype)[0] if sync.lora_merge else 0.0
    convert_s, _ = _elementwise_s(cluster, ck.params * (bytes_per(layout.param_dtype) + bytes_per(engine.dtype)))
    full_bytes = ck.params * bytes_per(engine.dtype)
    bucketed = sync.transfer == "bucketed"
    calls = math.ceil(full_bytes / sync.bucket_bytes) if bucketed else ck.num_tensors
    transfer_s = staging_s = 0.0
    if transfer_group is not None:
        transfer_s = calls * broadcast(cluster, full_bytes / calls, transfer_group).time_s
        if bucketed:  # each trainer rank's share: down to pinned host memory, and back per bucket
            staging_s = 2 * full_bytes / layout.world_size / cluster.accelerator.pcie_bandwidth_bytes_per_s
    per_call = prof.weight_sync_bucket_overhead_s if bucketed else prof.weight_sync_tensor_overhead_s
    # load_weights calls: one per bucket, one per tensor across pools, one generator on shared GPUs
    load_calls = calls if bucketed or transfer_group is not None else 1
    reload_s = ck.num_tensors * (prof.engine_load_tensor_overhead_s or 0.0)
    reload_s += load_calls * ck.num_engine_params * (prof.engine_load_param_walk_s or 0.0)
    shard = _engine_shard_params(model, engine)
    copy_s, copy_bytes = _elementwise_s(cluster, 2 * shard * bytes_per(engine.dtype))
    return _Sync(
        gather=gather, merge_s=merge_s, convert_s=convert_s, transfer_s=transfer_s, staging_s=staging_s,
        calls_name="per_bucket" if bucketed else "per_tensor", calls_s=calls * (per_call or 0.0),
        reload_s=reload_s, copy_s=copy_s, copy_bytes=copy_bytes,
    )


def _stage(name: str, cluster: Cluster, steps: _Sync, num_gpus: int, engine: EngineLayout, comm_bytes: float,
           peak_bytes: float) -> StageCost:
    work = (steps.copy_s - cluster.profile.kernel_launch_s) * engine.num_gpus
    return StageCost(
        name=name, time_s=steps.time_s, num_gpus=num_gpus, work_s=max(work, 0.0), depth_s=steps.time_s,
        hbm_bytes=steps.copy_bytes * engine.num_gpus, comm_bytes=comm_bytes, peak_memory_bytes=peak_bytes,
        breakdown=steps.breakdown(),
    )


def reshard_colocated(
    model: ModelSpec,
    cluster: Cluster,
    layout: TrainLayout,
    engine: EngineLayout,
    name: str = "weight_sync",
    *,
    sync: WeightSync = WeightSync(),
) -> StageCost:
    """Trainer and engine on the same GPUs (a): gather, convert, reload; no transfer."""
    check_train_layout(model, layout, "layout")
    check_engine_layout(model, engine, "engine")
    num_gpus = max(layout.world_size, engine.num_gpus)
    if num_gpus > cluster.num_gpus:
        raise SpecError("engine", f"needs {num_gpus} GPUs, the cluster has {cluster.num_gpus}")
    steps = _sync_steps(model, cluster, layout, engine, sync, None)
    return _stage(name, cluster, steps, num_gpus, engine, steps.gather.bytes_sent_per_rank * layout.world_size,
                  _engine_shard_params(model, engine) * bytes_per(engine.dtype))


def broadcast_disaggregated(
    model: ModelSpec,
    cluster: Cluster,
    layout: TrainLayout,
    engine: EngineLayout,
    name: str = "weight_sync",
    *,
    sync: WeightSync = WeightSync(),
) -> StageCost:
    """Trainer and engine on separate GPUs (b): gather, convert, broadcast to every rank, reload."""
    check_train_layout(model, layout, "layout")
    check_engine_layout(model, engine, "engine")
    num_gpus = layout.world_size + engine.num_gpus
    if num_gpus > cluster.num_gpus:
        raise SpecError("engine", f"trainer and engine need {num_gpus} GPUs, the cluster has {cluster.num_gpus}")
    # verl's actor_rollout group: every trainer and every engine GPU, the pools filling nodes in turn.
    group = CommGroup(size=num_gpus, ranks_per_node=min(num_gpus, cluster.gpus_per_node))
    steps = _sync_steps(model, cluster, layout, engine, sync, group)
    full_bytes = model.num_params * bytes_per(engine.dtype)
    comm = steps.gather.bytes_sent_per_rank * layout.world_size + full_bytes * (num_gpus - 1)
    return _stage(name, cluster, steps, num_gpus, engine, comm, _engine_shard_params(model, engine) * bytes_per(engine.dtype))


def _pcie_stage(cluster: Cluster, name: str, bytes_per_gpu: float, num_gpus: int, what: str) -> StageCost:
    if num_gpus > cluster.num_gpus:
        raise SpecError(what, f"needs {num_gpus} GPUs, the cluster has {cluster.num_gpus}")
    time_s = bytes_per_gpu / cluster.accelerator.pcie_bandwidth_bytes_per_s
    # The device side reads (or writes) each byte once in HBM: that is the work.
    work = bytes_per_gpu / (cluster.accelerator.hbm_bandwidth_bytes_per_s * cluster.profile.hbm_efficiency)
    return StageCost(
        name=name, time_s=time_s, num_gpus=num_gpus, work_s=work * num_gpus, depth_s=time_s,
        hbm_bytes=bytes_per_gpu * num_gpus, comm_bytes=bytes_per_gpu * num_gpus,
        breakdown=(("pcie", time_s),) if time_s > 0 else (),
    )


def offload_states(
    model: ModelSpec,
    cluster: Cluster,
    layout: TrainLayout,
    name: str = "offload",
    *,
    params: bool = True,
    grads: bool = False,
    optimizer: bool = True,
) -> StageCost:
    """One direction (offload or onload) of a training layout's states over PCIe (c)."""
    check_train_layout(model, layout, "layout")
    mem = train_memory(model, layout, 1)
    moved = (mem.weights_bytes if params else 0.0) + (mem.grads_bytes if grads else 0.0)
    moved += mem.optimizer_bytes if optimizer else 0.0
    return _pcie_stage(cluster, name, moved, layout.world_size, "layout")


def engine_sleep(model: ModelSpec, cluster: Cluster, engine: EngineLayout, name: str = "engine_wake") -> StageCost:
    """vLLM sleep (level 1) or wake-up: the engine's weights over PCIe, one direction (c).
    The KV cache is discarded on sleep and re-allocated on wake, which moves no bytes."""
    mem = inference_memory(model, engine, cluster.accelerator.device_memory_bytes)
    return _pcie_stage(cluster, name, mem.weights_bytes, engine.num_gpus, "engine")


def offload_switch(
    model: ModelSpec,
    cluster: Cluster,
    layout: TrainLayout,
    to: Literal["rollout", "train"],
    *,
    params: bool = True,
    grads: bool = True,
    optimizer: bool = True,
) -> StageCost:
    """A colocated pool's phase switch (c): ``to="rollout"`` offloads the training states to host
    memory to make room for the engine, ``to="train"`` loads them back (verl's
    ``param_offload`` / ``grad_offload`` / ``optimizer_offload`` around the rollout). Both
    directions cost the same PCIe time; the engine's own weights arrive by the weight sync."""
    if to not in ("rollout", "train"):
        raise SpecError("to", f"unknown phase {to!r}", "rollout, train")
    return offload_states(
        model, cluster, layout, f"phase_switch_to_{to}", params=params, grads=grads, optimizer=optimizer
    )

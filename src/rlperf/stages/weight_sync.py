"""Moving weights between the trainer and the rollout engine, and on/off the GPU between phases.

Three mechanisms, each returning a :class:`StageCost`. Each is one collective (or one PCIe copy)
on the iteration's dependency chain: nothing else of the stage can run beside it, so its depth is
its time (``depth_s = time_s``) and its work is only the device-memory copies (communication is
not work), so ``lower_bound_s() == time_s``.

(a) :func:`reshard_colocated` -- the trainer and the engine share GPUs (verl's hybrid engine,
    DeepSpeed-Chat, NeMo-RL colocated). Every GPU must end up holding its engine shard,
    ``W / (tp_e x pp_e)`` of the weights (the fullest stage, :mod:`rlperf.cost.memory_params`),
    and already holds its training shard, ``W / (tp_t x pp_t)`` further divided by ``dp x cp``
    under ZeRO-3. When the engine shard is larger it is all-gathered from the
    ``g = engine shard / training shard`` ranks holding its pieces, nearest ranks first
    (NVLink, plus the NIC once ``g`` spans nodes): the 3D-HybridEngine's regrouping (Sheng et al.
    2024, "HybridFlow", §5.4). ``gather_full_model=True`` instead gathers every full tensor on
    every rank, then keeps the engine's slice (verl's FSDP backend: ``DTensor.full_tensor`` per
    parameter). Gathers run in the training ``param_dtype`` (verl's FSDP keeps fp32 weights);
    the engine then copies its shard into its own buffers (one HBM read + write).
(b) :func:`broadcast_disaggregated` -- trainer and engine on separate GPUs (one-step-off /
    fully asynchronous recipes, OpenRLHF, slime, NeMo-RL). Each of the engine's
    ``tp_e x pp_e`` shards is broadcast, in the engine dtype, from one trainer GPU to the
    matching GPU of every replica, all shards at once over separate NICs (rail-optimized
    fabric). NCCL pipelines a broadcast as a chain, so a shard of ``n`` bytes takes
    ``n / (NIC x efficiency)`` plus one latency per hop (:func:`rlperf.cost.collectives.broadcast`).
    The sending trainer GPU first gathers its shard from the training layout as in (a); as in
    verl's tensor-by-tensor sync, gather and broadcast alternate per tensor and are not overlapped.

(a) and (b) also pay host-side costs that follow the number of tensors, not the bytes
(verl's own sync times: 0.12 s for Qwen2.5-Math-7B's ~340 checkpoint tensors, 15.8 s for
Qwen3-30B-A3B's ~18.9k, 58.6 s for Qwen3-235B-A22B's ~37k, where the bytes take 0.01-1.4 s).
The plan's :class:`rlperf.specs.plan.WeightSync` says how the transfer goes, and two profile
figures price it (no profile ships either: they are the framework's, not the hardware's;
``rlperf validate --calibrate`` fits both on the calibration split):

    calls  = N tensors (per_tensor)  or  ceil(engine shard bytes / bucket_bytes) (bucketed)
    call   = weight_sync_tensor_overhead_s   (one transfer call: handshake, launch, sync)
    reload = N x engine_load_tensor_overhead_s   (the engine's load_weights, tensor by tensor,
             on every engine GPU in parallel; MoE checkpoints hold tens of thousands of tensors)
    per_tensor:  sync = gather + transfer + copy + calls x call + reload     (nothing overlaps)
    bucketed:    sync = gather + max(transfer, reload) + copy + calls x call  (pipelined)

so one per-call figure serves both: a 45k-tensor refit costs 45k calls tensor by tensor and a
few hundred buckets bucketed. The ``transfer`` is the NCCL broadcast of (b); on shared GPUs
(a) the engine reads the gathered shard through CUDA IPC handles (the copy).
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
from typing import Literal

from rlperf.cost.collectives import CommGroup, all_gather, broadcast, group_for
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


def _engine_shard_params(model: ModelSpec, engine: EngineLayout) -> float:
    """Parameters on one GPU of the engine's fullest stage."""
    return max(s.total_params for s in stage_params(model, engine.tp, engine.pp, engine.tp))


def _train_shard_params(model: ModelSpec, layout: TrainLayout) -> float:
    """Weights one GPU of the training layout holds (its fullest stage; ZeRO-3 shards them)."""
    stages = stage_params(model, layout.tp, layout.pp, layout.expert_shards)
    if layout.zero_stage < 3:
        return max(s.total_params for s in stages)
    n = layout.shard_degree
    return max(s.dense_params / n + s.expert_params / layout.expert_shard_degree for s in stages)


def _gather_to_engine(
    model: ModelSpec, cluster: Cluster, layout: TrainLayout, engine: EngineLayout, full: bool
) -> tuple[float, float, int]:
    """(time, bytes sent per GPU, group size) of assembling one engine shard from the training
    shards on the ``g`` nearest ranks holding its pieces."""
    b = bytes_per(layout.param_dtype)
    if full:
        target = float(model.num_params)
        spread = layout.tp * layout.pp * (layout.shard_degree if layout.zero_stage >= 3 else 1)
    else:
        target = _engine_shard_params(model, engine)
        spread = math.ceil(target / _train_shard_params(model, layout) - 1e-9)
    g = max(1, min(spread, layout.world_size))
    if g == 1:
        return 0.0, 0.0, 1
    cost = all_gather(cluster, target * b, group_for(cluster, g))
    return cost.time_s, cost.bytes_sent_per_rank, g


def _tensor_terms(
    model: ModelSpec, cluster: Cluster, sync: WeightSync, shard_bytes: float, transfer_s: float
) -> tuple[float, tuple[tuple[str, float], ...]]:
    """(time of transfer + per-call + reload, breakdown) under ``sync`` (module docstring)."""
    n = model.num_weight_tensors
    per_call = cluster.profile.weight_sync_tensor_overhead_s or 0.0
    reload = n * (cluster.profile.engine_load_tensor_overhead_s or 0.0)
    if sync.transfer == "per_tensor":
        calls = n * per_call
        return transfer_s + calls + reload, (("broadcast", transfer_s), ("per_tensor", calls), ("reload", reload))
    calls = math.ceil(shard_bytes / sync.bucket_bytes) * per_call
    hidden = max(0.0, reload - transfer_s)  # the reload not hidden behind the transfer
    return transfer_s + hidden + calls, (("broadcast", transfer_s), ("per_bucket", calls), ("reload", hidden))


def _copy_in(cluster: Cluster, params: float, dtype: str) -> tuple[float, float]:
    """(time, HBM bytes) of writing a shard into the engine's buffers: one read, one write."""
    op = elementwise(cluster, 2 * params * bytes_per(dtype))
    return op.time_s, op.bytes


def reshard_colocated(
    model: ModelSpec,
    cluster: Cluster,
    layout: TrainLayout,
    engine: EngineLayout,
    name: str = "weight_sync",
    *,
    gather_full_model: bool = False,
    sync: WeightSync = WeightSync(),
) -> StageCost:
    """In-place reshard from the training layout to the engine layout on the same GPUs (a)."""
    check_train_layout(model, layout, "layout")
    check_engine_layout(model, engine, "engine")
    num_gpus = max(layout.world_size, engine.num_gpus)
    if num_gpus > cluster.num_gpus:
        raise SpecError("engine", f"needs {num_gpus} GPUs, the cluster has {cluster.num_gpus}")
    gather_s, sent, _ = _gather_to_engine(model, cluster, layout, engine, gather_full_model)
    shard = _engine_shard_params(model, engine)
    copy_s, copy_bytes = _copy_in(cluster, shard, engine.dtype)
    tensors_s, terms = _tensor_terms(model, cluster, sync, shard * bytes_per(engine.dtype), 0.0)
    time_s = gather_s + copy_s + tensors_s
    work = (copy_s - cluster.profile.kernel_launch_s) * engine.num_gpus
    return StageCost(
        name=name, time_s=time_s, num_gpus=num_gpus, work_s=max(work, 0.0), depth_s=time_s,
        hbm_bytes=copy_bytes * engine.num_gpus, comm_bytes=sent * layout.world_size,
        peak_memory_bytes=shard * bytes_per(engine.dtype),
        breakdown=tuple((k, v) for k, v in (("gather", gather_s), ("copy", copy_s), *terms) if v > 0),
    )


def broadcast_disaggregated(
    model: ModelSpec,
    cluster: Cluster,
    layout: TrainLayout,
    engine: EngineLayout,
    name: str = "weight_sync",
    *,
    sync: WeightSync = WeightSync(),
) -> StageCost:
    """Broadcast of the engine-dtype weights from the trainer to every rollout replica (b)."""
    check_train_layout(model, layout, "layout")
    check_engine_layout(model, engine, "engine")
    num_gpus = layout.world_size + engine.num_gpus
    if num_gpus > cluster.num_gpus:
        raise SpecError("engine", f"trainer and engine need {num_gpus} GPUs, the cluster has {cluster.num_gpus}")
    shard = _engine_shard_params(model, engine)
    shard_bytes = shard * bytes_per(engine.dtype)
    gather_s, gather_sent, _ = _gather_to_engine(model, cluster, layout, engine, False)
    # One sender (on a trainer node) and one receiver per replica; replicas share nodes when
    # several fit in one, and the shard's receivers then sit one per replica on that node.
    # On a single node every hop rides NVLink.
    size = engine.replicas + 1
    per_node = max(1, min(engine.replicas, cluster.gpus_per_node // engine.gpus_per_replica))
    group = CommGroup(size=size, ranks_per_node=size if cluster.num_nodes == 1 else per_node)
    bcast = broadcast(cluster, shard_bytes, group)
    copy_s, copy_bytes = _copy_in(cluster, shard, engine.dtype)
    tensors_s, terms = _tensor_terms(model, cluster, sync, shard_bytes, bcast.time_s)
    time_s = gather_s + copy_s + tensors_s
    streams = engine.gpus_per_replica
    work = (copy_s - cluster.profile.kernel_launch_s) * engine.num_gpus
    return StageCost(
        name=name, time_s=time_s, num_gpus=num_gpus, work_s=max(work, 0.0), depth_s=time_s,
        hbm_bytes=copy_bytes * engine.num_gpus,
        comm_bytes=gather_sent * layout.world_size + bcast.bytes_sent_per_rank * (size - 1) * streams,
        peak_memory_bytes=shard_bytes,
        breakdown=tuple((k, v) for k, v in (("gather", gather_s), ("copy", copy_s), *terms) if v > 0),
    )


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
    mem = inference_memory(model, engine, cluster.accelerator.hbm_bytes)
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

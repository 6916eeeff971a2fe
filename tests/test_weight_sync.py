"""Weight sync: colocated reshard, disaggregated broadcast, offload/onload over PCIe."""

from __future__ import annotations

import math

import pytest

from rlperf.catalog import load_model
from rlperf.cost.collectives import CommGroup, all_gather, broadcast, group_for
from rlperf.cost.memory import inference_memory, train_memory
from rlperf.errors import SpecError
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.hardware import Cluster
from rlperf.specs.parallel import EngineLayout, TrainLayout
from rlperf.specs.plan import WeightSync
from rlperf.stages.base import StageCost
from rlperf.stages.weight_sync import (
    MEGATRON_EXPERT_MATRICES,
    Checkpoint,
    broadcast_disaggregated,
    gather_full_tensors,
    engine_sleep,
    offload_states,
    offload_switch,
    reshard_colocated,
)

QWEN7B = load_model("Qwen2.5-7B")
# Without the shipped load_weights walk figure (bench/bench_param_walk.py measures it): the tests
# below set each host figure themselves
_SHIPPED = make_cluster("h100_sxm", num_gpus=16)
NODES2 = _SHIPPED.model_copy(update={"profile": _SHIPPED.profile.model_copy(update={"engine_load_param_walk_s": None})})


def _single_chain(cost: StageCost) -> None:
    assert cost.depth_s == cost.time_s
    assert cost.lower_bound_s() == pytest.approx(cost.time_s)
    assert cost.time_s == pytest.approx(sum(v for _, v in cost.breakdown))


def _with(cluster: Cluster, **fields: float) -> Cluster:
    return cluster.model_copy(update={"profile": cluster.profile.model_copy(update=fields)})


def test_disaggregated_sync_broadcasts_every_whole_tensor_to_every_rank() -> None:
    """verl's NCCL loop: each checkpoint tensor goes whole from trainer rank 0 to all trainer
    and engine GPUs (one chain of 16 ranks over 2 nodes here): N calls of the mean size, so the
    bytes ride the NIC once and every call pays the chain's hops."""
    lay, eng = TrainLayout(dp=8, zero_stage=1), EngineLayout(tp=1, replicas=8)
    cost = broadcast_disaggregated(QWEN7B, NODES2, lay, eng)
    n, full = QWEN7B.num_weight_tensors, QWEN7B.weight_bytes("bf16")
    assert full == pytest.approx(15.2e9, rel=0.01)
    group = CommGroup(size=16, ranks_per_node=8)
    assert cost.component("broadcast") == pytest.approx(n * broadcast(NODES2, full / n, group).time_s)
    nic = NODES2.accelerator.nic_bandwidth_bytes_per_s * NODES2.profile.inter_node_efficiency
    hops = 14 * NODES2.profile.intra_node_latency_s + NODES2.profile.inter_node_latency_s
    assert cost.component("broadcast") >= full / nic + n * hops * 0.999
    assert cost.component("tp_gather") == cost.component("zero3_gather") == 0  # whole weights on every rank
    assert cost.component("convert") > 0 and cost.component("copy") > 0
    _single_chain(cost)


def test_broadcast_needs_room_for_both_pools() -> None:
    with pytest.raises(SpecError, match="engine"):
        broadcast_disaggregated(QWEN7B, NODES2, TrainLayout(dp=8), EngineLayout(tp=1, replicas=9))


def test_colocated_sync_gathers_whole_tensors_and_transfers_nothing() -> None:
    """Shared GPUs: the engine reads the gathered tensors in place (same process or CUDA IPC)."""
    local = reshard_colocated(QWEN7B, NODES2, TrainLayout(dp=16, zero_stage=1), EngineLayout(tp=2, replicas=8))
    assert local.component("broadcast") == 0 and local.component("tp_gather") == 0
    # FSDP over 16 ranks: full_tensor() per tensor, an all-gather over the 16 data-parallel ranks
    fsdp = reshard_colocated(QWEN7B, NODES2, TrainLayout(dp=16, zero_stage=3), EngineLayout(tp=2, replicas=8))
    n, full = QWEN7B.num_weight_tensors, QWEN7B.weight_bytes("bf16")
    group = group_for(NODES2, 16)
    assert fsdp.component("zero3_gather") == pytest.approx(n * all_gather(NODES2, full / n, group).time_s)
    # tp 4 Megatron-style shards: one all-gather per tensor over the 4 tensor ranks (NVLink)
    tp4 = reshard_colocated(QWEN7B, NODES2, TrainLayout(dp=4, tp=4, zero_stage=1), EngineLayout(tp=2, replicas=8))
    assert 0 < tp4.component("tp_gather") < fsdp.component("zero3_gather")
    for c in (local, fsdp, tp4):
        _single_chain(c)


def test_moe_gather_follows_the_expert_and_pipeline_layout() -> None:
    """Megatron's generator: one EP all-gather per local expert matrix (fc1, fc2), each bringing
    ep experts; with pipeline stages, two broadcasts (name, tensor) per Megatron tensor."""
    moe = load_model("Qwen3-30B-A3B")
    cluster = make_cluster("h100_sxm", num_gpus=32)
    ck = Checkpoint.of(moe)
    assert ck.num_expert_tensors == 48 * 128 * 3 and ck.num_tensors == moe.num_weight_tensors
    ep8 = gather_full_tensors(moe, cluster, TrainLayout(dp=8, tp=2, ep=8, etp=1, zero_stage=1))
    assert ep8.calls == ck.num_dense_tensors + 48 * (128 // 8) * MEGATRON_EXPERT_MATRICES
    names = dict(ep8.terms)
    assert set(names) == {"tp_gather", "ep_gather"}
    pp4 = gather_full_tensors(moe, cluster, TrainLayout(dp=2, tp=2, pp=4, ep=2, etp=1, zero_stage=1))
    megatron_tensors = ck.num_dense_tensors + 48 * (128 // 2) * MEGATRON_EXPERT_MATRICES
    assert dict(pp4.terms).keys() >= {"pp_name", "pp_broadcast"}
    assert pp4.calls == 2 * megatron_tensors + ck.num_dense_tensors + 48 * 64 * MEGATRON_EXPERT_MATRICES
    none = gather_full_tensors(moe, cluster, TrainLayout(dp=32, zero_stage=1))
    assert none.time_s == 0 and none.calls == 0


def test_fp32_training_weights_cost_a_cast() -> None:
    lay32 = TrainLayout(dp=8, zero_stage=1, param_dtype="fp32")
    eng = EngineLayout(tp=1, replicas=8)
    bf = broadcast_disaggregated(QWEN7B, NODES2, TrainLayout(dp=8, zero_stage=1), eng)
    fp = broadcast_disaggregated(QWEN7B, NODES2, lay32, eng)
    assert fp.component("convert") == pytest.approx(bf.component("convert") * 6 / 4, rel=1e-3)


@pytest.mark.parametrize("call_s", [0.0, 4e-4, 1.5e-3])
def test_tensor_by_tensor_sync_pays_its_call_cost_per_checkpoint_tensor(call_s: float) -> None:
    """weight_sync_tensor_overhead_s x num_weight_tensors on top of the rest; an MoE model pays
    for every expert's tensors (Qwen3-30B-A3B: 18,867 of them); the bucket figure plays no part."""
    slow = _with(NODES2, weight_sync_tensor_overhead_s=call_s, weight_sync_bucket_overhead_s=1.0)
    moe = load_model("Qwen3-30B-A3B")
    args = (TrainLayout(dp=4, tp=2, zero_stage=1), EngineLayout(tp=2, replicas=4))
    for model in (QWEN7B, moe):
        for sync in (broadcast_disaggregated, reshard_colocated):
            base, cost = sync(model, NODES2, *args), sync(model, slow, *args)
            extra = model.num_weight_tensors * call_s
            assert cost.time_s == pytest.approx(base.time_s + extra)
            assert cost.component("per_tensor") == pytest.approx(extra)
            assert cost.work_s == base.work_s  # host time, not device work
            _single_chain(cost)


def test_bucketed_sync_pays_its_own_figure_per_bucket_and_reloads_every_tensor() -> None:
    """Per tensor: N x (call + reload). Bucketed (checkpoint-engine): ceil(bytes / bucket) x the
    bucket figure, the same per-tensor reload, the share of each trainer rank staged through
    pinned host memory (down and back over PCIe), and far fewer broadcast latencies."""
    call, per_bucket, reload = 1e-3, 5e-3, 2e-4
    cl = _with(NODES2, weight_sync_tensor_overhead_s=call, weight_sync_bucket_overhead_s=per_bucket,
               engine_load_tensor_overhead_s=reload)
    moe = load_model("Qwen3-30B-A3B")
    n, full = moe.num_weight_tensors, moe.weight_bytes("bf16")
    lay, eng = TrainLayout(dp=4, tp=2, zero_stage=1), EngineLayout(tp=2, replicas=4)
    base = broadcast_disaggregated(moe, NODES2, lay, eng)
    per_tensor = broadcast_disaggregated(moe, cl, lay, eng)
    assert per_tensor.time_s == pytest.approx(base.time_s + n * (call + reload))
    assert per_tensor.component("reload") == pytest.approx(n * reload)
    bucket = 256e6
    sync = WeightSync(transfer="bucketed", bucket_bytes=bucket)
    bucketed = broadcast_disaggregated(moe, cl, lay, eng, sync=sync)
    buckets = math.ceil(full / bucket)
    assert bucketed.component("per_bucket") == pytest.approx(buckets * per_bucket)
    assert bucketed.component("reload") == pytest.approx(n * reload)
    pcie = NODES2.accelerator.pcie_bandwidth_bytes_per_s
    assert bucketed.component("host_staging") == pytest.approx(2 * full / lay.world_size / pcie)
    group = CommGroup(size=16, ranks_per_node=8)
    assert bucketed.component("broadcast") == pytest.approx(buckets * broadcast(NODES2, full / buckets, group).time_s)
    assert bucketed.component("broadcast") < base.component("broadcast")
    assert bucketed.time_s < per_tensor.time_s
    # the bucket figure is the bucketed path's alone
    assert broadcast_disaggregated(moe, _with(cl, weight_sync_tensor_overhead_s=0.0), lay, eng,
                                   sync=sync).time_s == pytest.approx(bucketed.time_s)
    _single_chain(bucketed)
    _single_chain(per_tensor)


def test_offload_time_is_bytes_over_pcie() -> None:
    lay = TrainLayout(dp=16, zero_stage=3)
    mem = train_memory(QWEN7B, lay, 1)
    cost = offload_states(QWEN7B, NODES2, lay, params=True, grads=False, optimizer=True)
    pcie = NODES2.accelerator.pcie_bandwidth_bytes_per_s
    assert cost.time_s == pytest.approx((mem.weights_bytes + mem.optimizer_bytes) / pcie, rel=1e-12)
    _single_chain(cost)
    back = offload_switch(QWEN7B, NODES2, lay, "train")
    there = offload_switch(QWEN7B, NODES2, lay, "rollout")
    assert back.time_s == there.time_s == pytest.approx(mem.model_states_bytes / pcie)
    with pytest.raises(SpecError, match="to"):
        offload_switch(QWEN7B, NODES2, lay, "sideways")  # type: ignore[arg-type]


def test_engine_wake_reloads_its_weights_over_pcie() -> None:
    engine = EngineLayout(tp=2, replicas=8)
    cost = engine_sleep(QWEN7B, NODES2, engine)
    w = inference_memory(QWEN7B, engine, NODES2.accelerator.device_memory_bytes).weights_bytes
    assert cost.time_s == pytest.approx(w / NODES2.accelerator.pcie_bandwidth_bytes_per_s)
    assert cost.num_gpus == 16


def test_each_load_weights_call_walks_the_engine_parameters() -> None:
    """load_weights rebuilds dict(named_parameters()) per call: N calls tensor by tensor across
    pools, one per bucket bucketed, one generator on shared GPUs; Qwen3-30B-A3B's engine holds
    435 parameter tensors (q/k/v, gate/up fused; a layer's 128 experts in w13 and w2)."""
    walk = 1e-6
    cl = _with(NODES2, engine_load_param_walk_s=walk)
    moe = load_model("Qwen3-30B-A3B")
    ck = Checkpoint.of(moe)
    assert ck.num_engine_params == 1 + 1 + 1 + 48 * (1 + 1 + 2 + 2 + 1 + 2)  # embed, norm, head; per layer
    lay, eng = TrainLayout(dp=4, tp=2, zero_stage=1), EngineLayout(tp=2, replicas=4)
    per_tensor = broadcast_disaggregated(moe, cl, lay, eng)
    assert per_tensor.component("reload") == pytest.approx(ck.num_tensors * ck.num_engine_params * walk)
    sync = WeightSync(transfer="bucketed", bucket_bytes=1e9)
    bucketed = broadcast_disaggregated(moe, cl, lay, eng, sync=sync)
    assert bucketed.component("reload") == pytest.approx(math.ceil(moe.weight_bytes("bf16") / 1e9) * ck.num_engine_params * walk)
    shared = reshard_colocated(moe, cl, TrainLayout(dp=8, tp=2, zero_stage=1), EngineLayout(tp=2, replicas=8))
    assert shared.component("reload") == pytest.approx(ck.num_engine_params * walk)
    # the shipped profile walks at its measured figure
    shipped = broadcast_disaggregated(moe, _SHIPPED, lay, eng)
    assert _SHIPPED.profile.engine_load_param_walk_s is not None
    assert shipped.component("reload") == pytest.approx(
        ck.num_tensors * ck.num_engine_params * _SHIPPED.profile.engine_load_param_walk_s)

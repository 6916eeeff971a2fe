"""Weight sync: colocated reshard, disaggregated broadcast, offload/onload over PCIe."""

from __future__ import annotations

import pytest

from rlperf.catalog import load_model
from rlperf.cost.memory import inference_memory, train_memory
from rlperf.errors import SpecError
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import EngineLayout, TrainLayout
from rlperf.stages.base import StageCost
from rlperf.stages.weight_sync import (
    broadcast_disaggregated,
    engine_sleep,
    offload_states,
    offload_switch,
    reshard_colocated,
)

QWEN7B = load_model("Qwen2.5-7B")
NODES2 = make_cluster("h100_sxm", num_gpus=16)


def _single_chain(cost: StageCost) -> None:
    assert cost.depth_s == cost.time_s
    assert cost.lower_bound_s() == pytest.approx(cost.time_s)
    assert cost.time_s == pytest.approx(sum(v for _, v in cost.breakdown))


def test_disaggregated_broadcast_of_qwen7b_over_400g() -> None:
    nic = NODES2.accelerator.nic_bandwidth_bytes_per_s
    assert nic == 50e9  # 400 Gb/s
    cost = broadcast_disaggregated(QWEN7B, NODES2, TrainLayout(dp=8), EngineLayout(tp=1, replicas=1))
    weights = QWEN7B.weight_bytes("bf16")
    assert weights == pytest.approx(15.2e9, rel=0.01)
    ideal = weights / (nic * NODES2.profile.inter_node_efficiency)
    assert cost.component("broadcast") == pytest.approx(ideal, rel=1e-3)  # + one hop's latency
    assert cost.component("broadcast") >= ideal
    _single_chain(cost)


def test_broadcast_runs_engine_shards_in_parallel() -> None:
    one = broadcast_disaggregated(QWEN7B, NODES2, TrainLayout(dp=8), EngineLayout(tp=1, replicas=4))
    two = broadcast_disaggregated(QWEN7B, NODES2, TrainLayout(dp=8), EngineLayout(tp=2, replicas=2))
    assert two.component("broadcast") == pytest.approx(one.component("broadcast") / 2, rel=0.01)


def test_broadcast_needs_room_for_both_pools() -> None:
    with pytest.raises(SpecError, match="engine"):
        broadcast_disaggregated(QWEN7B, NODES2, TrainLayout(dp=8), EngineLayout(tp=1, replicas=9))


def test_colocated_reshard_gathers_only_what_the_engine_shard_lacks() -> None:
    # A tp=2 training shard (ZeRO-1 keeps weights whole) is the tp=2 engine shard: only the copy in.
    local = reshard_colocated(QWEN7B, NODES2, TrainLayout(dp=8, tp=2, zero_stage=1), EngineLayout(tp=2, replicas=8))
    assert local.component("gather") == 0 and local.component("copy") > 0
    # tp=4 training shards: each engine shard is gathered from 2 of them.
    pair = reshard_colocated(QWEN7B, NODES2, TrainLayout(dp=4, tp=4, zero_stage=1), EngineLayout(tp=2, replicas=8))
    assert pair.component("gather") > 0
    # FSDP over 16 ranks: an engine shard of tp=2 is spread over 8 ranks (one node, NVLink).
    fsdp = TrainLayout(dp=16, zero_stage=3)
    shard = reshard_colocated(QWEN7B, NODES2, fsdp, EngineLayout(tp=2, replicas=8))
    full = reshard_colocated(QWEN7B, NODES2, fsdp, EngineLayout(tp=2, replicas=8), gather_full_model=True)
    assert 0 < shard.component("gather") < full.component("gather")
    _single_chain(shard)
    _single_chain(full)


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
    w = inference_memory(QWEN7B, engine, NODES2.accelerator.hbm_bytes).weights_bytes
    assert cost.time_s == pytest.approx(w / NODES2.accelerator.pcie_bandwidth_bytes_per_s)
    assert cost.num_gpus == 16


@pytest.mark.parametrize("per_tensor_s", [0.0, 4e-4, 1.5e-3])
def test_tensor_by_tensor_sync_pays_the_profile_cost_per_checkpoint_tensor(per_tensor_s: float) -> None:
    """Both syncs add weight_sync_tensor_overhead_s x num_weight_tensors to what the bytes take;
    an MoE model pays for every expert's tensors (Qwen3-30B-A3B: 18,867 of them)."""
    prof = NODES2.profile.model_copy(update={"weight_sync_tensor_overhead_s": per_tensor_s})
    slow = NODES2.model_copy(update={"profile": prof})
    moe = load_model("Qwen3-30B-A3B")
    args = (TrainLayout(dp=4, tp=2, zero_stage=1), EngineLayout(tp=2, replicas=4))
    for model in (QWEN7B, moe):
        for sync in (broadcast_disaggregated, reshard_colocated):
            base, cost = sync(model, NODES2, *args), sync(model, slow, *args)
            extra = model.num_weight_tensors * per_tensor_s
            assert cost.time_s == pytest.approx(base.time_s + extra)
            assert cost.component("per_tensor") == pytest.approx(extra)
            assert cost.work_s == base.work_s  # host time, not device work
            _single_chain(cost)


def test_bucketed_sync_pays_per_bucket_and_hides_the_reload_behind_the_transfer() -> None:
    """Per tensor: N x (call + reload) on top of the bytes. Bucketed: one call per bucket of the
    engine shard, the reload overlapping the transfer: 18.9k MoE tensors cost 18.9k calls tensor
    by tensor and a few dozen bucketed."""
    from rlperf.specs.plan import WeightSync

    call, reload = 1e-3, 2e-4
    prof = NODES2.profile.model_copy(update={"weight_sync_tensor_overhead_s": call, "engine_load_tensor_overhead_s": reload})
    cl = NODES2.model_copy(update={"profile": prof})
    moe = load_model("Qwen3-30B-A3B")
    n = moe.num_weight_tensors
    lay, eng = TrainLayout(dp=4, tp=2, zero_stage=1), EngineLayout(tp=2, replicas=4)
    base = broadcast_disaggregated(moe, NODES2, lay, eng)
    per_tensor = broadcast_disaggregated(moe, cl, lay, eng)
    assert per_tensor.time_s == pytest.approx(base.time_s + n * (call + reload))
    bucket = 256e6
    bucketed = broadcast_disaggregated(moe, cl, lay, eng, sync=WeightSync(transfer="bucketed", bucket_bytes=bucket))
    shard_bytes = moe.weight_bytes("bf16") / 2  # tp 2 engine, bf16
    buckets = bucketed.component("per_bucket") / call
    assert buckets == pytest.approx(round(buckets)) and abs(buckets - shard_bytes / bucket) <= 1.5
    transfer = base.component("broadcast")
    assert bucketed.component("reload") == pytest.approx(max(0.0, n * reload - transfer))
    expected = base.time_s + buckets * call + max(0.0, n * reload - transfer)
    assert bucketed.time_s == pytest.approx(expected)
    assert bucketed.time_s < per_tensor.time_s / 5
    _single_chain(bucketed)
    _single_chain(per_tensor)

"""LoRA adapters (rlperf.cost.lora): parameter counts, memory and step FLOPs in closed form."""

from __future__ import annotations

import numpy as np
import pytest

from rlperf.catalog import load_model
from rlperf.cost.lora import MERGE_BYTES_PER_WEIGHT, adapter_params_per_layer, merge_cost, stage_adapter_params
from rlperf.cost.memory import train_memory
from rlperf.errors import SpecError
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import EngineLayout, TrainLayout
from rlperf.specs.plan import WeightSync
from rlperf.stages.weight_sync import reshard_colocated
from rlperf.stages.pass_cost import LayoutCosts, MicroBatchShapes

QWEN3B = load_model("Qwen2.5-3B")


def test_adapter_count_matches_peft_all_linear() -> None:
    """Qwen2.5-3B (d 2048, q 2048, kv 256, MLP 11008, 36 layers), r = 16: peft's all-linear
    adapters r(d_in + d_out) summed: 16 x (12800 + 39168) x 36 = 29,933,568."""
    assert adapter_params_per_layer(QWEN3B, 16) * QWEN3B.num_layers == 29_933_568
    lay = TrainLayout(lora_rank=16, tp=2)
    # tp 2: each column-parallel A stays whole, B halves; row-parallel the reverse
    d, q, kv, f = 2048, 2048, 256, 11008
    per_layer = 16 * ((d + q / 2) + 2 * (d + kv / 2) + (q / 2 + d) + 2 * (d + f / 2) + (f / 2 + d))
    assert stage_adapter_params(QWEN3B, lay, 36) == pytest.approx(36 * per_layer)
    assert stage_adapter_params(QWEN3B, TrainLayout(), 36) == 0


def test_adapter_path_moves_its_activations_through_hbm() -> None:
    """Qwen2.5-3B, r = 16: per layer and token the adapted linears read 3d + q + 2d + f = 23,296
    input elements and write q + 2 kv + d + 2f + d = 28,672 output elements (51,968 in all, the
    adapter count's d_in + d_out). Forward: A reads x, B writes,
    ``* scaling`` and the add pass over the output: 2 x in + (2 + 4 + 6) x out bytes per token;
    backward: 4 x in + 4 x out (GEMMs) + 6 x in + 4 x out (the input gradient's add, the
    scaling's backward)."""
    cluster = make_cluster("H100", num_gpus=8)
    shapes = MicroBatchShapes.single(np.array([1024.0, 2048.0]))
    full = LayoutCosts(QWEN3B, cluster, TrainLayout(dp=8, recompute="none"))
    lora = LayoutCosts(QWEN3B, cluster, TrainLayout(dp=8, recompute="none", lora_rank=16))
    shard_f, shard_l = full.shards[0], lora.shards[0]
    t, n = shapes.tokens, QWEN3B.num_layers
    w_in, w_out = 23_296 * n, 28_672 * n
    fwd_f, fwd_l = full.forward(shard_f, shapes), lora.forward(shard_l, shapes)
    assert np.allclose(fwd_l.hbm_bytes - fwd_f.hbm_bytes, (2 * w_in + 12 * w_out) * t)
    bwd_f, bwd_l = full.backward(shard_f, shapes, fwd_f), lora.backward(shard_l, shapes, fwd_l)
    # the frozen base drops its weight gradients (their traffic) and the adapter path adds its own
    frozen = lora._linear(shard_l, shapes, 1, shard_l.params * 2 + shard_l.matmul_io_per_token * t * 2)
    base = full._linear(shard_f, shapes, 2, shard_f.params * (2 + 8) + 2 * shard_f.matmul_io_per_token * t * 2)
    assert np.allclose((bwd_l.hbm_bytes - frozen.bytes) - (bwd_f.hbm_bytes - base.bytes), (10 * w_in + 8 * w_out) * t)
    # rank 16 is far below the ridge point: the adapter GEMMs run at HBM speed, not the GEMM rate
    assert np.all(fwd_l.body_s - fwd_f.body_s > (2 * w_in + 2 * w_out) * t / lora._matmul[1])


def test_moe_and_mla_refused_by_name() -> None:
    with pytest.raises(SpecError, match="lora_rank"):
        adapter_params_per_layer(load_model("Qwen3-30B-A3B"), 8)


def test_memory_keeps_frozen_weights_and_adapter_states() -> None:
    full = train_memory(QWEN3B, TrainLayout(dp=8, zero_stage=3), 4096)
    lora = train_memory(QWEN3B, TrainLayout(dp=8, zero_stage=3, lora_rank=16), 4096)
    adapters = 29_933_568
    # weights: the base (as before) + the adapters' bf16 copy; grads fp32 and Adam fp32
    # master + 2 moments over the adapters only, all sharded over the 8 ranks
    assert lora.weights_bytes == pytest.approx(full.weights_bytes + adapters * 2 / 8)
    assert lora.grads_bytes == pytest.approx(adapters * 4 / 8)
    assert lora.optimizer_bytes == pytest.approx(adapters * 12 / 8)
    assert lora.activations_bytes == full.activations_bytes


def test_step_flops_drop_the_base_weight_gradients() -> None:
    """Per token: forward 2P + 2A; backward 2P (data gradients) + 4A, instead of 4P."""
    cluster = make_cluster("H100", num_gpus=8)
    shapes = MicroBatchShapes.single(np.array([1024.0, 2048.0]))
    full = LayoutCosts(QWEN3B, cluster, TrainLayout(dp=8, recompute="none"))
    lora = LayoutCosts(QWEN3B, cluster, TrainLayout(dp=8, recompute="none", lora_rank=16))
    shard_f, shard_l = full.shards[0], lora.shards[0]
    t = shapes.tokens
    a = 29_933_568
    p = shard_f.matmul_params_per_token
    fwd_f, fwd_l = full.forward(shard_f, shapes), lora.forward(shard_l, shapes)
    assert np.allclose(fwd_l.flops - fwd_f.flops, 2 * a * t)
    bwd_f, bwd_l = full.backward(shard_f, shapes, fwd_f), lora.backward(shard_l, shapes, fwd_l)
    assert np.allclose(bwd_f.flops - bwd_l.flops, 2 * p * t - 4 * a * t)
    # the optimizer updates the adapters only (ZeRO-sharded)
    assert lora.trained_params(shard_l) == pytest.approx(a / 8)
    assert full.trained_params(shard_f) == pytest.approx(full.resident_params(shard_f))


def test_planner_and_default_plans_keep_the_runs_lora() -> None:
    """LoRA is what the run trains, not a layout choice: candidate and default plans keep it."""
    from rlperf.frameworks.default_plan import build_default_plan
    from rlperf.frameworks.presets import get_framework
    from rlperf.plan.space import train_layouts
    from rlperf.scenario import ScenarioSpec, resolve

    spec = ScenarioSpec.model_validate({
        "model": "Qwen2.5-3B", "cluster": {"gpu": "H100", "num_nodes": 1, "gpus_per_node": 8},
        "workload": {"preset": "deepscaler-8k"}, "plan": {"layouts": {"actor": {"lora_rank": 8}}},
    })
    assert {lay.lora_rank for lay in train_layouts(resolve(spec))} == {8}
    assert build_default_plan(get_framework("verl"), spec).plan.layout_for("actor").lora_rank == 8


def test_merging_the_adapters_passes_over_every_adapted_weight_on_each_rank() -> None:
    """DeepSpeed's hybrid engine fuses W += s (A B) into each gathered weight: Qwen2.5-3B adapts
    d(2q + 2kv) + 3 d f = 2048 x (4096 + 512) + 3 x 2048 x 11008 = 77,070,336 weights a layer;
    each costs the product's write and the scaling and add passes (12 bytes, memory bound at a
    low rank), plus reading the two rank-r factors. The sync adds exactly that on every rank."""
    cluster = make_cluster("H100", num_gpus=8)
    weights = 36 * 77_070_336
    seconds, num_bytes = merge_cost(QWEN3B, cluster, 16, "bf16")
    factors = 36 * 2 * 16 * 51_968  # A and B of every adapted linear, read by the product
    assert num_bytes == pytest.approx(MERGE_BYTES_PER_WEIGHT * weights + factors)
    # at least every byte at the HBM rate, and every kernel's launch (3 per linear, 7 linears)
    hbm = cluster.accelerator.hbm_bandwidth_bytes_per_s * cluster.profile.hbm_efficiency
    launches = 36 * 7 * 3 * cluster.profile.kernel_launch_s
    assert seconds >= num_bytes / hbm + launches
    assert merge_cost(QWEN3B, cluster, 0, "bf16") == (0.0, 0.0)

    engine = EngineLayout(tp=2, replicas=4)
    lora = TrainLayout(dp=8, zero_stage=3, lora_rank=16)
    plain = reshard_colocated(QWEN3B, cluster, lora, engine)
    merged = reshard_colocated(QWEN3B, cluster, lora, engine, sync=WeightSync(lora_merge=True))
    assert merged.time_s - plain.time_s == pytest.approx(seconds)
    assert dict(merged.breakdown)["lora_merge"] == pytest.approx(seconds)
    # full fine-tuning has nothing to merge
    full = TrainLayout(dp=8, zero_stage=3)
    assert reshard_colocated(QWEN3B, cluster, full, engine, sync=WeightSync(lora_merge=True)).time_s == plain_time(full, engine)


def plain_time(layout: TrainLayout, engine: EngineLayout) -> float:
    return reshard_colocated(QWEN3B, make_cluster("H100", num_gpus=8), layout, engine).time_s

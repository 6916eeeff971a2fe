"""Closed-form checks of training as FSDP trainers run it: the backends' elementwise kernel sets
(rlperf.stages.elementwise), FlashAttention's backward (which recomputes the scores) and ZeRO-3's
per-unit collectives."""

from __future__ import annotations

import numpy as np
import pytest

from rlperf.catalog import load_model
from rlperf.cost.collectives import all_gather, reduce_scatter
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.elementwise import EAGER, FUSED, kernels_for
from rlperf.stages.pass_cost import LayoutCosts, MicroBatchShapes
from rlperf.stages.shard import stage_shards
from rlperf.stages.train import train_step

QWEN = load_model("Qwen3-0.6B")  # RMSNorm, rotary, QK-norm, SwiGLU
H100 = make_cluster("h100_sxm", num_gpus=8)


def _dense_layer_elements(model, tp: int = 1) -> tuple[float, float, float, float, float]:  # type: ignore[no-untyped-def]
    """(norm, residual, rotary, qk-norm, MLP-width) features per token of one layer on one rank."""
    d = model.hidden_size
    qk = (model.num_heads + model.num_kv_heads) * model.head_dim / tp
    return model.norm.per_layer * d, 2 * d, qk, qk if model.qk_norm else 0.0, model.intermediate_size / tp


@pytest.mark.parametrize("ops", [FUSED, EAGER])
def test_elementwise_bytes_are_the_kernel_sets_bytes_per_element(ops) -> None:  # type: ignore[no-untyped-def]
    (shard,) = stage_shards(QWEN, 1, 1, 1, ops=ops)
    norm, res, rot, qkn, width = _dense_layer_elements(QWEN)
    per_layer = (norm * ops.rmsnorm_bytes + res * ops.residual_bytes + rot * ops.rotary_bytes
                 + qkn * ops.qk_norm_bytes + width * ops.gated_bytes)
    assert shard.elementwise_bytes_per_token == pytest.approx(QWEN.num_layers * per_layer, rel=1e-12)


def test_fused_set_reads_and_writes_each_element_once() -> None:
    # fused kernels: read + write in bf16 (4 bytes), adds read 2 write 1 (6), SwiGLU 2 in 1 out (6)
    assert (FUSED.rmsnorm_bytes, FUSED.residual_bytes, FUSED.rotary_bytes, FUSED.gated_bytes) == (4, 6, 4, 6)
    # transformers' RMSNorm: to(fp32) 2+4, pow 4+4, mean 4, mul 4+4, to(bf16) 4+2, weight 2+2
    assert EAGER.rmsnorm_bytes == 6 + 8 + 4 + 8 + 6 + 4
    assert EAGER.rotary_bytes == 4 + 2 + 4 + 4 + 6  # q*cos, -x2 (half), cat, *sin, +
    assert EAGER.gated_bytes == 4 + 6  # silu(gate), * up
    assert kernels_for("megatron") is FUSED and kernels_for("fsdp") is EAGER


def test_fsdp_runs_the_eager_set_and_megatron_the_fused_one() -> None:
    seqs = MicroBatchShapes.single(np.array([4096]))
    passes = {}
    for backend in ("fsdp", "megatron"):
        costs = LayoutCosts(QWEN, H100, TrainLayout(backend=backend))
        passes[backend] = costs.forward(costs.shards[0], seqs)
    eager, fused = passes["fsdp"], passes["megatron"]
    norm, _, rot, qkn, width = _dense_layer_elements(QWEN)
    extra = QWEN.num_layers * 4096 * (norm * 32 + rot * 16 + qkn * 32 + width * 4)
    assert eager.hbm_bytes[0] - fused.hbm_bytes[0] == pytest.approx(extra, rel=1e-9)
    assert eager.body_s[0] > fused.body_s[0]
    kernels = QWEN.num_layers * (EAGER.layer_kernels(QWEN) - FUSED.layer_kernels(QWEN))
    assert eager.launch_s[0] - fused.launch_s[0] == pytest.approx(kernels * H100.profile.kernel_launch_s)


def test_flash_backward_recomputes_the_scores() -> None:
    costs = LayoutCosts(QWEN, H100, TrainLayout())
    shard = costs.shards[0]
    mb = MicroBatchShapes.single(np.array([32768]))  # long: compute bound
    fwd = costs._attention(shard, mb, backward=False)
    bwd = costs._attention(shard, mb, backward=True)
    assert bwd.flops[0] == pytest.approx(2 * fwd.flops[0])  # the model's FLOPs
    qk, v = QWEN.q_head_dim, QWEN.v_head_dim
    assert bwd.time_s[0] == pytest.approx((3 * qk + 2 * v) / (qk + v) * fwd.time_s[0], rel=1e-9)  # 2.5x


def test_zero3_gathers_and_reduces_one_unit_at_a_time() -> None:
    costs = LayoutCosts(QWEN, H100, TrainLayout(dp=8, zero_stage=3))
    shard = costs.shards[0]
    units = shard.num_layers + 1  # every layer, and the root (embedding, final norm, head)
    gather = costs.weight_gather(shard, np.zeros(1))
    one = all_gather(H100, shard.params * 2 / units, costs.shard_group)
    assert gather.time_s == pytest.approx(units * one.time_s)
    assert gather.bytes_sent == pytest.approx(units * one.bytes_sent_per_rank)
    # each message pays its own latency: more than one collective of the whole stage
    assert gather.time_s > all_gather(H100, shard.params * 2, costs.shard_group).time_s
    rs = costs.grad_reduce(shard, np.zeros(1), "reduce_scatter")
    assert rs.time_s == pytest.approx(units * reduce_scatter(H100, shard.params * 4 / units, costs.shard_group).time_s)


def test_ulysses_moves_repeated_kv_heads_and_copies_each_tensor_twice() -> None:
    model = load_model("Qwen2.5-1.5B")  # 12 heads, 2 KV heads of 128
    lay = TrainLayout(dp=2, cp=4, cp_kind="ulysses")
    costs = LayoutCosts(model, H100, lay)
    shard = costs.shards[0]
    # k and v repeated to 4 heads (each rank gets one); q and o whole: 12 + 4 + 4 + 12 heads
    assert costs._ulysses_elements(shard) == (12 + 4 + 4 + 12) * 128
    t = np.array([8192.0])
    plain = LayoutCosts(model, H100, lay.model_copy(update={"cp": 1, "dp": 8}))
    copies = costs._elementwise(shard, t, 0, 1).bytes[0] - plain._elementwise(shard, t, 0, 1).bytes[0]
    assert copies == pytest.approx(8.0 * 32 * 128 * model.num_layers * 8192)
    assert LayoutCosts(QWEN, H100, lay)._ulysses_elements(LayoutCosts(QWEN, H100, lay).shards[0]) == (
        2 * QWEN.num_heads + 2 * QWEN.num_kv_heads) * QWEN.head_dim  # 8 KV heads: no repeat


def test_zero2_reduces_every_micro_batch_under_deepspeed_and_once_under_megatron() -> None:
    n, mbs = 4, 8  # 8 micro-batches per rank
    seqs = np.full(n * mbs, 512)
    sent = {}
    for backend in ("fsdp", "megatron"):
        lay = TrainLayout(dp=n, zero_stage=2, micro_batch_size=1, backend=backend)
        costs = LayoutCosts(QWEN, H100, lay)
        assert costs.reduces_every_microbatch == (backend == "fsdp")
        sent[backend] = train_step(QWEN, H100, lay, seqs).comm_bytes
    grads = (n - 1) / n * QWEN.num_params * 4 * n  # one fp32 reduce-scatter, every rank
    assert sent["fsdp"] - sent["megatron"] == pytest.approx((mbs - 1) * grads, rel=1e-6)


def test_zero2_offload_moves_each_micro_batch_partition_down_and_up() -> None:
    lay = TrainLayout(dp=4, zero_stage=2, offload_optimizer=True)
    costs = LayoutCosts(QWEN, H100, lay)
    shard = costs.shards[0]
    plain = LayoutCosts(QWEN, H100, lay.model_copy(update={"offload_optimizer": False}))
    pcie = H100.accelerator.pcie_bandwidth_bytes_per_s
    extra = costs._dp_traffic(shard, "reduce_scatter")[0] - plain._dp_traffic(shard, "reduce_scatter")[0]
    assert extra == pytest.approx(2 * costs.resident_params(shard) * 4 / pcie)


def test_deepspeed_gathers_one_linear_projection_at_a_time() -> None:
    """DeepSpeed's coordinator fetches each submodule's parameters in one all-gather
    (gather_unit="module"): a dense layer's q, k, v, o and MLP matrices each pay their own
    latency, the same bytes in all; FSDP gathers the layer at once."""
    layer = LayoutCosts(QWEN, H100, TrainLayout(dp=8, zero_stage=3))
    module = LayoutCosts(QWEN, H100, TrainLayout(dp=8, zero_stage=3, gather_unit="module"))
    shard = module.shards[0]
    per_layer = (2 if QWEN.fused_qkv else 4) + QWEN.mlp.num_matrices
    units = shard.num_layers * per_layer + 1
    assert module.gather_units(shard) == units and layer.gather_units(shard) == shard.num_layers + 1
    gather = module.weight_gather(shard, np.zeros(1))
    one = all_gather(H100, shard.params * 2 / units, module.shard_group)
    assert gather.time_s == pytest.approx(units * one.time_s)
    assert gather.bytes_sent == pytest.approx(layer.weight_gather(shard, np.zeros(1)).bytes_sent)
    assert gather.time_s > layer.weight_gather(shard, np.zeros(1)).time_s
    # the gradients are still reduce-scattered per layer unit
    assert module.grad_reduce(shard, np.zeros(1), "reduce_scatter").time_s == pytest.approx(
        layer.grad_reduce(shard, np.zeros(1), "reduce_scatter").time_s)

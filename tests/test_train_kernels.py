"""Closed-form checks of the kernel-level training terms: unfused attention, the backend's host
overhead per layer and pass, and NCCL's two protocols in the collectives."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rlperf.catalog import load_model
from rlperf.cost.collectives import all_gather, all_reduce, group_for
from rlperf.cost.roofline import matmul_size_factor
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.microbatch import microbatches_for
from rlperf.stages.pass_cost import (
    HF_EAGER_BACKWARD_BYTES,
    HF_EAGER_FORWARD_BYTES,
    UNFUSED_BACKWARD_BYTES,
    UNFUSED_FORWARD_BYTES,
    LayoutCosts,
    MicroBatchShapes,
)
from rlperf.stages.elementwise import FUSED
from rlperf.stages.shard import StageShard, stage_shards
from rlperf.stages.softmax import fused_softmax_available
from rlperf.stages.train import train_step
from rlperf.validate_train import gpt3_model

MODEL = load_model("Qwen3-0.6B")  # 28 layers, 16 heads
A100 = make_cluster("a100_80gb_sxm", num_gpus=8)


def _with(cluster, **fields):  # type: ignore[no-untyped-def]
    return cluster.model_copy(update={"profile": cluster.profile.model_copy(update=fields)})


@pytest.mark.parametrize(("backend", "fwd_table", "bwd_table", "sums", "layout_ops"), [
    ("megatron", UNFUSED_FORWARD_BYTES, UNFUSED_BACKWARD_BYTES, (13, 19), 0),  # fused scale-mask-softmax
    ("fsdp", HF_EAGER_FORWARD_BYTES, HF_EAGER_BACKWARD_BYTES, (24, 46), 5),  # Hugging Face's eager ops
])
def test_unfused_attention_moves_the_square_of_scores_through_hbm(backend, fwd_table, bwd_table, sums, layout_ops) -> None:  # type: ignore[no-untyped-def]
    tp, b, s = 2, 4, 1024  # b x heads per rank = 32: Megatron's fused softmax kernel applies
    lay = TrainLayout(tp=tp, micro_batch_size=b, attention_kernel="unfused", packing=False, backend=backend)
    costs = LayoutCosts(MODEL, A100, lay)
    shard = costs.shards[0]
    mb = MicroBatchShapes.of(microbatches_for(np.full(b, s), lay), padded=True)
    scores = shard.num_layers * MODEL.num_heads / tp * b * s * s  # every (query, key), full square
    io = shard.attention_io_per_token * b * s * 2  # q, k, v, o in bf16
    # Hugging Face's OPTAttention also copies q, k, v into the heads-first layout and the output
    # back (4 bytes per feature each) and scales the query (4 per q feature), in both passes:
    # Qwen3-0.6B at tp 2 holds 8 query heads and 4 KV heads of 128 a layer
    q, kv = 8 * 128, 4 * 128
    assert shard.attention_io_per_token == shard.num_layers * (2 * q + 2 * kv)
    copies = (4 * (2 * q + 2 * kv) + 4 * q) * shard.num_layers * b * s if layout_ops else 0.0
    fwd = costs._attention(shard, mb, backward=False)
    bwd = costs._attention(shard, mb, backward=True)
    assert fwd.bytes[0] == pytest.approx(fwd_table.sum() * scores + io + copies, rel=1e-12)
    assert bwd.bytes[0] == pytest.approx(bwd_table.sum() * scores + 2 * io + copies, rel=1e-12)
    assert (fwd_table.sum(), bwd_table.sum()) == sums
    # both score GEMMs (QK^T and PV) over the full square: 2 x 2 x head_dim FLOPs per score
    assert fwd.flops[0] == pytest.approx(2 * 2 * MODEL.head_dim * scores)
    assert bwd.flops[0] == pytest.approx(4 * 2 * MODEL.head_dim * scores)  # dP, dV, dQ, dK
    # one kernel per op, the core counted once in the shard's kernels
    assert costs._kernels(shard) == shard.kernels + (len(fwd_table) - 1 + layout_ops) * shard.num_layers
    flash = LayoutCosts(MODEL, A100, lay.model_copy(update={"attention_kernel": "flash"}))
    assert flash._attention(shard, mb, backward=False).time_s[0] < fwd.time_s[0]


def test_host_overhead_is_layers_times_passes_times_the_per_layer_cost() -> None:
    h = 1e-3
    cl = _with(A100, megatron_layer_overhead_s=h)
    lay = TrainLayout(dp=1, micro_batch_size=1, zero_stage=0, backend="megatron", recompute="full")
    costs = LayoutCosts(MODEL, cl, lay)
    shard = costs.shards[0]
    mb = MicroBatchShapes.single(np.array([512]))
    fwd = costs.forward(shard, mb)
    bwd = costs.backward(shard, mb, fwd)
    units = MODEL.num_layers + 2  # one stage: the layers, the embedding and the LM head + loss
    assert fwd.host_s == pytest.approx(units * h)
    assert bwd.host_s == pytest.approx(2 * units * h)  # backward + the recomputed forward
    # a dense model has no host-device synchronization: the smooth maximum of host and device
    # time alone, bit for bit
    assert shard.host_syncs == 0
    assert np.all(fwd.host_serial_s == 0) and np.all(bwd.host_serial_s == 0)
    for p in (fwd, bwd):
        assert np.array_equal(p.host_exposed_s, np.maximum(0.0, (p.host_s**3 + p.device_s**3) ** (1 / 3) - p.device_s))
    # two stages: the embedding on the first, the head on the last
    two = LayoutCosts(MODEL, cl, lay.model_copy(update={"pp": 2}))
    assert [two.forward(sh, mb).host_s for sh in two.shards] == pytest.approx(
        [(sh.num_layers + 1) * h for sh in two.shards])
    # another backend's figure does not apply
    assert LayoutCosts(MODEL, cl, lay.model_copy(update={"backend": "fsdp"})).forward(shard, mb).host_s == 0


def test_a_host_bound_step_is_the_host_time() -> None:
    # one second per layer and pass dwarfs the device: micro-batches x 3 passes x (layers + 2)
    cl = _with(A100, megatron_layer_overhead_s=1.0)
    lay = TrainLayout(dp=1, micro_batch_size=1, zero_stage=0, backend="megatron", recompute="full")
    n = 4
    step = train_step(MODEL, cl, lay, np.full(n, 256))
    assert step.time_s == pytest.approx(n * 3 * (MODEL.num_layers + 2), rel=1e-2)
    assert step.component("host") > 0.99 * step.time_s
    # a device-bound step hides the host time (entirely under max, all but a sliver when smooth)
    tiny = _with(A100, megatron_layer_overhead_s=1e-6)
    assert train_step(MODEL, _with(tiny, host_overlap_exponent=None), lay, np.full(n, 4096)).component("host") == 0
    busy = train_step(MODEL, _with(tiny, host_overlap_exponent=3.0), lay, np.full(n, 4096))
    assert busy.component("host") < 1e-6 * busy.time_s


def test_smooth_overlap_closed_form() -> None:
    # host = device: max gives the device time, the smooth maximum 2^(1/k) of it
    lay = TrainLayout(dp=1, micro_batch_size=1, zero_stage=0, backend="megatron", recompute="none")
    mb = MicroBatchShapes.single(np.array([512]))
    probe = LayoutCosts(MODEL, A100, lay)
    device = float(probe.forward(probe.shards[0], mb).device_s[0])
    per_layer = device / (MODEL.num_layers + 2)
    for k, factor in ((None, 1.0), (3.0, 2 ** (1 / 3)), (2.0, 2**0.5)):
        costs = LayoutCosts(MODEL, _with(A100, megatron_layer_overhead_s=per_layer, host_overlap_exponent=k), lay)
        fwd = costs.forward(costs.shards[0], mb)
        assert fwd.host_s == pytest.approx(device)
        assert float(fwd.time_s[0]) == pytest.approx(factor * device, rel=1e-9)


MOE = load_model("Qwen3-30B-A3B")  # 48 layers, all MoE


@pytest.mark.parametrize("k", [None, 3.0])
def test_the_op_after_each_moe_dispatch_sync_adds_to_the_device_time(k) -> None:  # type: ignore[no-untyped-def]
    # Megatron-Core's dispatcher waits for the tokens-per-expert counts once per MoE layer and
    # forward: the host time of one op per synchronization leaves the overlap
    h = 1e-3
    cl = _with(A100, megatron_layer_overhead_s=h, host_overlap_exponent=k)
    lay = TrainLayout(dp=8, ep=8, pp=4, micro_batch_size=1, zero_stage=1, backend="megatron", recompute="full")
    costs = LayoutCosts(MOE, cl.with_gpus(32), lay)
    mb = MicroBatchShapes.of(microbatches_for(np.array([256, 512, 4096]), lay))
    for shard in costs.shards:
        assert shard.host_syncs == shard.num_moe_layers == shard.num_layers == 12
        per_op = h * shard.num_layers / costs._kernels(shard)  # the layer's overhead over its kernels
        fwd = costs.forward(shard, mb)
        serial = 12 * per_op
        assert fwd.host_serial_s == pytest.approx(np.full(3, serial), rel=1e-12)
        host, dev = fwd.host_s, fwd.device_s
        free = host - serial
        blend = np.maximum(free, dev) if k is None else (free**k + dev**k) ** (1 / k)
        assert fwd.time_s == pytest.approx(blend + serial + fwd.pp_s, rel=1e-12)  # additive at the syncs
        # the replayed forward synchronizes again; the backward's own ops do not
        bwd = costs.backward(shard, mb, fwd)
        assert bwd.host_serial_s == pytest.approx(fwd.host_serial_s, rel=1e-12)
        none = LayoutCosts(MOE, cl.with_gpus(32), lay.model_copy(update={"recompute": "none"}))
        assert np.all(none.backward(shard, mb, none.forward(shard, mb)).host_serial_s == 0)


def test_the_sync_costs_one_op_device_bound_and_nothing_host_bound() -> None:
    lay = TrainLayout(dp=8, ep=8, micro_batch_size=1, zero_stage=1, backend="megatron", recompute="none")
    mb = MicroBatchShapes.single(np.array([8192]))

    def forward(h: float):  # type: ignore[no-untyped-def]
        costs = LayoutCosts(MOE, _with(A100, megatron_layer_overhead_s=h, host_overlap_exponent=3.0), lay)
        return costs.forward(costs.shards[0], mb)

    # device-bound: the host hides under the device except the op after each synchronization
    fast = forward(1e-7)
    assert float(fast.host_serial_s[0]) > 0
    assert float(fast.host_exposed_s[0]) == pytest.approx(float(fast.host_serial_s[0]), rel=1e-6)
    # host-bound: the device waits for the host anyway, the pass takes the host time
    slow = forward(1.0)
    assert float(slow.time_s[0]) == pytest.approx(float(slow.host_s[0] + slow.pp_s[0]), rel=1e-4)
    assert float(slow.host_exposed_s[0]) == pytest.approx(float(slow.host_s[0] - slow.device_s[0]), rel=1e-4)


def _gemm_flops(shard: StageShard) -> float:
    return float(sum(w * r * c for w, r, c in zip(shard.gemm_weights, shard.gemm_rows_per_token, shard.gemm_counts)))


def _gemm_work_at_rate(shard: StageShard, tokens: float) -> float:
    """sum over the shard's GEMMs of count x work / size factor (large-GEMM FLOPs)."""
    w, r, c = (np.asarray(x, dtype=np.float64) for x in (shard.gemm_weights, shard.gemm_rows_per_token, shard.gemm_counts))
    work = 2 * w * r * tokens
    return float((c * work / matmul_size_factor(A100.profile, work)).sum())


@pytest.mark.parametrize(("ep", "local", "waves"), [(8, 16, 4), (32, 4, 1), (64, 2, 1)])
def test_te_grouped_linear_runs_one_gemm_per_local_expert_four_streams_at_once(ep: int, local: int, waves: int) -> None:
    moe = MOE.moe
    assert moe is not None and moe.num_experts == 128
    d, f, mats, rows = MOE.hidden_size, moe.expert_intermediate_size, MOE.mlp.num_matrices, ep * moe.experts_per_token / 128
    te = stage_shards(MOE, 1, 1, ep, ops=FUSED)[0]  # Megatron: TEGroupedMLP -> GroupedLinear
    grouped = stage_shards(MOE, 1, 1, ep, ops=replace(FUSED, expert_gemm_streams=None))[0]
    alone = stage_shards(MOE, 1, 1, ep, ops=replace(FUSED, expert_gemm_streams=1))[0]
    routed = {(w, c) for w, r, c in zip(te.gemm_weights, te.gemm_rows_per_token, te.gemm_counts) if r == rows}
    n = MOE.num_layers  # one stage: every layer's GEMMs (all MoE)
    assert routed == {(local / waves * d * f, n * mats * waves)}  # ceil(L / 4) waves of L / waves experts
    assert {(w, c) for w, r, c in zip(grouped.gemm_weights, grouped.gemm_rows_per_token, grouped.gemm_counts)
            if r == rows} == {(local * d * f, n * mats)}
    # one launch per expert GEMM: L - 1 per projection beyond the kernel counted for it
    assert te.expert_gemm_launches == alone.expert_gemm_launches == n * mats * (local - 1)
    assert grouped.expert_gemm_launches == 0 and te.kernels == grouped.kernels
    # the same FLOPs, at the rate of smaller GEMMs: between one grouped GEMM and every expert alone
    assert _gemm_flops(te) == pytest.approx(_gemm_flops(grouped), rel=1e-12) == pytest.approx(te.matmul_params_per_token)
    for tokens in (512.0, 8192.0):
        g, t, a = (_gemm_work_at_rate(sh, tokens) for sh in (grouped, te, alone))
        assert g < a and g <= t <= a
        assert (t == pytest.approx(g, rel=1e-12)) is (waves == 1 and local <= 4)
    # the Megatron layout's passes use these GEMMs and launches
    lay = TrainLayout(dp=ep, ep=ep, micro_batch_size=1, zero_stage=1, backend="megatron", recompute="none")
    costs = LayoutCosts(MOE, A100.with_gpus(ep), lay)
    mb = MicroBatchShapes.single(np.array([2048]))
    shard = costs.shards[0]
    assert shard == te
    assert float(costs._gemm_flops_at_rate(shard, mb)[0]) == pytest.approx(_gemm_work_at_rate(te, 2048.0), rel=1e-12)
    fwd = costs.forward(shard, mb)
    assert float(fwd.launch_s[0]) == pytest.approx((costs._kernels(shard) + te.expert_gemm_launches) * A100.profile.kernel_launch_s)


def test_collectives_latency_at_one_byte_bandwidth_at_large_sizes() -> None:
    prof = A100.profile
    assert prof.collective_simple_latency_s and prof.collective_ll_bandwidth_fraction
    for p in (2, 4, 8):
        g = group_for(A100, p)
        alpha = prof.intra_node_latency_s
        # 1 byte: the low-latency protocol, the ring's 2(p-1) steps and nothing else to speak of
        assert all_reduce(A100, 1.0, g, "ring").time_s == pytest.approx(2 * (p - 1) * alpha, rel=1e-3)
        # 1 GiB: Simple's start-up is noise next to 2(p-1)/p n / B
        n = 2.0**30
        bw = A100.accelerator.intra_node_group_bandwidth_bytes_per_s(p) * prof.intra_node_efficiency
        t = all_reduce(A100, n, g, "ring").time_s
        assert t == pytest.approx(prof.collective_simple_latency_s + 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bw)
        assert t == pytest.approx(2 * (p - 1) / p * n / bw, rel=0.02)
        # the all-gather pays one start-up too
        ag = all_gather(A100, n, g).time_s
        assert ag == pytest.approx(prof.collective_simple_latency_s + (p - 1) * alpha + (p - 1) / p * n / bw)


def test_protocol_switch_is_continuous_and_monotone() -> None:
    g = group_for(A100, 8)
    sizes = np.geomspace(1, 2.0**31, 200)
    times = np.array([all_reduce(A100, float(n), g).time_s for n in sizes])
    assert np.all(np.diff(times) >= 0)


def test_vtrain_lut_points_within_a_fifth() -> None:
    # three published points of vTrain's A100 look-up table (trace/a100/AR_GPU{2,8}_1M_1024M_LUT)
    for p, n, measured_s in ((2, 2**20, 44.2e-6), (8, 2**20, 92.8e-6), (8, 2**30, 8193.0e-6)):
        t = all_reduce(A100, float(n), group_for(A100, p)).time_s
        assert t / measured_s == pytest.approx(1.0, abs=0.2)


def test_megatron_fused_softmax_conditions() -> None:
    # (sequences, heads per rank, padded length) -> Megatron's is_kernel_available
    cases = {
        (1, 2, 1024): False,  # b x np = 2: not a multiple of 4 (vTrain's tp 8, micro-batch 1)
        (2, 2, 1024): True,
        (1, 4, 1024): True,
        (1, 8, 4096): True,
        (1, 8, 4100): False,  # sk > 4096
        (1, 8, 1022): False,  # sk % 4
        (1, 8, 16): False,  # sk <= 16
        (1, 4, 64): False,  # sk 64: 8 batches per block (2 per warp, 4 warps)
        (2, 4, 64): True,
        (3, 4, 256): True,  # sk > 128: 4 per block
    }
    for (b, heads, sk), fused in cases.items():
        got = fused_softmax_available("megatron", np.array([b]), heads, np.array([sk]))
        assert bool(got[0]) is fused, (b, heads, sk)
        assert fused_softmax_available("fsdp", np.array([b]), heads, np.array([sk]))[0]


def test_softmax_fallback_adds_its_bytes_kernels_and_host_ops() -> None:
    h, tp, s = 1e-3, 8, 1024
    model = gpt3_model(1024, 16, 12, s)  # 16 heads: 2 per rank at tp 8
    cl = _with(A100, megatron_layer_overhead_s=h)
    lay = TrainLayout(tp=tp, micro_batch_size=1, zero_stage=0, backend="megatron", recompute="full",
                      attention_kernel="unfused", packing=False)
    costs = LayoutCosts(model, cl, lay)
    shard = costs.shards[0]
    mb = MicroBatchShapes.of(microbatches_for(np.full(1, s), lay), padded=True)
    scores = shard.num_layers * model.num_heads / tp * s * s
    io = shard.attention_io_per_token * s * 2  # q, k, v, o in bf16
    for backward, table, extra in ((False, UNFUSED_FORWARD_BYTES, 36 - 4), (True, UNFUSED_BACKWARD_BYTES, 40 - 6)):
        fused = table.sum() * scores + (2 if backward else 1) * io  # the kernel's own bytes
        diff = costs._attention(shard, mb, backward).bytes[0] - fused
        assert diff == pytest.approx(extra * scores, rel=1e-9)
    fwd = costs.forward(shard, mb)
    units = model.num_layers + 2
    kernels = costs._kernels(shard)  # the layer's overhead is spread over its kernels
    assert fwd.host_s[0] == pytest.approx(units * h + 4 * model.num_layers * h * model.num_layers / kernels)
    assert fwd.launch_s[0] == pytest.approx((kernels + 4 * model.num_layers) * cl.profile.kernel_launch_s)
    # two sequences per micro-batch (b x np = 4) take the fused kernel: no extra host time
    two = MicroBatchShapes.of(microbatches_for(np.full(2, s), lay.model_copy(update={"micro_batch_size": 2})), padded=True)
    assert costs.forward(shard, two).host_s[0] == pytest.approx(units * h)


def test_deepspeed_regathers_what_it_releases_between_recompute_and_backward() -> None:
    # GPT-2 block at d = 1024 (2^20 = M): modules qkv 3M, o 1M, fc 4M, proj 4M. Between a
    # module's recomputed forward and its backward lie the modules after it, twice: qkv 2 x 9M,
    # o 2 x 8M, fc 2 x 4M, proj 0
    model, mi = gpt3_model(1024, 16, 12, 1024), float(2**20)
    lay = TrainLayout(dp=8, zero_stage=3, recompute="full", gather_unit="module", prefetch_gathers=False)

    def regathered(**update):  # type: ignore[no-untyped-def]
        costs = LayoutCosts(model, A100, lay.model_copy(update=update))
        return costs.regathered_modules(costs.shards[0])

    assert regathered(max_reuse_distance_params=17 * mi) == (1, 3 * mi)  # qkv only
    assert regathered(max_reuse_distance_params=16 * mi) == (2, 4 * mi)  # the limit is reached: o too
    assert regathered(max_reuse_distance_params=8 * mi) == (3, 8 * mi)
    assert regathered() == (0, 0.0)  # DeepSpeed's default 1e9 keeps them all at this size
    # only DeepSpeed's per-module coordinator under full recompute releases them this way
    for other in ({"gather_unit": "layer"}, {"recompute": "selective"}, {"zero_stage": 2}):
        assert regathered(max_reuse_distance_params=0.0, **other) == (0, 0.0)
    # the backward's gather is the forward's plus one all-gather per module gathered again
    costs = LayoutCosts(model, A100, lay.model_copy(update={"max_reuse_distance_params": 16 * mi}))
    shard = costs.shards[0]
    compute = np.array([1.0])
    fwd, bwd = costs.weight_gather(shard, compute), costs.weight_gather(shard, compute, backward=True)
    one = all_gather(A100, 2 * mi * 2, costs.shard_group)  # a module of 2M parameters on average, bf16
    assert bwd.exposed_s[0] == pytest.approx(fwd.exposed_s[0] + 2 * model.num_layers * one.time_s, rel=1e-12)
    assert bwd.bytes_sent == pytest.approx(fwd.bytes_sent + 2 * model.num_layers * one.bytes_sent_per_rank, rel=1e-12)


def test_deepspeed_copies_a_coalesced_gather_out_of_its_flat_buffer() -> None:
    # GPT-2 block at d = 1024 (M = 2^20): modules qkv 3M (bias 3,072), o 1M (bias 1,024), fc 4M
    # (bias 4,096), proj 4M (bias 1,024). DeepSpeed partitions a tensor above the persistence
    # threshold; a module left with two or more is gathered through one flat buffer: the shards
    # cat'ed in (1/N of it), every tensor cat'ed out (all of it), read and write, bf16
    model, mi, layers, n = gpt3_model(1024, 16, 12, 1024), float(2**20), 12, 8
    lay = TrainLayout(dp=n, zero_stage=3, recompute="none", gather_unit="module", prefetch_gathers=False)

    def copy(**update):  # type: ignore[no-untyped-def]
        costs = LayoutCosts(model, A100, lay.model_copy(update=update))
        return costs.gather_copy_bytes(costs.shards[0])

    per_element = 2 * 2 * (1 + 1 / n)
    assert copy() == (0.0, 0)  # DeepSpeed's default 1e5 keeps every bias gathered: one tensor a module
    # every bias partitioned: all four modules coalesced, three kernels each (two tensors, the shards)
    assert copy(persistence_threshold_params=1000) == pytest.approx(
        (layers * per_element * (12 * mi + 3072 + 1024 + 4096 + 1024), layers * 4 * 3))
    # only the biases above 2,000 elements: qkv and fc
    assert copy(persistence_threshold_params=2000) == pytest.approx(
        (layers * per_element * (7 * mi + 3072 + 4096), layers * 2 * 3))
    # LoRA rank 128: A (r x d_in) and B (r x d_out) beside every weight, all above 1e5
    adapters = 128 * ((1024 + 3072) + (1024 + 1024) + (1024 + 4096) + (4096 + 1024))
    assert copy(lora_rank=128) == pytest.approx((layers * per_element * (12 * mi + adapters), layers * 4 * 4))
    # nothing without DeepSpeed's per-module coalesced gather over more than one rank
    for other in ({"gather_unit": "layer"}, {"zero_stage": 2}, {"dp": 1}):
        assert copy(persistence_threshold_params=1000, **other) == (0.0, 0)


def test_the_gather_copy_is_on_each_pass_and_on_what_the_backward_gathers_again() -> None:
    model, mi, layers = gpt3_model(1024, 16, 12, 1024), float(2**20), 12
    lay = TrainLayout(dp=8, zero_stage=3, recompute="none", gather_unit="module", prefetch_gathers=False,
                      micro_batch_size=1, packing=False)
    mb = MicroBatchShapes.of(microbatches_for(np.full(1, 1024), lay), padded=True)
    bandwidth = A100.accelerator.hbm_bandwidth_bytes_per_s * A100.profile.hbm_efficiency

    def passes(**update):  # type: ignore[no-untyped-def]
        costs = LayoutCosts(model, A100, lay.model_copy(update=update))
        shard = costs.shards[0]
        fwd = costs.forward(shard, mb)
        return fwd, costs.backward(shard, mb, fwd)

    for recompute, again in (("none", 0.0), ("full", 0.0), ("full", 4 * mi + 3072 + 1024)):
        # at a reuse distance of 16M the backward gathers qkv and o again (the regather test), biases too
        reuse = 16 * mi if again else 1e9
        f0, b0 = passes(recompute=recompute, max_reuse_distance_params=reuse)
        f1, b1 = passes(recompute=recompute, max_reuse_distance_params=reuse, persistence_threshold_params=1000)
        one = layers * 4.5 * (12 * mi + 9216)  # every module coalesced (as above), per gather
        assert f1.hbm_bytes[0] - f0.hbm_bytes[0] == pytest.approx(one)
        assert f1.body_s[0] - f0.body_s[0] == pytest.approx(one / bandwidth)
        assert f1.launch_s[0] - f0.launch_s[0] == pytest.approx(layers * 12 * A100.profile.kernel_launch_s)
        # the backward's own gather (under full recompute: the replayed forward's), and the re-gathers
        extra = one + layers * 4.5 * again
        assert b1.hbm_bytes[0] - b0.hbm_bytes[0] == pytest.approx(extra)
        assert b1.body_s[0] - b0.body_s[0] == pytest.approx(extra / bandwidth)

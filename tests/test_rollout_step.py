"""Step-time model of a rollout replica: closed forms against brute-force sums and hand
formulas (roofline at batch 1, compute-bound large batches, MoE experts touched, pp micro-batches)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.catalog import load_model
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import EngineLayout
from rlperf.stages.rollout_step import (
    SAMPLER_PASSES,
    Run,
    StepModel,
    eager_ops_per_layer,
    eager_ops_per_step,
    envelope_sum,
    kernels_per_step,
)

QWEN7 = load_model("Qwen2.5-7B")
H100 = make_cluster("H100", num_gpus=64)
# the device side alone: no engine host time (tested on its own below)
DEVICE = H100.model_copy(update={"profile": H100.profile.model_copy(
    update={"engine_step_overhead_s": None, "engine_seq_overhead_s": None})})

coef = st.floats(0.0, 10.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(c0=coef, c1=coef, m0=coef, m1=coef, floor=coef, fixed=coef, n=st.integers(0, 60))
def test_run_time_is_the_sum_of_step_times(
    c0: float, c1: float, m0: float, m1: float, floor: float, fixed: float, n: int
) -> None:
    run = Run(c0, c1, m0, m1, floor, fixed)
    brute = sum(run.step_s(i) for i in range(n))
    assert run.time_s(n) == pytest.approx(brute, rel=1e-9, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(lines=st.lists(st.tuples(coef, coef), min_size=1, max_size=4), n=st.integers(0, 50))
def test_envelope_sum_matches_brute_force(lines: list[tuple[float, float]], n: int) -> None:
    brute = sum(max(a + s * i for a, s in lines) for i in range(n))
    assert envelope_sum(lines, n) == pytest.approx(brute, rel=1e-9, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    c0=coef, c1=coef, m0=st.floats(0.1, 10), m1=coef, n=st.integers(1, 80), frac=st.floats(0, 1.2)
)
def test_steps_within_inverts_time(
    c0: float, c1: float, m0: float, m1: float, n: int, frac: float
) -> None:
    run = Run(c0, c1, m0, m1, 0.0, 0.01)
    t = frac * run.time_s(n)
    down = run.steps_within(t, n, round_up=False)
    up = run.steps_within(t, n, round_up=True)
    assert run.time_s(down) <= t + 1e-12
    assert down == n or run.time_s(down + 1) > t
    assert up == n or run.time_s(up) >= t
    assert up == 0 or run.time_s(up - 1) < t


def test_batch1_decode_streams_the_weights_at_the_profile_rate() -> None:
    """At batch 1 with a short context a step is memory bound: matmul weights / (bw · eff)."""
    step = StepModel.build(QWEN7, DEVICE, EngineLayout(tp=1))
    acc, prof = H100.accelerator, H100.profile
    expected = (
        QWEN7.matmul_params_per_token
        * 2
        / (acc.hbm_bandwidth_bytes_per_s * prof.decode_hbm_efficiency)
    )
    run = step.run(1, 100, 0, 0.0)
    assert run.step_s(0) == pytest.approx(expected, rel=0.01)
    # The full weight_bytes differs only by the embedding table, which decode gathers, not streams.
    assert run.step_s(0) == pytest.approx(
        QWEN7.weight_bytes() / (acc.hbm_bandwidth_bytes_per_s * prof.decode_hbm_efficiency),
        rel=0.08,
    )


def test_paged_kv_cache_is_read_at_the_paged_kernel_rate_and_a_static_batch_at_the_streaming_rate() -> None:
    """A memory-bound long-context step: weights at decode_hbm_efficiency plus the KV cache at
    decode_kv_hbm_efficiency (continuous batching: paged decode attention) or, for a static
    batch's contiguous cache, at decode_hbm_efficiency (module docstring)."""
    acc, prof = H100.accelerator, H100.profile
    assert prof.decode_kv_hbm_efficiency < prof.decode_hbm_efficiency  # the shipped figures
    b, ctx = 16, 16 * 8_000
    weights = QWEN7.matmul_params_per_token * 2
    kv = (ctx + b) * QWEN7.kv_bytes_per_token("bf16")
    for batching, kv_eff in (("continuous", prof.decode_kv_hbm_efficiency), ("static", prof.decode_hbm_efficiency)):
        step = StepModel.build(QWEN7, DEVICE, EngineLayout(tp=1, batching=batching))
        run = step.run(b, ctx, 0, 0.0)
        memory = weights / (acc.hbm_bandwidth_bytes_per_s * prof.decode_hbm_efficiency) + kv / (acc.hbm_bandwidth_bytes_per_s * kv_eff)
        assert run.m0 == pytest.approx(memory, rel=1e-12)
        assert run.m1 == pytest.approx(b * QWEN7.kv_bytes_per_token("bf16") / (acc.hbm_bandwidth_bytes_per_s * kv_eff), rel=1e-12)


def test_large_batch_decode_is_compute_bound() -> None:
    step = StepModel.build(QWEN7, H100, EngineLayout(tp=1))
    b = 4096
    run = step.run(b, 0, 0, 0.0)
    peak = H100.accelerator.peak("bf16") * H100.profile.matmul_eff("bf16")
    linear = b * QWEN7.linear_flops(1) / peak
    sampler = b * QWEN7.vocab_size * 4 * SAMPLER_PASSES / (H100.accelerator.hbm_bandwidth_bytes_per_s * H100.profile.decode_hbm_efficiency)
    assert step.sampler_s(b) == pytest.approx(sampler)  # tp = 1: no logits gather
    host = H100.profile.engine_step_s(QWEN7.num_layers) + b * H100.profile.engine_seq_s  # no overlap: added
    assert run.step_s(0) >= linear + sampler + host
    assert run.step_s(0) == pytest.approx(linear + sampler + host, rel=0.02)


def test_step_time_grows_with_batch_and_context() -> None:
    step = StepModel.build(QWEN7, H100, EngineLayout(tp=1))
    for ctx in (100, 10_000):
        times = [step.run(b, b * ctx, 0, 0.0).step_s(0) for b in (1, 8, 64, 512)]
        assert times == sorted(times)
    assert step.run(64, 64 * 10_000, 0, 0.0).step_s(0) > step.run(64, 64 * 100, 0, 0.0).step_s(0)


def test_launch_floor_uses_cuda_graph_cost() -> None:
    graphs = StepModel.build(QWEN7, H100, EngineLayout(tp=1), cuda_graphs=True)
    eager = StepModel.build(QWEN7, H100, EngineLayout(tp=1), cuda_graphs=False)
    prof = H100.profile
    assert kernels_per_step(QWEN7, 1) == 10 * QWEN7.num_layers
    assert kernels_per_step(QWEN7, 2) == 10 * QWEN7.num_layers  # all-reduces are communication
    per_kernel = max(prof.graph_kernel_launch_s, prof.decode_kernel_min_s)
    assert graphs.floor_s == pytest.approx(kernels_per_step(QWEN7, 1) * per_kernel)
    # a dense layer at tp 1: 10 ops (the published Llama-3.1-8B figure's own count)
    assert eager.floor_s == pytest.approx(QWEN7.num_layers * 10 * H100.profile.eager_op_launch_s)
    llama8 = load_model("Llama-3.1-8B")
    assert StepModel.build(llama8, H100, EngineLayout(tp=1), cuda_graphs=False).floor_s == pytest.approx(8.4e-3)
    # tp adds two all-reduces a layer; Qwen3 MoE layers dispatch their q/k norms and the routing
    moe = load_model("Qwen3-30B-A3B")
    assert eager_ops_per_layer(moe, 4, True) == 10 + 2 + 2 + 7
    # DeepSeek-V3: grouped top-k (14 for the routed block), a shared MLP (3), and MLA's eager
    # PyTorch ops (19) on top of its structural 6; a graph replays the structural count only
    dsv3 = load_model("DeepSeek-V3")
    assert dsv3.moe is not None and dsv3.moe.routing == "grouped" and moe.moe is not None and moe.moe.routing == "topk"
    assert eager_ops_per_layer(dsv3, 32, True) == 10 + 2 + 6 + 14 + 3 + 19
    assert eager_ops_per_step(dsv3, 32) == 3 * 37 + 58 * 54
    assert kernels_per_step(dsv3, 32) == 3 * 16 + 58 * 33


def test_tp_adds_two_all_reduces_per_layer_and_shards_weights() -> None:
    one = StepModel.build(QWEN7, H100, EngineLayout(tp=1))
    four = StepModel.build(QWEN7, H100, EngineLayout(tp=4))
    assert four.dense_weight_bytes_per_gpu == pytest.approx(one.dense_weight_bytes_per_gpu / 4)
    assert one.comm_s(8) == 0.0
    assert four.comm_s(8) > 2 * QWEN7.num_layers * H100.profile.intra_node_latency_s
    # Qwen2.5-7B has 4 KV heads: tp=4 splits them, so a GPU holds a quarter of each token's KV.
    assert four.kv_bytes_per_token_per_gpu == pytest.approx(QWEN7.kv_bytes_per_token() / 4)


def test_pipeline_microbatches_divide_token_work_not_weights() -> None:
    pp1 = StepModel.build(QWEN7, H100, EngineLayout(tp=1))
    pp2 = StepModel.build(QWEN7, H100, EngineLayout(tp=1, pp=2))
    big1, big2 = pp1.run(256, 256 * 8000, 0, 0.0), pp2.run(256, 256 * 8000, 0, 0.0)
    assert big2.m1 == pytest.approx(big1.m1 / 2) and big2.c1 == pytest.approx(big1.c1 / 2)
    # One sequence cannot be split: the two stages run one after the other (plus a hand-off).
    solo1, solo2 = pp1.run(1, 100, 0, 0.0), pp2.run(1, 100, 0, 0.0)
    assert solo2.step_s(0) >= solo1.step_s(0)


def test_moe_touches_more_experts_as_the_batch_grows() -> None:
    moe = load_model("Qwen3-30B-A3B")
    assert moe.moe is not None
    step = StepModel.build(moe, H100, EngineLayout(tp=1))
    e, k = moe.moe.num_experts, moe.moe.experts_per_token
    one = step.weight_bytes_per_gpu(1)
    assert one == pytest.approx(step.dense_weight_bytes_per_gpu + k * step.expert_bytes_per_gpu)
    assert one == pytest.approx(moe.matmul_params_per_token * 2, rel=1e-9)
    b = 16
    expected = e * (1 - (1 - k / e) ** b)
    assert step.weight_bytes_per_gpu(b) == pytest.approx(
        step.dense_weight_bytes_per_gpu + expected * step.expert_bytes_per_gpu
    )
    everything = step.dense_weight_bytes_per_gpu + e * step.expert_bytes_per_gpu
    assert step.weight_bytes_per_gpu(100_000) == pytest.approx(everything)
    assert math.isclose(
        everything,
        (moe.num_params - moe.breakdown.embedding - moe.breakdown.norms) * 2,
        rel_tol=1e-6,
    )


def test_touched_expert_slices_stream_on_the_grouped_gemm_size_curve() -> None:
    """A touched expert slice of s bytes costs s + s_half at the decode bandwidth (a rate of
    s / (s + s_half) of the dense one); the HBM traffic stays s; dense models are unaffected."""
    moe = load_model("Qwen3-30B-A3B")
    assert moe.moe is not None
    half = H100.profile.moe_expert_read_half_bytes
    assert half is not None and half > 0
    hbm = H100.accelerator.hbm_bandwidth_bytes_per_s * H100.profile.decode_hbm_efficiency
    k, layers = moe.moe.experts_per_token, moe.num_moe_layers
    for tp in (1, 4):
        step = StepModel.build(moe, H100, EngineLayout(tp=tp))
        slice_bytes = step.expert_bytes_per_gpu / layers  # one expert, one layer, one GPU
        want = (step.dense_weight_bytes_per_gpu + k * layers * (slice_bytes + half)) / hbm
        assert step.weight_read_s(1) == pytest.approx(want, rel=1e-12)
        assert step.weight_bytes_per_gpu(1) == pytest.approx(step.dense_weight_bytes_per_gpu + k * step.expert_bytes_per_gpu)
        # the expert part runs at s / (s + s_half) of the dense rate: slower for tp-sharded slices
        expert_s = step.weight_read_s(1) - step.dense_weight_bytes_per_gpu / hbm
        assert k * step.expert_bytes_per_gpu / hbm / expert_s == pytest.approx(slice_bytes / (slice_bytes + half))
    flat = H100.model_copy(update={"profile": H100.profile.model_copy(update={"moe_expert_read_half_bytes": None})})
    plain = StepModel.build(moe, flat, EngineLayout(tp=4))
    assert plain.weight_read_s(64) == pytest.approx(plain.weight_bytes_per_gpu(64) / hbm)
    dense = StepModel.build(QWEN7, H100, EngineLayout(tp=1))
    assert dense.weight_read_s(64) == dense.dense_weight_bytes_per_gpu / hbm


def test_host_overhead_is_added_to_every_step_and_is_not_work() -> None:
    """engine_step_overhead_s + engine_layer_overhead_s x layers is added to each step (after the
    roofline max, like communication): a run of n steps is longer by n x overhead exactly."""
    prof = H100.profile.model_copy(update={"engine_step_overhead_s": 2e-3, "engine_layer_overhead_s": 1e-5})
    slow = H100.model_copy(update={"profile": prof})
    none = H100.profile.model_copy(update={"engine_step_overhead_s": None})
    base = StepModel.build(QWEN7, H100.model_copy(update={"profile": none}), EngineLayout(tp=1))
    step = StepModel.build(QWEN7, slow, EngineLayout(tp=1))
    overhead = 2e-3 + 1e-5 * QWEN7.num_layers
    assert step.overhead_s == pytest.approx(overhead) and base.overhead_s == 0.0
    for b, ctx, n in ((1, 100, 1), (64, 64 * 5_000, 300), (512, 0, 7)):
        assert step.run(b, ctx, 0, 0.0).time_s(n) == pytest.approx(base.run(b, ctx, 0, 0.0).time_s(n) + n * overhead)
        assert step.run(b, ctx, 0, 0.0).fixed == pytest.approx(base.run(b, ctx, 0, 0.0).fixed + overhead)


def test_host_time_per_sequence_is_added_without_overlap_scheduling() -> None:
    """engine_seq_overhead_s x (decoding + prefilling sequences) is added to each step of an
    engine without overlap scheduling (vLLM V0/V1), on top of the fixed part."""
    prof = H100.profile.model_copy(update={"engine_seq_overhead_s": 2e-5, "engine_step_overhead_s": 1e-3})
    base = StepModel.build(QWEN7, DEVICE, EngineLayout(tp=1))
    step = StepModel.build(QWEN7, H100.model_copy(update={"profile": prof}), EngineLayout(tp=1))
    for b, ctx, chunk, wave, n in ((1, 100, 0, 0, 1), (64, 64 * 5_000, 0, 0, 300), (200, 0, 512, 8, 7)):
        host = 1e-3 + 2e-5 * (b + wave)
        got = step.run(b, ctx, chunk, 1e-7, wave)
        ref = base.run(b, ctx, chunk, 1e-7, wave)
        assert got.time_s(n) == pytest.approx(ref.time_s(n) + n * host, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 1024), ctx_per_seq=st.integers(0, 30_000), n=st.integers(1, 400),
       seq_us=st.floats(0.0, 200.0), fixed_ms=st.floats(0.0, 20.0))
def test_overlap_scheduling_takes_the_larger_of_device_and_host(
    b: int, ctx_per_seq: int, n: int, seq_us: float, fixed_ms: float
) -> None:
    """Under overlap scheduling each step costs max(device step, host time): the closed form
    equals the brute-force sum over steps of max(device_i, host), device_i from the same engine
    with no host time at all."""
    prof = H100.profile.model_copy(update={"engine_seq_overhead_s": seq_us * 1e-6, "engine_step_overhead_s": fixed_ms * 1e-3})
    zero = H100.profile.model_copy(update={"engine_seq_overhead_s": None, "engine_step_overhead_s": None})
    lay = EngineLayout(tp=2, overlap_scheduling=True)
    device = StepModel.build(QWEN7, H100.model_copy(update={"profile": zero}), lay).run(b, b * ctx_per_seq, 0, 0.0)
    step = StepModel.build(QWEN7, H100.model_copy(update={"profile": prof}), lay)
    host = fixed_ms * 1e-3 + seq_us * 1e-6 * b
    brute = sum(max(device.step_s(i), host) for i in range(n))
    assert step.run(b, b * ctx_per_seq, 0, 0.0).time_s(n) == pytest.approx(brute, rel=1e-9)
    # and the vectorized form agrees with the scalar one
    runs = step.runs(np.array([b]), np.array([b * ctx_per_seq]), np.array([0.0]), np.array([0.0]), np.array([0]))
    assert runs.time_s(np.array([n]))[0] == pytest.approx(brute, rel=1e-9)


def test_overlap_hides_host_time_below_the_device_step() -> None:
    """A host time shorter than the device step costs nothing under overlap scheduling and its
    full length without it."""
    lay_sync, lay_overlap = EngineLayout(tp=1), EngineLayout(tp=1, overlap_scheduling=True)
    b, ctx = 64, 64 * 8_000
    sync, overlap = StepModel.build(QWEN7, H100, lay_sync), StepModel.build(QWEN7, H100, lay_overlap)
    device = StepModel.build(QWEN7, DEVICE, lay_sync).run(b, ctx, 0, 0.0).step_s(0)
    host = H100.profile.engine_step_s(QWEN7.num_layers) + b * H100.profile.engine_seq_s
    assert 0 < host < device
    assert overlap.run(b, ctx, 0, 0.0).step_s(0) == pytest.approx(device, rel=1e-12)
    assert sync.run(b, ctx, 0, 0.0).step_s(0) == pytest.approx(device + host, rel=1e-12)


def test_moe_decode_reads_the_touched_experts_of_the_busiest_rank() -> None:
    moe = load_model("Qwen3-30B-A3B")  # 128 experts, top-8
    sharded = StepModel.build(moe, H100, EngineLayout(tp=4))
    ep = StepModel.build(moe, H100, EngineLayout(tp=4, ep=4))
    e, k = 128, 8
    for n in (1, 4, 32, 256):
        assert sharded.experts_read(n) == pytest.approx(e * (1 - (1 - k / e) ** n))
        # whole experts on 4 ranks: the busiest holds at least the mean and at most its 32
        assert e / 4 * (1 - (1 - k / e) ** n) <= ep.experts_read(n) <= 32
    assert ep.experts_read(4096) == pytest.approx(32)  # every local expert touched
    reads = [ep.experts_read(n) for n in (1, 2, 8, 64)]
    assert reads == sorted(reads)
    # the same mean bytes: a sharded GPU reads 1/4 of every touched expert, an ep rank whole experts
    assert ep.expert_bytes_per_gpu == pytest.approx(4 * sharded.expert_bytes_per_gpu)


def test_decode_breakdown_adds_up_to_the_step_and_names_its_sources() -> None:
    from rlperf.scenario import load_scenario
    from rlperf.stages.rollout_breakdown import decode_step_breakdown, representative_step

    moe = load_model("Qwen3-30B-A3B")
    lay = EngineLayout(tp=4, ep=4)
    bd = decode_step_breakdown(moe, H100, lay, 64, 64 * 3000.0)
    step = StepModel.build(moe, H100, lay)
    assert bd.step_s == pytest.approx(step.run(64, 64 * 3000.0, 0, 0.0).step_s(0), rel=1e-9)
    # with overlap scheduling, and with a host time long enough to set the step
    slow = H100.model_copy(update={"profile": H100.profile.model_copy(update={"engine_seq_overhead_s": 1e-3})})
    for cluster in (H100, slow):
        over = lay.model_copy(update={"overlap_scheduling": True})
        bd = decode_step_breakdown(moe, cluster, over, 64, 64 * 3000.0)
        ref = StepModel.build(moe, cluster, over).run(64, 64 * 3000.0, 0, 0.0).step_s(0)
        assert bd.step_s == pytest.approx(ref, rel=1e-9)
    assert bd.bound == "host"
    names = " ".join(t.name for t in bd.terms)
    assert "MoE experts read" in names and "tp all-reduce" in names and "sampler" in names
    assert all(t.source for t in bd.terms)
    rep = representative_step(load_scenario("gspo-qwen3-30b-a3b"))
    assert rep.num_decode > 0 and rep.experts_read > 0


def test_simulate_prints_the_decode_step_with_moe_and_communication_terms(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from rlperf.cli.render import console
    from rlperf.cli.simulate_cmd import render_decode_step
    from rlperf.scenario import load_scenario

    monkeypatch.setattr(console, "width", 400)  # one line per term

    for name in ("gspo-qwen3-30b-a3b", "grpo-deepseek-v3-h20"):
        render_decode_step(load_scenario(name))
        out = capsys.readouterr().out
        for term in ("MoE experts read", "grouped-GEMM size penalty", "tp all-reduce", "sampler", "engine host, per sequence", "vllm/issues/10634",
                     "profiles", "hardware.yaml"):
            assert term in out, (name, term)
    assert "across 4 nodes" in out  # DeepSeek-V3's TP-32 engine spans four 8-GPU nodes


def test_eager_engine_pays_the_eager_launch_cost() -> None:
    from rlperf.stages.rollout import simulate_rollout
    from rlperf.stages.rollout_breakdown import decode_step_breakdown
    from rlperf.stages.rollout_requests import RolloutRequests

    tiny = load_model("Qwen2.5-0.5B")
    graphs, eager = EngineLayout(tp=1), EngineLayout(tp=1, cuda_graphs=False)
    a = decode_step_breakdown(tiny, H100, graphs, 1, 100.0)
    b = decode_step_breakdown(tiny, H100, eager, 1, 100.0)
    assert a.side_s("floor") == pytest.approx(H100.profile.decode_kernel_min_s * kernels_per_step(tiny, 1))
    assert b.side_s("floor") == pytest.approx(H100.profile.eager_op_launch_s * 10 * tiny.num_layers)
    assert b.bound == "floor"  # batch 1 of a 0.5B model: eager dispatch sets the step
    assert b.step_s >= a.step_s
    reqs = RolloutRequests.build(np.full(4, 64), np.full(4, 256), np.arange(4), np.zeros(4, np.int64))
    fast = simulate_rollout(tiny, H100, graphs, reqs).makespan_s
    slow = simulate_rollout(tiny, H100, eager, reqs).makespan_s
    assert slow >= fast


def test_published_single_stream_steps_are_reproduced_where_derived_and_checked() -> None:
    """The host time per step and the shortest kernel come from one published vLLM sweep (one
    A100, one request at a time): Qwen3-1.7B 4.6 ms and Qwen3-0.6B 4.2 ms per token fix them
    (profiles.yaml); the same sweep's Qwen3-14B (24.3 ms) is then predicted within 10%."""
    a100 = make_cluster("A100", num_gpus=1)
    step = {name: StepModel.build(load_model(name), a100, EngineLayout(tp=1)).run(1, 129, 0, 0.0).step_s(0)
            for name in ("Qwen3-0.6B", "Qwen3-14B")}
    assert step["Qwen3-0.6B"] == pytest.approx(4.2e-3, rel=0.05)
    assert step["Qwen3-14B"] == pytest.approx(24.3e-3, rel=0.10)


def test_dp_attention_swaps_the_all_reduces_for_an_expert_all_to_all() -> None:
    """SGLang-style data-parallel attention with DeepEP: dense weights whole on every GPU, each
    GPU's own 1/tp of the KV, no tp all-reduce or logits gather, a dispatch and a combine per
    MoE layer (closed form of the module docstring), and tp times one GPU's KV capacity."""
    from rlperf.cost.memory import inference_memory
    from rlperf.specs.hardware import Accelerator

    m = load_model("DeepSeek-V3")
    assert m.moe is not None
    c = make_cluster("H20", num_gpus=32)  # 4 nodes of 8
    tp_lay = EngineLayout(tp=32, ep=32, dtype="fp8")
    dp_lay = tp_lay.model_copy(update={"dp_attention": True})
    tp_step, dp_step = StepModel.build(m, c, tp_lay), StepModel.build(m, c, dp_lay)
    assert dp_step.dense_weight_bytes_per_gpu == pytest.approx(32 * tp_step.dense_weight_bytes_per_gpu)
    assert dp_step.kv_bytes_per_token_per_gpu == pytest.approx(m.kv_bytes_per_token("bf16") / 32)
    assert tp_step.kv_bytes_per_token_per_gpu == pytest.approx(m.kv_bytes_per_token("bf16"))  # MLA: replicated
    assert dp_step.logits_gather_s(512) == 0.0 and tp_step.logits_gather_s(512) > 0.0
    # the all-to-all, by hand: 512 tokens -> 16 per GPU, k hidden vectors: an FP8 dispatch (1 byte
    # an element) and a bf16 combine (2 bytes), as DeepEP's low-latency kernels run an FP8 model
    acc: Accelerator = c.accelerator
    prof = c.profile
    a2a_rate = prof.moe_a2a_nic_efficiency
    assert a2a_rate is not None

    def one(elem_bytes: float) -> float:
        sent = 16 * m.moe.experts_per_token * m.hidden_size * elem_bytes if m.moe else 0.0
        cross = 24 / 32 * sent / (acc.nic_bandwidth_bytes_per_s * a2a_rate)
        intra = 7 / 32 * sent / (acc.intra_node_group_bandwidth_bytes_per_s(8) * prof.intra_node_efficiency)
        return prof.inter_node_latency_s + max(cross, intra)

    assert dp_step.comm_s(512) == pytest.approx(m.num_moe_layers * (one(1.0) + one(2.0)), rel=1e-12)
    assert dp_step.host_s_per_seq == pytest.approx(prof.engine_seq_s / 32)
    mem_tp = inference_memory(m, tp_lay, acc.device_memory_bytes)
    mem_dp = inference_memory(m, dp_lay, acc.device_memory_bytes)
    assert mem_dp.weights_bytes > mem_tp.weights_bytes  # attention and dense layers replicated
    per_gpu = math.floor(mem_dp.kv_capacity_bytes / (m.kv_bytes_per_token("bf16")))
    assert mem_dp.kv_capacity_tokens == pytest.approx(32 * per_gpu, abs=32)
    for bad in ({"pp": 2, "ep": 32}, {"ep": 1}):
        with pytest.raises(ValueError, match="dp_attention"):
            EngineLayout(tp=32, dp_attention=True, **{"ep": 32, **bad})  # type: ignore[arg-type]


def test_dp_attention_breakdown_names_the_dispatch_and_adds_up() -> None:
    from rlperf.stages.rollout_breakdown import decode_step_breakdown

    m = load_model("DeepSeek-V3")
    c = make_cluster("H20", num_gpus=32)
    lay = EngineLayout(tp=32, ep=32, dtype="fp8", dp_attention=True)
    bd = decode_step_breakdown(m, c, lay, 1024, 1024 * 2000.0)
    ref = StepModel.build(m, c, lay).run(1024, 1024 * 2000.0, 0, 0.0).step_s(0)
    assert bd.step_s == pytest.approx(ref, rel=1e-9)
    names = " ".join(t.name for t in bd.terms)
    assert "expert dispatch + combine" in names and "across 4 nodes" in names
    assert "tp all-reduce" not in names and "logits all-gather" not in names
    assert all(t.source for t in bd.terms)


def test_another_implementations_layer_sets_the_eager_op_count() -> None:
    """EngineLayout.eager_ops_per_layer replaces vLLM's structural count: the eager floor is that
    count x layers x eager_op_launch_s (tp 1: every op a kernel), and CUDA graphs floor its
    kernels the same way."""
    from rlperf.stages.rollout_step import step_ops

    llama = load_model("Llama-3.1-8B")
    hf = EngineLayout(tp=1, cuda_graphs=False, eager_ops_per_layer=45)
    assert step_ops(llama, hf) == (45 * 32, 45 * 32)
    assert step_ops(llama, EngineLayout(tp=1)) == (eager_ops_per_step(llama, 1), kernels_per_step(llama, 1))
    two = hf.model_copy(update={"tp": 2})
    assert step_ops(llama, two) == (45 * 32 + 64, 45 * 32)  # the all-reduces are communication
    step = StepModel.build(llama, H100, hf, cuda_graphs=False)
    assert step.floor_s == pytest.approx(45 * 32 * H100.profile.eager_op_launch_s)
    assert step.floor_s == pytest.approx(4.5 * StepModel.build(llama, H100, EngineLayout(tp=1), cuda_graphs=False).floor_s)


def test_refilling_a_fused_qkv_buffer_every_forward_copies_the_ranks_qkv_weights() -> None:
    """DeepSpeed's hybrid engine under ZeRO-3 runs _merge_qkv at every forward: Qwen2.5-7B at tp 2
    (14 query heads, 2 KV heads of 128 per GPU, d 3584, q/k/v biases, 28 layers) reads and writes
    (14 + 4) x 128 rows of 3584 weights and a bias a layer in bf16 per step, at the copy rate
    (hbm_efficiency), on the memory side; six more ops a layer (q, k, v and their biases)."""
    from rlperf.stages.rollout_breakdown import decode_step_breakdown
    from rlperf.stages.rollout_step import step_ops

    plain = EngineLayout(tp=2, batching="static", cuda_graphs=False, eager_ops_per_layer=5)
    copying = plain.model_copy(update={"qkv_copy_per_forward": True})
    copy_bytes = 2 * (14 + 4) * 128 * (3584 + 1) * 28 * 2
    prof, acc = DEVICE.profile, DEVICE.accelerator
    base, step = StepModel.build(QWEN7, DEVICE, plain, False), StepModel.build(QWEN7, DEVICE, copying, False)
    assert step.weight_copy_s == pytest.approx(copy_bytes / (acc.hbm_bandwidth_bytes_per_s * prof.hbm_efficiency))
    assert base.weight_copy_s == 0.0
    assert step.weight_read_s(32) - base.weight_read_s(32) == pytest.approx(step.weight_copy_s)
    assert step_ops(QWEN7, copying) == (5 * 28 + 56 + 6 * 28, 5 * 28 + 6 * 28)
    assert step.floor_s == pytest.approx((5 + 2 + 6) * 28 * prof.eager_op_launch_s)
    # the step's memory line grows by the copy and its floor by the copies' ops; the breakdown
    # names the copy and still sums to the step
    ctx = 32 * 2000.0
    a, b = base.run(32, ctx, 0, 0.0), step.run(32, ctx, 0, 0.0)
    assert b.m0 - a.m0 == pytest.approx(step.weight_copy_s)
    assert b.floor - a.floor == pytest.approx(6 * 28 * prof.eager_op_launch_s)
    bd = decode_step_breakdown(QWEN7, DEVICE, copying, 32, ctx)
    assert bd.step_s == pytest.approx(b.step_s(0), rel=1e-9)
    assert any("fused buffer" in t.name for t in bd.terms)


# One step model kept over the examples (as rlperf.sim.costs keeps one per engine): its tables
# of the array forms are made and grown from call to call.
_TABLED = StepModel.build(QWEN7, H100, EngineLayout(tp=2, pp=2, replicas=1))


@settings(max_examples=60, deadline=None)
@given(tokens=st.lists(st.integers(0, 400), min_size=1, max_size=120), seqs=st.lists(st.integers(0, 2), min_size=1))
def test_the_array_forms_equal_the_scalar_ones_bit_for_bit(tokens: list[int], seqs: list[int]) -> None:
    """comm_s and sampler_s of many runs at once (read from the step model's tables once they
    pay) equal the one-run forms, exactly."""
    n_tok = np.array(tokens, np.int64)
    mb = np.clip(np.resize(np.array(seqs, np.int64), n_tok.shape), 1, _TABLED.pp)
    comm = _TABLED.comm_s(n_tok, mb)
    sampler = _TABLED.sampler_s(n_tok)
    assert isinstance(comm, np.ndarray) and isinstance(sampler, np.ndarray)
    assert comm.tolist() == [_TABLED.comm_s(t, m) for t, m in zip(tokens, mb.tolist())]
    assert sampler.tolist() == [_TABLED.sampler_s(t) for t in tokens]

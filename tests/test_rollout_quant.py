"""A block-FP8 rollout engine (vLLM's w8a8, verl's rollout.quantization=fp8): what it streams in FP8
and what it keeps in bf16 (rlperf.stages.rollout_quant)."""

from __future__ import annotations

import pytest

from rlperf.catalog import load_model
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import EngineLayout
from rlperf.stages.rollout_step import StepModel, step_ops

QWEN8 = load_model("Qwen3-8B")
MOE = load_model("Qwen3-30B-A3B")
H100 = make_cluster("H100", num_gpus=8)
# the device side alone: no engine host time, no launch floor (the streaming closed form)
DEVICE = H100.model_copy(update={"profile": H100.profile.model_copy(
    update={"engine_step_overhead_s": None, "engine_seq_overhead_s": None, "decode_kernel_min_s": 0.0,
            "graph_kernel_launch_s": 0.0})})
FP8 = EngineLayout(tp=1, dtype="fp8")
BYTES_PER_QUANT_ELEM = 2 + 1 + 4 / 128  # bf16 read, fp8 write, an fp32 scale per 128


def _quant_elems_per_token(layers: int, d: int, heads_dim: int, ffn: int) -> int:
    """QKV and gate-up read d, output and down their row-parallel inputs (tp 1)."""
    return layers * (d + heads_dim + d + ffn)


def test_batch1_fp8_decode_streams_fp8_linears_and_a_bf16_lm_head() -> None:
    """Closed form at batch 1: (linear weights x 1 byte + LM head x 2 bytes) / (bw x eff) + the
    activation-quantization pass of one token at the copy rate. The old model streamed the LM
    head in FP8 and had no quantization pass."""
    acc, prof = DEVICE.accelerator, DEVICE.profile
    lm_head = QWEN8.vocab_size * QWEN8.hidden_size
    stream = (QWEN8.matmul_params_per_token - lm_head) * 1 + lm_head * 2
    elems = _quant_elems_per_token(QWEN8.num_layers, QWEN8.hidden_size, QWEN8.num_heads * QWEN8.head_dim,
                                   QWEN8.intermediate_size)
    expected = (stream / (acc.hbm_bandwidth_bytes_per_s * prof.decode_hbm_efficiency)
                + elems * BYTES_PER_QUANT_ELEM / (acc.hbm_bandwidth_bytes_per_s * prof.hbm_efficiency))
    step = StepModel.build(QWEN8, DEVICE, FP8)
    got = step.run(1, 100, 0, 0.0).step_s(0) - step.sampler_s(1)
    # the KV read of 101 tokens is the rest (bf16 KV: kv_dtype unchanged)
    kv = 101 * QWEN8.kv_bytes_per_token("bf16") / (acc.hbm_bandwidth_bytes_per_s * prof.decode_kv_hbm_efficiency)
    assert got == pytest.approx(expected + kv, rel=1e-9)
    bf16 = StepModel.build(QWEN8, DEVICE, EngineLayout(tp=1))
    assert bf16.run(1, 100, 0, 0.0).step_s(0) - bf16.sampler_s(1) == pytest.approx(
        QWEN8.matmul_params_per_token * 2 / (acc.hbm_bandwidth_bytes_per_s * prof.decode_hbm_efficiency) + kv,
        rel=1e-9)


def test_fp8_attention_lm_head_and_activations_stay_at_the_bf16_rates() -> None:
    acc, prof = H100.accelerator, H100.profile
    fp8, bf16 = StepModel.build(QWEN8, H100, FP8), StepModel.build(QWEN8, H100, EngineLayout(tp=1))
    # attention reads bf16 q, k, v: the bf16 peak, as without quantization (the old model: FP8 peak)
    assert fp8.attention_flops_per_s == bf16.attention_flops_per_s == acc.peak("bf16") * prof.attention_efficiency
    assert fp8.matmul_flops_per_s == acc.peak("fp8") * prof.matmul_eff("fp8")
    # a compute-bound decode step: the LM head's FLOPs at the bf16 rate, the rest at the FP8 rate
    b = 4096
    lm = fp8.lm_head_flops
    c0 = fp8.run(b, 0, 0, 0.0).c0 - b * fp8.attention_flops_per_pair / fp8.attention_flops_per_s
    assert c0 == pytest.approx(b * ((fp8.decode_linear_flops_per_token - lm) / fp8.matmul_flops_per_s
                                    + lm / bf16.matmul_flops_per_s), rel=1e-9)
    # tp all-reduces move bf16 activations: the same communication as a bf16 engine
    tp2 = EngineLayout(tp=2, dtype="fp8")
    assert StepModel.build(QWEN8, H100, tp2).comm_s(256) == StepModel.build(QWEN8, H100, EngineLayout(tp=2)).comm_s(256)


def test_fp8_adds_an_activation_quantization_kernel_before_every_quantized_gemm() -> None:
    # dense layer: QKV, output, gate-up, down; Qwen3-MoE layer: QKV, output and the fused MoE's two
    ops, kernels = step_ops(QWEN8, FP8)
    ops0, kernels0 = step_ops(QWEN8, EngineLayout(tp=1))
    assert (ops - ops0, kernels - kernels0) == (4 * QWEN8.num_layers,) * 2
    assert step_ops(MOE, FP8)[1] - step_ops(MOE, EngineLayout(tp=1))[1] == 4 * MOE.num_layers
    # the pass itself: every input a quantized GEMM reads, per token (tp 4: row-parallel inputs split)
    moe = MOE.moe
    assert moe is not None
    tp = 4
    per_layer = (MOE.hidden_size + MOE.num_heads * MOE.head_dim / tp
                 + MOE.hidden_size + moe.experts_per_token * moe.expert_intermediate_size / tp)
    step = StepModel.build(MOE, DEVICE, EngineLayout(tp=tp, dtype="fp8"))
    copy_rate = DEVICE.accelerator.hbm_bandwidth_bytes_per_s * DEVICE.profile.hbm_efficiency
    assert step.act_quant_s_per_token == pytest.approx(MOE.num_layers * per_layer * BYTES_PER_QUANT_ELEM / copy_rate)
    assert StepModel.build(MOE, DEVICE, EngineLayout(tp=tp)).act_quant_s_per_token == 0.0


@pytest.mark.parametrize("layout", [EngineLayout(tp=4, dtype="fp8"), EngineLayout(tp=8, ep=8, dtype="fp8", dp_attention=True)],
                         ids=["tp", "dp-attention"])
def test_fp8_decode_breakdown_adds_up_to_the_step(layout: EngineLayout) -> None:
    from rlperf.stages.rollout_breakdown import decode_step_breakdown

    bd = decode_step_breakdown(MOE, H100, layout, 64, 64 * 3000.0)
    ref = StepModel.build(MOE, H100, layout).run(64, 64 * 3000.0, 0, 0.0).step_s(0)
    assert bd.step_s == pytest.approx(ref, rel=1e-9)
    names = " ".join(t.name for t in bd.terms)
    assert "fp8 activation quantization" in names
    assert ("dispatch in fp8" in names) == layout.dp_attention

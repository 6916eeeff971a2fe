"""Roofline op costs: compute- vs memory-bound closed forms."""

from __future__ import annotations

import math

import pytest
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.cost.roofline import (
    adam_step,
    attention_decode,
    attention_prefill,
    causal_pairs,
    elementwise,
    fit_matmul_size_curve,
    gemm,
    matmul_size_factor,
    op_time,
)
from rlperf.errors import SpecError
from rlperf.specs.hardware_catalog import make_cluster

H100 = make_cluster("h100", num_gpus=1)
ACC, PROF = H100.accelerator, H100.profile


def test_large_gemm_is_compute_bound_at_matmul_efficiency() -> None:
    m = n = k = 16384
    c = gemm(H100, m, n, k)
    assert c.bound == "compute"
    assert c.flops == 2 * m * n * k
    size = matmul_size_factor(PROF, 2.0 * m * n * k)
    assert 0.999 < size < 1  # a 16k^3 GEMM is on the plateau of the size curve
    expected = 2 * m * n * k / (ACC.peak("bf16") * PROF.matmul_efficiency * size) + PROF.kernel_launch_s
    assert c.time_s == pytest.approx(expected)
    # achieved rate = matmul efficiency x peak (launch cost < 0.01% here)
    assert c.flops / c.time_s == pytest.approx(PROF.matmul_efficiency * ACC.peak("bf16"), rel=1e-3)


def test_fp8_gemm_uses_the_fp8_efficiency() -> None:
    c = gemm(H100, 16384, 16384, 16384, dtype="fp8")
    assert c.flops / c.time_s == pytest.approx(PROF.matmul_eff("fp8") * ACC.peak("fp8"), rel=1e-3)
    assert PROF.matmul_eff("fp8") != PROF.matmul_efficiency


def test_gemv_is_memory_bound_at_weight_bytes_over_bandwidth() -> None:
    n = k = 8192
    c = gemm(H100, 1, n, k)
    assert c.bound == "memory"
    weight_bytes = n * k * 2
    t_weights = weight_bytes / (ACC.hbm_bandwidth_bytes_per_s * PROF.hbm_efficiency)
    assert c.time_s == pytest.approx(t_weights + PROF.kernel_launch_s, rel=1e-3)


def test_tiny_op_is_latency_bound() -> None:
    c = elementwise(H100, 1024)
    assert c.bound == "latency"
    assert c.time_s == pytest.approx(PROF.kernel_launch_s, rel=0.01)
    graph = op_time(H100, 0, 1024, kind="elementwise", launch_s=PROF.graph_kernel_launch_s)
    assert graph.time_s < c.time_s


def test_attention_decode_time_scales_with_kv_bytes() -> None:
    def body(ctx: int) -> float:
        return attention_decode(H100, 32, 8, 128, batch=64, context_tokens_total=ctx).time_s - PROF.kernel_launch_s

    c = attention_decode(H100, 32, 8, 128, batch=64, context_tokens_total=64 * 4096)
    assert c.bound == "memory"
    kv = 2 * 64 * 4096 * 8 * 128 * 2
    assert c.bytes == pytest.approx(kv + 2 * 64 * 32 * 128 * 2)
    # doubling the context (KV bytes) about doubles the time; Q/O bytes are < 0.1% of it
    assert body(2 * 64 * 4096) / body(64 * 4096) == pytest.approx(2.0, rel=2e-3)


def test_attention_prefill_flops_and_io() -> None:
    h, kvh, d, s = 32, 8, 128, 4096
    c = attention_prefill(H100, h, kvh, d, q_tokens=s, kv_tokens=s)
    assert c.flops == pytest.approx(4 * h * d * s * (s + 1) / 2)
    assert c.bytes == pytest.approx((2 * s * h + 2 * s * kvh) * d * 2)
    assert c.bound == "compute"
    full = attention_prefill(H100, h, kvh, d, q_tokens=s, kv_tokens=s, causal=False)
    assert full.flops == pytest.approx(4 * h * d * s * s)
    # chunked prefill: 512 new queries over an 8192-token context see 7680 cached keys each
    assert causal_pairs(512, 8192) == 512 * 7680 + 512 * 513 / 2
    assert c.flops / (c.time_s - PROF.kernel_launch_s) == pytest.approx(PROF.attention_efficiency * ACC.peak("bf16"))


def test_adam_step_bytes_per_param() -> None:
    c = adam_step(H100, 1e9)
    assert c.bytes == pytest.approx(30e9)  # 16 read + 14 written per parameter
    assert c.bound == "memory"
    pure_bf16 = adam_step(H100, 1e9, master_dtype="bf16", grad_dtype="bf16", param_dtype="bf16")
    assert pure_bf16.bytes == pytest.approx(14e9)


def test_bad_inputs() -> None:
    with pytest.raises(SpecError, match="m"):
        gemm(H100, 0, 1, 1)
    with pytest.raises(SpecError, match="kv_tokens"):
        attention_prefill(H100, 8, 8, 64, q_tokens=10, kv_tokens=5)
    with pytest.raises(SpecError, match="dtype"):
        gemm(make_cluster("a100", num_gpus=1), 8, 8, 8, dtype="fp8")  # A100 has no FP8 tensor cores
    with pytest.raises(SpecError, match="num_bytes"):
        op_time(H100, 1.0, -1.0)


@settings(max_examples=200, deadline=None)
@given(st.floats(0, 1e18), st.floats(0, 1e13), st.floats(0, 1e18), st.floats(0, 1e13))
def test_time_monotone_in_work(f1: float, b1: float, f2: float, b2: float) -> None:
    lo = op_time(H100, min(f1, f2), min(b1, b2))
    hi = op_time(H100, max(f1, f2), max(b1, b2))
    assert math.isfinite(hi.time_s) and 0 < lo.time_s <= hi.time_s
    assert hi.time_s >= max(hi.flops / ACC.peak("bf16"), hi.bytes / ACC.hbm_bandwidth_bytes_per_s)


# ---------------------------------------------------------------------- GEMM rate vs size
A100_SWEEP = ([1024, 4096, 8192, 16384], [119.4, 228.0, 253.7, 256.5])  # Azure cuBLASLt FP16, TFLOP/s
H100_SWEEP = ([1024, 2048, 4096, 16384, 32768], [274.1, 1011.3, 1216.9, 1377.3, 1382.2])  # FP8


@pytest.mark.parametrize(("gpu", "sweep"), [("a100", A100_SWEEP), ("h100", H100_SWEEP)])
def test_shipped_size_curves_are_the_fits_of_the_published_sweeps(gpu: str, sweep: tuple[list[int], list[float]]) -> None:
    prof = make_cluster(gpu, num_gpus=1).profile
    sizes, rates = sweep
    w_half, a = fit_matmul_size_curve([2.0 * n**3 for n in sizes], rates)
    assert prof.matmul_half_rate_flops == pytest.approx(w_half, rel=2e-3)
    assert prof.matmul_size_exponent == pytest.approx(a, abs=2e-3)
    # and the curve reproduces the sweep (rate / its best) within 15%
    for n, r in zip(sizes, rates, strict=True):
        assert matmul_size_factor(prof, 2.0 * n**3) == pytest.approx(r / max(rates), rel=0.15)


def test_fit_recovers_a_known_curve() -> None:
    w = np.geomspace(1e7, 1e12, 9)
    prof = PROF.model_copy(update={"matmul_half_rate_flops": 3e9, "matmul_size_exponent": 0.8})
    rates = 500.0 * matmul_size_factor(prof, w) / matmul_size_factor(prof, w[-1])
    w_half, a = fit_matmul_size_curve(w.tolist(), rates.tolist())
    # the fit takes the best rate measured as the plateau (f(1e12) = 0.99 here): a small bias
    assert w_half == pytest.approx(3e9, rel=0.05) and a == pytest.approx(0.8, abs=0.03)
    with pytest.raises(SpecError):
        fit_matmul_size_curve([1e9], [1.0])


@given(st.floats(0.2, 3.0), st.floats(1e6, 1e12))
@settings(max_examples=60, deadline=None)
def test_size_factor_is_a_fraction_and_gemm_time_never_falls_with_size(a: float, w_half: float) -> None:
    prof = PROF.model_copy(update={"matmul_half_rate_flops": w_half, "matmul_size_exponent": a})
    w = np.geomspace(1e3, 1e15, 200)
    f = matmul_size_factor(prof, w)
    assert np.all((f > 0) & (f <= 1))
    assert np.all(np.diff(f) >= -1e-12)  # the rate rises with size
    time = w / f  # GEMM time x the large-GEMM rate
    assert np.all(np.diff(time) >= -1e-9 * time[1:])  # a bigger GEMM never runs faster
    big = 1e3 * w_half  # above the floor the factor is the Hill curve itself
    assert matmul_size_factor(prof, big) == pytest.approx(1 / (1 + 1e-3**a), rel=1e-12)


def test_size_curve_off_and_small_gemms_slower() -> None:
    flat = PROF.model_copy(update={"matmul_half_rate_flops": 0.0})
    assert matmul_size_factor(flat, 1.0) == 1.0
    assert np.all(matmul_size_factor(flat, np.array([1.0, 1e12])) == 1.0)
    small, big = gemm(H100, 1024, 1024, 1024), gemm(H100, 8192, 8192, 8192)
    assert small.flops / small.time_s < 0.5 * big.flops / big.time_s  # the 1k^3 GEMM is on the slope

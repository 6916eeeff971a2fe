"""Roofline time of one operation on one GPU, with achieved (not peak) ceilings.

  t = max(flops / (peak[dtype] x compute_eff), bytes / (hbm_bw x hbm_eff)) + kernel_launch_s

(Williams, Waterman & Patterson, "Roofline: an insightful visual performance model", CACM 52(4),
2009). The efficiencies come from the cluster's hardware profile: ``matmul_eff(dtype)`` for
GEMMs, ``attention_efficiency`` for fused attention, ``hbm_efficiency`` for memory traffic.
The fixed per-kernel cost is the profile's ``kernel_launch_s``; callers modelling CUDA-graph
replay can pass ``launch_s=profile.graph_kernel_launch_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Literal, TypeVar

import numpy as np

from rlperf.errors import SpecError
from rlperf.specs.dtypes import bytes_per
from rlperf.specs.hardware import Cluster, HardwareProfile

OpKind = Literal["matmul", "attention", "elementwise"]
ArrayOrFloat = TypeVar("ArrayOrFloat", float, np.ndarray)


@dataclass(frozen=True)
class OpCost:
    flops: float
    bytes: float  # HBM bytes read + written
    time_s: float
    bound: str  # "compute" | "memory" | "latency" (the launch cost exceeds both)


def _nonneg(field: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise SpecError(field, f"must be a finite number >= 0, got {value!r}")


def _positive_int(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SpecError(field, f"must be a positive integer, got {value!r}")


def op_time(
    cluster: Cluster,
    flops: float,
    num_bytes: float,
    dtype: str = "bf16",
    kind: OpKind = "matmul",
    memory_efficiency: float | None = None,
    launch_s: float | None = None,
    compute_scale: float = 1.0,
) -> OpCost:
    """Roofline time of one kernel doing ``flops`` and moving ``num_bytes`` through HBM.

    ``elementwise`` runs on the vector units (non-tensor FP32 peak; no measured efficiency, so the
    peak is the ceiling - such kernels are memory-bound long before it matters).
    ``memory_efficiency`` overrides the profile's hbm_efficiency (e.g. decode_hbm_efficiency);
    ``compute_scale`` in (0, 1] scales the compute ceiling (a GEMM's :func:`matmul_size_factor`)."""
    _nonneg("flops", flops)
    _nonneg("num_bytes", num_bytes)
    assert 0 < compute_scale <= 1, compute_scale
    flops_per_s, bytes_per_s = ceilings(cluster, dtype, kind, memory_efficiency)
    t_compute = flops / (flops_per_s * compute_scale)
    t_memory = num_bytes / bytes_per_s
    launch = cluster.profile.kernel_launch_s if launch_s is None else launch_s
    body = max(t_compute, t_memory)
    if launch > body:
        bound = "latency"
    else:
        bound = "compute" if t_compute >= t_memory else "memory"
    return OpCost(flops=flops, bytes=num_bytes, time_s=body + launch, bound=bound)


def ceilings(
    cluster: Cluster, dtype: str = "bf16", kind: OpKind = "matmul", memory_efficiency: float | None = None
) -> tuple[float, float]:
    """(achieved FLOP/s, achieved HBM bytes/s) of one kernel of ``kind``: what :func:`op_time`
    divides by. Callers costing many kernels of one kind at once (numpy arrays of FLOPs and
    bytes) take ``max(flops / ceiling, bytes / ceiling)`` themselves, with these."""
    acc, prof = cluster.accelerator, cluster.profile
    if kind == "matmul":
        ceiling = acc.peak(dtype) * prof.matmul_eff(dtype)
    elif kind == "attention":
        ceiling = acc.peak(dtype) * prof.attention_efficiency
    elif kind == "elementwise":
        ceiling = acc.fp32_vector_flops or acc.peak("bf16")
    else:
        raise SpecError("kind", f"unknown op kind {kind!r}", "matmul, attention, elementwise")
    mem_eff = prof.hbm_efficiency if memory_efficiency is None else memory_efficiency
    if not 0 < mem_eff <= 1:
        raise SpecError("memory_efficiency", f"must be in (0, 1], got {mem_eff!r}")
    return ceiling, acc.hbm_bandwidth_bytes_per_s * mem_eff


def matmul_size_factor(profile: HardwareProfile, work_flops: ArrayOrFloat) -> ArrayOrFloat:
    """Fraction of the large-GEMM rate (``matmul_eff``) that a GEMM of ``work_flops`` = 2mnk reaches.

      f(W) = W^a / (W^a + W_half^a) = 1 / (1 + (W_half / W)^a)

    with ``W_half = profile.matmul_half_rate_flops`` (the size at half the large-GEMM rate) and
    ``a = profile.matmul_size_exponent``: a smooth saturating (Hill) curve, 1 for large GEMMs,
    falling for GEMMs too small to fill the device (tile and wave quantization, launch ramp).
    Fitted per architecture to published size sweeps (:func:`fit_matmul_size_curve`);
    ``W_half = 0`` turns it off. Elementwise over a numpy array.

    The GEMM's time ``W / (C f(W)) = (W + W_half^a W^(1-a)) / C`` must not grow as ``W`` shrinks
    (a smaller GEMM can run as a padded larger one). For ``a > 1`` it has its minimum at
    ``W* = W_half (a - 1)^(1/a)``; below ``W*`` the time stays at that floor (``f`` falls in
    proportion to ``W``): the shortest GEMM kernel the curve allows. ``a <= 1`` needs no floor."""
    w_half, a = profile.matmul_half_rate_flops, profile.matmul_size_exponent
    if w_half <= 0:
        return np.ones_like(work_flops) if isinstance(work_flops, np.ndarray) else 1.0
    w = np.maximum(work_flops, 1e-300)
    floor_w = w_half * (a - 1.0) ** (1.0 / a) if a > 1 else 0.0
    at = np.maximum(w, floor_w)
    out: np.ndarray = 1.0 / (1.0 + (w_half / at) ** a) * (w / at)
    return out if isinstance(work_flops, np.ndarray) else float(out)


def fit_matmul_size_curve(work_flops: Sequence[float], flops_per_s: Sequence[float]) -> tuple[float, float]:
    """(W_half, a) of :func:`matmul_size_factor` fitted to measured GEMM rates at sizes ``work_flops``.

    The plateau is the best rate measured (as ``matmul_efficiency`` credits the best GEMM): each
    point's ``f = rate / best``; the fit minimizes the squared error of ``ln f`` over a grid of
    ``ln W_half`` and ``a``, refined twice around the best cell (deterministic, no solver)."""
    w = np.asarray(work_flops, dtype=np.float64)
    r = np.asarray(flops_per_s, dtype=np.float64)
    if w.size != r.size or w.size < 2 or np.any(w <= 0) or np.any(r <= 0):
        raise SpecError("gemm points", f"need >= 2 positive (work, rate) pairs, got {w.size} and {r.size}")
    target = np.log(r / r.max())
    lw = np.log(w)
    lo_w, hi_w = lw.min() - 6.0, lw.max() + 2.0
    lo_a, hi_a = 0.05, 5.0
    best = (lo_w, lo_a)
    for _ in range(3):
        grid_w = np.linspace(lo_w, hi_w, 241)[:, None, None]
        grid_a = np.linspace(lo_a, hi_a, 241)[None, :, None]
        pred = -np.log1p(np.exp(grid_a * (grid_w - lw[None, None, :])))
        err = ((pred - target) ** 2).sum(axis=2)
        i, j = np.unravel_index(int(np.argmin(err)), err.shape)
        best = (float(grid_w[i, 0, 0]), float(grid_a[0, j, 0]))
        step_w, step_a = (hi_w - lo_w) / 240, (hi_a - lo_a) / 240
        lo_w, hi_w = best[0] - 4 * step_w, best[0] + 4 * step_w
        lo_a, hi_a = max(1e-3, best[1] - 4 * step_a), best[1] + 4 * step_a
    return float(np.exp(best[0])), best[1]


def gemm(cluster: Cluster, m: int, n: int, k: int, dtype: str = "bf16") -> OpCost:
    """C[m,n] = A[m,k] @ B[k,n]: 2mnk FLOPs; reads A and B, writes C once, all in ``dtype``.

    The compute ceiling is the large-GEMM rate times :func:`matmul_size_factor` of 2mnk."""
    for field, v in (("m", m), ("n", n), ("k", k)):
        _positive_int(field, v)
    work = 2.0 * m * n * k
    return op_time(cluster, work, (m * k + k * n + m * n) * bytes_per(dtype), dtype, "matmul",
                   compute_scale=matmul_size_factor(cluster.profile, work))


def causal_pairs(q_tokens: int, kv_tokens: int) -> float:
    """(query, key) pairs a causal mask keeps when the q_tokens queries are the last of kv_tokens:
    query i (1-based) sees the kv_tokens - q_tokens cached keys plus i new ones."""
    return q_tokens * (kv_tokens - q_tokens) + q_tokens * (q_tokens + 1) / 2


def attention_prefill(
    cluster: Cluster,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    q_tokens: int,
    kv_tokens: int,
    causal: bool = True,
    dtype: str = "bf16",
) -> OpCost:
    """Fused (FlashAttention) forward over q_tokens queries and kv_tokens keys, one sequence.

    FLOPs: QK^T and PV are 2 x head_dim each per kept (query, key) pair and head: 4 h d pairs
    (Dao et al., FlashAttention, 2022). IO: FlashAttention reads Q, K, V once and writes O once;
    the score matrix never reaches HBM. K and V have num_kv_heads heads (GQA/MQA)."""
    for field, v in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                     ("q_tokens", q_tokens), ("kv_tokens", kv_tokens)):
        _positive_int(field, v)
    if causal and kv_tokens < q_tokens:
        raise SpecError("kv_tokens", f"{kv_tokens} < q_tokens {q_tokens} under a causal mask")
    pairs = causal_pairs(q_tokens, kv_tokens) if causal else float(q_tokens * kv_tokens)
    flops = 4.0 * num_heads * head_dim * pairs
    b = bytes_per(dtype)
    io = (2 * q_tokens * num_heads + 2 * kv_tokens * num_kv_heads) * head_dim * b  # Q, O; K, V
    return op_time(cluster, flops, io, dtype, "attention")


def attention_decode(
    cluster: Cluster,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    batch: int,
    context_tokens_total: int,
    dtype: str = "bf16",
) -> OpCost:
    """One decode step of attention for ``batch`` sequences whose contexts sum to
    ``context_tokens_total`` tokens: each new query attends to its whole context.

    Reads the KV cache once (2 x context x kv_heads x head_dim elements) plus the queries, writes
    the outputs. Arithmetic intensity is ~ num_heads / num_kv_heads FLOP/byte (bf16), far below
    any GPU's ridge point, so the time follows the KV bytes (memory-bound)."""
    for field, v in (("num_heads", num_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                     ("batch", batch)):
        _positive_int(field, v)
    if isinstance(context_tokens_total, bool) or context_tokens_total < batch:
        raise SpecError("context_tokens_total", f"{context_tokens_total} < batch {batch} (each sequence sees itself)")
    b = bytes_per(dtype)
    kv = 2.0 * context_tokens_total * num_kv_heads * head_dim * b
    qo = 2.0 * batch * num_heads * head_dim * b
    flops = 4.0 * num_heads * head_dim * context_tokens_total
    return op_time(cluster, flops, kv + qo, dtype, "attention")


def elementwise(cluster: Cluster, num_bytes: float, flops: float = 0.0) -> OpCost:
    """A streaming kernel (norm, activation, residual add, rotary, ...) moving ``num_bytes``."""
    return op_time(cluster, flops, num_bytes, "bf16", "elementwise")


# AdamW per parameter (PyTorch torch.optim.AdamW algorithm): weight decay w -= lr*wd*w (2),
# m = b1*m + (1-b1)*g (3), v = b2*v + (1-b2)*g*g (4), bias corrections m/(1-b1^t), v/(1-b2^t) (2),
# sqrt(v_hat) + eps (2), m_hat / that (1), x lr (1), w -= update (1).
ADAMW_FLOPS_PER_PARAM = 16.0


def adam_step(
    cluster: Cluster,
    num_params: float,
    master_dtype: str = "fp32",
    grad_dtype: str = "fp32",
    param_dtype: str = "bf16",
) -> OpCost:
    """One fused AdamW update of ``num_params`` parameters held on this GPU (mixed precision).

    Bytes per parameter: read master weight, m and v (3 x master) and the gradient (grad_dtype);
    write master weight, m and v (3 x master) and, when the model runs in a different dtype than
    the master copy, the model weight (param_dtype). fp32 master/states, fp32 grads, bf16 model:
    16 read + 14 written = 30 bytes/param (cf. the 16 bytes/param of state in Rajbhandari et al.,
    ZeRO, 2020: 2 + 2 + 12, plus fp32 gradients here as verl/FSDP reduce in fp32)."""
    _nonneg("num_params", num_params)
    per_param = adam_bytes_per_param(master_dtype, grad_dtype, param_dtype)
    return op_time(cluster, ADAMW_FLOPS_PER_PARAM * num_params, per_param * num_params, "fp32", "elementwise")


def adam_bytes_per_param(master_dtype: str = "fp32", grad_dtype: str = "fp32", param_dtype: str = "bf16") -> float:
    """Memory traffic of one mixed-precision AdamW update per parameter (see :func:`adam_step`)."""
    mb, gb, pb = bytes_per(master_dtype), bytes_per(grad_dtype), bytes_per(param_dtype)
    return 3 * mb + gb + 3 * mb + (pb if param_dtype != master_dtype else 0.0)


def cpu_adam_params_per_s(
    cluster: Cluster, master_dtype: str = "fp32", grad_dtype: str = "fp32", param_dtype: str = "bf16",
    threads: int | None = None,
) -> float:
    """Parameters per second one GPU's share of the host updates with a CPU Adam step
    (ZeRO-Offload: optimizer states and the step on the host; Ren et al., "ZeRO-Offload", ATC 2021).

    CPU Adam is memory bound: ~16 FLOP per parameter (``ADAMW_FLOPS_PER_PARAM``) against 30 bytes
    of fp32 state traffic (:func:`adam_bytes_per_param`), ~0.5 FLOP/byte, an order of magnitude
    below a server CPU's ridge point. A rank's step runs on its own OpenMP threads (``threads``,
    the rank's OMP_NUM_THREADS), and a core streams far less than its node's DRAM peak (Little's
    law: a core's outstanding misses x 64 B / latency), so

      rate = min(host_memory_bandwidth_bytes_per_s x host_adam_efficiency / bytes per parameter,
                 threads x host_adam_thread_params_per_s),

    with the host figures per GPU from the profile (the GPUs of a node share its DRAM). None
    threads (or no per-thread figure): the DRAM share alone."""
    prof = cluster.profile
    share = prof.host_adam_bytes_per_s / adam_bytes_per_param(master_dtype, grad_dtype, param_dtype)
    if threads is None or prof.host_adam_thread_params_per_s is None:
        return share
    return min(share, threads * prof.host_adam_thread_params_per_s)

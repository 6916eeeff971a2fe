"""Micro-benchmarks of the local device, written as a hardware profile file.

``rlperf calibrate`` measures, with torch on the local device (CUDA if available, else CPU):

- **GEMM** over several shapes and dtypes: FLOP/s = 2mnk / t, as ``F.linear`` with weights
  cycling through a pool larger than the caches (a model streams its weights; a GEMM that
  reuses one hot matrix overstates a CPU's in-model rate by up to 2x);
- **memory bandwidth**: STREAM-like copy (2 x bytes per element) and triad ``a = b + s c``
  (3 x bytes) over arrays far larger than the caches (McCalpin, STREAM benchmark);
- **attention prefill**: causal ``scaled_dot_product_attention``, FLOPs = 4 h d x causal pairs
  (as :func:`rlperf.cost.roofline.attention_prefill`);
- **decode streaming**: batch-1 GEMVs over the weight pool plus an SDPA decode step over a KV
  cache, bytes = weights + KV read (what a batch-1 decode step streams, as gpt-fast's MBU);
- **optimizer step**: ``torch.optim.AdamW`` over N fp32 parameters, bytes as
  :func:`rlperf.cost.roofline.adam_step` counts them;
- **host memory**: on CUDA, the same copy/triad and AdamW on CPU tensors (what a CPU-offloaded
  optimizer runs on); on a CPU the device's own figures;
- **kernel launch**: eager cost per tiny op (a chain of ``add_`` on one element); on CUDA also
  the per-kernel cost inside a replayed CUDA graph.

Each figure is the *best* of several timed repetitions (the least disturbed run; the machine may
be shared). The local device is usually not in the accelerator catalog, so the file defines it
(``accelerator:``): its peak FLOP/s per dtype is the best GEMM rate measured, its memory
bandwidth the best of copy and triad, its memory size the device's (RAM on a CPU). The profile
efficiencies are then relative to those peaks:

- ``matmul_efficiency`` (and ``_by_dtype``): 1, the best GEMM rate over the peak that it
  defines: as the catalog profiles (MAMF / datasheet peak), the large-GEMM rate is the best rate
  over shapes;
- ``matmul_half_rate_flops`` and ``matmul_size_exponent``: the GEMM rate's size curve
  (:func:`rlperf.cost.roofline.matmul_size_factor`) fitted to the compute dtype's GEMMs, rate vs
  ``2mnk`` (:func:`rlperf.cost.roofline.fit_matmul_size_curve`), as the catalog fits published
  size sweeps;
- ``attention_efficiency``: prefill attention FLOP/s / peak, in the compute dtype (default bf16,
  the cost model's mixed-precision compute dtype);
- ``hbm_efficiency``: copy bandwidth / peak bandwidth (the shipped profiles use STREAM copy);
- ``decode_hbm_efficiency``: decode streaming bandwidth / peak bandwidth, in the dtype (compute
  dtype or fp32) that streams faster (a hardware rate; a slower dtype's kernels are software);
- ``kernel_launch_s`` and ``graph_kernel_launch_s`` (a CPU has no graphs: the eager cost);
- ``train_mfu_cap``: the end-to-end MFU of forward + backward through one decoder layer of a
  published config (Qwen2.5-0.5B's, HF eager with autocast), as the catalog's cap is the best
  published end-to-end training MFU; ``forward_mfu_cap``: the same layer's forward alone under
  ``no_grad`` (what log-prob and value passes run);
- ``host_memory_bandwidth_bytes_per_s``: the host's best of copy and triad (at the thread count
  used) over the GPUs that share the host (1 on a CPU), as the catalog's figure is the host's
  DRAM per GPU; ``host_adam_efficiency``: the host AdamW bytes/s over that best (CPU Adam is
  memory bound, :func:`rlperf.cost.roofline.cpu_adam_params_per_s`);

- ``engine_step_overhead_s`` and ``engine_layer_overhead_s``: HF ``generate``'s framework cost
  per decode step of a tiny model, fixed and per layer (1 vs 3 layers), which the engine model
  adds to every step (the runtime's engine is HF generate); ``engine_seq_overhead_s`` 0, as the
  batch-1 measurement holds HF's host time per sequence in its fixed part.

Collective fields (intra/inter-node) keep the generic values: one device runs no collectives.
The raw numbers go to the file's ``measurements:`` section, which the profile loader skips.
"""

from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rlperf.cost.roofline import causal_pairs, fit_matmul_size_curve
from rlperf.errors import SpecError
from rlperf.runtime.models import TORCH_DTYPES

DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
LOCAL_ID = "local"


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one calibration (full or quick, CPU or CUDA)."""

    gemm_shapes: tuple[tuple[int, int, int], ...]
    gemm_dtypes: tuple[str, ...]
    stream_elements: int  # fp32 elements per array
    attn_heads: int
    attn_head_dim: int
    attn_seq: int
    attn_batch: int
    gemv_rows: int  # square weight matrix rows (fp32/compute dtype)
    decode_batch: int
    decode_kv_heads: int
    decode_context: int
    adam_params: int
    block_batch: int  # reference decoder layer: sequences x tokens per fwd+bwd
    block_seq: int
    launch_ops: int
    pool_bytes: float  # weight operands cycle through this many bytes (more than the per-core caches)
    pool_flops: float  # ... but one pass over the pool does at most this many FLOPs (big GEMMs reuse
    # their weights over many rows and are compute bound: a cache hit changes little)
    repeats: int
    budget_s: float  # per benchmark, after the first repetition


def sizes_for(device: torch.device, quick: bool) -> Sizes:
    if device.type == "cuda":
        if quick:
            return Sizes(((1024, 1024, 1024), (4096, 4096, 4096)), ("bf16", "fp32"), 1 << 26, 16, 128, 2048, 1,
                         8192, 8, 8, 4096, 1 << 24, 4, 1024, 2000, 256e6, 1e12, 3, 0.5)
        return Sizes(((1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096)),
                     ("bf16", "fp16", "fp32"), 1 << 28, 32, 128, 4096, 4, 16384, 32, 8, 4096, 1 << 27, 8, 2048, 20000, 1e9, 1e13, 5, 2.0)
    if quick:
        return Sizes(((128, 128, 128), (512, 512, 512)), ("fp32", "bf16"), 1 << 21, 4, 64, 256, 1, 1024, 4, 2, 512, 1 << 18, 1, 64, 2000, 16e6, 1e9, 3, 0.2)
    # CPU: 64 MB weight pools, far beyond a core's L2 (1-4 MB), as a model's layers
    return Sizes(((64, 512, 512), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (2048, 1408, 512)),
                 ("fp32", "bf16"), 1 << 25, 8, 64, 1024, 1, 4096, 8, 2, 2048, 1 << 23, 4, 256, 20000, 64e6, 4e9, 5, 1.0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn: Callable[[], object], device: torch.device, repeats: int, budget_s: float) -> float:
    """Minimum wall time of ``fn`` over at least ``repeats`` runs (after one untimed run),
    continuing while the runs so far took less than ``budget_s``."""
    fn()
    _sync(device)
    best = float("inf")
    spent = 0.0
    n = 0
    while n < repeats or spent < budget_s:
        t0 = time.perf_counter()
        fn()
        _sync(device)
        dt = time.perf_counter() - t0
        best = min(best, dt)
        spent += dt
        n += 1
        if n >= 100 * repeats:
            break
    return best


@dataclass(frozen=True)
class GemmPoint:
    dtype: str
    m: int
    n: int
    k: int
    flops_per_s: float


@dataclass(frozen=True)
class Calibration:
    device: str
    device_name: str
    threads: int  # torch intra-op threads (CPU); the profile describes the device at this count
    memory_bytes: float
    compute_dtype: str
    gemm: tuple[GemmPoint, ...]
    copy_bytes_per_s: float
    triad_bytes_per_s: float
    attention_prefill_flops_per_s: dict[str, float]  # dtype -> FLOP/s
    attention_shape: dict[str, int]
    gemv_bytes_per_s: dict[str, float]  # dtype -> bytes/s
    decode_attention_bytes_per_s: dict[str, float]
    decode_bytes_per_s: dict[str, float]  # weights + KV of one decode step / its time
    adam_bytes_per_s: float
    adam_params: int
    host_copy_bytes_per_s: float  # host DRAM (the device itself on a CPU)
    host_triad_bytes_per_s: float
    host_adam_bytes_per_s: float  # torch AdamW on CPU tensors
    host_devices: int  # devices sharing the host's memory (CUDA devices; 1 on a CPU)
    block_flops_per_s: float  # fwd+bwd of the reference decoder layer, compute dtype
    block_mfu: float  # block_flops_per_s / peak of the compute dtype
    block_forward_flops_per_s: float  # forward only (no_grad) of the same layer
    block_forward_mfu: float
    engine_step_s: dict[str, float]  # HF generate per decode step of a tiny model: fixed, per layer
    kernel_launch_s: float
    graph_kernel_launch_s: float | None
    seconds: float
    torch_version: str = str(torch.__version__)
    date: str = field(default_factory=lambda: datetime.date.today().isoformat())

    # ------------------------------------------------------------------ derived
    def peak_flops(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for g in self.gemm:
            out[g.dtype] = max(out.get(g.dtype, 0.0), g.flops_per_s)
        return out

    def best_gemm(self, dtype: str) -> GemmPoint:
        """The fastest GEMM measured in ``dtype`` (MAMF: max achievable matmul FLOP/s over shapes)."""
        return max((g for g in self.gemm if g.dtype == dtype), key=lambda g: g.flops_per_s)

    @property
    def peak_bandwidth_bytes_per_s(self) -> float:
        return max(self.copy_bytes_per_s, self.triad_bytes_per_s)

    @property
    def host_bandwidth_bytes_per_s(self) -> float:
        return max(self.host_copy_bytes_per_s, self.host_triad_bytes_per_s)

    @property
    def decode_dtype(self) -> str:
        """The dtype whose decode step streamed fastest (the device's achievable decode rate)."""
        return max(self.decode_bytes_per_s, key=lambda d: self.decode_bytes_per_s[d])

    def to_profile(self) -> dict[str, Any]:
        """The profile file's content: the accelerator, its efficiencies, and the raw numbers."""
        peaks = self.peak_flops()
        bw = self.peak_bandwidth_bytes_per_s
        primary = "bf16" if "bf16" in peaks else self.compute_dtype

        def eff(dtype: str) -> dict[str, Any]:
            g = self.best_gemm(dtype)
            return {"value": _frac(g.flops_per_s / peaks[dtype]),
                    "from": f"best {dtype} GEMM ({g.m}x{g.n}x{g.k}, {g.flops_per_s / 1e9:,.1f} GFLOP/s) / peak, where the peak is "
                            "that best rate: every GEMM is credited with the best rate measured, as the catalog's MAMF / peak does"}

        src = f"rlperf calibrate, {self.date}, torch {self.torch_version}"
        a = self.attention_shape
        attn = self.attention_prefill_flops_per_s[self.compute_dtype]
        dd = self.decode_dtype
        dec = self.decode_bytes_per_s[dd]
        accelerator: dict[str, Any] = {
            "id": LOCAL_ID,
            "name": f"{self.device_name} (measured)",
            "vendor": "",
            "architecture": platform.machine() if self.device == "cpu" else "cuda",
            "peak_flops": {k: float(v) for k, v in peaks.items()},
            "fp32_vector_flops": float(peaks.get("fp32", max(peaks.values()))),
            "hbm_bytes": float(self.memory_bytes),
            "reported_memory_bytes": float(self.memory_bytes),
            "hbm_bandwidth_bytes_per_s": float(bw),
            "intra_node_bandwidth_bytes_per_s": float(self.copy_bytes_per_s),
            "nic_bandwidth_bytes_per_s": float(self.copy_bytes_per_s),
            "pcie_bandwidth_bytes_per_s": float(self.copy_bytes_per_s),
            "gpus_per_node": 1,
            "assumed": {
                "peak_flops": "the best GEMM rate measured per dtype, not a datasheet peak",
                "hbm_bandwidth_bytes_per_s": "the best of STREAM copy and triad measured",
                "hbm_bytes": "no datasheet: the device memory torch reports (RAM on a CPU)",
                "reported_memory_bytes": "torch.cuda.get_device_properties().total_memory (RAM on a CPU)",
                "intra_node_bandwidth_bytes_per_s": "one device, no links: set to the copy bandwidth",
                "nic_bandwidth_bytes_per_s": "one device, no links: set to the copy bandwidth",
                "pcie_bandwidth_bytes_per_s": "not measured: set to the copy bandwidth",
            },
            "notes": [f"written by {src} on {self.device}"],
        }
        profile: dict[str, Any] = {
            "accelerator": accelerator,
            "matmul_efficiency": eff(primary),
            "matmul_efficiency_by_dtype": {d: eff(d) for d in peaks if d != primary},
            **self.size_curve(),
            "attention_efficiency": {
                "value": _frac(attn / peaks[self.compute_dtype]),
                "from": f"causal SDPA prefill {self.compute_dtype} (batch {a['batch']}, heads {a['heads']}, head_dim {a['head_dim']}, seq {a['seq']}): "
                        f"{attn / 1e9:,.1f} GFLOP/s / peak {peaks[self.compute_dtype] / 1e9:,.1f}",
            },
            "hbm_efficiency": {"value": _frac(self.copy_bytes_per_s / bw),
                               "from": f"copy {self.copy_bytes_per_s / 1e9:,.2f} GB/s / best {bw / 1e9:,.2f} GB/s"},
            "decode_hbm_efficiency": {"value": _frac(dec / bw),
                                      "from": f"batch-1 GEMV + SDPA decode step ({dd}, the faster dtype) {dec / 1e9:,.2f} GB/s / best {bw / 1e9:,.2f} GB/s"},
            "kernel_launch_s": {"value": self.kernel_launch_s, "from": "eager cost per tiny op (chain of one-element add_)"},
            "graph_kernel_launch_s": (
                {"value": self.graph_kernel_launch_s, "from": "per kernel inside a replayed CUDA graph"}
                if self.graph_kernel_launch_s is not None
                else {"value": self.kernel_launch_s, "from": "no CUDA graphs on this device: the eager cost"}
            ),
            "train_mfu_cap": {
                "value": _frac(self.block_mfu),
                "from": f"end-to-end fwd+bwd of one {REFERENCE_BLOCK} decoder layer (eager HF, {self.compute_dtype} autocast): "
                        f"{self.block_flops_per_s / 1e9:,.1f} GFLOP/s / peak {peaks[self.compute_dtype] / 1e9:,.1f}",
            },
            "forward_mfu_cap": {
                "value": _frac(self.block_forward_mfu),
                "from": f"end-to-end forward (no_grad) of the same {REFERENCE_BLOCK} decoder layer: "
                        f"{self.block_forward_flops_per_s / 1e9:,.1f} GFLOP/s / peak {peaks[self.compute_dtype] / 1e9:,.1f}",
            },
            "host_memory_bandwidth_bytes_per_s": {
                "value": float(self.host_bandwidth_bytes_per_s / self.host_devices),
                "from": f"host best of copy {self.host_copy_bytes_per_s / 1e9:,.2f} and triad {self.host_triad_bytes_per_s / 1e9:,.2f} GB/s "
                        f"(CPU tensors, {self.threads} threads) / {self.host_devices} device(s) sharing the host",
            },
            "host_adam_efficiency": {
                "value": _frac(self.host_adam_bytes_per_s / self.host_bandwidth_bytes_per_s),
                "from": f"torch AdamW on CPU tensors {self.host_adam_bytes_per_s / 1e9:,.2f} GB/s (28 B per fp32 parameter) / "
                        f"host best {self.host_bandwidth_bytes_per_s / 1e9:,.2f} GB/s",
            },
            "engine_step_overhead_s": {
                "value": max(0.0, float(self.engine_step_s["fixed_s"])),
                "from": "HF generate per decode step of a tiny model (batch 1, 1 vs 3 layers): the fixed part",
            },
            "engine_layer_overhead_s": {
                "value": max(0.0, float(self.engine_step_s["per_layer_s"])),
                "from": "HF generate per decode step of a tiny model (batch 1, 1 vs 3 layers): the part per layer",
            },
            "engine_seq_overhead_s": {
                "value": 0.0,
                "from": "HF generate at batch 1: its host time per sequence is inside the fixed part measured above",
            },
            "source": src,
            "measurements": self.measurements(),
        }
        return profile

    def size_curve(self) -> dict[str, Any]:
        """The profile's GEMM size-curve fields, fitted to the compute dtype's GEMMs."""
        pts = [g for g in self.gemm if g.dtype == self.compute_dtype]
        w_half, a = fit_matmul_size_curve([2.0 * g.m * g.n * g.k for g in pts], [g.flops_per_s for g in pts])
        shown = ", ".join(f"{g.m}x{g.n}x{g.k} {g.flops_per_s / 1e9:,.0f}" for g in pts)
        frm = (f"fit of rate vs 2mnk over the {self.compute_dtype} GEMMs ({shown} GFLOP/s) with the best as the plateau "
               "(rlperf.cost.roofline.fit_matmul_size_curve)")
        return {"matmul_half_rate_flops": {"value": w_half, "from": frm}, "matmul_size_exponent": {"value": a, "from": frm}}

    def measurements(self) -> dict[str, Any]:
        d = asdict(self)
        d["gemm"] = [asdict(g) for g in self.gemm]
        d["adam_efficiency"] = self.adam_bytes_per_s / self.peak_bandwidth_bytes_per_s
        return d


def _frac(x: float) -> float:
    """An efficiency for the profile: in (0, 1] (a best-of measurement can only tie the peak)."""
    return float(min(1.0, max(x, 1e-6)))


# ---------------------------------------------------------------------- benchmarks
def _pool(rows: int, cols: int, dtype: torch.dtype, device: torch.device, s: Sizes, flops: float) -> list[torch.Tensor]:
    """Weight matrices filling ``pool_bytes``: cycling through them, each GEMM reads its weight
    from memory, not from a near cache (a model streams its weights layer by layer). At most
    ``pool_flops / flops`` of them (one GEMM of ``flops`` each)."""
    nbytes = rows * cols * (torch.finfo(dtype).bits // 8)
    count = max(1, min(512, -(-int(s.pool_bytes) // nbytes), int(s.pool_flops // flops)))
    first = torch.randn(rows, cols, device=device, dtype=dtype)
    return [first] + [first.clone() for _ in range(count - 1)]


def _gemm(device: torch.device, dtype: str, m: int, n: int, k: int, s: Sizes) -> GemmPoint:
    """``F.linear`` of an (m, k) input with (n, k) weights, as a model's layers run."""
    dt = TORCH_DTYPES[dtype]
    x = torch.randn(m, k, device=device, dtype=dt)
    ws = _pool(n, k, dt, device, s, 2.0 * m * n * k)

    def run() -> None:
        for w in ws:
            F.linear(x, w)

    t = best_time(run, device, s.repeats, s.budget_s) / len(ws)
    return GemmPoint(dtype, m, n, k, 2.0 * m * n * k / t)


def _stream(device: torch.device, s: Sizes) -> tuple[float, float]:
    n = s.stream_elements
    a = torch.empty(n, device=device)
    b = torch.rand(n, device=device)
    c = torch.rand(n, device=device)
    t_copy = best_time(lambda: a.copy_(b), device, s.repeats, s.budget_s)
    t_triad = best_time(lambda: torch.add(b, c, alpha=3.0, out=a), device, s.repeats, s.budget_s)
    return 2 * 4 * n / t_copy, 3 * 4 * n / t_triad


def _attention(device: torch.device, dtype: torch.dtype, s: Sizes) -> float:
    q = torch.randn(s.attn_batch, s.attn_heads, s.attn_seq, s.attn_head_dim, device=device, dtype=dtype)
    k, v = torch.randn_like(q), torch.randn_like(q)
    t = best_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), device, s.repeats, s.budget_s)
    flops = 4.0 * s.attn_heads * s.attn_head_dim * causal_pairs(s.attn_seq, s.attn_seq) * s.attn_batch
    return flops / t


def _decode(device: torch.device, dtype: torch.dtype, s: Sizes) -> tuple[float, float, float]:
    """(GEMV bytes/s, decode attention bytes/s, combined bytes/s)."""
    nbytes = torch.finfo(dtype).bits // 8
    ws = _pool(s.gemv_rows, s.gemv_rows, dtype, device, s, 2.0 * s.gemv_rows**2)
    x = torch.randn(1, s.gemv_rows, device=device, dtype=dtype)

    def gemv() -> None:
        for w in ws:
            F.linear(x, w)

    t_w = best_time(gemv, device, s.repeats, s.budget_s) / len(ws)
    w_bytes = float(ws[0].numel() * nbytes)
    hq, hkv, d = s.attn_heads, s.decode_kv_heads, s.attn_head_dim
    q = torch.randn(s.decode_batch, hq, 1, d, device=device, dtype=dtype)
    kc = torch.randn(s.decode_batch, hkv, s.decode_context, d, device=device, dtype=dtype)
    vc = torch.randn_like(kc)
    t_a = best_time(lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True), device, s.repeats, s.budget_s)
    kv_bytes = float(2 * kc.numel() * nbytes + 2 * q.numel() * nbytes)
    return w_bytes / t_w, kv_bytes / t_a, (w_bytes + kv_bytes) / (t_w + t_a)


def _adam(device: torch.device, s: Sizes) -> float:
    chunks = 8
    ps = [torch.nn.Parameter(torch.randn(s.adam_params // chunks, device=device)) for _ in range(chunks)]
    for p in ps:
        p.grad = torch.randn_like(p)
    opt = torch.optim.AdamW(ps, lr=1e-6)
    t = best_time(opt.step, device, s.repeats, s.budget_s)
    # read w, m, v, g and write w, m, v in fp32 (roofline.adam_step: 28 bytes/param at fp32)
    return 28.0 * (s.adam_params // chunks) * chunks / t


def _launch(device: torch.device, s: Sizes) -> tuple[float, float | None]:
    x = torch.zeros(1, device=device)

    def chain() -> None:
        for _ in range(s.launch_ops):
            x.add_(1.0)

    eager = best_time(chain, device, s.repeats, s.budget_s) / s.launch_ops
    if device.type != "cuda":
        return eager, None
    graph = torch.cuda.CUDAGraph()
    ops = min(s.launch_ops, 1000)
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with torch.cuda.stream(stream):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(ops):
            x.add_(1.0)
    replay = best_time(graph.replay, device, s.repeats, s.budget_s) / ops
    return eager, replay


# One decoder layer of a published config (not any scenario's model) for the end-to-end rate.
REFERENCE_BLOCK = "Qwen2.5-0.5B"


def _block(device: torch.device, dtype: str, s: Sizes) -> tuple[float, float]:
    """FLOP/s of (forward + backward, forward only under no_grad) through one decoder layer of
    REFERENCE_BLOCK (HF eager, autocast to ``dtype``): (3 or 1) x (2 x linear params x tokens +
    4 h d x causal pairs)."""
    from rlperf.runtime.models import compute_ctx, from_config, hf_config

    cfg = hf_config(REFERENCE_BLOCK, num_hidden_layers=1, vocab_size=1024)  # a small embedding (a gather)
    torch.manual_seed(0)
    model = from_config("AutoModel", cfg).to(device)
    x = torch.randint(0, cfg.vocab_size, (s.block_batch, s.block_seq), device=device)

    def step() -> None:
        with compute_ctx(device, TORCH_DTYPES[dtype]):
            h = model(input_ids=x, use_cache=False).last_hidden_state
        h.float().sum().backward()

    def forward() -> None:
        with torch.no_grad(), compute_ctx(device, TORCH_DTYPES[dtype]):
            model(input_ids=x, use_cache=False)

    t = best_time(step, device, s.repeats, s.budget_s)
    t_fwd = best_time(forward, device, s.repeats, s.budget_s)
    linear: int = sum(m.weight.numel() for m in model.layers[0].modules() if isinstance(m, torch.nn.Linear))
    heads, head_dim = int(cfg.num_attention_heads), int(cfg.hidden_size) // int(cfg.num_attention_heads)
    attn = 4.0 * heads * head_dim * causal_pairs(s.block_seq, s.block_seq) * s.block_batch
    flops = 2.0 * linear * s.block_batch * s.block_seq + attn
    return 3.0 * flops / t, flops / t_fwd


def _engine_step(device: torch.device, s: Sizes) -> dict[str, float]:
    """HF ``generate`` time per decode step of a tiny model (batch 1, hidden 64): its framework
    cost, split into a fixed part and a part per layer (1 vs 3 layers)."""
    from rlperf.runtime.models import from_config, hf_config

    steps = 32
    per: dict[int, float] = {}
    for layers in (1, 3):
        cfg = hf_config("tiny-qwen2", num_hidden_layers=layers, max_window_layers=layers, hidden_size=64, intermediate_size=128)
        torch.manual_seed(0)
        lm = from_config("AutoModelForCausalLM", cfg).to(device).eval()
        ids = torch.ones(1, 4, dtype=torch.long, device=device) * 5
        run = lambda lm=lm, ids=ids: lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=0,
                                                 max_new_tokens=steps, min_new_tokens=steps, pad_token_id=1, eos_token_id=1)
        per[layers] = best_time(run, device, s.repeats, s.budget_s) / steps
    per_layer = max(0.0, (per[3] - per[1]) / 2)
    return {"fixed_s": per[1] - per_layer, "per_layer_s": per_layer}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model}, {torch.get_num_threads()} threads"


def memory_bytes(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def calibrate(device: str = "auto", quick: bool = False, compute_dtype: str | None = None,
              threads: int | None = None, progress: Callable[[str], None] | None = None) -> Calibration:
    """Run the micro-benchmarks on ``device`` (auto: CUDA if available, else CPU) with
    ``threads`` torch threads (default: torch's)."""
    from rlperf.runtime.step import _resolve_device, set_threads

    dev = _resolve_device(device)
    set_threads(threads)
    s = sizes_for(dev, quick)
    dtype_name = compute_dtype or "bf16"  # the cost model's mixed precision computes in bf16
    if dtype_name not in TORCH_DTYPES:
        raise SpecError("dtype", f"cannot calibrate {dtype_name!r}", ", ".join(TORCH_DTYPES))
    dtypes = tuple(dict.fromkeys((*s.gemm_dtypes, dtype_name)))
    say = progress or (lambda _msg: None)
    t0 = time.perf_counter()
    with torch.no_grad():
        say("GEMM")
        gemm = tuple(_gemm(dev, dt, m, n, k, s) for dt in dtypes for (m, n, k) in s.gemm_shapes)
        say("memory bandwidth")
        copy_bw, triad_bw = _stream(dev, s)
        say("attention")
        attn_dtypes = tuple(dict.fromkeys((dtype_name, "fp32")))
        attn = {d: _attention(dev, TORCH_DTYPES[d], s) for d in attn_dtypes}
        say("decode streaming")
        decode = {d: _decode(dev, TORCH_DTYPES[d], s) for d in attn_dtypes}
    say("optimizer step")
    adam_bw = _adam(dev, s)
    host_copy, host_triad, host_adam, host_devices = copy_bw, triad_bw, adam_bw, 1
    if dev.type == "cuda":
        say("host memory (CPU tensors)")
        cpu = torch.device("cpu")
        hs = sizes_for(cpu, quick)
        with torch.no_grad():
            host_copy, host_triad = _stream(cpu, hs)
        host_adam = _adam(cpu, hs)
        host_devices = torch.cuda.device_count()
    say("reference decoder layer (fwd + bwd)")
    block, block_fwd = _block(dev, dtype_name, s)
    say("generate step overhead")
    with torch.no_grad():
        engine = _engine_step(dev, s)
    peak_c = max(g.flops_per_s for g in gemm if g.dtype == dtype_name)
    say("kernel launch")
    with torch.no_grad():
        eager, graph = _launch(dev, s)
    return Calibration(
        device=dev.type,
        device_name=device_name(dev),
        threads=torch.get_num_threads(),
        memory_bytes=memory_bytes(dev),
        compute_dtype=dtype_name,
        gemm=gemm,
        copy_bytes_per_s=copy_bw,
        triad_bytes_per_s=triad_bw,
        attention_prefill_flops_per_s=attn,
        attention_shape={"batch": s.attn_batch, "heads": s.attn_heads, "head_dim": s.attn_head_dim, "seq": s.attn_seq},
        gemv_bytes_per_s={d: v[0] for d, v in decode.items()},
        decode_attention_bytes_per_s={d: v[1] for d, v in decode.items()},
        decode_bytes_per_s={d: v[2] for d, v in decode.items()},
        adam_bytes_per_s=adam_bw,
        adam_params=s.adam_params,
        host_copy_bytes_per_s=host_copy,
        host_triad_bytes_per_s=host_triad,
        host_adam_bytes_per_s=host_adam,
        host_devices=host_devices,
        block_flops_per_s=block,
        block_mfu=block / peak_c,
        block_forward_flops_per_s=block_fwd,
        block_forward_mfu=block_fwd / peak_c,
        engine_step_s=engine,
        kernel_launch_s=eager,
        graph_kernel_launch_s=graph,
        seconds=time.perf_counter() - t0,
    )


def write_profile(cal: Calibration, path: str | os.PathLike[str]) -> None:
    """Write ``cal`` as a profile file (YAML, or JSON for a ``.json`` name)."""
    from pathlib import Path

    import yaml

    p = Path(path)
    data = cal.to_profile()
    from rlperf.outputs import dumps_strict, write_text

    if p.suffix.lower() == ".json":
        write_text(p, dumps_strict(data, indent=1) + "\n")
        return
    head = (
        f"# Hardware profile of the local device ({cal.device_name}), measured by rlperf calibrate\n"
        f"# on {cal.date} with torch {cal.torch_version} in {cal.seconds:.0f} s. Use it with\n"
        f"# --hardware-profile {p.name} (accelerator id '{LOCAL_ID}'). Peaks are the best rates measured;\n"
        "# efficiencies are relative to them. 'measurements' holds the raw numbers (not read back).\n"
    )
    write_text(p, head + yaml.safe_dump(data, sort_keys=False, width=120))

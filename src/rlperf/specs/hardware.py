"""Accelerators, their achieved efficiencies (the hardware profile), and clusters.

Peak numbers are facts with sources (``data/hardware.yaml``, built from
shared/research/hardware.yaml). Achieved efficiencies are *data* in a :class:`HardwareProfile`,
never constants in code: a profile can be replaced by ``--hardware-profile FILE`` (e.g. one
written by ``rlperf calibrate``).

Units: FLOP/s, bytes, bytes/s, seconds (SI, decimal).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from rlperf.specs.base import Spec


class Accelerator(Spec):
    """One accelerator's peak capabilities (dense, no sparsity)."""

    id: str = Field(min_length=1)
    name: str
    vendor: str = ""
    peak_flops: dict[str, float]  # dtype -> dense peak FLOP/s (tensor units), e.g. {"bf16": 989e12}
    fp32_vector_flops: float = Field(default=0.0, ge=0)  # non-tensor FP32 (elementwise, optimizer)
    hbm_bytes: float = Field(gt=0)
    hbm_bandwidth_bytes_per_s: float = Field(gt=0)
    intra_node_bandwidth_bytes_per_s: float = Field(gt=0)  # per GPU, one direction (NVLink)
    nic_bandwidth_bytes_per_s: float = Field(gt=0)  # scale-out NIC per GPU, one direction
    pcie_bandwidth_bytes_per_s: float = Field(default=25e9, gt=0)  # host <-> device, one direction
    gpus_per_node: int = Field(default=8, gt=0)
    price_usd_per_hour: float | None = Field(default=None, ge=0)

    def peak(self, dtype: str) -> float:
        from rlperf.errors import SpecError

        v = self.peak_flops.get(dtype)
        if not v:
            raise SpecError("dtype", f"{self.id} has no {dtype} tensor throughput", ", ".join(sorted(self.peak_flops)))
        return v


class HardwareProfile(Spec):
    """Achieved efficiencies and latencies for one accelerator (fractions of peak, seconds).

    Every field documents where its default came from in ``data/profiles.yaml``; the defaults
    here are the generic fallbacks used when an accelerator has no measurement of its own."""

    accelerator: str
    matmul_efficiency: float = Field(default=0.7, gt=0, le=1)  # large GEMM, achieved/peak
    attention_efficiency: float = Field(default=0.4, gt=0, le=1)  # flash attention fwd, achieved/peak
    hbm_efficiency: float = Field(default=0.8, gt=0, le=1)  # achieved/peak memory bandwidth
    decode_hbm_efficiency: float = Field(default=0.6, gt=0, le=1)  # weight+KV streaming in decode
    intra_node_efficiency: float = Field(default=0.8, gt=0, le=1.2)  # NCCL busbw / link spec
    inter_node_efficiency: float = Field(default=0.8, gt=0, le=1)  # NCCL busbw / NIC spec
    intra_node_latency_s: float = Field(default=10e-6, ge=0)  # collective alpha, inside a node
    inter_node_latency_s: float = Field(default=30e-6, ge=0)  # collective alpha, across nodes
    kernel_launch_s: float = Field(default=5e-6, ge=0)  # per-kernel fixed cost (decode step floor)
    train_mfu_cap: float = Field(default=0.6, gt=0, le=1)  # matmul efficiency cap in training
    source: str = ""


class Cluster(Spec):
    """``num_nodes`` x ``gpus_per_node`` accelerators of one kind, two-level network."""

    accelerator: Accelerator
    profile: HardwareProfile
    num_nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        if self.profile.accelerator != self.accelerator.id:
            raise ValueError(f"profile is for {self.profile.accelerator!r}, cluster has {self.accelerator.id!r}")
        return self

    @property
    def num_gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def price_usd_per_hour(self) -> float | None:
        p = self.accelerator.price_usd_per_hour
        return None if p is None else p * self.num_gpus

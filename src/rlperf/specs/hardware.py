"""Accelerators, their achieved efficiencies (the hardware profile), and clusters.

Peak numbers are facts with sources (``data/hardware.yaml``, built from
shared/research/hardware.yaml). Achieved efficiencies are *data* in a :class:`HardwareProfile`
(``data/profiles.yaml``), never constants in code: a profile can be replaced by
``--hardware-profile FILE`` (e.g. one written by ``rlperf calibrate``).

Units: FLOP/s, bytes, bytes/s, seconds (SI, decimal).

Device memory. ``hbm_bytes`` is the datasheet capacity in decimal bytes (H100: "80 GB" ->
80e9). What an engine or a trainer can allocate is what the CUDA (HIP) runtime reports,
``reported_memory_bytes``: cudaMemGetInfo's total, i.e. ``torch.cuda.mem_get_info()[1]`` =
``torch.cuda.get_device_properties(i).total_memory`` (H100 SXM: 85,045,477,376 bytes =
79.2 GiB, the datasheet's 80 GiB of HBM less the driver's reservation). vLLM and SGLang size
their KV cache from it (vLLM: ``requested_memory = gpu_memory_utilization * total`` with
``total`` from ``torch.cuda.mem_get_info()``, ``vllm/v1/worker/gpu_worker.py``). Every memory
check reads :attr:`Accelerator.device_memory_bytes`::

    device_memory_bytes = reported_memory_bytes   if a reported figure is catalogued
                        = hbm_bytes               otherwise (no published figure: the datasheet)

Figures and sources per part: ``data/hardware.yaml``. A reported total lies within 10% of the
datasheet figure (GiB vs GB is 7.4%, the driver takes < 1%); outside that is a unit slip.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from rlperf.inputs.ranges import GPUS, Bandwidth, Bytes, FlopRate, GpusPerNode, LaunchSeconds, NumNodes, OverheadSeconds
from rlperf.specs.base import Spec

Fraction = Annotated[float, Field(gt=0, le=1)]


class Source(Spec):
    """Where some fields of a record come from."""

    fields: tuple[str, ...]
    url: str
    note: str = ""


class Accelerator(Spec):
    """One accelerator's peak capabilities (dense, no sparsity)."""

    id: str = Field(min_length=1)
    name: str
    vendor: str = ""
    architecture: str = ""
    aliases: tuple[str, ...] = ()  # other names accepted by load_accelerator (normalized)
    peak_flops: dict[str, FlopRate]  # dtype -> dense peak FLOP/s (tensor units), e.g. {"bf16": 989e12}
    fp32_vector_flops: float = Field(default=0.0, ge=0)  # non-tensor FP32 (elementwise, optimizer)
    hbm_bytes: Bytes  # datasheet capacity, decimal bytes
    # total device memory the CUDA (HIP) runtime reports (torch.cuda.mem_get_info()[1]); None: no
    # published figure, the datasheet's is used (device_memory_bytes)
    reported_memory_bytes: Bytes | None = None
    hbm_bandwidth_bytes_per_s: Bandwidth
    intra_node_bandwidth_bytes_per_s: Bandwidth  # per GPU, one direction (NVLink)
    # Full-mesh fabrics (AMD Infinity Fabric): one GPU pair's direct link, one direction. A group
    # of r GPUs then reaches at most (r-1) links; None on switched fabrics (NVSwitch), where any
    # group gets the full per-GPU bandwidth.
    p2p_link_bandwidth_bytes_per_s: Bandwidth | None = None
    nic_bandwidth_bytes_per_s: Bandwidth  # scale-out NIC per GPU, one direction
    pcie_bandwidth_bytes_per_s: Bandwidth = 25e9  # host <-> device, one direction
    gpus_per_node: GpusPerNode = 8  # GPUs sharing the intra-node (scale-up) fabric
    price_usd_per_hour: float | None = Field(default=None, ge=0)
    tdp_w: float | None = Field(default=None, gt=0)
    assumed: dict[str, str] = Field(default_factory=dict)  # field -> why a value without a direct source was chosen
    notes: tuple[str, ...] = ()
    sources: tuple[Source, ...] = ()

    @model_validator(mode="after")
    def _check_memory(self) -> Accelerator:
        rep = self.reported_memory_bytes
        if rep is not None and not 0.9 * self.hbm_bytes <= rep <= 1.1 * self.hbm_bytes:
            raise ValueError(
                f"reported_memory_bytes {rep:.4g} must lie within 10% of hbm_bytes {self.hbm_bytes:.4g} "
                "(the runtime's total in bytes, e.g. 85045477376 for an H100 SXM)"
            )
        return self

    @property
    def device_memory_bytes(self) -> float:
        """Memory of one device that an engine or trainer can allocate: the runtime's reported
        total where catalogued, the datasheet figure otherwise (module docstring)."""
        rep = self.reported_memory_bytes
        return self.hbm_bytes if rep is None else rep

    def peak(self, dtype: str) -> float:
        from rlperf.errors import SpecError

        v = self.peak_flops.get(dtype)
        if not v:
            raise SpecError("dtype", f"{self.id} has no {dtype} tensor throughput", ", ".join(sorted(self.peak_flops)))
        return v

    def intra_node_group_bandwidth_bytes_per_s(self, ranks_per_node: int) -> float:
        """Per-GPU one-direction scale-up bandwidth usable by a group of ``ranks_per_node`` GPUs.

        Switched fabrics give every group the full per-GPU figure; a full mesh gives a group
        only the links to its peers: min(spec, (r-1) x link) (MLE-net: two MI300X share one
        64 GB/s link, eight reach 7 x 64 = 448 GB/s)."""
        link = self.p2p_link_bandwidth_bytes_per_s
        if link is None or ranks_per_node < 2:
            return self.intra_node_bandwidth_bytes_per_s
        return min(self.intra_node_bandwidth_bytes_per_s, (ranks_per_node - 1) * link)


SYNC_ONLY_FIELDS: frozenset[str] = frozenset(
    {"weight_sync_tensor_overhead_s", "weight_sync_bucket_overhead_s", "engine_load_tensor_overhead_s",
     "engine_load_param_walk_s"}
)
"""HardwareProfile fields only the weight sync reads (rlperf.stages.weight_sync)."""

ROLLOUT_ONLY_FIELDS: frozenset[str] = frozenset(
    {"decode_hbm_efficiency", "decode_kv_hbm_efficiency", "engine_step_overhead_s", "engine_layer_overhead_s", "engine_seq_overhead_s",
     "moe_routing_imbalance", "moe_expert_read_half_bytes", "moe_a2a_nic_efficiency"}
)
"""HardwareProfile fields only the rollout engine reads (rlperf.stages.rollout_step): a
simulation's training and forward stages are the same whatever their values, so the stage
caches (rlperf.sim.costs) key those stages without them (tests/test_stage_cache_keys.py)."""


class HardwareProfile(Spec):
    """Achieved efficiencies and latencies for one accelerator (fractions of peak, seconds).

    Every shipped value is derived from a published measurement in ``data/profiles.yaml``,
    which records its provenance. The defaults here are the *generic* fallbacks of that file
    (its ``generic:`` block; a test keeps the two equal) for an accelerator without data."""

    accelerator: str
    matmul_efficiency: float = Field(default=0.781, gt=0, le=1)  # large BF16 GEMM, achieved/peak
    # dtype -> large-GEMM efficiency where it differs from BF16 (e.g. FP8 ~0.71 on H100)
    matmul_efficiency_by_dtype: dict[str, Fraction] = Field(default_factory=dict)
    attention_efficiency: float = Field(default=0.332, gt=0, le=1)  # flash attention fwd, achieved/peak
    hbm_efficiency: float = Field(default=0.835, gt=0, le=1)  # achieved/peak memory bandwidth (STREAM)
    decode_hbm_efficiency: float = Field(default=0.725, gt=0, le=1)  # end-to-end decode (weights streamed)
    # paged decode attention reading the KV cache (continuous-batching engines), achieved/peak
    decode_kv_hbm_efficiency: float = Field(default=0.536, gt=0, le=1)
    intra_node_efficiency: float = Field(default=0.77, gt=0, le=1.2)  # ring busbw / link spec
    # NVLink SHARP all-reduce: algorithm bandwidth / per-direction spec (None: no NVLS)
    nvls_allreduce_efficiency: float | None = Field(default=None, gt=0, le=1)
    inter_node_efficiency: float = Field(default=0.895, gt=0, le=1)  # achieved per NIC / NIC spec
    intra_node_latency_s: LaunchSeconds = 2.143e-6  # collective alpha per step, in a node
    inter_node_latency_s: LaunchSeconds = 10.25e-6  # collective alpha per step, across nodes
    kernel_launch_s: LaunchSeconds = 2.65e-6  # per-kernel fixed cost, eager launches
    graph_kernel_launch_s: LaunchSeconds = 0.58e-6  # per-kernel cost inside a CUDA graph
    # the shortest a decode kernel runs (launch latency, ramp, tail): a step of n kernels takes at
    # least n times it (stages.rollout_step)
    decode_kernel_min_s: LaunchSeconds = 6.13e-6
    # host time to dispatch one op (kernel or collective) of a rollout engine's decode step in
    # eager PyTorch (no CUDA graphs: Python, dispatcher, allocator, launch); a decode step cannot
    # run faster than its ops are dispatched (stages.rollout_step counts them per layer)
    eager_op_launch_s: LaunchSeconds = 2.625e-5
    # End-to-end MFU figures for reference (the best published training MFU; a forward-only pass's,
    # as `rlperf calibrate` measures it). The stage models cost kernels one by one and do not cap
    # them with these: a whole-pass MFU already contains the launches, memory-bound work and host
    # time they add.
    train_mfu_cap: float = Field(default=0.552, gt=0, le=1)
    forward_mfu_cap: float | None = Field(default=None, gt=0, le=1)
    # Host side, per GPU: the node's DRAM peak (sockets x channels x MT/s x 8 B) / GPUs per node,
    # and what a CPU Adam step achieves of it (CPU-offloaded optimizer; stages.train).
    host_memory_bandwidth_bytes_per_s: Bandwidth = 70.4e9
    host_adam_efficiency: float = Field(default=0.721, gt=0, le=1)
    # Parameters per second one host thread's CPU Adam step updates (fp32 master weights and
    # moments): a rank whose optimizer runs on few threads (TrainLayout.cpu_optimizer_threads;
    # Ray and torchrun start each rank with OMP_NUM_THREADS=1) is bound by its threads, not by its
    # share of the node's DRAM (cost.roofline.cpu_adam_params_per_s). None: the DRAM share alone.
    host_adam_thread_params_per_s: float | None = Field(default=2.78e8, gt=0)
    # GEMM rate vs problem size (work W = 2mnk FLOPs): rate(W) = matmul_eff x W^a / (W^a + W_half^a),
    # W_half = matmul_half_rate_flops (0: every GEMM at the large-GEMM rate), a = matmul_size_exponent
    # (cost.roofline.matmul_size_factor).
    matmul_half_rate_flops: float = Field(default=7.519e9, ge=0)
    matmul_size_exponent: float = Field(default=1.11, gt=0)
    # Host-side cost of one rollout-engine step (scheduling, input preparation, sampler
    # bookkeeping, output processing), added to every step or, under the engine's overlap
    # scheduling, overlapped with it (stages.rollout_step): engine_step_overhead_s +
    # engine_layer_overhead_s x layers + engine_seq_overhead_s x sequences (the
    # per-layer part: eager module dispatch, e.g. HF generate). The fixed part is vLLM's (a
    # published single-stream figure, profiles.yaml); `rlperf validate --calibrate` can refit it,
    # `rlperf calibrate` measures HF generate's. None: nothing added.
    engine_step_overhead_s: OverheadSeconds | None = 2.14e-3
    engine_layer_overhead_s: OverheadSeconds | None = None
    # The engine's host time per sequence of a step (scheduling it, preparing its inputs,
    # processing its sampled token): grows with the batch (stages.rollout_step). A host-CPU
    # figure, the same for every accelerator (vLLM V1's decode gap, profiles.yaml). None: nothing.
    engine_seq_overhead_s: OverheadSeconds | None = 2.15e-5
    # Host-side cost of a trainer -> engine weight sync per call (stages.weight_sync), one figure
    # per path (WeightSync.transfer): per checkpoint tensor tensor by tensor (verl's default NCCL
    # loop), per bucket bucketed (checkpoint-engine). None: nothing.
    weight_sync_tensor_overhead_s: OverheadSeconds | None = None
    weight_sync_bucket_overhead_s: OverheadSeconds | None = None
    # NCCL protocols (cost.collectives): the bandwidth protocol (Simple/LL128) pays a fixed
    # start-up of collective_simple_latency_s per call on top of the per-step alphas; the
    # low-latency protocol (LL) pays none but reaches collective_ll_bandwidth_fraction of the
    # link. None (either): one protocol, the plain alpha-beta model.
    collective_simple_latency_s: OverheadSeconds | None = None
    collective_ll_bandwidth_fraction: float | None = Field(default=None, gt=0, le=1)
    # Host/framework time per transformer layer and micro-batch pass (forward, recompute and
    # backward each pay it) of a training backend that the GPU does not overlap (eager module
    # dispatch, autograd, hooks; stages.pass_cost). None: nothing added. Megatron's default is
    # the A100 figure fitted to vTrain's iterations (profiles.yaml generic: an assumption for
    # other hosts); FSDP has no figure.
    megatron_layer_overhead_s: OverheadSeconds | None = 1.028e-3
    fsdp_layer_overhead_s: OverheadSeconds | None = None
    # How a pass's host time and device time combine: (host^k + device^k)^(1/k), a smooth maximum
    # (the host runs ahead of the device only between synchronizations). None: max(host, device).
    host_overlap_exponent: float | None = Field(default=3.0, gt=1, le=100)
    # The engine's load_weights per checkpoint tensor (reload after a sync, both transfer modes;
    # stages.weight_sync). None: nothing.
    engine_load_tensor_overhead_s: OverheadSeconds | None = None
    # Host time per engine parameter tensor of one load_weights call: every call rebuilds
    # dict(named_parameters()) over the whole model (stages.weight_sync). None: nothing.
    engine_load_param_walk_s: OverheadSeconds | None = 1.83e-6
    # MoE decode with expert parallelism: the busiest rank's distinct experts read per step over
    # the uniform-routing figure (popular experts; stages.rollout_step). None: 1 (no published
    # figure, and no calibration case could identify it).
    moe_routing_imbalance: float | None = Field(default=None, ge=1)
    # MoE decode: the per-GPU slice of one expert (its gate, up and down matrices in one layer)
    # at which the engine's grouped GEMM streams it at half its large-slice bandwidth; a slice
    # of s bytes costs s + this at the decode bandwidth (stages.rollout_step). None: s alone.
    moe_expert_read_half_bytes: float | None = Field(default=1.44e6, ge=0, le=1e9)
    # Cross-node bytes of an expert dispatch / combine under data-parallel attention (DeepEP's
    # low-latency kernels) per second, over the NIC spec. None: inter_node_efficiency.
    moe_a2a_nic_efficiency: float | None = Field(default=0.78, gt=0, le=1)
    source: str = ""
    provenance: dict[str, str] = Field(default_factory=dict)  # field -> derivation and source url

    def matmul_eff(self, dtype: str) -> float:
        """Large-GEMM efficiency for ``dtype`` (the BF16 figure where none is recorded)."""
        return self.matmul_efficiency_by_dtype.get(dtype, self.matmul_efficiency)

    def train_layer_overhead_s(self, backend: str) -> float:
        """Host time per layer and micro-batch pass of the training ``backend`` (0 without a figure)."""
        value = self.megatron_layer_overhead_s if backend == "megatron" else self.fsdp_layer_overhead_s
        return value or 0.0

    def engine_step_s(self, num_layers: int) -> float:
        """Host-side engine cost of every rollout-engine step of a ``num_layers`` model that does
        not depend on the batch (the per-sequence part: :attr:`engine_seq_s`)."""
        fixed = self.engine_step_overhead_s or 0.0
        return fixed + (self.engine_layer_overhead_s or 0.0) * num_layers

    @property
    def engine_seq_s(self) -> float:
        """Host-side engine cost per sequence of a rollout-engine step (0 without a figure)."""
        return self.engine_seq_overhead_s or 0.0

    @property
    def host_adam_bytes_per_s(self) -> float:
        """Host memory traffic per second a CPU Adam step sustains, per GPU's share of the host."""
        return self.host_memory_bandwidth_bytes_per_s * self.host_adam_efficiency


class Cluster(Spec):
    """``num_nodes`` scale-up domains ("nodes") of ``gpus_per_node`` accelerators of one kind,
    two-level network. A node is the NVLink domain: 8 GPUs of an HGX server, or the 72 GPUs of
    a GB200 NVL72 rack. A job need not fill its last domain: ``last_node_gpus`` GPUs of it are
    used (ranks are numbered node by node, so only the last one is partial)."""

    accelerator: Accelerator
    profile: HardwareProfile
    num_nodes: NumNodes
    gpus_per_node: GpusPerNode
    last_node_gpus: GpusPerNode | None = None  # None: the last node is full

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        if self.profile.accelerator != self.accelerator.id:
            raise ValueError(f"profile is for {self.profile.accelerator!r}, cluster has {self.accelerator.id!r}")
        if self.last_node_gpus is not None and self.last_node_gpus > self.gpus_per_node:
            raise ValueError(f"last_node_gpus {self.last_node_gpus} exceeds gpus_per_node {self.gpus_per_node}")
        GPUS.require("num_nodes", self.num_gpus)  # nodes x GPUs per node
        return self

    @property
    def num_gpus(self) -> int:
        last = self.gpus_per_node if self.last_node_gpus is None else self.last_node_gpus
        return (self.num_nodes - 1) * self.gpus_per_node + last

    def with_gpus(self, num_gpus: int) -> Cluster:
        """The first ``num_gpus`` GPUs of this cluster's kind, packed node by node (a pool)."""
        nodes = -(-num_gpus // self.gpus_per_node)
        last = num_gpus - (nodes - 1) * self.gpus_per_node
        if nodes == 1:  # one (partial) node: a node of exactly those GPUs
            return self.model_copy(update={"num_nodes": 1, "gpus_per_node": num_gpus, "last_node_gpus": None})
        return self.model_copy(update={
            "num_nodes": nodes, "last_node_gpus": None if last == self.gpus_per_node else last,
        })

    @property
    def price_usd_per_hour(self) -> float | None:
        p = self.accelerator.price_usd_per_hour
        return None if p is None else p * self.num_gpus

"""Collective communication time: the alpha-beta model over a two-level topology.

A group has p ranks, r of them on each node it touches, spread over m = ceil(p / r) nodes. Each
GPU has two links (both one direction, achieved = spec x profile efficiency):

  B_intra = scale-up bandwidth usable by r peers (NVLink / xGMI / PCIe) x intra_node_efficiency
  B_inter = its own scale-out NIC x inter_node_efficiency (rail-optimized: one NIC per GPU)

and a per-step start-up cost alpha_intra / alpha_inter (profile latencies). A collective costs
steps x alpha + bytes / bandwidth (Hockney's alpha-beta model, as used for MPI collectives by
Thakur, Rabenseifner & Gropp, "Optimization of Collective Communication Operations in MPICH",
IJHPCA 19(1), 2005).

Bandwidths follow NCCL's "bus bandwidth" convention (nccl-tests doc/PERFORMANCE.md): an
all-reduce of n bytes over p ranks moves 2(p-1)/p * n bytes through each rank's link, an
all-gather or reduce-scatter (p-1)/p * n (n = the full gathered / input size), so
``intra_node_efficiency`` (measured busbw / link spec) plugs in directly. The ring all-reduce is
bandwidth-optimal (Patarasuk & Yuan, JPDC 69(2), 2009).

Two levels (hierarchical, as NCCL runs across nodes): reduce-scatter inside the node (r ranks),
all-reduce across the m nodes on each rank's 1/r shard over its own NIC, all-gather inside the
node. NCCL pipelines chunks through all links at once, so the bandwidth term is the *slower*
link's, max(intra, inter), not their sum; latency terms add. This is the model under which
MLE-net derives "37 GB/s on each NIC" from a 4-node B200 busbw of 381.8 GB/s, i.e. the one the
inter-node efficiencies in profiles.yaml were read with.

Algorithms (``auto`` takes the fastest, which reproduces NCCL's choices: tree for small messages
across many nodes, ring for large ones, NVLS inside NVSwitch nodes):
  ring  latency 2(r-1) a_intra + 2(m-1) a_inter
  tree  inter-node pipelined double binary tree on the shard (Sanders, Speck & Traff, "Two-tree
        algorithms for full bandwidth broadcast, reduction and scan", Parallel Computing 35(12),
        2009; NCCL >= 2.4): latency 2 ceil(log2 m) a_inter, 2 * shard bytes per NIC. Inside a
        node NCCL's tree is a chain: 2(p-1) steps, 2n bytes.
  nvls  NVLink SHARP (single node): the switch reduces; algorithm bandwidth is ~flat in p (MLE-net
        H200 sweep), time = n / (spec x nvls_allreduce_efficiency). No small-message NVLS figure
        is published, so it shares the ring's latency term.

Protocols (where the profile gives both figures; else one protocol, the plain model above).
NCCL moves data with a low-latency protocol (LL: flags in every 8-byte line, no extra start-up,
a fraction of the link bandwidth) or a bandwidth protocol (Simple/LL128: full bandwidth after a
fixed start-up per call) and takes the faster (NCCL's tuning model, src/graph/tuning.cc). Ring
all-reduce, all-gather and reduce-scatter, in and across nodes, cost the smaller of

  LL      steps x alpha + bytes / (B x collective_ll_bandwidth_fraction)
  Simple  collective_simple_latency_s + steps x alpha + bytes / B

which reproduces the shape of nccl-tests sweeps: ~44 us at 32-64 KiB on 8 A100 (LL), a ~90-100 us
plateau from 1 to 4 MiB (Simple's start-up), then bandwidth bound (stas00 ml-engineering;
vTrain's A100 look-up tables, profiles.yaml).

Each formula is written once for a byte count or a numpy array of them: ``all_reduce`` and the
others cost one collective, ``costs_each`` costs one kind of collective at many sizes in one
pass (the training stage model asks for every micro-batch's size), with the same figures.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from rlperf.errors import SpecError
from rlperf.specs.hardware import Cluster

Algorithm = Literal["ring", "tree", "nvls", "auto"]
# A byte count, or an array of them: every formula below takes either.
Num = float | np.ndarray


def _lo(a: Num, b: Num) -> Num:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        lo: np.ndarray = np.minimum(a, b)
        return lo
    return min(a, b)


def _hi(a: Num, b: Num) -> Num:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        hi: np.ndarray = np.maximum(a, b)
        return hi
    return max(a, b)


@dataclass(frozen=True)
class CommGroup:
    """``size`` ranks, ``ranks_per_node`` of them sharing each node the group touches."""

    size: int
    ranks_per_node: int

    def __post_init__(self) -> None:
        if self.size < 1:
            raise SpecError("group.size", f"must be >= 1, got {self.size}")
        if not 1 <= self.ranks_per_node <= self.size:
            raise SpecError("group.ranks_per_node", f"{self.ranks_per_node} not in 1..size ({self.size})")

    @property
    def num_nodes(self) -> int:
        return -(-self.size // self.ranks_per_node)


@dataclass(frozen=True)
class CollectiveCost:
    time_s: float
    bytes_sent_per_rank: float  # through the busiest rank's links, all phases
    algorithm: str


FREE = CollectiveCost(time_s=0.0, bytes_sent_per_rank=0.0, algorithm="none")


@dataclass(frozen=True)
class _Net:
    intra_bw: float  # bytes/s per GPU, one direction, achieved
    inter_bw: float
    intra_alpha: float  # s per step
    inter_alpha: float
    nvls_bw: float | None  # NVLS all-reduce algorithm bandwidth, bytes/s
    simple_latency_s: float = 0.0  # the bandwidth protocol's start-up per call
    ll_fraction: float | None = None  # LL's share of the bandwidth; None: one protocol

    def protocol_time_s(self, latency_s: float, bandwidth_s: Num) -> Num:
        """The faster protocol for a collective of ``latency_s`` (steps x alpha) and
        ``bandwidth_s`` (bytes / full bandwidth): LL or Simple (module docstring)."""
        if self.ll_fraction is None:
            return latency_s + bandwidth_s
        return latency_s + _lo(bandwidth_s / self.ll_fraction, self.simple_latency_s + bandwidth_s)


def _net(cluster: Cluster, group: CommGroup) -> _Net:
    if group.size > cluster.num_gpus:
        raise SpecError("group.size", f"{group.size} ranks on a cluster of {cluster.num_gpus} GPUs")
    if group.ranks_per_node > cluster.gpus_per_node:
        raise SpecError(
            "group.ranks_per_node",
            f"{group.ranks_per_node} ranks per node on nodes of {cluster.gpus_per_node} GPUs",
        )
    acc, prof = cluster.accelerator, cluster.profile
    link = acc.intra_node_group_bandwidth_bytes_per_s(group.ranks_per_node)
    nvls = prof.nvls_allreduce_efficiency
    return _Net(
        intra_bw=link * prof.intra_node_efficiency,
        inter_bw=acc.nic_bandwidth_bytes_per_s * prof.inter_node_efficiency,
        intra_alpha=prof.intra_node_latency_s,
        inter_alpha=prof.inter_node_latency_s,
        nvls_bw=None if nvls is None else acc.intra_node_bandwidth_bytes_per_s * nvls,
        simple_latency_s=prof.collective_simple_latency_s or 0.0,
        ll_fraction=prof.collective_ll_bandwidth_fraction if prof.collective_simple_latency_s is not None else None,
    )


def _check_bytes(field: str, value: Num) -> None:
    if isinstance(value, np.ndarray):
        bad = ~(np.isfinite(value) & (value >= 0))
        if bad.any():
            _check_bytes(field, float(value[bad][0]))
    elif not (math.isfinite(value) and value >= 0):
        raise SpecError(field, f"must be a finite number >= 0, got {value!r}")


def _check_algorithm(value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise SpecError("algorithm", f"unknown algorithm {value!r}", ", ".join(allowed))


@dataclass(frozen=True)
class _Option:
    """One algorithm's (time, bytes sent per rank), for one size or an array of sizes."""

    time_s: Num
    bytes_sent: Num
    algorithm: str


def _pick(options: list[_Option], algorithm: str) -> CollectiveCost:
    if algorithm == "auto":
        c = min(options, key=lambda c: c.time_s)  # first wins ties: ring before tree/nvls
        return CollectiveCost(float(c.time_s), float(c.bytes_sent), c.algorithm)
    for c in options:
        if c.algorithm == algorithm:
            return CollectiveCost(float(c.time_s), float(c.bytes_sent), c.algorithm)
    raise SpecError("algorithm", f"{algorithm!r} does not apply to this group", ", ".join(c.algorithm for c in options))


@dataclass(frozen=True)
class CollectiveCosts:
    """:class:`CollectiveCost` of one kind of collective at many sizes (arrays by size)."""

    time_s: np.ndarray
    bytes_sent_per_rank: np.ndarray


def _pick_each(options: list[_Option]) -> CollectiveCosts:
    """The fastest option at each size, the first of equals (as :func:`_pick`'s ``auto``)."""
    time = np.asarray(options[0].time_s, np.float64)
    sent = np.asarray(options[0].bytes_sent, np.float64)
    for c in options[1:]:
        better = c.time_s < time
        time = np.where(better, c.time_s, time)
        sent = np.where(better, c.bytes_sent, sent)
    return CollectiveCosts(time, sent)


@dataclass(frozen=True)
class _Ring:
    """One hierarchical ring gather (or scatter) of n bytes: intra then inter, pipelined."""

    latency_s: float
    intra_bytes: Num
    inter_bytes: Num

    def time_s(self, net: _Net, times: int = 1) -> Num:
        """``times`` passes (2 for an all-reduce: reduce-scatter + all-gather in one call)."""
        bw = _hi(self.intra_bytes / net.intra_bw, self.inter_bytes / net.inter_bw)
        return net.protocol_time_s(times * self.latency_s, times * bw)


def _ring_gather(n: Num, group: CommGroup, net: _Net) -> _Ring:
    # all-gather of n bytes: inside the node (r-1)/r * n per rank; across nodes each rank moves its
    # 1/r share: (m-1)/m * n/r over its NIC. Steps: (r-1) intra, (m-1) inter.
    r, m = group.ranks_per_node, group.num_nodes
    return _Ring(
        latency_s=(r - 1) * net.intra_alpha + (m - 1) * net.inter_alpha,
        intra_bytes=(r - 1) / r * n,
        inter_bytes=(m - 1) / m * n / r,
    )


def _all_reduce_options(n: Num, group: CommGroup, net: _Net) -> list[_Option]:
    p, r, m = group.size, group.ranks_per_node, group.num_nodes
    # ring = reduce-scatter + all-gather: twice a ring gather (2(p-1)/p * n bytes when m == 1)
    g = _ring_gather(n, group, net)
    options = [_Option(g.time_s(net, 2), 2 * (g.intra_bytes + g.inter_bytes), "ring")]
    if m == 1:
        # NCCL's tree inside a node is a chain: reduce up, broadcast down, pipelined
        chain = net.protocol_time_s(2 * (p - 1) * net.intra_alpha, 2 * n / net.intra_bw)
        options.append(_Option(chain, 2 * n, "tree"))
        if net.nvls_bw is not None:
            options.append(_Option(net.protocol_time_s(2 * (p - 1) * net.intra_alpha, n / net.nvls_bw), n, "nvls"))
    else:
        # intra-node reduce-scatter + all-gather as in the ring; across nodes a pipelined double
        # binary tree on each rank's n/r shard: 2 * n/r bytes per NIC, 2 ceil(log2 m) steps
        intra_b, tree_b = 2 * g.intra_bytes, 2 * n / r
        lat = 2 * (r - 1) * net.intra_alpha + 2 * math.ceil(math.log2(m)) * net.inter_alpha
        t = net.protocol_time_s(lat, _hi(intra_b / net.intra_bw, tree_b / net.inter_bw))
        options.append(_Option(t, intra_b + tree_b, "tree"))
    return options


def all_reduce(cluster: Cluster, num_bytes: float, group: CommGroup, algorithm: Algorithm = "auto") -> CollectiveCost:
    """All-reduce of ``num_bytes`` per rank (every rank ends with the full reduced buffer)."""
    _check_bytes("num_bytes", num_bytes)
    _check_algorithm(algorithm, ("ring", "tree", "nvls", "auto"))
    if group.size == 1 or num_bytes == 0:
        return FREE
    return _pick(_all_reduce_options(num_bytes, group, _net(cluster, group)), algorithm)


def _gather_options(n: Num, group: CommGroup, net: _Net) -> list[_Option]:
    g = _ring_gather(n, group, net)
    return [_Option(g.time_s(net), g.intra_bytes + g.inter_bytes, "ring")]


def _gather_like(cluster: Cluster, field: str, n: float, group: CommGroup, algorithm: str) -> CollectiveCost:
    _check_bytes(field, n)
    _check_algorithm(algorithm, ("ring", "auto"))
    if group.size == 1 or n == 0:
        return FREE
    return _pick(_gather_options(n, group, _net(cluster, group)), "auto")


def all_gather(
    cluster: Cluster, num_bytes_out: float, group: CommGroup, algorithm: Literal["ring", "auto"] = "auto"
) -> CollectiveCost:
    """All-gather producing ``num_bytes_out`` on every rank (each contributes 1/p of it)."""
    return _gather_like(cluster, "num_bytes_out", num_bytes_out, group, algorithm)


def reduce_scatter(
    cluster: Cluster, num_bytes_in: float, group: CommGroup, algorithm: Literal["ring", "auto"] = "auto"
) -> CollectiveCost:
    """Reduce-scatter of a ``num_bytes_in`` buffer per rank (each ends with 1/p of the sum).

    The mirror image of the all-gather: same steps, same bytes (NCCL busbw for both is
    algbw x (p-1)/p; MLE-net measures 361 vs 363 GB/s on 8x H200)."""
    return _gather_like(cluster, "num_bytes_in", num_bytes_in, group, algorithm)


def _all_to_all_options(n: Num, group: CommGroup, net: _Net) -> list[_Option]:
    p, r = group.size, group.ranks_per_node
    intra_b, inter_b = (r - 1) / p * n, (p - r) / p * n
    pair_lat = (r - 1) * net.intra_alpha + (p - r) * net.inter_alpha
    pair_t = pair_lat + _hi(intra_b / net.intra_bw, inter_b / net.inter_bw)
    steps = math.ceil(math.log2(p))
    intra_steps = min(steps, math.ceil(math.log2(r)))
    step_b = n / 2
    bruck_t = intra_steps * (net.intra_alpha + step_b / net.intra_bw)
    bruck_t = bruck_t + (steps - intra_steps) * (net.inter_alpha + step_b / net.inter_bw)
    return [_Option(pair_t, intra_b + inter_b, "pairwise"), _Option(bruck_t, steps * step_b, "bruck")]


def all_to_all(
    cluster: Cluster,
    num_bytes_per_rank: float,
    group: CommGroup,
    algorithm: Literal["pairwise", "bruck", "auto"] = "auto",
) -> CollectiveCost:
    """All-to-all: each rank holds ``num_bytes_per_rank`` split evenly over the p ranks.

    pairwise (Thakur et al. 2005, long messages): one step per peer, (r-1) inside the node and
    (p-r) across; the 1/p chunks to node peers ride NVLink while the rest ride the NIC at the
    same time (NCCL posts all peers in one group), so the bandwidth term is the slower link's.
    bruck (Thakur et al. 2005, short messages): ceil(log2 p) steps of n/2 bytes each; the
    log2(r) steps to partners at distance < r stay inside the node."""
    _check_bytes("num_bytes_per_rank", num_bytes_per_rank)
    _check_algorithm(algorithm, ("pairwise", "bruck", "auto"))
    if group.size == 1 or num_bytes_per_rank == 0:
        return FREE
    return _pick(_all_to_all_options(num_bytes_per_rank, group, _net(cluster, group)), algorithm)


def broadcast(
    cluster: Cluster, num_bytes: float, group: CommGroup, algorithm: Literal["ring", "tree", "auto"] = "auto"
) -> CollectiveCost:
    """Broadcast of ``num_bytes`` from one rank to the group.

    ring: NCCL's pipelined chain through all p ranks, (p-m) hops inside nodes and (m-1) across;
    time = hops x alpha + n / slowest link (every link carries n once).
    tree: binomial tree, ceil(log2 p) rounds of alpha + n/B (Thakur et al. 2005); the root sends
    n every round."""
    _check_bytes("num_bytes", num_bytes)
    _check_algorithm(algorithm, ("ring", "tree", "auto"))
    if group.size == 1 or num_bytes == 0:
        return FREE
    net = _net(cluster, group)
    n, p, r, m = num_bytes, group.size, group.ranks_per_node, group.num_nodes
    if r == 1:
        slowest = net.inter_bw
    else:
        slowest = net.intra_bw if m == 1 else min(net.intra_bw, net.inter_bw)
    chain = _Option((p - m) * net.intra_alpha + (m - 1) * net.inter_alpha + n / slowest, n, "ring")
    inter_rounds = math.ceil(math.log2(m))
    intra_rounds = math.ceil(math.log2(r))
    tree_t = inter_rounds * (net.inter_alpha + n / net.inter_bw) + intra_rounds * (net.intra_alpha + n / net.intra_bw)
    tree = _Option(tree_t, (inter_rounds + intra_rounds) * n, "tree")
    return _pick([chain, tree], algorithm)


def _p2p_bandwidth(cluster: Cluster, same_node: bool) -> tuple[float, float]:
    """(latency, bandwidth) of one send between two ranks (p2p's docstring)."""
    acc, prof = cluster.accelerator, cluster.profile
    if same_node:
        return prof.intra_node_latency_s, acc.intra_node_group_bandwidth_bytes_per_s(2) * prof.intra_node_efficiency
    if cluster.num_nodes < 2:
        raise SpecError("same_node", "a cross-node send needs a cluster of at least 2 nodes")
    return prof.inter_node_latency_s, acc.nic_bandwidth_bytes_per_s * prof.inter_node_efficiency


def p2p(cluster: Cluster, num_bytes: float, same_node: bool) -> CollectiveCost:
    """One send/recv of ``num_bytes`` between two ranks: alpha + n / B.

    Inside a node the pair's bandwidth is the scale-up link (one link on a full mesh) x
    intra_node_efficiency (MLE-net p2p copies reach 83-91% of spec, the ring busbw 76-82%)."""
    _check_bytes("num_bytes", num_bytes)
    if num_bytes == 0:
        return FREE
    alpha, bw = _p2p_bandwidth(cluster, same_node)
    return CollectiveCost(alpha + num_bytes / bw, num_bytes, "p2p")


CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
_OPTIONS: dict[str, Callable[[np.ndarray, CommGroup, _Net], list[_Option]]] = {
    "all_reduce": _all_reduce_options, "all_gather": _gather_options, "reduce_scatter": _gather_options,
    "all_to_all": _all_to_all_options,
}


def costs_each(kind: CollectiveKind, cluster: Cluster, num_bytes: np.ndarray, group: CommGroup) -> CollectiveCosts:
    """``kind``'s :class:`CollectiveCost` (algorithm ``auto``) at each of ``num_bytes`` (the size
    argument of the scalar function: per rank, gathered output, input buffer) in one pass."""
    n = np.asarray(num_bytes, np.float64)
    _check_bytes("num_bytes", n)
    if group.size == 1:
        return CollectiveCosts(np.zeros(n.shape), np.zeros(n.shape))
    got = _pick_each(_OPTIONS[kind](n, group, _net(cluster, group)))
    free = n == 0
    return CollectiveCosts(np.where(free, 0.0, got.time_s), np.where(free, 0.0, got.bytes_sent_per_rank))


def p2p_each(cluster: Cluster, num_bytes: np.ndarray, same_node: bool) -> CollectiveCosts:
    """:func:`p2p` at each of ``num_bytes``."""
    n = np.asarray(num_bytes, np.float64)
    _check_bytes("num_bytes", n)
    if not n.any():
        return CollectiveCosts(np.zeros(n.shape), np.zeros(n.shape))
    alpha, bw = _p2p_bandwidth(cluster, same_node)
    free = n == 0
    return CollectiveCosts(np.where(free, 0.0, alpha + n / bw), n)


def group_for(cluster: Cluster, size: int, stride: int = 1) -> CommGroup:
    """The group of ``size`` ranks ``stride`` apart, ranks numbered node by node (tp innermost).

    E.g. on 8-GPU nodes a TP group of 8 is group_for(c, 8) (one node), the DP group of a tp=8
    layout is group_for(c, dp, stride=8) (one rank per node), and a tp=2 layout's DP group of 8
    is group_for(c, 8, stride=2): 4 ranks on each of 2 nodes. ranks_per_node is the most members
    any node holds."""
    if size < 1:
        raise SpecError("size", f"must be >= 1, got {size}")
    if stride < 1:
        raise SpecError("stride", f"must be >= 1, got {stride}")
    last = (size - 1) * stride
    if last >= cluster.num_gpus:
        raise SpecError(
            "size",
            f"{size} ranks {stride} apart need {last + 1} GPUs; the cluster has {cluster.num_gpus}",
        )
    per_node: dict[int, int] = {}
    for k in range(size):
        node = (k * stride) // cluster.gpus_per_node
        per_node[node] = per_node.get(node, 0) + 1
    return CommGroup(size=size, ranks_per_node=max(per_node.values()))

"""Alpha-beta collectives: closed forms, topology, invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.cost.collectives import (
    CommGroup,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    costs_each,
    group_for,
    p2p,
    p2p_each,
    reduce_scatter,
)
from rlperf.errors import SpecError
from rlperf.specs.hardware_catalog import make_cluster

# no NVLS: ring is the single-node all-reduce. One NCCL protocol (the plain alpha-beta model whose
# closed forms these tests check); the LL/Simple choice is checked in test_train_kernels.py.
_A100 = make_cluster("a100", num_nodes=4)
A100 = _A100.model_copy(update={"profile": _A100.profile.model_copy(update={"collective_simple_latency_s": None})})
H200 = make_cluster("h200", num_nodes=16)


def _intra(c):  # achieved per-GPU scale-up bandwidth, one direction
    return c.accelerator.intra_node_bandwidth_bytes_per_s * c.profile.intra_node_efficiency


@pytest.mark.parametrize("p", [2, 4, 8])
def test_ring_all_reduce_closed_form_single_node(p: int) -> None:
    n = 3e9
    cost = all_reduce(A100, n, CommGroup(p, p), algorithm="ring")
    assert cost.bytes_sent_per_rank == pytest.approx(2 * (p - 1) / p * n)
    alpha = A100.profile.intra_node_latency_s
    assert cost.time_s == pytest.approx(alpha * 2 * (p - 1) + cost.bytes_sent_per_rank / _intra(A100))


def test_ring_busbw_reproduces_the_profile_measurement() -> None:
    # 8x H200 ring at 16 GiB: measured busbw 367.61 GB/s (MLE-net) -> profile -> same busbw back
    n = 16 * 2**30
    t = all_reduce(H200, n, group_for(H200, 8), algorithm="ring").time_s
    assert n * 1.75 / t / 1e9 == pytest.approx(367.61, rel=0.01)


@pytest.mark.parametrize("p", [2, 8])
def test_all_gather_and_reduce_scatter_bytes(p: int) -> None:
    n = 1e9
    g = CommGroup(p, p)
    ag, rs = all_gather(A100, n, g), reduce_scatter(A100, n, g)
    assert ag.bytes_sent_per_rank == pytest.approx((p - 1) / p * n)
    assert rs.bytes_sent_per_rank == pytest.approx((p - 1) / p * n)
    alpha = A100.profile.intra_node_latency_s
    assert ag.time_s == pytest.approx(alpha * (p - 1) + (p - 1) / p * n / _intra(A100))
    assert rs.time_s == pytest.approx(ag.time_s)
    # all-reduce = reduce-scatter + all-gather on a ring
    assert all_reduce(A100, n, g, algorithm="ring").time_s == pytest.approx(2 * ag.time_s)


def test_size_one_is_free() -> None:
    g = CommGroup(1, 1)
    for cost in (all_reduce(H200, 1e9, g), all_gather(H200, 1e9, g), reduce_scatter(H200, 1e9, g),
                 all_to_all(H200, 1e9, g), broadcast(H200, 1e9, g)):
        assert cost.time_s == 0 and cost.bytes_sent_per_rank == 0


def test_inter_node_slower_than_intra_node() -> None:
    n = 1e9
    intra = all_reduce(H200, n, group_for(H200, 8))  # one node
    inter = all_reduce(H200, n, group_for(H200, 8, stride=8))  # one rank on each of 8 nodes
    assert inter.time_s > intra.time_s
    assert p2p(H200, n, same_node=False).time_s > p2p(H200, n, same_node=True).time_s
    assert all_to_all(H200, n, group_for(H200, 8, stride=8)).time_s > all_to_all(H200, n, group_for(H200, 8)).time_s


def test_hierarchical_all_reduce_is_bounded_by_the_nic() -> None:
    # 4 nodes x 8 B200, 16 GiB: measured busbw 381.8 GB/s (MLE-net), from which the profile's
    # inter-node efficiency was read under this very model -> the model gives it back
    b200 = make_cluster("b200", num_nodes=4)
    n = 16 * 2**30
    t = all_reduce(b200, n, group_for(b200, 32), algorithm="ring").time_s
    assert n * 2 * 31 / 32 / t / 1e9 == pytest.approx(381.8, rel=0.01)


def test_tree_wins_small_messages_across_many_nodes_ring_wins_large_inside_a_node() -> None:
    dp = group_for(H200, 16, stride=8)  # 16 nodes, one rank each
    assert all_reduce(H200, 1e3, dp).algorithm == "tree"
    assert all_reduce(A100, 1e9, group_for(A100, 8)).algorithm == "ring"
    assert all_reduce(H200, 1e9, group_for(H200, 8)).algorithm == "nvls"  # NVSwitch + SHARP
    assert all_reduce(H200, 1e9, group_for(H200, 2)).algorithm == "ring"  # NVLS algbw < ring at p=2
    with pytest.raises(SpecError, match="algorithm"):
        all_reduce(A100, 1e9, group_for(A100, 8), algorithm="nvls")


def test_full_mesh_pairs_get_one_link() -> None:
    mi = make_cluster("mi300x", num_gpus=8)
    n = 4 * 2**30
    two = all_reduce(mi, n, CommGroup(2, 2))
    eight = all_reduce(mi, n, CommGroup(8, 8))
    busbw_two = n * 1.0 / two.time_s  # 2(p-1)/p = 1 for p = 2
    assert busbw_two == pytest.approx(64e9 * mi.profile.intra_node_efficiency, rel=0.01)
    assert n * 1.75 / eight.time_s > 4 * busbw_two


def test_group_for_fills_nodes_first() -> None:
    assert group_for(H200, 8) == CommGroup(8, 8)
    assert group_for(H200, 16) == CommGroup(16, 8)
    assert group_for(H200, 8, stride=2) == CommGroup(8, 4)
    assert group_for(H200, 16, stride=8) == CommGroup(16, 1)
    assert group_for(H200, 4, stride=16) == CommGroup(4, 1)
    assert group_for(make_cluster("h200", num_gpus=4), 4) == CommGroup(4, 4)
    with pytest.raises(SpecError, match="size"):
        group_for(H200, 17, stride=8)


def test_bad_inputs_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="num_bytes"):
        all_reduce(H200, -1, CommGroup(8, 8))
    with pytest.raises(SpecError, match="ranks_per_node"):
        CommGroup(4, 8)
    assert all_reduce(make_cluster("gb200", num_gpus=72), 1e6, CommGroup(72, 72)).time_s > 0  # NVL72 node
    with pytest.raises(SpecError, match="ranks_per_node"):
        all_reduce(make_cluster("h100", num_nodes=2), 1e6, CommGroup(16, 16))
    with pytest.raises(SpecError, match="same_node"):
        p2p(make_cluster("h100", num_gpus=8), 1e6, same_node=False)


def test_broadcast_and_all_to_all_shapes() -> None:
    g = group_for(H200, 64)
    big = broadcast(H200, 1e9, g)
    assert big.algorithm == "ring"  # pipelined chain: n / slowest link
    nic = H200.accelerator.nic_bandwidth_bytes_per_s * H200.profile.inter_node_efficiency
    assert big.time_s == pytest.approx(1e9 / nic, rel=0.01)
    assert broadcast(H200, 1e3, g).algorithm == "tree"
    assert all_to_all(H200, 1e4, g).algorithm == "bruck"
    a2a = all_to_all(H200, 1e9, g, algorithm="pairwise")
    assert a2a.bytes_sent_per_rank == pytest.approx(63 / 64 * 1e9)


GROUPS = st.sampled_from([(8, 1), (8, 8), (16, 8), (32, 4), (64, 8), (128, 1), (2, 2)])
SIZES = st.floats(min_value=0, max_value=1e11, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(GROUPS, SIZES, SIZES, st.sampled_from(["ar", "ag", "rs", "a2a", "bc"]))
def test_time_is_monotone_finite_nonnegative(group: tuple[int, int], a: float, b: float, kind: str) -> None:
    g = CommGroup(*group)
    f = {"ar": all_reduce, "ag": all_gather, "rs": reduce_scatter, "a2a": all_to_all, "bc": broadcast}[kind]
    lo, hi = sorted((a, b))
    t_lo, t_hi = f(H200, lo, g).time_s, f(H200, hi, g).time_s
    assert math.isfinite(t_lo) and math.isfinite(t_hi)
    assert 0 <= t_lo <= t_hi * (1 + 1e-12)


@pytest.mark.parametrize("cluster", [A100, H200], ids=["a100-one-protocol", "h200-ll-simple"])
@pytest.mark.parametrize("group", [(2, 2), (8, 8), (16, 8), (32, 2), (64, 1)])
def test_costs_each_equals_the_scalar_functions_exactly(cluster, group: tuple[int, int]) -> None:
    """The array path (the training stage model costs every micro-batch size at once) gives the
    scalar functions' figures bit for bit, across the LL/Simple and ring/tree switch points."""
    size, per_node = group
    if size > cluster.num_gpus:
        pytest.skip("group larger than the cluster")
    g = CommGroup(size, per_node)
    sizes = np.concatenate(([0.0, 1.0, 8.0], np.geomspace(10.0, 4e10, 200)))
    for kind, fn in (("all_reduce", all_reduce), ("all_gather", all_gather), ("reduce_scatter", reduce_scatter),
                     ("all_to_all", all_to_all)):
        got = costs_each(kind, cluster, sizes, g)
        want = [fn(cluster, float(n), g) for n in sizes]
        assert got.time_s.tolist() == [c.time_s for c in want], kind
        assert got.bytes_sent_per_rank.tolist() == [c.bytes_sent_per_rank for c in want], kind
    for same in (True, False):
        sends = p2p_each(cluster, sizes, same)
        assert sends.time_s.tolist() == [p2p(cluster, float(n), same).time_s for n in sizes]
    with pytest.raises(SpecError, match="num_bytes"):
        costs_each("all_reduce", cluster, np.array([1.0, -1.0]), g)

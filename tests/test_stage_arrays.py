"""The array paths of the training-side stage models against their one-at-a-time definitions:
first-fit-decreasing and the dp balance against plain reference loops, pass costs of many
micro-batches against each alone, per-rank pipeline times against each rank alone."""

from __future__ import annotations

import heapq

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.catalog import load_model
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.microbatch import MicroBatches, balance_over_ranks, by_token_budget, microbatches_for
from rlperf.stages.pass_cost import LayoutCosts, MicroBatchShapes
from rlperf.stages.pipeline import pipeline_time, pipeline_times

lengths = st.lists(st.integers(1, 5000), min_size=1, max_size=300).map(lambda xs: np.array(xs, dtype=np.int64))


def first_fit_decreasing(seqs: np.ndarray, budget: int) -> list[list[int]]:
    """The definition: longest first, each to the lowest-numbered bin with room."""
    bins: list[list[int]] = []
    room: list[int] = []
    for t in sorted(seqs.tolist(), reverse=True):
        for i, free in enumerate(room):
            if t <= free:
                bins[i].append(t)
                room[i] -= t
                break
        else:
            bins.append([t])
            room.append(max(budget - t, 0))
    return bins


def balance(seqs: np.ndarray, ranks: int) -> list[list[int]]:
    """The definition: longest first, each to the least-loaded rank with room (lowest index)."""
    n = len(seqs)
    cap = [n // ranks + (1 if r < n % ranks else 0) for r in range(ranks)]
    heap = [(0, r) for r in range(ranks) if cap[r]]
    parts: list[list[int]] = [[] for _ in range(ranks)]
    for t in sorted(seqs.tolist(), reverse=True):
        load, r = heapq.heappop(heap)
        parts[r].append(t)
        if len(parts[r]) < cap[r]:
            heapq.heappush(heap, (load + t, r))
    return parts


@settings(max_examples=200, deadline=None)
@given(lengths, st.integers(1, 12000))
def test_first_fit_decreasing_matches_the_definition(seqs: np.ndarray, budget: int) -> None:
    assert [b.tolist() for b in by_token_budget(seqs, budget)] == first_fit_decreasing(seqs, budget)


@settings(max_examples=200, deadline=None)
@given(lengths, st.integers(1, 40))
def test_balance_matches_the_definition(seqs: np.ndarray, ranks: int) -> None:
    assert [p.tolist() for p in balance_over_ranks(seqs, ranks)] == balance(seqs, ranks)


@settings(max_examples=100, deadline=None)
@given(lengths, st.integers(1, 9), st.sampled_from([None, 3000, 9000]))
def test_flat_microbatches_are_the_nested_ones(seqs: np.ndarray, dp: int, budget: int | None) -> None:
    plan = microbatches_for(seqs, TrainLayout(dp=dp, max_tokens_per_microbatch=budget, micro_batch_size=3))
    nested = [[mb.tolist() for mb in rank] for rank in plan.ranks]
    again = MicroBatches.of(nested)
    assert [[mb.tolist() for mb in rank] for rank in again.ranks] == nested
    assert plan.rank_tokens().tolist() == [sum(sum(mb) for mb in rank) for rank in nested]
    assert plan.max_microbatch_tokens() == max(sum(mb) for rank in nested for mb in rank)


SMALL = load_model("Qwen3-0.6B")
MOE = load_model("Qwen3-30B-A3B")
NODE = make_cluster("H100", num_gpus=8)
LAYOUTS = [
    (SMALL, TrainLayout(dp=2, tp=2, pp=2, zero_stage=3, max_tokens_per_microbatch=4096)),
    (SMALL, TrainLayout(dp=2, cp=4, zero_stage=1, micro_batch_size=2, recompute="selective")),
    (SMALL, TrainLayout(dp=4, cp=2, cp_kind="ulysses", zero_stage=0, micro_batch_size=3, overlap_grad_comm=False)),
    (MOE, TrainLayout(dp=4, tp=2, ep=4, zero_stage=3, max_tokens_per_microbatch=8192, recompute="none")),
]


def test_pass_costs_of_many_microbatches_are_each_alone() -> None:
    seqs = np.random.default_rng(5).integers(1, 6000, 80)
    for model, lay in LAYOUTS:
        costs = LayoutCosts(model, NODE, lay)
        plan = microbatches_for(seqs, lay)
        many = MicroBatchShapes.of(plan)
        assert many.tokens.size == plan.sizes.size
        for shard in costs.shards:
            fwd = costs.forward(shard, many)
            bwd = costs.backward(shard, many, fwd)
            gather = costs.weight_gather(shard, bwd.compute_s)
            for k, rank_mbs in enumerate(mb for rank in plan.ranks for mb in rank):
                one = MicroBatchShapes.single(rank_mbs)
                f1 = costs.forward(shard, one)
                b1 = costs.backward(shard, one, f1)
                assert (f1.time_s[0], f1.flops[0], f1.comm_bytes[0]) == (fwd.time_s[k], fwd.flops[k], fwd.comm_bytes[k])
                assert (b1.time_s[0], b1.hbm_bytes[0], b1.cp_s[0]) == (bwd.time_s[k], bwd.hbm_bytes[k], bwd.cp_s[k])
                assert costs.weight_gather(shard, b1.compute_s).exposed_s[0] == gather.exposed_s[k]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=6), st.integers(1, 4), st.integers(0, 10**6))
def test_pipeline_times_are_each_rank_alone(per_rank: list[int], p: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    rank_of = np.repeat(np.arange(len(per_rank)), per_rank)
    t = rng.uniform(0.1, 2.0, (p, rank_of.size))
    ranks = pipeline_times(t, rank_of, len(per_rank))
    for r in range(len(per_rank)):
        one = pipeline_time(t[:, rank_of == r])
        assert (one.busy_s, one.bubble_s) == (ranks.busy_s[r], ranks.bubble_s[r])
        if per_rank[r]:
            assert one.busiest_stage == ranks.busiest_stage[r]


@settings(max_examples=100, deadline=None)
@given(lengths, st.integers(1, 9), st.sampled_from([None, 1, 3000, 9000]), st.integers(1, 5))
def test_microbatches_are_the_balance_then_the_cut(seqs: np.ndarray, dp: int, budget: int | None, size: int) -> None:
    """The compiled packing (rlperf.stages.packing_kernel) against the definitions: the balance
    over dp ranks, then each rank's share cut by first fit or in chunks of ``size`` in verl's
    order (sorted, even positions rising then odd ones falling)."""
    plan = microbatches_for(seqs, TrainLayout(dp=dp, max_tokens_per_microbatch=budget, micro_batch_size=size))
    parts = balance(seqs, dp)

    def verl_order(p: list[int]) -> list[int]:
        rising = sorted(p)
        return rising[::2] + rising[1::2][::-1]

    want = [first_fit_decreasing(np.array(p, np.int64), budget) if budget
            else [verl_order(p)[i : i + size] for i in range(0, len(p), size)] for p in parts]
    assert [[mb.tolist() for mb in rank] for rank in plan.ranks] == want

"""Micro-batching and the forward-only pass (reference / old-policy log-probs, critic values)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from rlperf.catalog import load_model
from rlperf.errors import SpecError
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.forward import forward_pass
from rlperf.stages.pass_cost import MicroBatchShapes
from rlperf.stages.shard import stage_shards
from rlperf.stages.microbatch import (
    as_lengths,
    balance_over_ranks,
    by_count,
    by_token_budget,
    microbatches_for,
    split_minibatches,
)

lengths = st.lists(st.integers(1, 5000), min_size=1, max_size=200).map(
    lambda xs: np.array(xs, dtype=np.int64)
)

# ---------------------------------------------------------------------- micro-batching


@given(lengths, st.integers(1, 8192))
def test_token_budget_never_exceeded_unless_one_long_sequence(seqs: np.ndarray, budget: int) -> None:
    bins = by_token_budget(seqs, budget)
    assert sorted(np.concatenate(bins).tolist()) == sorted(seqs.tolist())
    for b in bins:
        assert b.sum() <= budget or b.size == 1


@given(lengths, st.integers(1, 8192))
def test_first_fit_decreasing_leaves_at_most_one_bin_half_empty(seqs: np.ndarray, budget: int) -> None:
    # Any first-fit packing: two bins at most half full would have been merged.
    bins = by_token_budget(seqs, budget)
    assert sum(1 for b in bins if 2 * b.sum() <= budget) <= 1


@given(lengths, st.integers(1, 8192))
def test_first_fit_decreasing_is_the_plain_first_fit(seqs: np.ndarray, budget: int) -> None:
    # The packer finds the first bin with room through two heaps keyed by one int each; the
    # plain definition scans the bins in order.
    bins: list[list[int]] = []
    for t in sorted(seqs.tolist(), reverse=True):
        home = next((b for b in bins if budget - sum(b) >= t), None)
        if home is None:
            bins.append([t])
        else:
            home.append(t)
    assert [b.tolist() for b in by_token_budget(seqs, budget)] == bins


@given(lengths, st.integers(1, 16))
def test_balance_is_the_plain_longest_first_greedy(seqs: np.ndarray, ranks: int) -> None:
    # Each sequence, longest first, to the least-loaded rank with room (ties: lowest index).
    n = seqs.size
    cap = [n // ranks + (1 if r < n % ranks else 0) for r in range(ranks)]
    parts: list[list[int]] = [[] for _ in range(ranks)]
    for t in sorted(seqs.tolist(), reverse=True):
        r = min((r for r in range(ranks) if len(parts[r]) < cap[r]), key=lambda r: (sum(parts[r]), r))
        parts[r].append(t)
    assert [p.tolist() for p in balance_over_ranks(seqs, ranks)] == parts


@given(lengths, st.integers(1, 16))
def test_balance_equal_counts_and_all_sequences_kept(seqs: np.ndarray, ranks: int) -> None:
    parts = balance_over_ranks(seqs, ranks)
    assert len(parts) == ranks
    counts = [p.size for p in parts]
    assert max(counts) - min(counts) <= 1
    assert sorted(np.concatenate(parts).tolist()) == sorted(seqs.tolist())


@given(lengths, st.integers(2, 8))
def test_balance_is_no_worse_than_round_robin(seqs: np.ndarray, ranks: int) -> None:
    parts = balance_over_ranks(seqs, ranks)
    naive = [seqs[r::ranks] for r in range(ranks)]
    assert max(int(p.sum()) for p in parts) <= max(int(p.sum()) for p in naive) + int(seqs.max())


def test_count_microbatches_and_cp_budget() -> None:
    seqs = np.array([100, 200, 300, 400, 500])
    assert [b.tolist() for b in by_count(seqs, 2)] == [[100, 200], [300, 400], [500]]
    # The budget is per device: with cp=2 a micro-batch may hold twice the budget.
    mb = microbatches_for(seqs, TrainLayout(cp=2, max_tokens_per_microbatch=300))
    assert all(b.sum() <= 600 for b in mb.ranks[0])
    assert mb.num_ranks == 1 and mb.rank_tokens().tolist() == [1500]


def test_bad_inputs_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="seq_tokens"):
        as_lengths(np.array([3, 0]))
    with pytest.raises(SpecError, match="seq_tokens"):
        as_lengths(np.zeros((2, 2)))
    with pytest.raises(SpecError, match="num_minibatches"):
        split_minibatches(np.array([1, 2]), 3)


@settings(max_examples=50)
@given(lengths, st.integers(1, 8), st.integers(1, 8))
def test_microbatches_cover_the_minibatch(seqs: np.ndarray, dp: int, mbs: int) -> None:
    mb = microbatches_for(seqs, TrainLayout(dp=dp, micro_batch_size=mbs))
    assert mb.rank_tokens().sum() == seqs.sum()
    assert all(b.size <= mbs for r in mb.ranks for b in r)


# ---------------------------------------------------------------------- forward-only pass

SMALL = load_model("Qwen3-0.6B")  # 28 layers, 16 heads, 8 KV heads
DENSE = load_model("Qwen2.5-7B")
NODE = make_cluster("h100_sxm", num_gpus=8)


def test_flops_match_the_model() -> None:
    seqs = np.array([300, 1200, 4000, 77, 2500])
    cost = forward_pass(SMALL, NODE, TrainLayout(dp=2, micro_batch_size=2, zero_stage=0), seqs)
    expected = sum(SMALL.forward_flops(int(s)) for s in seqs)
    assert expected <= cost.flops <= expected * 1.01  # + the log-softmax's elementwise FLOPs
    values = forward_pass(SMALL, NODE, TrainLayout(dp=2, micro_batch_size=2, zero_stage=0), seqs, head="value")
    assert values.flops < cost.flops and values.time_s < cost.time_s


def test_one_sequence_per_rank_without_communication_takes_its_depth() -> None:
    cost = forward_pass(DENSE, NODE, TrainLayout(dp=8, zero_stage=0), np.full(8, 4096))
    assert cost.time_s == pytest.approx(cost.depth_s, rel=1e-12)
    assert cost.breakdown == (("compute", cost.time_s),)


def test_the_straggler_rank_sets_the_time() -> None:
    lay = TrainLayout(dp=4, zero_stage=0, max_tokens_per_microbatch=32768)
    short = forward_pass(DENSE, NODE, lay, np.full(16, 1000))
    skewed = forward_pass(DENSE, NODE, lay, np.array([30000] + [1000] * 15))
    alone = forward_pass(DENSE, NODE, TrainLayout(zero_stage=0), np.array([30000]))
    assert skewed.time_s >= alone.time_s > short.time_s


def test_forward_pipeline_fill_and_drain() -> None:
    p, m = 4, 6
    # every GEMM at the large-GEMM rate: the value head's d x 1 GEMM would otherwise sit at the
    # size curve's shortest-kernel floor and make the last stage a little slower than the others
    flat = NODE.model_copy(update={"profile": NODE.profile.model_copy(update={"matmul_half_rate_flops": 0.0})})
    cost = forward_pass(SMALL, flat, TrainLayout(pp=p, zero_stage=0, micro_batch_size=1), np.full(m, 4096),
                        head="value")
    pipe = sum(cost.component(k) for k in ("compute", "pp_comm", "bubble"))
    assert cost.component("bubble") / pipe == pytest.approx((p - 1) / (m + p - 1), rel=2e-3)


def test_zero3_gathers_the_weights_once_per_microbatch() -> None:
    n, m = 8, 3
    lay = TrainLayout(dp=n, zero_stage=3, micro_batch_size=1)
    cost = forward_pass(SMALL, NODE, lay, np.full(n * m, 1024))
    assert cost.comm_bytes / n == pytest.approx(m * (n - 1) / n * SMALL.num_params * 2, rel=1e-9)
    assert 0 < cost.component("zero_gather") < cost.component("compute")


def test_tensor_and_context_parallel_communication() -> None:
    seqs = np.full(4, 32768)
    tp = forward_pass(DENSE, NODE, TrainLayout(tp=4, dp=2, zero_stage=0), seqs)
    assert tp.component("tp_comm") > 0
    ring = forward_pass(DENSE, NODE, TrainLayout(cp=4, dp=2, zero_stage=0), seqs)
    ulysses = forward_pass(DENSE, NODE, TrainLayout(cp=4, dp=2, zero_stage=0, cp_kind="ulysses"), seqs)
    # 32k-token sequences: each ring step's attention hides the K/V send.
    assert ring.component("cp_comm") == 0
    assert ulysses.component("cp_comm") > 0
    assert ring.comm_bytes > 0


def test_memory_overflow_names_the_stage() -> None:
    with pytest.raises(SpecError, match="ref_logprob"):
        forward_pass(DENSE, NODE, TrainLayout(zero_stage=0, micro_batch_size=64), np.full(64, 32768))


def test_layout_larger_than_cluster_is_an_error() -> None:
    with pytest.raises(SpecError, match="layout"):
        forward_pass(SMALL, NODE, TrainLayout(dp=16), np.full(16, 100))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4, 7]),
    st.sampled_from([1, 2]), st.sampled_from(["ring", "ulysses"]), st.sampled_from([0, 3]),
    st.booleans(), st.sampled_from([None, 1024, 8192]), st.integers(1, 4),
    st.lists(st.integers(16, 8000), min_size=1, max_size=24),
)
def test_time_is_at_least_the_work_depth_bound(
    dp: int, tp: int, pp: int, cp: int, cp_kind: str, zero: int, sp: bool, budget: int | None, mbs: int,
    seqs: list[int],
) -> None:
    try:
        lay = TrainLayout(dp=dp, tp=tp, pp=pp, cp=cp, cp_kind=cp_kind, zero_stage=zero, sequence_parallel=sp,
                          max_tokens_per_microbatch=budget, micro_batch_size=mbs)
        gpus = lay.world_size
        cluster = make_cluster("h100_sxm", num_gpus=gpus if gpus <= 8 else -(-gpus // 8) * 8)
        cost = forward_pass(SMALL, cluster, lay, np.array(seqs))
    except SpecError:
        assume(False)
        return
    assert cost.time_s >= cost.lower_bound_s() * (1 - 1e-9)
    assert cost.time_s == pytest.approx(sum(v for _, v in cost.breakdown), rel=1e-9)


@pytest.mark.parametrize("name", ["Qwen3-0.6B", "Qwen2.5-7B", "Qwen3-30B-A3B"])
@pytest.mark.parametrize("pp", [1, 2, 4])
def test_stage_shards_add_up_to_the_model(name: str, pp: int) -> None:
    model = load_model(name)
    shards = stage_shards(model, tp=1, pp=pp, ep=1)
    assert sum(s.matmul_params_per_token for s in shards) == pytest.approx(model.matmul_params_per_token, rel=1e-12)
    assert sum(s.num_layers for s in shards) == model.num_layers
    if pp == 1:
        assert shards[0].params == model.num_params
    halves = stage_shards(model, tp=2, pp=pp, ep=1)
    ratio = sum(s.matmul_params_per_token for s in halves) / model.matmul_params_per_token
    assert 0.5 <= ratio < 0.52  # the MoE router and the norms stay whole on every tp rank


@pytest.mark.parametrize("name", ["Qwen3-0.6B", "Qwen2.5-7B", "Qwen3-30B-A3B", "DeepSeek-V3"])
@pytest.mark.parametrize(("tp", "pp", "ep"), [(1, 1, 1), (2, 2, 1), (4, 1, 8)])
def test_gemm_shapes_add_up_to_the_matmul_weights_per_token(name: str, tp: int, pp: int, ep: int) -> None:
    """Each stage's GEMM list (weight x rows per token x count) is its matmul weights per token."""
    model = load_model(name)
    for head in ("logprobs", "value"):
        for sh in stage_shards(model, tp, pp, ep if model.moe else 1, head):
            total = sum(w * r * c for w, r, c in zip(sh.gemm_weights, sh.gemm_rows_per_token, sh.gemm_counts, strict=True))
            assert total == pytest.approx(sh.matmul_params_per_token, rel=1e-12)
            assert all(c >= 1 for c in sh.gemm_counts) and all(r > 0 for r in sh.gemm_rows_per_token)


def test_forward_passes_are_the_training_forward_uncapped() -> None:
    """No end-to-end MFU caps a forward pass's GEMMs: its compute is the training step's
    forward kernel for kernel, whatever forward_mfu_cap / train_mfu_cap say."""
    from rlperf.stages.pass_cost import LayoutCosts

    seqs = np.full(8, 4096)
    lay = TrainLayout(dp=8, zero_stage=0)
    prof = NODE.profile
    low = NODE.model_copy(update={"profile": prof.model_copy(update={"forward_mfu_cap": 0.05, "train_mfu_cap": 0.05})})
    a, b = forward_pass(SMALL, NODE, lay, seqs), forward_pass(SMALL, low, lay, seqs)
    assert a.time_s == b.time_s
    costs = LayoutCosts(SMALL, NODE, lay)
    one = costs.forward(costs.shards[0], MicroBatchShapes.single(np.array([4096])))
    assert a.component("compute") == pytest.approx(float(one.compute_s[0]), rel=1e-12)  # one sequence per rank


def test_without_packing_each_sequence_computes_its_microbatchs_longest() -> None:
    """packing=False (HF eager batches): a micro-batch of sequences L_i costs as len x max L_i
    tokens and len x L(L+1)/2 causal pairs; with one sequence per micro-batch nothing changes."""
    seqs = np.array([1000, 900, 400, 100, 800, 50])
    packed = TrainLayout(zero_stage=0, micro_batch_size=3)
    padded = packed.model_copy(update={"packing": False})
    plan = microbatches_for(seqs, packed)
    longest = [max(mb) for mb in plan.ranks[0]]
    assert plan.microbatch_tokens(padded=True).tolist() == [len(mb) * m for mb, m in zip(plan.ranks[0], longest, strict=True)]
    shapes = MicroBatchShapes.of(plan, padded=True)
    assert shapes.pairs.tolist() == [len(mb) * m * (m + 1) / 2 for mb, m in zip(plan.ranks[0], longest, strict=True)]
    a, b = forward_pass(SMALL, NODE, packed, seqs), forward_pass(SMALL, NODE, padded, seqs)
    assert b.flops > a.flops and b.time_s > a.time_s
    one = packed.model_copy(update={"micro_batch_size": 1})
    assert forward_pass(SMALL, NODE, one, seqs).time_s == forward_pass(
        SMALL, NODE, one.model_copy(update={"packing": False}), seqs).time_s

"""Micro-batching and the forward-only pass (reference / old-policy log-probs, critic values)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.errors import SpecError
from rlperf.specs.parallel import TrainLayout
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

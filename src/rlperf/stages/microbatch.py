"""Micro-batching: sequences of a mini-batch spread over data-parallel ranks, then cut into
micro-batches, by count or by a token budget.

Two steps, as in verl (``trainer.balance_batch`` and ``use_dynamic_bsz``):

1. **Balance over dp ranks.** Each rank gets the same number of sequences (``equal_size``) and
   about the same number of tokens: longest-processing-time-first greedy, each sequence to the
   least-loaded rank that still has room (a close stand-in for the Karmarkar-Karp partition
   verl's ``get_seqlen_balanced_partitions`` computes). Context parallelism does not change the
   assignment: each sequence is then split over the cp ranks of its group.
2. **Cut each rank's share into micro-batches.** By count, ``micro_batch_size`` sequences each
   (in the balanced order); or by a token budget (dynamic batch size / sequence packing): bins
   of at most ``max_tokens_per_microbatch`` tokens per device filled first-fit-decreasing.
   The budget is per device, as verl's ``*_max_token_len_per_gpu``: a micro-batch of the cp
   group holds up to ``budget x cp`` tokens, ``budget`` on each device. A sequence longer than
   the budget gets a micro-batch of its own.

The straggler (the most loaded rank) sets a step's time; :func:`MicroBatches.ranks` keeps
every rank so a caller can take the max of any cost function over them.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rlperf.errors import SpecError
from rlperf.specs.parallel import TrainLayout


@dataclass(frozen=True)
class MicroBatches:
    """One mini-batch as it runs: ``ranks[r][j]`` is the token lengths of micro-batch ``j`` on
    data-parallel rank ``r`` (whole sequences, before the cp split)."""

    ranks: tuple[tuple[np.ndarray, ...], ...]

    @property
    def num_ranks(self) -> int:
        return len(self.ranks)

    def rank_tokens(self) -> np.ndarray:
        """Tokens per dp rank."""
        return np.array([sum(int(mb.sum()) for mb in r) for r in self.ranks], dtype=np.int64)

    def max_microbatches(self) -> int:
        return max(len(r) for r in self.ranks)

    def max_microbatch_tokens(self) -> int:
        """Tokens of the largest micro-batch on any rank (what sizes the activation memory)."""
        return max(int(mb.sum()) for r in self.ranks for mb in r)

    def longest_sequence(self) -> int:
        return max(int(mb.max()) for r in self.ranks for mb in r)


def as_lengths(seq_tokens: np.ndarray | Sequence[int], field: str = "seq_tokens") -> np.ndarray:
    """Validate a batch of per-sequence token counts (prompt + response) at the edge."""
    arr = np.asarray(seq_tokens)
    if arr.ndim != 1 or arr.size == 0:
        raise SpecError(field, f"need a non-empty 1-D array of token counts, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.any(arr != np.floor(arr)) or np.any(arr < 1):
        raise SpecError(field, "token counts must be positive integers")
    return arr.astype(np.int64)


def balance_over_ranks(seq_tokens: np.ndarray, num_ranks: int) -> tuple[np.ndarray, ...]:
    """Split sequences over ``num_ranks`` ranks: equal counts (within one), balanced tokens.

    Longest first, each to the least-loaded rank with room; a rank's sequences come out longest
    first. Ranks left without a sequence (fewer sequences than ranks) get an empty array."""
    assert num_ranks >= 1
    n = seq_tokens.size
    cap = [n // num_ranks + (1 if r < n % num_ranks else 0) for r in range(num_ranks)]
    heap = [(0, r) for r in range(num_ranks) if cap[r] > 0]
    heapq.heapify(heap)
    parts: list[list[int]] = [[] for _ in range(num_ranks)]
    for length in np.sort(seq_tokens)[::-1]:
        load, r = heapq.heappop(heap)
        parts[r].append(int(length))
        if len(parts[r]) < cap[r]:
            heapq.heappush(heap, (load + int(length), r))
    return tuple(np.array(p, dtype=np.int64) for p in parts)


def by_count(seq_tokens: np.ndarray, micro_batch_size: int) -> tuple[np.ndarray, ...]:
    """Consecutive chunks of ``micro_batch_size`` sequences (the last may be shorter)."""
    assert micro_batch_size >= 1
    n = seq_tokens.size
    return tuple(seq_tokens[i : i + micro_batch_size] for i in range(0, n, micro_batch_size))


def by_token_budget(seq_tokens: np.ndarray, max_tokens: int) -> tuple[np.ndarray, ...]:
    """First-fit-decreasing bins of at most ``max_tokens`` tokens; a longer sequence alone."""
    assert max_tokens >= 1
    bins: list[list[int]] = []
    room: list[int] = []
    for length in np.sort(seq_tokens)[::-1]:
        t = int(length)
        for i, free in enumerate(room):
            if t <= free:
                bins[i].append(t)
                room[i] -= t
                break
        else:
            bins.append([t])
            room.append(max(max_tokens - t, 0))
    return tuple(np.array(b, dtype=np.int64) for b in bins)


def microbatches_for(seq_tokens: np.ndarray, layout: TrainLayout) -> MicroBatches:
    """One mini-batch under ``layout``: balanced over its dp ranks, cut by count or by budget."""
    parts = balance_over_ranks(seq_tokens, layout.dp)
    budget = layout.max_tokens_per_microbatch
    ranks = []
    for part in parts:
        if budget is None:
            ranks.append(by_count(part, layout.micro_batch_size))
        else:
            ranks.append(by_token_budget(part, budget * layout.cp))
    return MicroBatches(tuple(ranks))


def split_minibatches(seq_tokens: np.ndarray, num_minibatches: int) -> tuple[np.ndarray, ...]:
    """The batch cut into ``num_minibatches`` consecutive mini-batches (optimizer steps)."""
    if num_minibatches < 1 or num_minibatches > seq_tokens.size:
        raise SpecError(
            "num_minibatches", f"{num_minibatches} for {seq_tokens.size} sequences",
            f"1..{seq_tokens.size}",
        )
    return tuple(np.array_split(seq_tokens, num_minibatches))

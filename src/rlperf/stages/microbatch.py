"""Micro-batching: sequences of a mini-batch spread over data-parallel ranks, then cut into
micro-batches, by count or by a token budget.

Two steps, as in verl (``trainer.balance_batch`` and ``use_dynamic_bsz``):

1. **Balance over dp ranks.** Each rank gets the same number of sequences (``equal_size``) and
   about the same number of tokens: longest-processing-time-first greedy, each sequence to the
   least-loaded rank that still has room (a close stand-in for the Karmarkar-Karp partition
   verl's ``get_seqlen_balanced_partitions`` computes). Context parallelism does not change the
   assignment: each sequence is then split over the cp ranks of its group.
2. **Cut each rank's share into micro-batches.** By count, ``micro_batch_size`` consecutive
   sequences in verl's order within a rank: sorted by length, then the even positions rising
   and the odd ones falling (``partition[::2] + partition[1::2][::-1]``, "smaller micro-batches
   at both ends", ``RayPPOTrainer._balance_batch`` since verl #3605, v0.6), so the longest
   sequences share the middle micro-batches with every other one of the longer half, not one
   micro-batch of the longest ``micro_batch_size``. (verl before #3605 kept a rank's sequences
   in batch order, unrelated to length: micro-batches of about the mean length.) Or by a token
   budget (dynamic batch size / sequence packing): bins
   of at most ``max_tokens_per_microbatch`` tokens per device filled first-fit-decreasing.
   The budget is per device, as verl's ``*_max_token_len_per_gpu``: a micro-batch of the cp
   group holds up to ``budget x cp`` tokens, ``budget`` on each device. A sequence longer than
   the budget gets a micro-batch of its own.

The straggler (the most loaded rank) sets a step's time; :func:`MicroBatches.ranks` keeps
every rank so a caller can take the max of any cost function over them.

Without packing (``TrainLayout.packing = False``: an engine that batches a micro-batch as a
padded ``sequences x longest`` tensor, e.g. Hugging Face eager without remove-padding), every
sequence of a micro-batch computes as many tokens as its longest: ``padded=True`` counts them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, pairwise

import numpy as np

from rlperf.memo import BoundedMemo
from rlperf.errors import SpecError
from rlperf.specs.parallel import TrainLayout


@dataclass(frozen=True)
class MicroBatches:
    """One mini-batch as it runs, stored flat: ``lengths`` holds the token lengths of every
    sequence (whole sequences, before the cp split), micro-batch after micro-batch and rank after
    rank; micro-batch ``k`` is the next ``sizes[k]`` of them and runs on data-parallel rank
    ``rank_of[k]`` (non-decreasing). Flat arrays let the stage models cost all micro-batches at
    once; :attr:`ranks` gives the nested view."""

    lengths: np.ndarray
    sizes: np.ndarray
    rank_of: np.ndarray
    num_ranks: int

    @classmethod
    def of(cls, ranks: Sequence[Sequence[Sequence[int]]]) -> MicroBatches:
        """From ``ranks[r][j]``: the lengths of micro-batch ``j`` on rank ``r``."""
        flat = list(chain.from_iterable(ranks))
        lengths = np.fromiter(chain.from_iterable(flat), np.int64)
        sizes = np.fromiter(map(len, flat), np.int64, len(flat))
        rank_of = np.repeat(np.arange(len(ranks), dtype=np.int64), [len(rank) for rank in ranks])
        return cls(lengths, sizes, rank_of, len(ranks))

    @cached_property
    def starts(self) -> np.ndarray:
        """Index in ``lengths`` of each micro-batch's first sequence."""
        starts: np.ndarray = np.cumsum(self.sizes) - self.sizes
        return starts

    @cached_property
    def ranks(self) -> tuple[tuple[np.ndarray, ...], ...]:
        """``ranks[r][j]``: the token lengths of micro-batch ``j`` on data-parallel rank ``r``."""
        mbs = np.split(self.lengths, np.cumsum(self.sizes)[:-1]) if self.sizes.size else []
        first = np.searchsorted(self.rank_of, np.arange(self.num_ranks + 1))
        return tuple(tuple(mbs[first[r] : first[r + 1]]) for r in range(self.num_ranks))

    def microbatch_tokens(self, padded: bool = False) -> np.ndarray:
        """Tokens of each micro-batch; ``padded``: each sequence counted at the micro-batch's
        longest (``sizes x longest``)."""
        if not self.sizes.size:
            return np.zeros(0, np.int64)
        if padded:
            longest: np.ndarray = self.sizes * self.microbatch_longest()
            return longest
        return np.add.reduceat(self.lengths, self.starts)

    def microbatch_longest(self) -> np.ndarray:
        """The longest sequence of each micro-batch."""
        return np.maximum.reduceat(self.lengths, self.starts) if self.sizes.size else np.zeros(0, np.int64)

    def rank_tokens(self) -> np.ndarray:
        """Tokens per dp rank."""
        return np.bincount(self.rank_of, self.microbatch_tokens(), self.num_ranks).astype(np.int64)

    def max_microbatches(self) -> int:
        return int(np.bincount(self.rank_of, minlength=self.num_ranks).max())

    def max_microbatch_tokens(self, padded: bool = False) -> int:
        """Tokens of the largest micro-batch on any rank (what sizes the activation memory)."""
        return int(self.microbatch_tokens(padded).max())

    def longest_sequence(self) -> int:
        return int(self.lengths.max())


def as_lengths(seq_tokens: np.ndarray | Sequence[int], field: str = "seq_tokens") -> np.ndarray:
    """Validate a batch of per-sequence token counts (prompt + response) at the edge."""
    arr = np.asarray(seq_tokens)
    if arr.ndim != 1 or arr.size == 0:
        raise SpecError(field, f"need a non-empty 1-D array of token counts, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or np.any(arr < 1) or (
            not np.issubdtype(arr.dtype, np.integer) and np.any(arr != np.floor(arr))):  # integers are whole
        raise SpecError(field, "token counts must be positive integers")
    return arr.astype(np.int64)


def balance_over_ranks(seq_tokens: np.ndarray, num_ranks: int) -> tuple[np.ndarray, ...]:
    """Split sequences over ``num_ranks`` ranks: equal counts (within one), balanced tokens.

    Longest first, each to the least-loaded rank with room; a rank's sequences come out longest
    first. Ranks left without a sequence (fewer sequences than ranks) get an empty array."""
    values, starts = _balance(seq_tokens, num_ranks)
    return tuple(np.split(values, starts[1:-1]))


def _balance(seq_tokens: np.ndarray, num_ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`balance_over_ranks` flat: (the lengths rank after rank, each rank's start)."""
    from rlperf.stages import packing_kernel

    assert num_ranks >= 1
    desc = np.ascontiguousarray(np.sort(np.asarray(seq_tokens, np.int64))[::-1])
    return packing_kernel.balance(desc, num_ranks)


def by_count(seq_tokens: np.ndarray, micro_batch_size: int) -> tuple[np.ndarray, ...]:
    """Consecutive chunks of ``micro_batch_size`` sequences (the last may be shorter)."""
    assert micro_batch_size >= 1
    n = seq_tokens.size
    return tuple(seq_tokens[i : i + micro_batch_size] for i in range(0, n, micro_batch_size))


def by_token_budget(seq_tokens: np.ndarray, max_tokens: int) -> tuple[np.ndarray, ...]:
    """First-fit-decreasing bins of at most ``max_tokens`` tokens: longest first, each sequence
    to the lowest-numbered bin with room for it, else to a new bin (a sequence longer than the
    budget alone)."""
    from rlperf.stages import packing_kernel

    assert max_tokens >= 1
    desc = np.ascontiguousarray(np.sort(np.asarray(seq_tokens, np.int64))[::-1])
    out, sizes, _ = packing_kernel.first_fit(desc, np.array([0, desc.size], np.int64), max_tokens)
    return tuple(np.split(out, np.cumsum(sizes)[:-1]))


# Packing depends only on the lengths, the dp degree and the cut (a token budget per micro-batch
# of the cp group, budget x cp, or a sequence count), and a planner costs the same batch under
# the same cut many times (old log-probs, reference log-probs and the update all pack one batch;
# hundreds of candidate plans share a layout, and layouts that differ elsewhere, or only in how
# budget and cp make up their product, share a cut), so results are memoized: the key is a
# digest of the lengths, the value is immutable (read-only arrays). The balance over the dp
# ranks, the costlier half, is memoized on its own: every cut of one dp degree shares it.
_Cut = tuple[str, int]  # ("tokens", budget x cp) or ("sequences", micro_batch_size)
_PACKED: BoundedMemo[tuple[bytes, int, int, _Cut], MicroBatches] = BoundedMemo(512)
_BALANCED: BoundedMemo[tuple[bytes, int, int], tuple[np.ndarray, np.ndarray]] = BoundedMemo(256)


def microbatches_for(seq_tokens: np.ndarray, layout: TrainLayout) -> MicroBatches:
    """One mini-batch under ``layout``: balanced over its dp ranks, cut by count or by budget."""
    arr = np.ascontiguousarray(seq_tokens, dtype=np.int64)
    cut = _cut_of(layout)
    digest = hashlib.blake2b(arr.tobytes(), digest_size=16).digest()
    key = (digest, arr.size, layout.dp, cut)
    hit = _PACKED.get(key)
    if hit is not None:
        return hit
    mbs = _cut(_balanced(arr, digest, layout.dp), cut)
    for a in (mbs.lengths, mbs.sizes, mbs.rank_of):
        a.flags.writeable = False
    return _PACKED.put(key, mbs)


def _balanced(arr: np.ndarray, digest: bytes, dp: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_balance` of ``arr`` (whose digest is ``digest``) over ``dp`` ranks, memoized (the
    caller only reads it)."""
    key = (digest, arr.size, dp)
    hit = _BALANCED.get(key)
    if hit is not None:
        return hit
    parts = _balance(arr, dp)
    for a in parts:
        a.flags.writeable = False
    return _BALANCED.put(key, parts)


def _cut_of(layout: TrainLayout) -> _Cut:
    budget = layout.max_tokens_per_microbatch
    return ("sequences", layout.micro_batch_size) if budget is None else ("tokens", budget * layout.cp)


def _pack(seq_tokens: np.ndarray, layout: TrainLayout) -> MicroBatches:
    """:func:`microbatches_for` without the memos."""
    return _cut(_balance(seq_tokens, layout.dp), _cut_of(layout))


def _cut(parts: tuple[np.ndarray, np.ndarray], cut: _Cut) -> MicroBatches:
    """The balanced ``parts`` (lengths rank after rank, each rank's start) cut into
    micro-batches."""
    from rlperf.stages import packing_kernel

    values, starts = parts
    num_ranks = starts.size - 1
    kind, size = cut
    if kind == "sequences":  # consecutive chunks of ``size`` per rank, the last one shorter
        values = np.concatenate([ends_small(values[a:b][::-1]) for a, b in pairwise(starts.tolist())])
        count = np.diff(starts)
        full, rest = count // size, count % size
        per_rank = full + (rest > 0)
        rank_of = np.repeat(np.arange(num_ranks, dtype=np.int64), per_rank)
        sizes = np.full(rank_of.size, size, np.int64)
        last = np.cumsum(per_rank)[rest > 0] - 1
        sizes[last] = rest[rest > 0]
        return MicroBatches(values, sizes, rank_of, num_ranks)
    # A rank's part is already longest first, the order first-fit-decreasing takes it in.
    out, sizes, rank_of = packing_kernel.first_fit(values, starts, size)
    return MicroBatches(out, sizes, rank_of, num_ranks)


def ends_small(rising: np.ndarray) -> np.ndarray:
    """A rank's sequences (sorted shortest first) in verl's order: the even positions of the
    sorted list rising, then the odd ones falling (small micro-batches at both ends, the
    longest in the middle). The cost model's cut and the reference runtime both call it."""
    return np.concatenate([rising[::2], rising[1::2][::-1]])


def split_minibatches(seq_tokens: np.ndarray, num_minibatches: int) -> tuple[np.ndarray, ...]:
    """The batch cut into ``num_minibatches`` consecutive mini-batches (optimizer steps)."""
    if num_minibatches < 1 or num_minibatches > seq_tokens.size:
        raise SpecError(
            "num_minibatches", f"{num_minibatches} for {seq_tokens.size} sequences",
            f"1..{seq_tokens.size}",
        )
    return tuple(np.array_split(seq_tokens, num_minibatches))

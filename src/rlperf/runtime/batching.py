"""Mini- and micro-batches of the reference runtime, as *indices* into the step's responses.

The same rules as the cost model (:mod:`rlperf.stages.microbatch`) on one data-parallel rank:
mini-batches are consecutive slices of the batch (``np.array_split``); a mini-batch's sequences
are cut into micro-batches of ``micro_batch_size`` sequences in verl's order (sorted by length,
the even positions rising then the odd ones falling), or taken longest first and packed
first-fit-decreasing into bins of at most ``max_tokens_per_microbatch`` tokens. Both orders keep
the padding of a micro-batch small (HF eager pads to the longest sequence).
"""

from __future__ import annotations

import numpy as np

from rlperf.errors import SpecError
from rlperf.specs.parallel import TrainLayout
from rlperf.stages.microbatch import ends_small


def minibatch_indices(num_sequences: int, num_minibatches: int) -> list[np.ndarray]:
    if num_minibatches < 1 or num_minibatches > num_sequences:
        raise SpecError("algorithm.minibatches", f"{num_minibatches} for {num_sequences} responses", f"1..{num_sequences}")
    return [np.asarray(p, dtype=np.int64) for p in np.array_split(np.arange(num_sequences), num_minibatches)]


def microbatch_indices(seq_tokens: np.ndarray, index: np.ndarray, layout: TrainLayout) -> list[np.ndarray]:
    """Micro-batches of the sequences ``index`` (lengths ``seq_tokens[index]``) under ``layout``."""
    lengths = seq_tokens[index]
    budget = layout.max_tokens_per_microbatch
    if budget is None:  # verl's order within a rank, as the cost model's cut by count
        ordered = ends_small(index[np.argsort(lengths, kind="stable")])
        size = layout.micro_batch_size
        return [ordered[i : i + size] for i in range(0, ordered.size, size)]
    # stable sort, longest first (ties keep batch order), as balance_over_ranks does for dp = 1
    order = index[np.argsort(-lengths, kind="stable")]
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order.tolist():
        t = int(seq_tokens[i])
        for b, free in enumerate(room):
            if t <= free:
                bins[b].append(i)
                room[b] -= t
                break
        else:
            bins.append([i])
            room.append(max(budget * layout.cp - t, 0))
    return [np.asarray(b, dtype=np.int64) for b in bins]

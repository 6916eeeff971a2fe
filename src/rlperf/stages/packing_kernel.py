"""Micro-batch packing compiled (:mod:`rlperf.stages.microbatch`'s two loops on int64 arrays;
:mod:`rlperf.stages.jit`: at install, or by numba).

* :func:`balance`: longest first, each sequence to the least-loaded rank that still has room
  (ties to the lowest index), ranks keyed in a binary heap by one int, ``load x ranks +
  rank`` (the keys are distinct, so any binary heap pops them in the same order).
* :func:`first_fit`: each rank's sequences (longest first) to the lowest-numbered bin with
  room for them, else to a new bin with ``max(budget - length, 0)`` room. The lowest bin with
  room at least ``t`` is found in a max-tree over the bins' room (O(log bins) per sequence),
  as wide as the most bins a rank can open.

Both return flat arrays (:class:`rlperf.stages.microbatch.MicroBatches`' layout).
tests/test_stage_arrays.py compares them with the definitions, loop by loop.
"""

from __future__ import annotations

import numpy as np

from rlperf.stages.jit import loop


@loop("Tuple((i8[:], i8[:]))(i8[:], i8)")
def balance(desc: np.ndarray, num_ranks: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequences ``desc`` (non-increasing) over ``num_ranks`` ranks, equal counts within one:
    (the lengths rank after rank, each rank's in the order it got them; each rank's start in
    it, ``num_ranks + 1`` entries)."""
    n = desc.shape[0]
    cap = np.empty(num_ranks, np.int64)
    heap = np.empty(num_ranks, np.int64)
    size = 0
    for r in range(num_ranks):
        cap[r] = n // num_ranks + (1 if r < n % num_ranks else 0)
        if cap[r] > 0:  # all loads start at 0: the ranks in order are a heap
            heap[size] = r
            size += 1
    rank_of = np.empty(n, np.int64)
    count = np.zeros(num_ranks, np.int64)
    for k in range(n):
        key = heap[0]
        r = key % num_ranks
        rank_of[k] = r
        count[r] += 1
        if count[r] < cap[r]:
            key += desc[k] * num_ranks  # heapreplace: the top sifts down with its new load
        else:  # heappop: the last entry sifts down from the top
            size -= 1
            key = heap[size]
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= size:
                break
            if child + 1 < size and heap[child + 1] < heap[child]:
                child += 1
            if heap[child] >= key:
                break
            heap[pos] = heap[child]
            pos = child
        if size > 0:
            heap[pos] = key
    starts = np.zeros(num_ranks + 1, np.int64)
    for r in range(num_ranks):
        starts[r + 1] = starts[r] + count[r]
    out = np.empty(n, np.int64)
    fill = starts[:-1].copy()
    for k in range(n):
        r = rank_of[k]
        out[fill[r]] = desc[k]
        fill[r] += 1
    return out, starts


@loop("Tuple((i8[:], i8[:], i8[:]))(i8[:], i8[:], i8)")
def first_fit(values: np.ndarray, starts: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First fit of each rank's lengths ``values[starts[r]:starts[r + 1]]`` (non-increasing)
    into bins of ``budget`` tokens: (the lengths bin after bin, rank after rank, each bin's in
    the order it got them; each bin's size; each bin's rank)."""
    num_ranks = starts.shape[0] - 1
    n = values.shape[0]
    # Leaves for the most bins any rank opens: its sequences, and at most 2 x its tokens / budget
    # + 1 (first fit leaves at most one bin half full or less: a later bin's first item did not
    # fit in the earlier one, so that one was already over half full)
    longest_part = 1
    for r in range(num_ranks):
        total = 0
        for k in range(starts[r], starts[r + 1]):
            total += values[k]
        longest_part = max(longest_part, min(starts[r + 1] - starts[r], 2 * total // budget + 1))
    width = 1
    while width < longest_part:
        width *= 2
    tree = np.empty(2 * width, np.int64)  # max room over each node's bins; -1: no bin
    bin_of = np.empty(n, np.int64)
    out = np.empty(n, np.int64)
    sizes = np.empty(n, np.int64)
    rank_of = np.empty(n, np.int64)
    num_bins = 0
    for r in range(num_ranks):
        tree[:] = -1
        first_bin = num_bins
        for k in range(starts[r], starts[r + 1]):
            t = values[k]
            if tree[1] >= t:  # the lowest-numbered bin with room: descend leftmost
                node = 1
                while node < width:
                    node = 2 * node if tree[2 * node] >= t else 2 * node + 1
                room = tree[node] - t
            else:
                node = width + num_bins - first_bin
                num_bins += 1
                sizes[num_bins - 1] = 0
                rank_of[num_bins - 1] = r
                room = budget - t if budget > t else 0
            b = first_bin + node - width
            bin_of[k] = b
            sizes[b] += 1
            tree[node] = room
            node //= 2
            while node >= 1:
                tree[node] = max(tree[2 * node], tree[2 * node + 1])
                node //= 2
    fill = np.empty(num_bins, np.int64)
    at = 0
    for b in range(num_bins):
        fill[b] = at
        at += sizes[b]
    for k in range(n):
        b = bin_of[k]
        out[fill[b]] = values[k]
        fill[b] += 1
    return out, sizes[:num_bins].copy(), rank_of[:num_bins].copy()

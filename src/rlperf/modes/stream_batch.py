"""Requests a small stream decodes at once, on average over its steady calls.

A stream (verl's fully-async rollouter, :class:`rlperf.modes.execution.Streaming`) keeps
``(1 + τ)·n`` requests in flight (``n`` = B·G): each step's call admits the step's ``n``
requests beside the ``τ·n`` carried over, and stops once ``n`` have finished, which leaves the
``τ·n`` longest to the next call. Where the engines hold every request in flight (no queue),
all of them decode at once, so the call's decode batch shrinks from ``(1 + τ)·n`` to ``τ·n`` as
they finish; the fast estimate's steady call assumed ``(1 + τ)·n`` all along and was ~25% low
per generated token on streams of 8 to 32 responses (tests/test_estimate_accuracy.py).

A fluid model of the calls in decode steps (every request in flight advances one token per
step; no time, so no stage cost) gives the average batch. With ``r`` the tokens each request
in flight still has to decode:

    call k:  r ← r ∪ L                     (the step's n requests; the first call also
                                            admits ⌊τ·n⌉ more, L's first ones over again:
                                            τ·B prompts ahead, rlperf.modes.Mode.prompts_ahead)
             t_k = the n-th smallest of r  (decode steps until n requests have finished)
             d_k = Σ min(r, t_k)            (tokens decoded in the call)
             r ← (r - t_k) over r > t_k     (the carried requests)
    c = Σ d_k / Σ t_k                      over the calls after the warm-up

The warm-up runs until ``2·max L`` decode steps have passed (a response of the cap has then
been admitted and finished at least once); the measure then runs as many decode steps more,
and at least 4 calls. The measured calls also give the most calls a request spans (admitted in
call ``a``, finished in call ``b``: ``b - a + 1``), from which
:meth:`Streaming.expected_staleness` predicts the lag (``s`` more; ``⌈max L / Δ⌉ - 1`` with
this ``Δ`` predicted a 4-GPU question's small streams a version under their simulated lag).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

MIN_MEASURED_CALLS = 4


@dataclass(frozen=True)
class StreamCalls:
    """What a small stream's steady calls look like in decode steps."""

    decode_batch: float  # requests decoding at once, on average (c)
    longest_span_calls: int  # most calls a request spans, from the call admitting it to the one finishing it


def stream_calls(lengths: np.ndarray, ahead: int) -> StreamCalls:
    """The steady calls of a stream whose requests in flight all fit in its engines
    (``lengths``: the step's ``n`` response lengths; ``ahead``: requests the first call admits
    beyond them)."""
    return _calls(np.ascontiguousarray(lengths, dtype=np.int64).tobytes(), int(ahead))


@lru_cache(maxsize=64)
def _calls(lengths_bytes: bytes, ahead: int) -> StreamCalls:
    lengths = np.frombuffer(lengths_bytes, dtype=np.int64)
    n = len(lengths)
    if n == 0:
        return StreamCalls(1.0, 1)
    horizon = 2 * int(lengths.max())
    left = np.concatenate([lengths, np.resize(lengths, ahead)])  # τ > 1: more than one batch ahead
    admitted = np.zeros(len(left), np.int64)  # the call that admitted each request in flight
    passed = measured_steps = decoded = calls = span = 0
    k = 0
    while passed < horizon or measured_steps < horizon or calls < MIN_MEASURED_CALLS:
        t = int(np.partition(left, n - 1)[n - 1])
        done = left <= t
        if passed >= horizon:
            measured_steps += t
            decoded += int(np.minimum(left, t).sum())
            calls += 1
            span = max(span, int(k - admitted[done].min()) + 1)
        passed += t
        left, admitted = left[~done] - t, admitted[~done]
        k += 1
        left = np.concatenate([left, lengths])
        admitted = np.concatenate([admitted, np.full(n, k, np.int64)])
    return StreamCalls(decoded / max(measured_steps, 1), span)

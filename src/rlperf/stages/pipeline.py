"""Pipeline-parallel schedules: makespan of ``m`` micro-batches over ``p`` stages, and its bubble.

Micro-batch ``j`` takes ``t[s, j]`` on stage ``s``. When every stage takes the same
``t_j`` the schedule is a flow shop with job-only processing times, whose makespan is
``sum_j t_j + (p-1) max_j t_j`` exactly: the critical path runs every micro-batch through one
stage and the longest one through the other ``p-1``. With equal ``t`` this is ``(m + p - 1) t``
and the bubble is the fraction ``(p-1)/(m+p-1)`` of it, the figure for GPipe and 1F1B
(Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", §2.2.1; 1F1B changes the memory, not the bubble). Unequal stages (the last one
holds the LM head) generalize this to: the busiest stage's total plus, for every other stage,
its longest micro-batch.

Interleaved 1F1B with ``v`` model chunks per device divides the fill/drain by ``v``:
bubble ``(p-1)/v · t`` on top of ``m t``, i.e. the fraction ``(p-1)/(v m + p - 1)`` (ibid.
§2.2.2), at the price of ``v`` times more point-to-point sends (counted by the caller). A
forward-only pass (reference log-probs, critic values) runs the same fill/drain with ``t_j`` the
forward time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlperf.specs.parallel import PipelineSchedule


@dataclass(frozen=True)
class PipelineTime:
    """Busy time of the bottleneck stage and the idle time the schedule adds to it."""

    busy_s: float  # sum over micro-batches of the busiest stage's time
    bubble_s: float  # fill and drain
    busiest_stage: int = 0

    @property
    def total_s(self) -> float:
        return self.busy_s + self.bubble_s

    @property
    def bubble_fraction(self) -> float:
        return self.bubble_s / self.total_s if self.total_s > 0 else 0.0


def pipeline_time(
    stage_s: np.ndarray,
    schedule: PipelineSchedule = "1f1b",
    virtual_stages: int = 1,
) -> PipelineTime:
    """Makespan of micro-batches with times ``stage_s[s, j]`` (stage ``s``, micro-batch ``j``;
    forward + backward for a training step, forward only for an inference pass).

    Never less than the longest micro-batch's trip through all stages (interleaving cannot
    beat that when there are fewer micro-batches than stages)."""
    t = np.asarray(stage_s, dtype=np.float64)
    assert t.ndim == 2 and t.shape[0] >= 1, t.shape
    ranks = pipeline_times(t, np.zeros(t.shape[1], np.int64), 1, schedule, virtual_stages)
    return PipelineTime(float(ranks.busy_s[0]), float(ranks.bubble_s[0]), int(ranks.busiest_stage[0]))


@dataclass(frozen=True)
class PipelineTimes:
    """:class:`PipelineTime` of each data-parallel rank (arrays indexed by rank)."""

    busy_s: np.ndarray
    bubble_s: np.ndarray
    busiest_stage: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        total: np.ndarray = self.busy_s + self.bubble_s
        return total


def pipeline_times(
    stage_s: np.ndarray,
    rank_of: np.ndarray,
    num_ranks: int,
    schedule: PipelineSchedule = "1f1b",
    virtual_stages: int = 1,
) -> PipelineTimes:
    """:func:`pipeline_time` of every dp rank at once: micro-batch ``j`` (column ``j`` of
    ``stage_s``) runs on rank ``rank_of[j]`` (non-decreasing). A rank without micro-batches
    takes no time."""
    t = stage_s
    assert t.ndim == 2 and t.shape[0] >= 1 and t.shape[1] == rank_of.size, (t.shape, rank_of.shape)
    assert (schedule == "interleaved") == (virtual_stages > 1)
    p, m = t.shape
    if m == 0:
        zero = np.zeros(num_ranks)
        return PipelineTimes(zero, zero, np.zeros(num_ranks, np.int64))
    if p == 1:  # no fill or drain: a rank's sum, never below its longest micro-batch (times >= 0)
        return PipelineTimes(np.bincount(rank_of, t[0], num_ranks), np.zeros(num_ranks), np.zeros(num_ranks, np.int64))
    # per stage and rank: the sum and the max over the rank's micro-batches
    per_stage = np.stack([np.bincount(rank_of, t[s], num_ranks) for s in range(p)])
    busiest = np.argmax(per_stage, axis=0)
    first = np.searchsorted(rank_of, np.arange(num_ranks))
    has = np.bincount(rank_of, minlength=num_ranks) > 0
    longest = np.zeros((p, num_ranks))
    longest[:, has] = np.maximum.reduceat(t, first[has], axis=1)
    trip = np.zeros(num_ranks)
    trip[has] = np.maximum.reduceat(t.sum(axis=0), first[has])
    cols = np.arange(num_ranks)
    busy = per_stage[busiest, cols]
    fill_drain = (longest.sum(axis=0) - longest[busiest, cols]) / virtual_stages
    total = np.maximum(busy + fill_drain, trip)
    return PipelineTimes(busy, total - busy, busiest)

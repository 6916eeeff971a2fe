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
    assert (schedule == "interleaved") == (virtual_stages > 1)
    if t.shape[1] == 0:
        return PipelineTime(0.0, 0.0, 0)
    per_stage = t.sum(axis=1)
    busiest = int(np.argmax(per_stage))
    longest = t.max(axis=1)
    fill_drain = (float(longest.sum()) - float(longest[busiest])) / virtual_stages
    busy = float(per_stage[busiest])
    total = max(busy + fill_drain, float(t.sum(axis=0).max()))
    return PipelineTime(busy, total - busy, busiest)

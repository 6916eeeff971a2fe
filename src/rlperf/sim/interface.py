"""What the simulator asks of the stage cost models (one small protocol, aesthetics.md P6).

The simulator decides *when* and *where* a stage runs; the cost models say *how long* it takes
on a given number of GPUs. Keeping that boundary narrow lets tests drive the simulator with toy
costs and check scheduling invariants exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from rlperf.sim.kernel import Segment
from rlperf.stages.base import StageCost
from rlperf.stages.rollout_requests import Dispatch


@dataclass(frozen=True)
class RolloutBatch:
    """Requests of one rollout call. Arrays are aligned (one entry per request)."""

    prompt_tokens: np.ndarray  # int64
    target_tokens: np.ndarray  # int64: response length the request would reach if unbounded
    generated_tokens: np.ndarray  # int64: tokens already generated in earlier calls (partial rollout)
    group_ids: np.ndarray  # int64: requests of one prompt share a group (prefix sharing, dispatch)

    def __post_init__(self) -> None:
        n = len(self.prompt_tokens)
        assert len(self.target_tokens) == len(self.generated_tokens) == len(self.group_ids) == n
        assert np.all(self.generated_tokens <= self.target_tokens)

    @property
    def num_requests(self) -> int:
        return len(self.prompt_tokens)

    def take(self, index: np.ndarray | slice) -> RolloutBatch:
        """The requests ``index`` selects (a mask, indices or a slice), every array alike."""
        return RolloutBatch(self.prompt_tokens[index], self.target_tokens[index], self.generated_tokens[index],
                            self.group_ids[index])

    @staticmethod
    def concat(batches: Sequence[RolloutBatch]) -> RolloutBatch:
        """The requests of ``batches``, in order (group ids as they are)."""
        return RolloutBatch(*(np.concatenate([getattr(b, f) for b in batches])
                              for f in ("prompt_tokens", "target_tokens", "generated_tokens", "group_ids")))


@dataclass(frozen=True)
class GroupAdmission:
    """A rollouter that streams whole prompt groups (verl fully_async): at most
    ``min(per_engine x replicas, max_total)`` groups in flight, the next one submitted when a
    group has all its responses (rlperf.stages.rollout_groups); the call stops once
    ``stop_after_groups`` groups are complete (None: when every request has finished).
    ``dispatch``: how the submitted requests reach the engines; verl's rollouter sends each
    through its agent loop's server manager, one server per request in turn
    (``round_robin_requests``, rlperf.stages.rollout_requests.RolloutOptions.dispatch)."""

    per_engine: int
    max_total: int | None = None
    stop_after_groups: int | None = None
    dispatch: Dispatch = "round_robin_requests"

    def in_flight(self, replicas: int) -> int:
        """Groups in flight on ``replicas`` engines."""
        m = self.per_engine * replicas
        return m if self.max_total is None else min(m, self.max_total)


@dataclass(frozen=True)
class RolloutOutcome:
    cost: StageCost
    finish_s: np.ndarray  # per request, offset from the call's start (inf if unfinished)
    generated_tokens: np.ndarray  # per request, total generated after this call
    replica_finish_s: np.ndarray  # per replica, offset from start when it went idle
    gpus_per_replica: int
    tail_s: float  # time from 90% of requests finished to the end (Seer's "tail")
    segments: tuple[Segment, ...] = ()


class StageCosts(Protocol):
    """Cost models for one resolved scenario. ``gpus`` is the number of GPUs granted."""

    def rollout(self, batch: RolloutBatch, gpus: int, token_budget: int | None,
                stop_after_finished: int | None = None, groups: GroupAdmission | None = None,
                kv_cached: np.ndarray | None = None) -> RolloutOutcome:
        """One rollout call; ``stop_after_finished``: stop once that many requests finished
        (the rest are returned unfinished with the tokens generated so far); ``groups``: whole
        groups admitted a few at a time, and the call's stop counted in groups; ``kv_cached``
        (bool per request, None: none): carried requests that go on decoding with their KV
        instead of being re-prefilled (no weight update since the previous call)."""
        ...

    def forward(self, role: str, seq_tokens: np.ndarray, gpus: int, name: str) -> StageCost: ...

    def train(self, role: str, seq_tokens: np.ndarray, gpus: int, name: str,
              num_minibatches: int | None = None) -> StageCost:
        """One training pass over ``seq_tokens`` in ``num_minibatches`` optimizer updates per
        epoch (None: the scenario's; a streamed batch's local update makes its share)."""
        ...

    def reward(self, seq_tokens: np.ndarray, gpus: int) -> StageCost: ...

    def weight_sync(self, rollout_gpus: int, train_gpus: int, same_pool: bool) -> StageCost: ...

    def phase_switch(self, gpus: int, to: Literal["rollout", "train"]) -> StageCost: ...

    def min_gpus(self, key: str) -> int: ...

    def engine_memory_bytes(self, gpus: int) -> float: ...

    def device_memory_bytes(self) -> float: ...

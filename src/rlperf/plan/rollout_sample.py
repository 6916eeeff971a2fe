"""The fast estimate's rollout: a few replicas simulated at request level stand for all of them.

A synchronous rollout call (every request at ``t = 0``, no stop) dispatched round-robin by
group runs ``R`` replicas that never interact: replica ``r`` serves the groups of rank
``r, r + R, r + 2R, ...`` and finishes on its own. The call's makespan is the latest replica's
finish, and the latest replica is the one that holds the most work. So the estimate simulates,
exactly as the simulator would:

- the ``CRITICAL`` replicas with the most tokens (prompt + response up to the budget) and the
  ``CRITICAL`` with the longest request: the makespan is the latest of their finishes;
- ``m`` more, evenly spaced in the load order of the rest, each standing for
  ``(R - critical) / m`` replicas: with the critical ones (one each) they give the finish time
  by which 90% of all requests are done, hence the rollout's tail (Seer's tail, as
  :func:`rlperf.stages.rollout_result.tail_after_fraction_s`). ``m`` is ``SPREAD``, or more
  where that would sample fewer than ``SPREAD_REQUESTS`` requests (a quantile of a few dozen
  finish times is noisy), up to all of the rest.

Each sampled replica gets exactly its requests in their order: the sample's groups are laid
out round after round, the replicas with one group more (when ``R`` does not divide the
groups) first, so that round-robin over the sample's ``k`` replicas hands the ``j``-th group to
sample replica ``j mod k``. When the sample would be every replica, the figures are the full
simulation's. The cost of an estimate is then that of at most ``max(8 replicas, about
SPREAD_REQUESTS requests)``, whatever the pool size. Measured against the full simulation on the shipped questions'
rollouts: the latest replica was always the most or second most loaded (makespan exact); the
tail is within docs/benchmarks.md's stated tolerance. Only the estimate (which ranks plans)
uses this; the simulator runs every replica.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from rlperf.sim.interface import RolloutBatch, RolloutOutcome

CRITICAL = 2  # most loaded replicas, by tokens and by longest request
SPREAD = 4  # at least this many replicas stand for the rest (the tail's quantile) ...
SPREAD_REQUESTS = 1024  # ... and with the critical ones at least this many requests


@dataclass(frozen=True)
class ReplicaSample:
    """The requests of ``replicas`` (of ``num_replicas``), laid out for round-robin dispatch over
    ``len(replicas)``: ``batch`` holds the requests ``requests`` of the full batch; ``weight``:
    how many replicas each one's replica stands for."""

    batch: RolloutBatch
    requests: np.ndarray
    replicas: tuple[int, ...]
    num_replicas: int
    weight: np.ndarray

    @classmethod
    def of(cls, batch: RolloutBatch, num_replicas: int, budget: int | None) -> ReplicaSample | None:
        """The sample of ``batch`` on ``num_replicas`` replicas; None when every replica is
        simulated anyway (few replicas)."""
        R = num_replicas
        per_replica = batch.num_requests / max(R, 1)
        spread_n = max(SPREAD, math.ceil(SPREAD_REQUESTS / per_replica) - 2 * CRITICAL)
        if R <= 2 * CRITICAL + spread_n:
            return None
        groups = batch.group_ids
        _, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
        rank_of_group = np.empty(len(first), np.int64)
        rank_of_group[np.argsort(first, kind="stable")] = np.arange(len(first))
        rank = rank_of_group[inverse]  # round-robin rank of each request's group
        replica = rank % R
        target = batch.target_tokens if budget is None else np.minimum(batch.target_tokens, batch.generated_tokens + budget)
        load = np.bincount(replica, batch.prompt_tokens + target, R)
        longest = np.zeros(R, np.int64)
        np.maximum.at(longest, replica, target)
        critical: list[int] = []
        for by_load in (np.argsort(-load, kind="stable"), np.argsort(-longest, kind="stable")):
            critical += [r for r in by_load[:CRITICAL].tolist() if r not in critical]
        rest = [r for r in np.argsort(load, kind="stable").tolist() if r not in critical]
        spread = [rest[int((j + 0.5) * len(rest) / spread_n)] for j in range(spread_n)]
        weight_of = {r: 1.0 for r in critical} | {r: len(rest) / spread_n for r in spread}
        n_groups = len(first)
        count = np.bincount(np.arange(n_groups) % R, minlength=R)  # groups per replica
        chosen = sorted(critical + spread, key=lambda r: (-count[r], r))
        order: list[int] = []  # group ranks, round after round
        for t in range(int(count[chosen[0]])):
            order += [t * R + r for r in chosen if t < count[r]]
        by_rank = np.argsort(rank, kind="stable")  # requests grouped by rank, in index order
        starts = np.searchsorted(rank[by_rank], np.arange(n_groups + 1))
        idx = np.concatenate([by_rank[starts[g]:starts[g + 1]] for g in order])
        sub = replace(batch.take(idx), group_ids=rank[idx])
        weight = np.array([weight_of[int(r)] for r in replica[idx].tolist()])
        return cls(sub, idx, tuple(chosen), R, weight)

    def makespan_and_tail_s(self, outcome: RolloutOutcome, fraction: float = 0.9) -> tuple[float, float]:
        """(makespan, tail) of the whole call from the sample's outcome: the latest sampled
        replica's finish, and the time after ``fraction`` of the requests (weighted by the
        replicas each sampled one stands for) had finished."""
        makespan = float(outcome.cost.time_s)
        finish = outcome.finish_s
        by = np.argsort(finish, kind="stable")
        cum = np.cumsum(self.weight[by])
        k = int(np.searchsorted(cum, fraction * cum[-1] * (1 - 1e-12)))
        done = float(finish[by][min(k, len(by) - 1)])
        if not math.isfinite(done):
            return makespan, 0.0
        return makespan, max(0.0, makespan - done)

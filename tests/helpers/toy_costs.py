"""Toy cost models with closed forms, to test the simulator's scheduling exactly."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlperf.sim.interface import GroupAdmission, RolloutBatch, RolloutOutcome
from rlperf.stages.base import StageCost


def _cost(name: str, t: float, gpus: int) -> StageCost:
    return StageCost(name, t, max(gpus, 1), work_s=t * max(gpus, 1), depth_s=t / 4, peak_memory_bytes=1e9)


@dataclass
class ToyCosts:
    """Rollout: replicas of ``gpus_per_replica`` GPUs; each request runs alone on its replica
    for ``s_per_token`` x tokens (requests dispatched round-robin, served one after another).
    Group admission: only its stop (after k complete groups) is modelled, not the gate."""

    s_per_token: float = 1e-3
    fwd_s_per_token: float = 1e-5
    train_s_per_token: float = 3e-5
    gpus_per_replica: int = 2
    sync_s: float = 0.5
    switch_s: float = 0.25

    def rollout(self, batch: RolloutBatch, gpus: int, token_budget: int | None,
                stop_after_finished: int | None = None, groups: GroupAdmission | None = None,
                kv_cached: np.ndarray | None = None) -> RolloutOutcome:
        replicas = max(1, gpus // self.gpus_per_replica)
        todo = batch.target_tokens - batch.generated_tokens
        if token_budget is not None:
            todo = np.minimum(todo, token_budget)
        finish = np.zeros(batch.num_requests)
        start = np.zeros(batch.num_requests)
        clock = np.zeros(replicas)
        for i in range(batch.num_requests):
            r = i % replicas
            start[i] = clock[r]
            clock[r] += todo[i] * self.s_per_token
            finish[i] = clock[r]
        t_stop = np.inf
        if stop_after_finished is not None and stop_after_finished < batch.num_requests:
            t_stop = float(np.sort(finish)[stop_after_finished - 1])  # the k-th request's finish
        ids, inverse = np.unique(batch.group_ids, return_inverse=True)
        if groups is not None and groups.stop_after_groups is not None and groups.stop_after_groups < len(ids):
            group_done = np.zeros(len(ids))
            np.maximum.at(group_done, inverse.reshape(-1), finish)
            t_stop = float(np.sort(group_done)[groups.stop_after_groups - 1])  # the k-th group's last finish
        if t_stop < np.inf:
            # Stop then: the others keep the tokens made by then.
            made = np.clip(np.floor((t_stop - start) / self.s_per_token + 1e-9), 0, todo).astype(np.int64)
            todo = np.where(finish <= t_stop, todo, made)
            clock = np.minimum(clock, t_stop)
        done = batch.generated_tokens + todo
        finish = np.where(done >= batch.target_tokens, finish, np.inf)
        t = float(clock.max())
        fin = np.sort(finish[np.isfinite(finish)])
        tail = t - float(fin[int(0.9 * (len(fin) - 1))]) if len(fin) else 0.0
        cost = StageCost("generate", t, gpus, work_s=float(todo.sum()) * self.s_per_token * self.gpus_per_replica,
                         depth_s=float(todo.max(initial=0)) * self.s_per_token, peak_memory_bytes=2e9)
        return RolloutOutcome(cost, finish, done, clock.copy(), self.gpus_per_replica, tail)

    def forward(self, role: str, seq_tokens: np.ndarray, gpus: int, name: str) -> StageCost:
        return _cost(name, float(seq_tokens.sum()) * self.fwd_s_per_token / gpus, gpus)

    def train(self, role: str, seq_tokens: np.ndarray, gpus: int, name: str,
              num_minibatches: int | None = None) -> StageCost:
        return _cost(name, float(seq_tokens.sum()) * self.train_s_per_token / gpus, gpus)

    def reward(self, seq_tokens: np.ndarray, gpus: int) -> StageCost:
        return _cost("reward", 0.01 * len(seq_tokens) / 64, gpus)

    def weight_sync(self, rollout_gpus: int, train_gpus: int, same_pool: bool) -> StageCost:
        return _cost("weight_sync", self.sync_s, rollout_gpus)

    def phase_switch(self, gpus: int, to: str) -> StageCost:
        return _cost("phase_switch", self.switch_s, gpus)

    def min_gpus(self, key: str) -> int:
        return self.gpus_per_replica if key == "generate" else 1

    def engine_memory_bytes(self, gpus: int) -> float:
        return 2e9

    def device_memory_bytes(self) -> float:
        return 80e9


def toy_sampler(seed: int = 0, mean: float = 400.0, cap: int = 2000, group_size: int = 4):  # type: ignore[no-untyped-def]
    def sample(step: int, num_prompts: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([seed, step])
        p = rng.integers(50, 200, size=num_prompts)
        r = np.minimum(cap, np.maximum(1, rng.lognormal(np.log(mean), 0.8, size=(num_prompts, group_size)))).astype(np.int64)
        return p, r

    return sample

"""Generation rounds: how many prompts a step generates, in how many rounds, and which share of
the responses training keeps (DAPO dynamic sampling, PRIME oversampling).

- plain: one round of ``B`` prompts, every response kept;
- oversampling (PRIME): one round of ``⌊ρ·B⌉`` prompts, the first ``B·G`` responses kept;
- dynamic sampling (DAPO): rounds of ``⌊m·B⌉`` prompts until enough groups with mixed rewards
  are kept; with a keep rate ``q`` the expected number of rounds is ``⌈1 / (m·q)⌉``, capped at
  ``max_gen_rounds`` (Yu et al. 2025, §3.2; verl's ``gen_batch_size`` / ``max_num_gen_batches``).

Which groups survive depends on rewards the performance model does not know, so the first ones
generated are kept. Filtering keeps a subset of one rollout's completion order, so stage fusion
(waves in completion order) is not applied to filtered rounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlperf.algorithms.spec import AlgorithmSpec


@dataclass(frozen=True)
class GenerationRounds:
    prompts_multiplier: float  # generated prompts per round / prompts per step
    rounds: int  # rollout calls per step
    filters: bool  # training keeps only the first B·G responses
    adaptive: bool  # dynamic sampling: the number of rounds depends on the rewards

    @classmethod
    def of(cls, algorithm: AlgorithmSpec, keep_rate: float) -> GenerationRounds:
        """Formula above, line by line."""
        if algorithm.dynamic_sampling:
            m = algorithm.gen_batch_multiplier
            rounds = min(algorithm.max_gen_rounds, math.ceil(1.0 / (m * keep_rate) - 1e-9))
            return cls(m, rounds, True, True)
        if algorithm.oversample > 1:
            return cls(algorithm.oversample, 1, True, False)
        return cls(1.0, 1, False, False)

    def prompts_per_round(self, prompts_per_step: int) -> int:
        return round(self.prompts_multiplier * prompts_per_step) if self.prompts_multiplier != 1.0 else prompts_per_step

    @property
    def allows_fusion(self) -> bool:
        return not self.filters

    @property
    def allows_partial_rollout(self) -> bool:
        """Dynamic sampling decides the next round from finished groups; carrying unfinished
        requests across steps has no defined meaning there."""
        return not self.adaptive

    @property
    def allows_streaming(self) -> bool:
        """A stream admits a step's fresh requests and stops once ``B·G`` have finished; with
        more generated than trained (filtering) every step admits more than finishes, so the
        requests in flight grow without end (lags of 17-21 versions simulated on small DAPO
        plans) and there is no steady state to plan for."""
        return not self.filters

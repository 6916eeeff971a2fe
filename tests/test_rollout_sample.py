"""The fast estimate's replica sample (rlperf.plan.rollout_sample) against the full rollout."""

from __future__ import annotations

import numpy as np
import pytest

from rlperf.plan.estimate import Estimator
from rlperf.plan.rollout_sample import ReplicaSample
from rlperf.scenario import load_scenario
from rlperf.sim.costs import AnalyticCosts

T90_TOLERANCE = 0.06  # docs/benchmarks.md: 42 rollouts of the shipped questions, at most 5.9%


@pytest.fixture(scope="module")
def setup():  # type: ignore[no-untyped-def]
    sc = load_scenario("grpo-qwen2.5-7b-colocated-sync")
    wl = sc.workload.model_copy(update={"prompts_per_step": 512, "group_size": 4})
    from rlperf.scenario import Scenario

    small = Scenario(sc.spec, sc.models, sc.cluster, wl, sc.algorithm)
    return small, Estimator(small)


@pytest.mark.parametrize("budget", [None, 1024])
@pytest.mark.parametrize("gpus", [48, 64])
def test_sampled_replicas_are_simulated_exactly_and_give_the_makespan(setup, gpus: int, budget: int | None) -> None:  # type: ignore[no-untyped-def]
    sc, est = setup
    costs = AnalyticCosts(sc, timeline=False)
    full = costs.rollout(est.batch, gpus, budget)
    sample = ReplicaSample.of(est.batch, gpus, budget)  # tp 1: one replica per GPU
    assert sample is not None and len(sample.replicas) < gpus
    part = costs.rollout(sample.batch, len(sample.replicas), budget)
    # Each sampled replica runs exactly its requests of the full call: same finish times.
    assert part.finish_s.tolist() == full.finish_s[sample.requests].tolist()
    assert part.replica_finish_s.tolist() == full.replica_finish_s[list(sample.replicas)].tolist()
    makespan, tail = sample.makespan_and_tail_s(part)
    assert makespan == full.cost.time_s  # the latest replica is among the most loaded
    t90, t90_full = makespan - tail, full.cost.time_s - full.tail_s
    assert abs(t90 / t90_full - 1) <= T90_TOLERANCE


def test_few_replicas_or_requests_are_all_simulated(setup) -> None:  # type: ignore[no-untyped-def]
    _, est = setup  # 2,048 requests
    assert ReplicaSample.of(est.batch, 8, None) is None
    s = ReplicaSample.of(est.batch, 64, None)  # 32 requests per replica
    assert s is not None and len(s.replicas) == 32  # 4 critical + enough for 1,024 requests
    # the sample stands for every replica (8 groups each): weights add up to the pool
    assert len(set(s.requests.tolist())) == len(s.requests)
    assert np.isclose(s.weight.sum() / 32, 64)

"""Execution modes: the work-depth bound holds in every mode, staleness stays within its bound,
steady-state results do not depend on the simulated length, and sharing a pool buys nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.algorithms import get_algorithm
from rlperf.modes import mode_of
from rlperf.sim.result import SimResult
from rlperf.sim.simulate import SimConfig, simulate
from rlperf.specs.plan import ExecutionMode, Placement, Plan
from tests.helpers.toy_costs import ToyCosts, toy_sampler


def same_every_step(seed: int = 0, mean: float = 400.0):  # type: ignore[no-untyped-def]
    """Every iteration draws the same lengths: the schedule becomes periodic after warm-up."""
    base = toy_sampler(seed, mean=mean)
    return lambda step, num_prompts: base(step % 1000, num_prompts)


def run(mode: ExecutionMode, placement: Placement | None = None, algo: str = "GRPO", iterations: int = 8,
        warmup: int = 1, sample=None, prompts: int = 8) -> SimResult:  # type: ignore[no-untyped-def]
    plan = Plan(placement=placement or Placement(), mode=mode)
    cfg = SimConfig(name="toy", algorithm=get_algorithm(algo), plan=plan, num_gpus=8, prompts_per_step=prompts,
                    group_size=4, sample=sample or same_every_step(), minibatches=2, iterations=iterations,
                    warmup=warmup, max_response_tokens=2000)
    return simulate(cfg, ToyCosts())


MODES = st.one_of(
    st.just(ExecutionMode()),
    st.just(ExecutionMode(kind="one_step_off")),
    st.builds(lambda s: ExecutionMode(kind="async", staleness=s), st.integers(0, 3)),
    st.builds(lambda b, s: ExecutionMode(kind="partial_rollout", token_budget=b, staleness=s),
              st.sampled_from([100, 400, 1500]), st.integers(0, 1)),
)
PLACEMENTS = st.sampled_from([Placement(), Placement(kind="disaggregated", rollout_gpus=2),
                              Placement(kind="disaggregated", rollout_gpus=4), Placement(kind="disaggregated", rollout_gpus=6)])


@settings(max_examples=30, deadline=None)
@given(mode=MODES, placement=PLACEMENTS, fusion=st.booleans(), algo=st.sampled_from(["GRPO", "PPO", "DAPO", "ReMax", "PRIME"]),
       seed=st.integers(0, 20))
def test_steady_step_never_beats_the_work_depth_bound(mode: ExecutionMode, placement: Placement, fusion: bool, algo: str,
                                                       seed: int) -> None:
    mode = mode.model_copy(update={"fusion": fusion})
    r = run(mode, placement, algo, iterations=10, sample=same_every_step(seed))
    assert r.step_time_s >= r.bounds.lower_bound_s * (1 - 1e-9), (r.step_time_s, r.bounds)
    # Staleness: within the mode's bound, and the distribution counts every trained response.
    d = r.staleness_distribution
    assert max(r.staleness) <= d.bound == max(mode_of(mode).staleness_bound(2000), d.max)
    assert max(r.staleness) <= mode_of(mode).staleness_bound(2000)
    assert d.num_responses == len(r.staleness)


@pytest.mark.parametrize("staleness", [1, 2])
def test_async_step_does_not_depend_on_the_simulated_length(staleness: int) -> None:
    split = Placement(kind="disaggregated", rollout_gpus=4)
    m = ExecutionMode(kind="async", staleness=staleness)
    short, long = run(m, split, iterations=4), run(m, split, iterations=12)
    assert short.step_time_s == pytest.approx(long.step_time_s, rel=1e-6)


def test_colocated_async_is_not_faster_than_sync() -> None:
    # One pool whose engine sleeps during training: waking it loads the newest weights.
    for s in (1, 2, 3):
        a = run(ExecutionMode(kind="async", staleness=s), iterations=6, sample=toy_sampler(1))
        sync = run(ExecutionMode(), iterations=6, sample=toy_sampler(1))
        assert a.tokens_per_step == sync.tokens_per_step
        assert a.step_time_s >= sync.step_time_s * (1 - 1e-9)
        assert set(a.staleness) == {0}


def test_staleness_zero_equals_sync_in_every_mode_family() -> None:
    split = Placement(kind="disaggregated", rollout_gpus=4)
    sync = run(ExecutionMode(), split, sample=toy_sampler(2))
    for m in (ExecutionMode(kind="async", staleness=0), ExecutionMode(kind="partial_rollout", token_budget=10**6)):
        r = run(m, split, sample=toy_sampler(2))
        assert r.step_times_s == sync.step_times_s and set(r.staleness) == {0}


def test_empty_passes_are_valid() -> None:
    # A budget of one token: no response finishes in the first iterations; and more fusion waves
    # than responses. Both simulate (nothing to compute in an empty pass).
    r = run(ExecutionMode(kind="partial_rollout", token_budget=1), Placement(kind="disaggregated", rollout_gpus=4),
            iterations=2, prompts=2)
    assert r.trained_responses_per_step == 0 and np.isfinite(r.step_time_s)
    f = run(ExecutionMode(fusion=True, fusion_chunks=64), algo="PPO", prompts=2, iterations=3)
    assert f.step_time_s > 0


def test_staleness_distribution_summary() -> None:
    r = run(ExecutionMode(kind="partial_rollout", token_budget=300), Placement(kind="disaggregated", rollout_gpus=4),
            iterations=12, sample=toy_sampler(3))
    d = r.staleness_distribution
    assert sum(d.share(k) for k in range(len(d.counts))) == pytest.approx(1.0)
    assert d.max >= 1 and "mean" in d.summary()

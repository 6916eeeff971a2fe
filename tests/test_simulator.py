"""Simulator invariants, driven by toy costs with closed forms (tests/helpers/toy_costs.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.algorithms import get_algorithm
from rlperf.sim.simulate import SimConfig, simulate
from rlperf.specs.plan import ExecutionMode, Placement, Plan
from tests.helpers.toy_costs import ToyCosts, toy_sampler


def cfg(algo: str = "GRPO", placement: Placement | None = None, mode: ExecutionMode | None = None,
        iterations: int = 5, prompts: int = 16, seed: int = 0, minibatches: int = 2) -> SimConfig:
    plan = Plan(placement=placement or Placement(), mode=mode or ExecutionMode())
    return SimConfig(
        name="toy", algorithm=get_algorithm(algo), plan=plan, num_gpus=8, prompts_per_step=prompts,
        group_size=4, sample=toy_sampler(seed), minibatches=minibatches, iterations=iterations, warmup=1,
    )


DISAGG = Placement(kind="disaggregated", rollout_gpus=4)


def test_colocated_sync_step_is_the_sum_of_its_stages() -> None:
    # Everything on the GPUs serializes; the rule-based reward runs on CPUs beside the phase
    # switch (both wait only for the rollout) and is shorter, so it is off the critical path.
    r = simulate(cfg(), ToyCosts())
    on_gpus = sum(s.time_s for s in r.stages if s.pool != "cpu")
    assert r.stage("reward").time_s < r.stage("phase_switch").time_s
    assert r.step_time_s == pytest.approx(on_gpus, rel=1e-9)


def test_disaggregated_sync_step_equals_critical_path() -> None:
    r = simulate(cfg(placement=DISAGG), ToyCosts())
    t = {s.name: s.time_s for s in r.stages}
    # sync -> generate -> {reward on CPUs || old and ref log-probs, serialized on the training
    # pool} -> advantage -> actor update
    path = t["weight_sync"] + t["generate"] + max(t["reward"], t["old_logprob"] + t["ref_logprob"]) + t["actor_update"]
    assert r.step_time_s == pytest.approx(path, rel=1e-9)


def test_async_with_zero_staleness_equals_sync() -> None:
    a = simulate(cfg(placement=DISAGG, mode=ExecutionMode(kind="async", staleness=0)), ToyCosts())
    s = simulate(cfg(placement=DISAGG), ToyCosts())
    assert a.step_times_s == s.step_times_s
    assert set(a.staleness) == {0}


@pytest.mark.parametrize("staleness", [1, 2])
def test_async_is_never_slower_than_sync(staleness: int) -> None:
    a = simulate(cfg(placement=DISAGG, mode=ExecutionMode(kind="async", staleness=staleness), iterations=8), ToyCosts())
    s = simulate(cfg(placement=DISAGG, iterations=8), ToyCosts())
    assert a.tokens_per_s >= s.tokens_per_s * (1 - 1e-9)
    assert max(a.staleness) <= staleness


def test_partial_rollout_with_unlimited_budget_equals_plain_rollout() -> None:
    big = ExecutionMode(kind="partial_rollout", token_budget=2**20)  # above any response: no limit
    a = simulate(cfg(placement=DISAGG, mode=big), ToyCosts())
    s = simulate(cfg(placement=DISAGG), ToyCosts())
    assert a.step_times_s == s.step_times_s


def test_partial_rollout_conserves_tokens() -> None:
    sample = toy_sampler(0)
    iters = 6
    c = cfg(placement=DISAGG, mode=ExecutionMode(kind="partial_rollout", token_budget=300), iterations=iters)
    from rlperf.sim.simulate import Simulator

    sim = Simulator(c, ToyCosts())
    sim.run()
    requested = sum(int(sample(it * 1000, 16)[1].sum()) for it in range(iters))
    generated = sum(st.generated_tokens for st in sim.iters)
    carried = 0 if sim.carry is None else int((sim.carry.target_tokens - sim.carry.generated_tokens).sum())
    assert generated + carried == requested
    # Every finished response is trained exactly once.
    finished = sum(len(st.kept_seq_tokens) for st in sim.iters if st.kept_seq_tokens is not None)
    assert finished + (0 if sim.carry is None else sim.carry.num_requests) == iters * 16 * 4


def test_same_seed_same_result_json() -> None:
    a = simulate(cfg(placement=DISAGG, mode=ExecutionMode(kind="async", staleness=1)), ToyCosts())
    b = simulate(cfg(placement=DISAGG, mode=ExecutionMode(kind="async", staleness=1)), ToyCosts())
    assert json.dumps(a.to_dict(True), default=str) == json.dumps(b.to_dict(True), default=str)


def test_fusion_never_slower_in_colocated_and_disaggregated() -> None:
    for pl in (Placement(), DISAGG):
        f = simulate(cfg("PPO", placement=pl, mode=ExecutionMode(fusion=True)), ToyCosts())
        s = simulate(cfg("PPO", placement=pl), ToyCosts())
        assert f.step_time_s <= s.step_time_s * (1 + 1e-9)


@pytest.mark.parametrize("algo", ["PPO", "GRPO", "Dr.GRPO", "DAPO", "RLOO", "REINFORCE++", "ReMax", "GSPO", "PRIME", "VAPO"])
def test_every_algorithm_simulates(algo: str) -> None:
    r = simulate(cfg(algo, placement=DISAGG, iterations=3), ToyCosts())
    assert r.step_time_s > 0
    for p in r.pools:
        assert 0.0 <= p.utilization <= 1.0
    assert r.bounds.lower_bound_s <= r.step_time_s * (1 + 1e-9)


@settings(max_examples=25, deadline=None)
@given(
    rollout_gpus=st.sampled_from([2, 4, 6]),
    staleness=st.integers(0, 3),
    fusion=st.booleans(),
    seed=st.integers(0, 50),
    colocated=st.booleans(),
)
def test_invariants(rollout_gpus: int, staleness: int, fusion: bool, seed: int, colocated: bool) -> None:
    pl = Placement() if colocated else Placement(kind="disaggregated", rollout_gpus=rollout_gpus)
    r = simulate(cfg(placement=pl, mode=ExecutionMode(kind="async", staleness=staleness, fusion=fusion), seed=seed), ToyCosts())
    for p in r.pools:
        assert 0.0 <= p.utilization <= 1.0
    assert all(0 <= s <= staleness for s in r.staleness)
    assert len(r.staleness) == (r.iterations - r.warmup) * 16 * 4  # every trained response counted once
    assert np.isfinite(r.step_time_s) and r.step_time_s > 0

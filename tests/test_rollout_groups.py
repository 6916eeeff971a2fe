"""Group admission (verl's fully-async rollouter): whole groups submitted, at most M in flight,
the next one when a group has all its responses; stops after k complete groups."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.catalog import load_model
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import EngineLayout
from rlperf.stages.rollout import RolloutOptions, RolloutRequests, RolloutResult, simulate_rollout

QWEN7 = load_model("Qwen2.5-7B")
H100 = make_cluster("H100", num_gpus=8)


def run(response: np.ndarray, group: np.ndarray, replicas: int = 1, **opts: object) -> RolloutResult:
    reqs = RolloutRequests.build(np.full(len(response), 64), response, group)
    layout = EngineLayout(replicas=replicas, max_num_seqs=64)
    options = RolloutOptions(debug_checks=True, **opts)  # type: ignore[arg-type]
    return simulate_rollout(QWEN7, H100, layout, reqs, options, kv_capacity=10_000_000)


def groups(num_groups: int, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(1, 400, num_groups * size), np.repeat(np.arange(num_groups), size)


def test_all_groups_in_flight_is_per_request_admission() -> None:
    resp, grp = groups(12, 4, 0)
    a = run(resp, grp)
    b = run(resp, grp, max_groups_in_flight=12)
    assert np.array_equal(a.finish_time_s, b.finish_time_s)
    assert a.makespan_s == b.makespan_s


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 6), st.integers(0, 10_000), st.integers(1, 2))
def test_at_most_m_groups_and_each_waits_for_a_completion(m: int, seed: int, replicas: int) -> None:
    """Group k >= M starts no earlier than the (k-M+1)-th group completion, tokens are
    conserved, and every request finishes."""
    resp, grp = groups(10, 4, seed)
    res = run(resp, grp, replicas, max_groups_in_flight=m)
    assert np.all(res.finished)
    assert res.num_decode_tokens == int(resp.sum())
    done = np.sort([res.finish_time_s[grp == g].max() for g in range(10)])
    # a request of group k finishes at least its own solo decode after group k's submission
    first_finish = np.array([res.finish_time_s[grp == g].min() for g in range(10)])
    for k in range(m, 10):
        assert first_finish[k] > done[k - m] - 1e-9


def test_fewer_groups_in_flight_never_finish_sooner() -> None:
    """Holding slots for a group's slowest response cannot shorten the call (one replica,
    memory-bound decode: smaller batches)."""
    resp, grp = groups(16, 8, 3)
    spans = [run(resp, grp, max_groups_in_flight=m).makespan_s for m in (16, 8, 4, 2)]
    assert spans == sorted(spans)
    assert spans[-1] > spans[0]


def test_stop_after_groups_returns_whole_groups() -> None:
    resp, grp = groups(10, 4, 7)
    res = run(resp, grp, max_groups_in_flight=4, stop_after_num_groups=3)
    complete = [g for g in range(10) if np.all(res.finished[grp == g])]
    assert len(complete) >= 3
    assert res.stopped_early
    # the stop is the third completion
    assert res.makespan_s == pytest.approx(np.sort([res.finish_time_s[grp == g].max() for g in complete])[2])
    # unfinished requests keep their counts; groups never submitted generated nothing
    assert np.all(res.generated_tokens <= resp)
    assert res.num_decode_tokens == int(res.generated_tokens.sum())


def test_streaming_whole_groups_with_the_analytic_costs() -> None:
    """verl's rollouter on the analytic engine: every step trains at least its batch, the staleness
    distribution counts every trained response, and the step respects its work-depth bound."""
    from rlperf.sim.run import run_scenario
    from rlperf.specs.plan import ExecutionMode, Placement
    from tests.test_scenarios import small

    sc = small("grpo-qwen2.5-7b-async-s2", prompts=16, iterations=4)
    mode = ExecutionMode(kind="streaming", staleness_threshold=0.5, train_parts=2, groups_per_engine=1)
    plan = sc.plan.model_copy(update={"mode": mode, "placement": Placement(kind="disaggregated", rollout_gpus=8)})
    r = run_scenario(sc.with_plan(plan))
    assert r.trained_responses_per_step >= 16 * 16  # at least the batch (whole groups: tests/test_modes.py)
    assert r.staleness_distribution.num_responses == len(r.staleness)
    assert r.step_time_s >= r.bounds.lower_bound_s


def test_round_robin_requests_spreads_each_group_over_the_replicas() -> None:
    """verl's server manager (one server per request, in turn): group g of 8 requests on 4
    replicas puts 2 on each, requests in submission order go to replicas 0, 1, 2, 3, 0, ...;
    by group round-robin the whole group stays on one replica."""
    resp, grp = groups(6, 8, 5)
    spread = run(resp, grp, 4, dispatch="round_robin_requests")
    assert np.array_equal(spread.replica_of, np.arange(48) % 4)
    kept = run(resp, grp, 4)
    for g in range(6):
        assert len(set(kept.replica_of[grp == g])) == 1
        assert np.bincount(spread.replica_of[grp == g], minlength=4).tolist() == [2, 2, 2, 2]
    assert spread.num_decode_tokens == kept.num_decode_tokens == int(resp.sum())


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 6), st.integers(0, 10_000), st.integers(2, 3))
def test_round_robin_requests_under_the_gate(m: int, seed: int, replicas: int) -> None:
    """Gated groups spread request by request: the k-th submitted request goes to replica
    k mod R (the gate submits whole groups, so each group's requests are consecutive), tokens
    are conserved and every request finishes."""
    resp, grp = groups(10, 4, seed)
    res = run(resp, grp, replicas, max_groups_in_flight=m, dispatch="round_robin_requests")
    assert np.all(res.finished)
    assert res.num_decode_tokens == int(resp.sum())
    # a group's requests went to consecutive replicas (mod R)
    for g in range(10):
        r = res.replica_of[grp == g]
        assert np.array_equal((r - r[0]) % replicas, np.arange(4) % replicas)
    assert np.bincount(res.replica_of, minlength=replicas).max() - np.bincount(res.replica_of).min() <= 1

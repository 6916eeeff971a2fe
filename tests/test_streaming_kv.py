"""Requests carried across a streamed call boundary keep their KV unless the weights changed
(verl's fully-async rollouter interrupts and re-prefills only at a weight sync): the engine
resumes them without a prefill, the same in the event loop, the Python and the compiled
run-out, and the simulator asks for it exactly at the boundaries without a sync."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlperf.algorithms import get_algorithm
from rlperf.errors import SpecError
from rlperf.sim.interface import GroupAdmission, RolloutBatch, RolloutOutcome
from rlperf.sim.simulate import SimConfig, Simulator
from rlperf.specs.parallel import EngineLayout
from rlperf.specs.plan import ExecutionMode, Placement, Plan
from rlperf.stages.base import StageCost
from rlperf.stages.rollout import RolloutOptions, RolloutRequests, simulate_rollout
from tests.helpers.toy_costs import ToyCosts, toy_sampler
from tests.test_rollout_kernel import python_run_out
from tests.test_rollout_runout import H100, QWEN7, assert_same

DEBUG = RolloutOptions(debug_checks=True)


def call(prompt: np.ndarray, resp: np.ndarray, already: np.ndarray, cached: np.ndarray | None,
         layout: EngineLayout, opts: RolloutOptions = DEBUG, kv: int | None = 10_000_000):  # type: ignore[no-untyped-def]
    req = RolloutRequests.build(prompt, resp, already_generated=already, kv_cached=cached)
    return simulate_rollout(QWEN7, H100, layout, req, opts, kv_capacity=kv)


def test_a_request_with_its_kv_cached_goes_on_decoding_without_a_prefill() -> None:
    n = 8
    prompt, resp, already = np.full(n, 300), np.full(n, 900), np.full(n, 200)
    layout = EngineLayout(replicas=2)
    cold = call(prompt, resp, already, None, layout)
    warm = call(prompt, resp, already, np.ones(n, bool), layout)
    assert cold.num_prefill_tokens == n * (300 + 200)  # every context re-prefilled
    assert warm.num_prefill_tokens == 0
    for r in (cold, warm):  # tokens conserved: each request grows to its response, once
        assert np.array_equal(r.generated_tokens, resp)
        assert r.num_decode_tokens == int(np.sum(resp - already))
    assert warm.makespan_s < cold.makespan_s
    # Half of them cached: only the others' contexts are prefilled.
    half = np.arange(n) < n // 2
    mixed = call(prompt, resp, already, half, layout)
    assert mixed.num_prefill_tokens == (n // 2) * (300 + 200)
    assert cold.makespan_s > mixed.makespan_s > warm.makespan_s


def test_cached_requests_that_do_not_fit_are_re_prefilled() -> None:
    """Slots or KV short at the start: the requests that do not fit wait and are re-prefilled
    when admitted, as without a cache."""
    n = 6
    prompt, resp, already = np.full(n, 400), np.full(n, 1000), np.full(n, 300)
    few_slots = call(prompt, resp, already, np.ones(n, bool), EngineLayout(max_num_seqs=4))
    assert few_slots.num_prefill_tokens == 2 * (400 + 300)
    small_kv = call(prompt, resp, already, np.ones(n, bool), EngineLayout(), kv=3 * 1400)
    assert 0 < small_kv.num_prefill_tokens
    assert np.array_equal(small_kv.generated_tokens, resp)


def test_kv_cached_needs_generated_tokens() -> None:
    with pytest.raises(SpecError, match="kv_cached"):
        RolloutRequests.build([10, 10], [5, 5], already_generated=[0, 2], kv_cached=[True, True])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 40),
    seed=st.integers(0, 10_000),
    replicas=st.integers(1, 3),
    max_num_seqs=st.integers(1, 32),
    sharing=st.booleans(),
    kv=st.sampled_from([8_000, None]),
    dispatch=st.sampled_from(["round_robin", "least_loaded", "round_robin_requests"]),
    stop=st.booleans(),
)
def test_cached_kv_is_the_same_in_the_event_loop_and_both_run_outs(
    n: int, seed: int, replicas: int, max_num_seqs: int, sharing: bool, kv: int | None, dispatch: str, stop: bool,
) -> None:
    """The resume happens before the replicas are planned, so the compiled run-out, the Python
    run-out and the event-by-event loop agree bit for bit (groups of 4 sharing a prompt; run to
    the end or stopped after half the requests finished)."""
    rng = np.random.default_rng(seed)
    group = np.arange(n) // 4
    prompt = rng.integers(20, 600, group.max() + 1)[group]
    resp = rng.integers(2, 2500, n)
    already = np.minimum(resp - 1, rng.integers(0, 1200, n))
    cached = (already > 0) & (rng.random(n) < 0.7)
    req = RolloutRequests.build(prompt, resp, group, already, kv_cached=cached)
    layout = EngineLayout(replicas=replicas, max_num_seqs=max_num_seqs, max_num_batched_tokens=max(512, max_num_seqs),
                          prefix_sharing=sharing)
    cap = None if kv is None else int(np.max(prompt + resp)) + kv
    want = n // 2 if stop else None
    opts = RolloutOptions(dispatch=dispatch, stop_after_num_finished=want)  # type: ignore[arg-type]
    fast = simulate_rollout(QWEN7, H100, layout, req, opts, cap)
    assert_same(fast, python_run_out(QWEN7, H100, layout, req, opts, cap))
    slow = RolloutOptions(dispatch=dispatch, event_by_event=True, debug_checks=True,  # type: ignore[arg-type]
                          stop_after_num_finished=want)
    assert_same(fast, simulate_rollout(QWEN7, H100, layout, req, slow, cap))
    assert fast.num_decode_tokens == int(np.sum(fast.generated_tokens - already))


@dataclass
class _Recorded:
    batch: RolloutBatch
    kv_cached: np.ndarray | None
    syncs_before: int


@dataclass
class RecordingCosts(ToyCosts):
    """Toy costs that note every rollout call and how many weight syncs came before it."""

    calls: list[_Recorded] = field(default_factory=list)
    syncs: int = 0

    def rollout(self, batch: RolloutBatch, gpus: int, token_budget: int | None,
                stop_after_finished: int | None = None, groups: GroupAdmission | None = None,
                kv_cached: np.ndarray | None = None) -> RolloutOutcome:
        self.calls.append(_Recorded(batch, kv_cached, self.syncs))
        return super().rollout(batch, gpus, token_budget, stop_after_finished, groups, kv_cached)

    def weight_sync(self, rollout_gpus: int, train_gpus: int, same_pool: bool) -> StageCost:
        self.syncs += 1
        return super().weight_sync(rollout_gpus, train_gpus, same_pool)


def record(mode: ExecutionMode, placement: Placement) -> list[_Recorded]:
    plan = Plan(placement=placement, mode=mode)
    cfg = SimConfig(name="toy", algorithm=get_algorithm("GRPO"), plan=plan, num_gpus=8, prompts_per_step=8,
                    group_size=4, sample=toy_sampler(4), minibatches=2, iterations=7, warmup=1,
                    max_response_tokens=2000)
    costs = RecordingCosts()
    Simulator(cfg, costs).run()
    return costs.calls


SPLIT = Placement(kind="disaggregated", rollout_gpus=4)


@pytest.mark.parametrize("groups", [None, 1])
def test_a_boundary_without_a_weight_update_re_prefills_nothing(groups: int | None) -> None:
    """Streaming τ = 0.5: a main call ends when the batch is complete and the next ahead call
    starts with the same weights (no sync between): every carried request that had started
    keeps its KV. After a sync none does (verl's pause() cancels them and clears the cache)."""
    calls = record(ExecutionMode(kind="streaming", staleness_threshold=0.5, train_parts=2, groups_per_engine=groups),
                   SPLIT)
    kept = 0
    for prev, c in pairwise(calls):
        started = c.batch.generated_tokens > 0
        if c.syncs_before > prev.syncs_before or not started.any():
            assert c.kv_cached is None
            continue
        assert c.kv_cached is not None and np.array_equal(c.kv_cached, started)
        kept += 1
    assert kept >= 3  # the boundaries without a sync exist and were all kept


@pytest.mark.parametrize(("mode", "placement", "carried"), [
    # staleness 0 is sync: a weight sync before every call
    (ExecutionMode(kind="streaming", staleness_threshold=0.0, train_parts=2), SPLIT, False),
    # colocated: the engine sleeps while training, its KV freed
    (ExecutionMode(kind="streaming", staleness_threshold=0.5), Placement(), True),
    # a partial rollout returns its unfinished requests to the buffer between calls
    (ExecutionMode(kind="partial_rollout", token_budget=400), SPLIT, True),
])
def test_no_kv_is_kept_where_the_engine_is_interrupted(mode: ExecutionMode, placement: Placement,
                                                       carried: bool) -> None:
    calls = record(mode, placement)
    if carried:  # started requests were carried, so the check below is not vacuous
        assert any((c.batch.generated_tokens > 0).any() for c in calls)
    assert all(c.kv_cached is None for c in calls)

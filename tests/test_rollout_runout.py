"""The rollout's run-out (replicas planned on integers, drained and timed in vectorized passes
once nothing outside can reach them) equals the event-by-event simulation exactly."""

from __future__ import annotations

import dataclasses
from unittest.mock import patch

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlperf.catalog import load_model
from rlperf.stages import rollout_runout as runout
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import EngineLayout
from rlperf.stages.rollout import RolloutOptions, RolloutRequests, RolloutResult, simulate_rollout
from rlperf.stages.rollout_step import Run, Runs, StepModel

QWEN7 = load_model("Qwen2.5-7B")
MOE = load_model("Qwen3-30B-A3B")
H100 = make_cluster("H100", num_gpus=64)


def assert_same(a: RolloutResult, b: RolloutResult) -> None:
    for f in dataclasses.fields(RolloutResult):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert np.array_equal(x, y), f.name
        else:
            assert x == y, f.name


def groups_of(longest: int, size: int, num_groups: int) -> st.SearchStrategy[list[tuple[int, list[int]]]]:
    """Groups as (prompt, responses)."""
    return st.lists(st.tuples(st.integers(1, longest), st.lists(st.integers(1, longest), min_size=1, max_size=size)),
                    min_size=1, max_size=num_groups)


def requests_of(groups: list[tuple[int, list[int]]], kv: int | None) -> tuple[RolloutRequests, int | None]:
    """The requests of ``groups`` and a KV capacity of ``kv`` tokens, raised to hold the longest
    alone (small caches preempt); None: the memory model's."""
    prompt = [p for p, rs in groups for _ in rs]
    response = [r for _, rs in groups for r in rs]
    group = [g for g, (_, rs) in enumerate(groups) for _ in rs]
    cap = None if kv is None else max(kv, max(p + r for p, r in zip(prompt, response)))
    return RolloutRequests.build(prompt, response, group), cap


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=groups_of(3000, 6, 40),
    replicas=st.integers(1, 4),
    tp_pp=st.sampled_from([(1, 1), (2, 1), (2, 2)]),
    max_num_seqs=st.integers(1, 64),
    budget=st.sampled_from([256, 2048, 8192]),
    sharing=st.booleans(),
    kv=st.sampled_from([12_000, 40_000, None]),
    token_budget=st.sampled_from([None, 500]),
    moe=st.booleans(),
    debug=st.booleans(),
)
def test_run_out_equals_event_by_event(
    groups: list[tuple[int, list[int]]], replicas: int, tp_pp: tuple[int, int], max_num_seqs: int,
    budget: int, sharing: bool, kv: int | None, token_budget: int | None, moe: bool, debug: bool,
) -> None:
    """``debug``: the invariants checked at every event (the engine's loop then keeps its
    state on the replica throughout)."""
    req, cap = requests_of(groups, kv)
    layout = EngineLayout(
        tp=tp_pp[0], pp=tp_pp[1], replicas=replicas, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs), prefix_sharing=sharing,
    )
    model = MOE if moe else QWEN7
    opts = RolloutOptions(token_budget_per_request=token_budget, debug_checks=debug)
    fast = simulate_rollout(model, H100, layout, req, opts, cap)
    slow = simulate_rollout(model, H100, layout, req, opts.model_copy(update={"event_by_event": True}), cap)
    assert_same(fast, slow)


def test_run_out_after_staggered_arrivals() -> None:
    """Requests arriving over time: event by event until the last arrives, then the run-out."""
    rng = np.random.default_rng(3)
    n = 300
    req = RolloutRequests.build(
        rng.integers(10, 2000, n), rng.integers(1, 4000, n), arrival_s=np.sort(rng.uniform(0, 20, n))
    )
    for dispatch in ("round_robin", "least_loaded", "round_robin_requests"):
        opts = RolloutOptions(dispatch=dispatch)
        fast = simulate_rollout(QWEN7, H100, EngineLayout(replicas=3, max_num_seqs=32), req, opts, 200_000)
        slow = simulate_rollout(QWEN7, H100, EngineLayout(replicas=3, max_num_seqs=32), req,
                                opts.model_copy(update={"event_by_event": True}), 200_000)
        assert_same(fast, slow)
        for stop in ({"time_limit_s": 25.0}, {"stop_after_num_finished": 150}):  # after the last arrival
            stopped = opts.model_copy(update=stop)
            fast = simulate_rollout(QWEN7, H100, EngineLayout(replicas=3, max_num_seqs=32), req, stopped, 200_000)
            slow = simulate_rollout(QWEN7, H100, EngineLayout(replicas=3, max_num_seqs=32), req,
                                    stopped.model_copy(update={"event_by_event": True}), 200_000)
            assert fast.stopped_early
            assert_same(fast, slow)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=groups_of(2000, 4, 30),
    replicas=st.integers(1, 4),
    max_num_seqs=st.integers(1, 32),
    kv=st.sampled_from([8_000, 30_000, None]),
    token_budget=st.sampled_from([None, 300]),
    stop=st.one_of(st.tuples(st.just("time_limit_s"), st.floats(0.01, 60.0)),
                   st.tuples(st.just("stop_after_num_finished"), st.integers(1, 120))),
    batch=st.sampled_from([1, 3, 1024]),
)
def test_run_out_to_a_stop_equals_event_by_event(
    groups: list[tuple[int, list[int]]], replicas: int, max_num_seqs: int, kv: int | None,
    token_budget: int | None, stop: tuple[str, float], batch: int,
) -> None:
    """A time limit or a finished-count stop: the run-out in batches of ``batch`` runs per
    replica (set back to the stop) leaves every figure as the event-by-event loop does."""
    req, cap = requests_of(groups, kv)
    layout = EngineLayout(replicas=replicas, max_num_seqs=max_num_seqs, max_num_batched_tokens=2048)
    opts = RolloutOptions(token_budget_per_request=token_budget, **{stop[0]: stop[1]})
    with patch.object(runout, "STOP_BATCH_RUNS", batch):
        fast = simulate_rollout(QWEN7, H100, layout, req, opts, cap)
    slow = simulate_rollout(QWEN7, H100, layout, req, opts.model_copy(update={"event_by_event": True}), cap)
    assert_same(fast, slow)


def test_run_out_under_preemption_storms() -> None:
    """A cache that holds a few sequences, prompts prefilled over several steps: preemptions
    while a wave is in flight, waves joining while admission waits, storms of evictions."""
    rng = np.random.default_rng(0)
    n = 400
    group = np.repeat(np.arange(n // 4), 4)
    prompt = rng.integers(50, 1500, n // 4)[group]
    response = rng.integers(1, 3000, n)
    req = RolloutRequests.build(prompt, response, group)
    layout = EngineLayout(replicas=2, max_num_seqs=64, max_num_batched_tokens=256)
    cap = int(np.max(prompt + response)) + 8000
    fast = simulate_rollout(QWEN7, H100, layout, req, RolloutOptions(), cap)
    assert fast.num_preemptions > 1000
    assert_same(fast, simulate_rollout(QWEN7, H100, layout, req, RolloutOptions(event_by_event=True), cap))


coef = st.floats(0.0, 10.0, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.tuples(coef, coef, coef, coef, coef, st.integers(0, 60)), min_size=1, max_size=20),
       floor=coef)
def test_runs_time_equals_run_time(rows: list[tuple[float, float, float, float, float, int]], floor: float) -> None:
    """The vectorized closed form gives, run by run, exactly the scalar one."""
    c0, c1, m0, m1, fixed, n = (np.array(c) for c in zip(*rows))
    many = Runs(c0, c1, m0, m1, np.full(len(rows), floor), fixed).time_s(n.astype(np.int64))
    one = [Run(*r[:4], floor, r[4]).time_s(r[5]) for r in rows]
    assert many.tolist() == one


def test_step_model_runs_equal_run() -> None:
    step = StepModel.build(MOE, H100, EngineLayout(tp=2, pp=2))
    args = [(0, 0, 700.0, 1e-6, 3), (5, 9000, 0.0, 2e-6, 0), (64, 300_000, 12.5, 1e-6, 2), (1, 17, 3.0, 0.0, 1)]
    many = step.runs(*(np.array(c) for c in zip(*args)))
    for k, a in enumerate(args):
        one = step.run(*a)
        assert (one.c0, one.c1, one.m0, one.m1, one.fixed) == (
            many.c0[k], many.c1[k], many.m0[k], many.m1[k], many.fixed[k])


# Step models the solo-time comparison below draws from (dense and MoE, tensor and pipeline
# parallel, eager and graph-captured): built once.
_SOLO_STEPS = [StepModel.build(m, H100, EngineLayout(tp=tp, pp=pp, cuda_graphs=graphs))
               for m, tp, pp, graphs in ((QWEN7, 1, 1, True), (QWEN7, 4, 2, False), (MOE, 2, 2, True), (MOE, 1, 1, False))]


@settings(max_examples=60, deadline=None)
@given(step=st.sampled_from(_SOLO_STEPS), budget=st.sampled_from([256, 2048, 16384]),
       reqs=st.lists(st.tuples(st.integers(1, 60_000), st.integers(0, 40_000)), min_size=1, max_size=12))
def test_solo_times_one_by_one_equal_the_array_forms(step: StepModel, budget: int, reqs: list[tuple[int, int]]) -> None:
    """A few requests costed one by one on the scalar forms (rollout.SOLO_SCALAR_MAX) give
    exactly what the array forms give for them all at once."""
    from rlperf.stages import rollout

    ctx, steps = (np.array(c, np.int64) for c in zip(*reqs))
    one_by_one = rollout.solo_times_s(step, ctx, steps, budget)
    with patch.object(rollout, "SOLO_SCALAR_MAX", 0):
        at_once = rollout.solo_times_s(step, ctx, steps, budget)
    assert one_by_one[0].tolist() == at_once[0].tolist()
    assert one_by_one[1].tolist() == at_once[1].tolist()

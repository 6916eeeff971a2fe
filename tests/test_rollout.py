"""Rollout engine at request granularity: closed forms, conservation of tokens, partial
rollout and resume, KV capacity (debug checks at every event), dispatch, bounds."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlperf.catalog import load_model
from rlperf.errors import SpecError
from rlperf.specs.hardware_catalog import make_cluster
from rlperf.specs.parallel import EngineLayout
from rlperf.stages.rollout import (
    RolloutOptions,
    RolloutRequests,
    RolloutResult,
    kv_capacity_tokens,
    simulate_rollout,
)
from rlperf.stages.rollout_step import StepModel

QWEN7 = load_model("Qwen2.5-7B")
# the scheduling mechanics on the device's step times alone (the engine's host time per step is
# tested in test_rollout_step)
_SHIPPED = make_cluster("H100", num_gpus=64)
H100 = _SHIPPED.model_copy(update={"profile": _SHIPPED.profile.model_copy(
    update={"engine_step_overhead_s": None, "engine_seq_overhead_s": None})})
DEBUG = RolloutOptions(debug_checks=True)


def run(
    prompt: list[int] | np.ndarray,
    response: list[int] | np.ndarray,
    layout: EngineLayout | None = None,
    options: RolloutOptions = DEBUG,
    kv: int | None = 10_000_000,
    **req: object,
) -> RolloutResult:
    requests = RolloutRequests.build(prompt, response, **req)  # type: ignore[arg-type]
    return simulate_rollout(
        QWEN7, H100, layout or EngineLayout(), requests, options, kv_capacity=kv
    )


def conserved(res: RolloutResult, already: np.ndarray | int = 0) -> None:
    """Tokens generated in the call = the growth of every request's count."""
    assert res.num_decode_tokens == int(np.sum(res.generated_tokens - already))


# ---------------------------------------------------------------------- closed forms
def test_single_request_decode_matches_weight_streaming() -> None:
    """Batch 1, short prompt: T decode steps cost T · weights/(bw · eff) within a few %."""
    t = 2000
    res = run([16], [t + 1])
    acc, prof = H100.accelerator, H100.profile
    per_token = (
        2
        * QWEN7.matmul_params_per_token
        / (acc.hbm_bandwidth_bytes_per_s * prof.decode_hbm_efficiency)
    )
    assert res.decode_depth_s == pytest.approx(t * per_token, rel=0.03)
    assert res.makespan_s == pytest.approx(res.depth_s, rel=1e-9)  # alone, the bound is met
    assert res.num_steps == t + 1  # one prefill step (which samples token 1) and t decode steps


def test_single_request_equals_step_by_step_sum() -> None:
    prompt, response = 3000, 500
    res = run([prompt], [response], EngineLayout(max_num_batched_tokens=1024))
    step = StepModel.build(QWEN7, H100, EngineLayout(max_num_batched_tokens=1024))
    chunks = math.ceil(prompt / 1024)
    q = step.prefill_s_per_token(prompt, prompt * (prompt + 1) / 2, 1)
    prefill = step.run(0, 0, prompt / chunks, q, 1).time_s(chunks)  # the wave: one sequence
    decode = sum(step.run(1, prompt + 1 + i, 0, 0.0).step_s(0) for i in range(response - 1))
    assert res.makespan_s == pytest.approx(prefill + decode, rel=1e-9)
    assert res.num_prefill_tokens == prompt


def test_equal_lengths_finish_together() -> None:
    res = run([500] * 64, [1000] * 64)
    assert res.tail_s == pytest.approx(0.0, abs=1e-12)
    assert np.all(res.finish_time_s == res.makespan_s)


def test_doubling_responses_at_least_doubles_decode_depth() -> None:
    resp = np.array([100, 700, 3000, 1200])
    one = run([300] * 4, resp)
    two = run([300] * 4, 2 * resp)
    assert two.decode_depth_s >= 2 * one.decode_depth_s
    assert two.makespan_s >= one.makespan_s


# ---------------------------------------------------------------------- conservation
def test_tokens_conserved_and_counts_add_up() -> None:
    rng = np.random.default_rng(1)
    resp = rng.integers(1, 3000, 300)
    res = run(
        rng.integers(10, 800, 75).repeat(4),
        resp,
        EngineLayout(replicas=3, max_num_seqs=32),
        group_id=np.arange(300) // 4,
    )
    assert res.finished.all()
    assert np.array_equal(res.generated_tokens, resp)
    conserved(res)
    # every step is a decode step for its batch; prefill covers each group's prompt once
    assert res.num_steps <= int(resp.sum())
    assert res.makespan_s >= res.lower_bound_s() * (1 - 1e-9)


def test_partial_rollout_with_token_budget_then_resume_conserves_tokens() -> None:
    rng = np.random.default_rng(2)
    n = 200
    prompt, resp = rng.integers(10, 500, n // 8).repeat(8), rng.integers(1, 5000, n)
    requested = int(resp.sum())
    req = RolloutRequests.build(prompt, resp, np.arange(n) // 8)
    already = req.already_generated
    total_new = 0
    for _ in range(20):
        res = simulate_rollout(
            QWEN7,
            H100,
            EngineLayout(replicas=2, max_num_seqs=64),
            req,
            RolloutOptions(token_budget_per_request=700, debug_checks=True),
            kv_capacity=2_000_000,
        )
        assert np.all(res.generated_tokens - already <= 700)
        total_new += res.num_decode_tokens
        conserved(res, already)
        left = ~res.finished
        if not left.any():
            break
        assert np.all(np.isfinite(res.finish_time_s))  # budget stops leave the engine
        group = req.group_id[left]
        req = RolloutRequests.build(prompt[left], resp[left], group, res.generated_tokens[left])
        prompt, resp, already = prompt[left], resp[left], req.already_generated
    assert not left.any()
    assert total_new == requested


def test_time_limit_then_resume_conserves_tokens() -> None:
    rng = np.random.default_rng(3)
    n = 120
    prompt, resp = rng.integers(10, 500, n), rng.integers(1, 4000, n)
    full = run(prompt, resp, EngineLayout(replicas=2, max_num_seqs=16))
    first = run(
        prompt,
        resp,
        EngineLayout(replicas=2, max_num_seqs=16),
        RolloutOptions(time_limit_s=full.makespan_s / 3, debug_checks=True),
    )
    assert first.stopped_early and first.makespan_s == pytest.approx(full.makespan_s / 3)
    assert 0 < first.num_decode_tokens < resp.sum()
    assert np.all(np.isinf(first.finish_time_s[~first.finished]))
    left = ~first.finished
    second = run(
        prompt[left],
        resp[left],
        EngineLayout(replicas=2, max_num_seqs=16),
        already_generated=first.generated_tokens[left],
    )
    assert first.num_decode_tokens + second.num_decode_tokens == int(resp.sum())
    assert np.array_equal(second.generated_tokens, resp[left])
    # resumed requests re-prefill their generated tokens
    assert second.num_prefill_tokens >= int(np.sum(first.generated_tokens[left]))


def test_stop_after_num_finished() -> None:
    rng = np.random.default_rng(4)
    resp = rng.integers(100, 4000, 80)
    res = run(
        [200] * 80,
        resp,
        EngineLayout(replicas=2),
        RolloutOptions(stop_after_num_finished=40, debug_checks=True),
    )
    assert res.stopped_early
    assert res.finished.sum() >= 40
    assert res.makespan_s == pytest.approx(np.sort(res.finish_time_s)[39])
    # the shortest 40 finish first when all start together in one batch per replica
    assert set(np.flatnonzero(res.finished)) <= set(np.argsort(resp, kind="stable")[:60])


# ---------------------------------------------------------------------- KV capacity, preemption
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.tuples(st.integers(1, 600), st.integers(0, 5)), min_size=1, max_size=40),
    group_prompt=st.lists(st.integers(1, 300), min_size=6, max_size=6),
    cap_extra=st.integers(0, 2000),
    max_seqs=st.integers(1, 16),
    sharing=st.booleans(),
    replicas=st.integers(1, 3),
)
def test_kv_capacity_respected_at_every_event(
    lengths: list[tuple[int, int]],
    group_prompt: list[int],
    cap_extra: int,
    max_seqs: int,
    sharing: bool,
    replicas: int,
) -> None:
    resp = [r for r, _ in lengths]
    group = [g for _, g in lengths]
    prompt = [group_prompt[g] for g in group]
    cap = max(p + r for p, r in zip(prompt, resp)) + cap_extra
    lay = EngineLayout(
        replicas=replicas,
        max_num_seqs=max_seqs,
        max_num_batched_tokens=max(max_seqs, 64),
        prefix_sharing=sharing,
    )
    res = run(prompt, resp, lay, kv=cap, group_id=group)  # debug checks assert capacity per event
    assert np.array_equal(res.generated_tokens, resp)
    conserved(res)
    assert res.makespan_s >= res.depth_s * (1 - 1e-9)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    reqs=st.lists(
        st.tuples(st.integers(1, 800), st.integers(0, 7), st.floats(0, 3)), min_size=1, max_size=30
    ),
    group_prompt=st.lists(st.integers(1, 200), min_size=8, max_size=8),
    dispatch=st.sampled_from(["round_robin", "least_loaded", "round_robin_requests"]),
    budget=st.one_of(st.none(), st.integers(1, 400)),
    limit_frac=st.one_of(st.none(), st.floats(0.05, 1.0)),
    stop_after=st.one_of(st.none(), st.integers(1, 30)),
    pp=st.sampled_from([1, 2]),
)
def test_any_partial_rollout_resumes_to_the_full_responses(
    reqs: list[tuple[int, int, float]],
    group_prompt: list[int],
    dispatch: str,
    budget: int | None,
    limit_frac: float | None,
    stop_after: int | None,
    pp: int,
) -> None:
    """Arrivals, budgets, time limits and early stops in any mix: each call conserves tokens,
    respects the KV cache (debug checks), and resuming the unfinished requests ends with
    every response complete."""
    resp = np.array([r for r, _, _ in reqs])
    group = np.array([g for _, g, _ in reqs])
    prompt = np.array([group_prompt[g] for g in group])
    arrival = np.array([a for _, _, a in reqs])
    lay = EngineLayout(replicas=2, pp=pp, max_num_seqs=4, max_num_batched_tokens=64)
    limit = (
        None
        if limit_frac is None
        else limit_frac * run(prompt, resp, lay, arrival_s=arrival).makespan_s
    )
    opts = RolloutOptions(
        dispatch=dispatch,  # type: ignore[arg-type]
        token_budget_per_request=budget,
        time_limit_s=limit,
        stop_after_num_finished=stop_after,
        debug_checks=True,
    )
    already = np.zeros(len(resp), np.int64)
    left = np.ones(len(resp), bool)
    total = 0
    for call in range(4 * len(resp) + 2000):
        if call == 1:  # later calls: no arrivals and no time limit (either may forbid progress)
            opts = opts.model_copy(update={"time_limit_s": None})
            arrival = arrival * 0
        res = run(
            prompt[left],
            resp[left],
            lay,
            opts,
            kv=2000,
            group_id=group[left],
            arrival_s=arrival[left],
            already_generated=already[left],
        )
        assert np.all(res.generated_tokens >= already[left])
        assert np.all(res.generated_tokens <= resp[left])
        if budget is not None:
            assert np.all(res.generated_tokens - already[left] <= budget)
        assert np.all(np.isfinite(res.finish_time_s[res.finished]))
        conserved(res, already[left])
        total += res.num_decode_tokens
        already[left] = res.generated_tokens
        left = already < resp
        if not left.any():
            break
    assert not left.any()
    assert total == int(resp.sum())


def test_small_cache_preempts_and_still_completes() -> None:
    rng = np.random.default_rng(5)
    resp = rng.integers(500, 3000, 64)
    roomy = run([100] * 64, resp, EngineLayout(max_num_seqs=64))
    tight = run([100] * 64, resp, EngineLayout(max_num_seqs=64), kv=20_000)
    assert roomy.num_preemptions == 0 and tight.num_preemptions > 0
    assert np.array_equal(tight.generated_tokens, resp)
    assert tight.num_prefill_tokens > roomy.num_prefill_tokens  # recompute after preemption


def test_prefix_sharing_prefills_a_group_prompt_once() -> None:
    shared = run([1000] * 8, [50] * 8, EngineLayout(prefix_sharing=True), group_id=[0] * 8)
    private = run([1000] * 8, [50] * 8, EngineLayout(prefix_sharing=False), group_id=[0] * 8)
    assert shared.num_prefill_tokens == 1000 + 7  # the others recompute one position for logits
    assert private.num_prefill_tokens == 8000
    assert shared.makespan_s < private.makespan_s


def test_request_that_cannot_fit_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"requests\[1\]"):
        run([10, 10], [100, 5000], kv=1000)
    with pytest.raises(SpecError, match="max_num_batched_tokens"):
        run([10], [10], EngineLayout(max_num_seqs=512, max_num_batched_tokens=256))


def test_capacity_from_memory_model() -> None:
    cap = kv_capacity_tokens(QWEN7, H100, EngineLayout())
    assert 100_000 < cap < 80e9 / QWEN7.kv_bytes_per_token()
    res = run([100] * 4, [100] * 4, kv=None)
    assert res.finished.all()


# ---------------------------------------------------------------------- dispatch and replicas
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    resp=st.lists(st.integers(1, 2000), min_size=1, max_size=24),
    base=st.integers(1, 3),
    factor=st.integers(2, 3),
    max_seqs=st.sampled_from([4, 256]),
)
def test_more_replicas_never_increase_makespan(
    resp: list[int], base: int, factor: int, max_seqs: int
) -> None:
    """Round-robin by group onto k·R replicas refines the split onto R (each new replica
    serves a subset of an old one's requests), so the makespan cannot grow."""
    few = run([200] * len(resp), resp, EngineLayout(replicas=base, max_num_seqs=max_seqs))
    many = run([200] * len(resp), resp, EngineLayout(replicas=base * factor, max_num_seqs=max_seqs))
    assert many.makespan_s <= few.makespan_s * (1 + 1e-9)


def test_round_robin_keeps_groups_together_and_least_loaded_balances() -> None:
    group = np.arange(32) // 4
    rr = run([100] * 32, [200] * 32, EngineLayout(replicas=4), group_id=group)
    for g in range(8):
        assert len(set(rr.replica_of[group == g])) == 1
    assert np.array_equal(rr.replica_of[::4], np.arange(8) % 4)
    arrival = np.repeat(np.arange(8) * 0.5, 4)
    least = RolloutOptions(dispatch="least_loaded")
    # long responses: every replica is still busy at the next arrival, so groups spread evenly
    busy = run(
        [100] * 32, [5000] * 32, EngineLayout(replicas=4), least, group_id=group, arrival_s=arrival
    )
    assert np.array_equal(busy.replica_of[::4], np.arange(8) % 4)
    # short responses (~1.1 s): replica 0 is idle again when group 3 arrives at 1.5 s
    short = run(
        [100] * 32, [200] * 32, EngineLayout(replicas=4), least, group_id=group, arrival_s=arrival
    )
    for g in range(8):
        assert len(set(short.replica_of[group == g])) == 1
    assert short.replica_of[12] == 0 and 3 not in short.replica_of


def test_late_arrival_on_idle_replica_starts_at_arrival() -> None:
    alone = run([300], [400])
    late = run([300], [400], arrival_s=[5.0])
    assert late.finish_time_s[0] == pytest.approx(5.0 + alone.finish_time_s[0])


def test_arrival_joins_a_running_batch() -> None:
    res = run([300, 300], [4000, 100], arrival_s=[0.0, 1.0])
    assert res.finish_time_s[1] < res.finish_time_s[0]
    assert res.finish_time_s[1] > 1.0
    assert res.generated_tokens.tolist() == [4000, 100]


# ---------------------------------------------------------------------- outputs
def test_timeline_and_chrome_trace() -> None:
    res = run([300] * 6, [100, 200, 300, 400, 500, 600], EngineLayout(replicas=2))
    assert sum(s.end_s - s.start_s for s in res.segments) == pytest.approx(
        float(res.replica_busy_s.sum())
    )
    assert {s.kind for s in res.segments} == {"prefill", "decode"}
    assert max(s.end_s for s in res.segments) == pytest.approx(res.makespan_s)
    events = res.chrome_trace_events()
    json.dumps(events)
    assert len(events) == len(res.segments) and all(e["ph"] == "X" for e in events)


def test_tail_and_low_occupancy_on_a_skewed_batch() -> None:
    resp = [100] * 63 + [5000]
    res = run([100] * 64, resp, EngineLayout(max_num_seqs=64))
    assert res.tail_s > 0.9 * (res.makespan_s - np.sort(res.finish_time_s)[62])
    assert res.below_10pct_slots_s > 0.8 * res.makespan_s
    assert res.below_25pct_slots_s >= res.below_10pct_slots_s


def test_deterministic() -> None:
    rng = np.random.default_rng(6)
    args = (rng.integers(10, 500, 50), rng.integers(1, 2000, 50))
    a, b = run(*args, EngineLayout(replicas=3)), run(*args, EngineLayout(replicas=3))
    assert a.makespan_s == b.makespan_s and np.array_equal(a.finish_time_s, b.finish_time_s)
    assert a.segments == b.segments


def test_bad_requests_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="already_generated"):
        RolloutRequests.build([10], [5], already_generated=[5])
    with pytest.raises(SpecError, match="response_tokens"):
        RolloutRequests.build([10, 10], [5])
    with pytest.raises(SpecError, match="prompt_tokens"):
        RolloutRequests.build([0], [5])
    with pytest.raises(SpecError, match="group 0"):
        RolloutRequests.build([10, 11], [5, 5], group_id=[0, 0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=60))
def test_pareto_front_is_the_set_of_undominated_points(points: list[tuple[int, int]]) -> None:
    from rlperf.stages.rollout import _pareto

    x = np.array([p[0] for p in points], np.int64)
    y = np.array([p[1] for p in points], np.int64)
    fx, fy = _pareto(x, y)
    front = sorted({(a, b) for a, b in points
                    if not any(c >= a and d >= b and (c, d) != (a, b) for c, d in points)}, key=lambda p: (-p[1], -p[0]))
    assert list(zip(fx.tolist(), fy.tolist())) == front


def test_a_group_with_two_prompt_lengths_names_the_first_clash() -> None:
    with pytest.raises(SpecError, match=r"requests.prompt_tokens\[3\].*group 1 has prompts of 5 and 9"):
        RolloutRequests.build([7, 5, 7, 9, 5], [10] * 5, [0, 1, 0, 1, 1])

"""The compiled run-out (rlperf.stages.rollout_kernel) equals the Python run-out and the
event-by-event loop in every field, bit for bit."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlperf.stages import rollout_runout as runout
from rlperf.specs.parallel import EngineLayout
from rlperf.stages.rollout import RolloutOptions, RolloutRequests, RolloutResult, simulate_rollout
from rlperf.stages.rollout_step import StepModel
from tests.test_rollout_runout import H100, MOE, QWEN7, assert_same, groups_of, requests_of


def python_run_out(*args: object) -> RolloutResult:
    with patch.object(runout, "COMPILED", False):
        return simulate_rollout(*args)  # type: ignore[arg-type]


def test_compiled_loop_is_used() -> None:
    """numba is a pinned dependency: the run-out the planner uses is the compiled one (else the
    comparisons below would compare the Python loop with itself)."""
    assert runout.compiled()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=groups_of(3000, 6, 40),
    replicas=st.integers(1, 4),
    tp_pp=st.sampled_from([(1, 1), (2, 2)]),
    max_num_seqs=st.integers(1, 64),
    budget=st.sampled_from([256, 2048]),
    sharing=st.booleans(),
    kv=st.sampled_from([6_000, 12_000, None]),
    token_budget=st.sampled_from([None, 500]),
    moe=st.booleans(),
    staggered=st.booleans(),
    dispatch=st.sampled_from(["round_robin", "least_loaded", "round_robin_requests"]),
    stop=st.one_of(st.none(), st.tuples(st.just("time_limit_s"), st.floats(0.01, 60.0)),
                   st.tuples(st.just("stop_after_num_finished"), st.integers(1, 150))),
)
def test_compiled_equals_python_run_out(
    groups: list[tuple[int, list[int]]], replicas: int, tp_pp: tuple[int, int], max_num_seqs: int,
    budget: int, sharing: bool, kv: int | None, token_budget: int | None, moe: bool, staggered: bool,
    dispatch: str, stop: tuple[str, float] | None,
) -> None:
    """Requests all at once (the run-out also applies the replicas' first events) or arriving
    over time (the run-out starts from replicas mid-flight: waves prefilling, stale heap
    entries, groups resident, preempted requests queued); groups kept on one replica or spread
    over several; small caches that preempt; no stop, a time limit or a finished count (the
    compiled run-out to a stop: a dry run to the end gives the stop, then the runs that end by
    it)."""
    req, cap = requests_of(groups, kv)
    if staggered:
        arrival = np.sort(np.random.default_rng(len(groups)).uniform(0, 5, req.num_requests))
        req = RolloutRequests.build(req.prompt_tokens, req.response_tokens, req.group_id, arrival_s=arrival)
    layout = EngineLayout(
        tp=tp_pp[0], pp=tp_pp[1], replicas=replicas, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs), prefix_sharing=sharing,
    )
    model = MOE if moe else QWEN7
    opts = RolloutOptions(token_budget_per_request=token_budget, dispatch=dispatch,  # type: ignore[arg-type]
                          **({} if stop is None else {stop[0]: stop[1]}))
    assert_same(simulate_rollout(model, H100, layout, req, opts, cap), python_run_out(model, H100, layout, req, opts, cap))


@pytest.mark.parametrize("sharing", [True, False])
def test_compiled_under_preemption_storms(sharing: bool) -> None:
    """Hundreds of preemptions, waves joining while admission waits, a resumed request's
    prompt and tokens prefilled again."""
    rng = np.random.default_rng(1)
    n = 600
    group = np.repeat(np.arange(n // 6), 6)
    prompt = rng.integers(50, 1500, n // 6)[group]
    req = RolloutRequests.build(prompt, rng.integers(1, 3000, n), group)
    layout = EngineLayout(replicas=3, max_num_seqs=64, max_num_batched_tokens=256, prefix_sharing=sharing)
    cap = int(np.max(req.prompt_tokens + req.response_tokens)) + 6000
    fast = simulate_rollout(QWEN7, H100, layout, req, RolloutOptions(), cap)
    assert fast.num_preemptions > 500
    assert_same(fast, python_run_out(QWEN7, H100, layout, req, RolloutOptions(), cap))
    assert_same(fast, simulate_rollout(QWEN7, H100, layout, req, RolloutOptions(event_by_event=True), cap))


def _compiled_stop_is_python_stop(opts: RolloutOptions, knob: str, value: float) -> None:
    """The compiled run-out to a stop, with ``runout.<knob>`` patched to ``value``, equals the
    Python run-out to it."""
    rng = np.random.default_rng(2)
    n = 600
    group = np.arange(n) // 6
    req = RolloutRequests.build(rng.integers(50, 1500, n // 6)[group], rng.integers(1, 3000, n), group)
    layout = EngineLayout(replicas=3, max_num_seqs=64, max_num_batched_tokens=256)
    cap = int(np.max(req.prompt_tokens + req.response_tokens)) + 6000
    with patch.object(runout, knob, value):
        fast = simulate_rollout(QWEN7, H100, layout, req, opts, cap)
    assert fast.stopped_early
    assert_same(fast, python_run_out(QWEN7, H100, layout, req, opts, cap))


@pytest.mark.parametrize("dry_runs", [1, 7])
@pytest.mark.parametrize("stop", [{"stop_after_num_finished": 300}, {"time_limit_s": 40.0}])
def test_compiled_stop_in_short_dry_runs(dry_runs: int, stop: dict[str, float]) -> None:
    """Dry runs of a few runs per replica, grown until every event up to the stop is planned:
    the same result as the Python run-out to the stop."""
    _compiled_stop_is_python_stop(RolloutOptions(**stop), "DRY_RUNS", dry_runs)  # type: ignore[arg-type]


@pytest.mark.parametrize("runs_per_finish", [0.0, 0.5, 100.0])
def test_compiled_stop_whatever_the_first_dry_run_guesses(runs_per_finish: float) -> None:
    """The first dry run to a stop after finished requests is sized from the requests still
    wanted (RUNS_PER_FINISH): too short (then grown) or long, the same result as the Python
    run-out to the stop."""
    _compiled_stop_is_python_stop(RolloutOptions(stop_after_num_finished=300), "RUNS_PER_FINISH", runs_per_finish)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=groups_of(3000, 6, 40), replicas=st.integers(1, 3), max_num_seqs=st.integers(1, 32),
       budget=st.sampled_from([256, 2048]), sharing=st.booleans(), want=st.integers(1, 100))
def test_a_stop_that_completes_the_run_in_progress_settles_alike(
    groups: list[tuple[int, list[int]]], replicas: int, max_num_seqs: int, budget: int, sharing: bool, want: int,
) -> None:
    """The run in progress at a stop is committed up to it (Replica.run_until); where the float
    sums put the stop exactly at its end, the whole run is committed and the stop settles
    completions due at that step and a wave whose prefill it finished (settle_stopped, and
    CallPlanner.settle on the arrays). Forced here on every replica (steps_within answers the
    whole run) so the compiled and Python run-outs meet those cases bit for bit."""
    from rlperf.stages.rollout_step import Run

    req, cap = requests_of(groups, None)
    layout = EngineLayout(replicas=replicas, max_num_seqs=max_num_seqs, max_num_batched_tokens=max(budget, max_num_seqs),
                          prefix_sharing=sharing)
    opts = RolloutOptions(stop_after_num_finished=want)
    real = Run.steps_within

    def whole(self: Run, elapsed_s: float, n_max: int, round_up: bool) -> int:
        return n_max if not round_up else real(self, elapsed_s, n_max, round_up)

    with patch.object(Run, "steps_within", whole):
        assert_same(simulate_rollout(QWEN7, H100, layout, req, opts, cap), python_run_out(QWEN7, H100, layout, req, opts, cap))


# One step model kept over the examples below (as rlperf.sim.costs keeps one per engine): its
# memoized coefficients carry over from call to call.
_KEPT: dict[tuple[int, int, int], StepModel] = {}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=groups_of(3000, 6, 40), replicas=st.integers(1, 3), tp_pp=st.sampled_from([(1, 1), (2, 2)]),
       stop=st.one_of(st.none(), st.integers(1, 100)))
def test_a_kept_step_model_gives_what_a_fresh_one_gives(
    groups: list[tuple[int, list[int]]], replicas: int, tp_pp: tuple[int, int], stop: int | None,
) -> None:
    req, cap = requests_of(groups, 8_000)
    layout = EngineLayout(tp=tp_pp[0], pp=tp_pp[1], replicas=replicas, max_num_seqs=32)
    opts = RolloutOptions(stop_after_num_finished=stop)
    kept = _KEPT.setdefault((*tp_pp, replicas), StepModel.build(QWEN7, H100, layout))
    assert_same(simulate_rollout(QWEN7, H100, layout, req, opts, cap, step=kept),
                simulate_rollout(QWEN7, H100, layout, req, opts, cap))


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=6), quantities=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_running_sums_add_as_a_cumulative_sum(counts: list[int], quantities: int, seed: int) -> None:
    """The compiled running sums of the run-out's timing equal numpy's cumulative sum along each
    replica's row (start, then its runs, then zeros) bit for bit: after every run and in total
    (the start for a replica without runs)."""
    from rlperf.stages.rollout_loop import running_sums

    rng = np.random.default_rng(seed)
    c = np.array(counts, np.int64)
    bounds = np.concatenate(([0], np.cumsum(c)))
    starts = rng.uniform(0, 1e3, (quantities, c.size))
    values = rng.uniform(0, 10, (quantities, int(c.sum()))) ** rng.uniform(-3, 3)
    row = np.repeat(np.arange(c.size), c)
    col = np.arange(int(c.sum())) - np.repeat(bounds[:-1], c) + 1
    m = np.zeros((quantities, c.size, int(c.max()) + 1))
    m[:, :, 0] = starts
    m[:, row, col] = values
    sums = np.cumsum(m, axis=2)
    after, total = running_sums(starts, values, bounds)
    assert np.array_equal(after, sums[:, row, col]) and np.array_equal(total, sums[:, np.arange(c.size), c])

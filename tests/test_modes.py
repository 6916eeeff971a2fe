"""Execution modes: the work-depth bound holds in every mode, staleness stays within its bound,
steady-state results do not depend on the simulated length, and sharing a pool buys nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.algorithms import get_algorithm
from rlperf.modes import mode_of
from rlperf.modes.stream_batch import stream_calls
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
    st.builds(lambda t, f, k, g: ExecutionMode(kind="streaming", staleness_threshold=t, inflight_weight_updates=f,
                                               train_parts=k, groups_per_engine=g),
              st.sampled_from([0.0, 0.3, 0.5, 1.0, 1.5, 2.0]), st.booleans(), st.sampled_from([1, 2, 4]),
              st.sampled_from([None, 1, 2])),
)
PLACEMENTS = st.sampled_from([Placement(), Placement(kind="disaggregated", rollout_gpus=2),
                              Placement(kind="disaggregated", rollout_gpus=4), Placement(kind="disaggregated", rollout_gpus=6)])


@settings(max_examples=30, deadline=None)
@given(mode=MODES, placement=PLACEMENTS, fusion=st.booleans(), algo=st.sampled_from(["GRPO", "PPO", "DAPO", "ReMax", "PRIME"]),
       seed=st.integers(0, 20))
def test_steady_step_never_beats_the_work_depth_bound(mode: ExecutionMode, placement: Placement, fusion: bool, algo: str,
                                                       seed: int) -> None:
    if mode.kind in ExecutionMode.USED_BY["fusion"]:  # the other kinds refuse it (they never fuse)
        mode = mode.model_copy(update={"fusion": fusion})
    r = run(mode, placement, algo, iterations=10, sample=same_every_step(seed))
    assert r.step_time_s >= r.bounds.lower_bound_s * (1 - 1e-9), (r.step_time_s, r.bounds)
    # Staleness: within the mode's bound, and the distribution counts every trained response.
    d = r.staleness_distribution
    bound = mode_of(mode).staleness_bound(2000)
    assert d.bound == bound and (bound is None or max(r.staleness) <= bound)
    assert d.num_responses == len(r.staleness) and d.max == max(r.staleness)


_SETTLE = ("a stream of τ = 1.5 on 4+4 GPUs has not settled by its warm-up (bound_staleness + 2 = 4 "
           "iterations): steps 7.12, 8.77, 9.14, 7.47, then 7.253 (measured) against 7.26 from the next, "
           "so the measured mean 7.2588 s is 0.02% under the rollout pool's work bound 7.26 s (one more "
           "warm-up iteration clears it); found by Hypothesis's random search, not by its derandomized "
           "CI examples")
_WINDOW_EDGE = ("a stream of τ = 0.5 on 4+4 GPUs (lengths of seed 17 every step) is measured 2e-5 under its "
                "work-depth bound (4e-5 and 7e-5 with one and two more warm-up iterations; more drain: the "
                "same). Located: steps are measured between actor-update ends, and the window's last update "
                "(0.1526 s) is shorter than the one before it (0.1569 s), the batch's mix having changed, "
                "while the rollout pool's period is 8.989 s: step 9 is 8.9819 s, and the window's mean "
                "(8.98884 s) is under the least iteration's rollout-pool work (8.989 s). The bound holds over "
                "a long run (the update differences telescope), not in a window whose last update is shorter "
                "than its first. 8 of 810 streaming runs of a sweep (τ 0.3-2, parts 1-4, groups, 2/4/6 "
                "rollout GPUs, 3 seeds) are under their bound: this case (6) and the τ = 1.5 one (2)")


@pytest.mark.parametrize("tau, seed", [
    pytest.param(1.5, 11, marks=pytest.mark.xfail(strict=True, reason=_SETTLE)),
    pytest.param(0.5, 17, marks=pytest.mark.xfail(strict=True, reason=_WINDOW_EDGE)),
])
def test_a_stream_is_never_measured_under_its_bound(tau: float, seed: int) -> None:
    """Known cases of streams whose measured step is under their work-depth bound."""
    mode = ExecutionMode(kind="streaming", staleness_threshold=tau)
    r = run(mode, Placement(kind="disaggregated", rollout_gpus=4), "GRPO", iterations=10, sample=same_every_step(seed))
    assert r.step_time_s >= r.bounds.lower_bound_s * (1 - 1e-9), (r.step_time_s, r.bounds)


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
    for m in (ExecutionMode(kind="async", staleness=0), ExecutionMode(kind="partial_rollout", token_budget=10**6),
              ExecutionMode(kind="streaming", staleness_threshold=0.0),
              ExecutionMode(kind="streaming", staleness_threshold=0.0, groups_per_engine=1)):
        r = run(m, split, sample=toy_sampler(2))
        assert r.step_times_s == pytest.approx(sync.step_times_s, rel=1e-12) and set(r.staleness) == {0}


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


SPLIT = Placement(kind="disaggregated", rollout_gpus=4)


@pytest.mark.parametrize(("threshold", "parts", "groups"),
                         [(1.0, 1, None), (0.5, 1, None), (0.5, 4, None), (0.0, 4, None), (1.5, 2, None),
                          (0.5, 4, 1), (1.0, 1, 2), (0.0, 2, 1)])
def test_streaming_conserves_tokens_under_interruption(threshold: float, parts: int, groups: int | None) -> None:
    from rlperf.sim.simulate import Simulator

    sample = toy_sampler(4)
    m = ExecutionMode(kind="streaming", staleness_threshold=threshold, train_parts=parts, groups_per_engine=groups)
    plan = Plan(placement=SPLIT, mode=m)
    iters = 7
    cfg = SimConfig(name="toy", algorithm=get_algorithm("GRPO"), plan=plan, num_gpus=8, prompts_per_step=8, group_size=4,
                    sample=sample, minibatches=2, iterations=iters, warmup=1, max_response_tokens=2000)
    sim = Simulator(cfg, ToyCosts())
    sim.run()
    n_iter = sim.num_iterations
    ahead = round(threshold * 8)
    requested = sum(int(sample(it * 1000, 8 + (ahead if it == 0 else 0))[1].sum()) for it in range(n_iter))
    generated = sum(s.generated_tokens for s in sim.iters)
    carry = sim.carry
    left = 0 if carry is None else int((carry.target_tokens - carry.generated_tokens).sum())
    assert generated + left == requested  # every token generated exactly once, none lost at a pause
    trained = sum(len(s.kept_seq_tokens) for s in sim.iters if s.kept_seq_tokens is not None)
    held = sim.engine.held
    in_flight = (0 if carry is None else carry.num_requests) + (0 if held is None else held.num_requests)
    assert trained + in_flight == n_iter * 8 * 4 + ahead * 4
    # Each step trains at least its batch: the call stops once B·G responses finished.
    assert all(s.kept_seq_tokens is not None and len(s.kept_seq_tokens) >= 32 for s in sim.iters)
    if groups is not None:  # whole groups: a step trains G responses per prompt, never a part of one
        assert all(s.kept_seq_tokens is not None and len(s.kept_seq_tokens) % 4 == 0 for s in sim.iters)


def test_whole_groups_are_never_lost_next_to_a_greedy_call() -> None:
    """ReMax's greedy baseline call runs between streamed calls: responses held for their
    group stay held, and every sampled response is trained once or still in flight."""
    from rlperf.sim.simulate import Simulator

    m = ExecutionMode(kind="streaming", staleness_threshold=0.5, train_parts=2, groups_per_engine=1)
    cfg = SimConfig(name="toy", algorithm=get_algorithm("ReMax"), plan=Plan(placement=SPLIT, mode=m), num_gpus=8,
                    prompts_per_step=8, group_size=4, sample=toy_sampler(5), minibatches=2, iterations=6, warmup=1,
                    max_response_tokens=2000)
    sim = Simulator(cfg, ToyCosts())
    sim.run()
    trained = sum(len(s.kept_seq_tokens) for s in sim.iters if s.kept_seq_tokens is not None)
    in_flight = sum(0 if b is None else b.num_requests for b in (sim.engine.carry, sim.engine.held))
    assert trained + in_flight == sim.num_iterations * 8 * 4 + 4 * 4  # + the first call's τ·B prompts


@pytest.mark.parametrize(("threshold", "parts", "groups"),
                         [(0.5, 1, None), (1.0, 1, None), (0.0, 4, None), (0.5, 4, None), (0.5, 4, 1), (0.0, 4, 2)])
def test_more_rollout_gpus_never_slow_a_streaming_plan(threshold: float, parts: int, groups: int | None) -> None:
    m = ExecutionMode(kind="streaming", staleness_threshold=threshold, train_parts=parts, groups_per_engine=groups)
    times = [run(m, Placement(kind="disaggregated", rollout_gpus=g), iterations=8, sample=toy_sampler(1), prompts=16)
             .step_time_s for g in (2, 4, 6)]
    assert times == sorted(times, reverse=True)


def test_streaming_hides_the_tail_and_inflight_updates_hide_the_sync() -> None:
    a = run(ExecutionMode(kind="async", staleness=1), SPLIT, iterations=8, sample=toy_sampler(1), prompts=16)
    s = run(ExecutionMode(kind="streaming", staleness_threshold=1.0), SPLIT, iterations=8, sample=toy_sampler(1), prompts=16)
    f = run(ExecutionMode(kind="streaming", staleness_threshold=1.0, inflight_weight_updates=True), SPLIT, iterations=8,
            sample=toy_sampler(1), prompts=16)
    assert f.step_time_s <= s.step_time_s < a.step_time_s
    assert s.stage("generate").time_s < a.stage("generate").time_s


def test_trace_shows_the_staleness_of_each_update() -> None:
    from rlperf.sim.trace import chrome_trace

    r = run(ExecutionMode(kind="streaming", staleness_threshold=1.0), SPLIT, iterations=4, sample=toy_sampler(1))
    updates = [e for e in chrome_trace(r.segments)["traceEvents"] if e.get("name") == "actor_update"]
    assert updates and all(e["args"]["staleness_max"] >= e["args"]["staleness_mean"] >= 0 for e in updates)
    assert max(e["args"]["staleness_mean"] for e in updates) >= 1  # after the first step, all lag


def test_colocated_async_is_not_faster_than_sync_with_the_analytic_costs() -> None:
    from rlperf.sim.run import run_scenario
    from tests.test_scenarios import small

    # Pipelining buys nothing on one pool whose engine sleeps during training. (Streaming and
    # partial rollout can still be faster there: they cut the rollout's tail, not overlap.)
    sc = small("grpo-qwen2.5-7b-colocated-sync", prompts=8, iterations=4)
    sync = run_scenario(sc)
    for mode in (ExecutionMode(kind="one_step_off"), ExecutionMode(kind="async", staleness=2)):
        a = run_scenario(sc.with_plan(sc.plan.model_copy(update={"mode": mode})))
        assert a.tokens_per_step == sync.tokens_per_step
        assert a.step_time_s >= sync.step_time_s * (1 - 1e-9)
        assert a.bounds.lower_bound_s <= a.step_time_s


@pytest.mark.parametrize(("threshold", "parts", "logprobs"),
                         [(0.1, 1, "rollout"), (0.5, 4, "rollout"), (1.0, 2, "when_needed"), (2.0, 1, "when_needed"),
                          (0.0, 4, "rollout")])
def test_verl_export_and_import_keep_the_streaming_mode_exactly(threshold: float, parts: int, logprobs: str) -> None:
    from rlperf.frameworks import export_verl, import_verl
    from rlperf.scenario import load_scenario_spec

    spec = load_scenario_spec("grpo-qwen2.5-7b-async-s2")
    # verl's rollouter: whole prompt groups, 16 per server in flight (a constant of its code)
    mode = ExecutionMode(kind="streaming", staleness_threshold=threshold, train_parts=parts, groups_per_engine=16)
    algorithm = spec.algorithm.model_copy(update={"old_logprob": logprobs, "minibatches": 8})
    spec = spec.model_copy(update={"plan": spec.plan.model_copy(update={"mode": mode}), "algorithm": algorithm})
    out = export_verl(spec)
    args = dict(a.lstrip("+").split("=", 1) for a in out.args if "=" in a)
    # verl's keys: fractional threshold as is, local updates x mini-batches per update = the batch
    assert float(args["async_training.staleness_threshold"]) == threshold
    assert int(args["async_training.trigger_parameter_sync_step"]) == parts
    assert int(args["async_training.require_batches"]) == 8 // parts
    assert args["async_training.partial_rollout"] == "True"
    assert args["async_training.use_rollout_log_probs"] == str(logprobs == "rollout")
    back, report = import_verl(None, list(out.args), gpu=spec.cluster.gpu)
    assert back.plan.mode == mode and not report.unknown
    assert back.algorithm.minibatches == 8 and back.algorithm.old_logprob == logprobs
    assert not any("whole prompt groups" in m for m in out.not_expressible)
    # request-by-request admission is not what verl runs: the export says so
    other = spec.model_copy(update={"plan": spec.plan.model_copy(update={"mode": mode.model_copy(
        update={"groups_per_engine": None})})})
    assert any("whole prompt groups" in m for m in export_verl(other).not_expressible)


def test_openrlhf_async_with_partial_rollout_is_streaming() -> None:
    from rlperf.frameworks import export_openrlhf, import_openrlhf
    from rlperf.scenario import load_scenario_spec

    spec = load_scenario_spec("grpo-qwen2.5-7b-async-s2")
    mode = ExecutionMode(kind="streaming", staleness_threshold=2.0)
    spec = spec.model_copy(update={"plan": spec.plan.model_copy(update={"mode": mode})})
    out = export_openrlhf(spec)
    assert "--partial_rollout" in out.args and "--async_train" in out.args
    back, report = import_openrlhf(list(out.args), gpu=spec.cluster.gpu)
    assert back.plan.mode == mode and not report.unknown


def test_streamed_training_overlaps_the_rollout() -> None:
    # verl fully_async: local updates start as their responses finish (train_parts), and a
    # fractional threshold lets a share of the next batch generate during the update.
    whole = run(ExecutionMode(kind="streaming", staleness_threshold=0.0), SPLIT, iterations=8, sample=toy_sampler(1),
                prompts=16)
    parts = run(ExecutionMode(kind="streaming", staleness_threshold=0.0, train_parts=4), SPLIT, iterations=8,
                sample=toy_sampler(1), prompts=16)
    ahead = run(ExecutionMode(kind="streaming", staleness_threshold=0.5, train_parts=4), SPLIT, iterations=8,
                sample=toy_sampler(1), prompts=16)
    assert ahead.step_time_s <= parts.step_time_s < whole.step_time_s
    assert set(parts.staleness) == {0}  # threshold 0: the batch waits for the newest weights
    assert ahead.staleness_distribution.max >= 1  # the ahead share used the previous weights
    for r in (whole, parts, ahead):
        assert r.step_time_s >= r.bounds.lower_bound_s * (1 - 1e-9)
        # Every step trains its batch once, parts or not.
        assert r.trained_responses_per_step >= 16 * 4


def test_rollout_logprobs_drop_the_old_logprob_pass() -> None:
    algo = get_algorithm("GRPO").with_rollout_logprobs()
    names = [s.name for s in algo.active_stages(updates_per_rollout=4)]
    assert "old_logprob" not in names and "actor_update" in names
    assert all("old_logprob" not in s.deps for s in algo.stages)


def test_train_parts_need_streaming() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="train_parts"):
        ExecutionMode(kind="async", staleness=1, train_parts=4)


def test_streaming_step_does_not_depend_on_the_simulated_length() -> None:
    # Long responses accumulate in flight for several syncs before the trained batches have
    # their steady length mix; the simulation extends its warm-up past the longest lag it saw
    # (trained, or still in flight), whatever warm-up was asked for.
    m = ExecutionMode(kind="streaming", staleness_threshold=0.5, train_parts=2)
    split = Placement(kind="disaggregated", rollout_gpus=6)
    short = run(m, split, iterations=3, warmup=1, sample=same_every_step(2, mean=600.0), prompts=16)
    long = run(m, split, iterations=14, warmup=1, sample=same_every_step(2, mean=600.0), prompts=16)
    for r in (short, long):
        assert r.warmup > max(r.staleness) + 1
        assert not any("settle" in n for n in r.notes)
    assert short.warmup == long.warmup
    assert short.step_time_s == pytest.approx(long.step_time_s, rel=0.05)


def test_partial_rollout_step_does_not_depend_on_the_simulated_length() -> None:
    # A response of the cap needs ⌈cap/β⌉ calls before the carried requests settle: the
    # simulation takes that warm-up even when fewer iterations were asked for.
    m = ExecutionMode(kind="partial_rollout", token_budget=400)
    short = run(m, SPLIT, iterations=3, warmup=1)
    long = run(m, SPLIT, iterations=12, warmup=1)
    assert short.warmup == long.warmup == mode_of(m).warmup_iterations(2000, False)
    assert short.step_time_s == pytest.approx(long.step_time_s, rel=1e-6)


def test_openrlhf_export_names_what_it_cannot_keep() -> None:
    from rlperf.frameworks import export_openrlhf
    from rlperf.scenario import load_scenario_spec

    spec = load_scenario_spec("grpo-qwen2.5-7b-async-s2")
    mode = ExecutionMode(kind="streaming", staleness_threshold=0.5, train_parts=2)
    algorithm = spec.algorithm.model_copy(update={"old_logprob": "rollout"})
    spec = spec.model_copy(update={"plan": spec.plan.model_copy(update={"mode": mode}), "algorithm": algorithm})
    out = export_openrlhf(spec)
    assert "--partial_rollout" in out.args and "--async_train" in out.args
    missing = " | ".join(out.not_expressible)
    assert "threshold 0.5" in missing and "written as 1" in missing  # whole batches only
    assert "2 local updates" in missing and "log-probs from the rollout" in missing


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=40), st.integers(1, 3000), st.sampled_from([0.25, 0.5, 1.0]))
def test_a_steady_call_runs_every_piece_of_one_steps_responses(lengths: list[int], budget: int, tau: float) -> None:
    """The fast estimate's steady call (Mode.steady_call): with a budget ``β`` it holds
    ``Σ ⌈L/β⌉`` requests that generate ``Σ L`` new tokens in pieces of at most ``β``, carried ones
    (``k·β`` generated) first; streaming's ``Δ`` keeps about ``(1 + τ)·n`` requests' work in flight."""
    from rlperf.sim.interface import RolloutBatch

    target = np.asarray(lengths, np.int64)
    n = len(target)
    fresh = RolloutBatch(np.full(n, 7, np.int64), target, np.zeros(n, np.int64), np.arange(n, dtype=np.int64))
    assert mode_of(ExecutionMode()).steady_call(fresh) is fresh
    call = mode_of(ExecutionMode(kind="partial_rollout", token_budget=budget)).steady_call(fresh)
    assert call.num_requests == int(np.sum(-(-target // budget)))
    new = np.minimum(call.target_tokens - call.generated_tokens, budget)
    assert int(new.sum()) == int(target.sum()) and np.all(call.generated_tokens % budget == 0)
    assert np.all(np.diff(call.generated_tokens) <= 0)  # the oldest carried pieces first
    assert len(np.unique(call.group_ids)) == call.num_requests  # a carried piece is another step's group
    streaming = mode_of(ExecutionMode(kind="streaming", staleness_threshold=tau))
    delta = streaming.steady_budget(fresh)
    c = stream_calls(target, round(tau * n)).decode_batch  # no slot limit: all in flight decode
    assert delta is not None and delta * c * (1 + 1e-9) >= target.sum() > (delta - 1) * c * (1 - 1e-9)  # Δ = ⌈Σ L / c⌉, c a float


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=40), st.sampled_from([0.25, 0.5, 1.0]),
       st.one_of(st.none(), st.integers(1, 60)))
def test_streamings_steady_call_cuts_responses_at_their_own_phase(lengths: list[int], tau: float,
                                                                  slots: int | None) -> None:
    """Streaming's steady call (Streaming.steady_call): ``Δ = Σ L / c``, ``c`` the slots where
    fewer than ``(1 + τ)·n``, else the stream's average decode batch (rlperf.modes.stream_batch);
    each response in pieces of at most ``Δ`` that tile ``[0, L)`` (one piece of each, ``Σ L``
    new tokens), the first ending at its own phase, so the call re-prefills about ``Σ L / Δ``
    pieces (the requests decoding at an update), at least the cut-at-start count."""
    from rlperf.sim.interface import RolloutBatch

    target = np.asarray(lengths, np.int64)
    n = len(target)
    fresh = RolloutBatch(np.full(n, 7, np.int64), target, np.zeros(n, np.int64), np.arange(n, dtype=np.int64))
    streaming = mode_of(ExecutionMode(kind="streaming", staleness_threshold=tau))
    delta = streaming.steady_budget(fresh, slots)
    full = slots is not None and slots < (1 + tau) * n
    c = float(slots) if full and slots is not None else stream_calls(target, round(tau * n)).decode_batch
    assert delta is not None and delta * c * (1 + 1e-9) >= target.sum() > (delta - 1) * c * (1 - 1e-9)  # Δ = ⌈Σ L / c⌉, c a float
    call = streaming.steady_call(fresh, slots)
    new = call.target_tokens - call.generated_tokens
    assert np.all(new >= 1) and np.all(new <= delta)
    assert int(new.sum()) == int(target.sum())
    # the pieces of response i (group i + k·n) tile [0, L_i)
    for i in range(n):
        mine = call.group_ids % n == i
        starts, ends = np.sort(call.generated_tokens[mine]), np.sort(call.target_tokens[mine])
        assert starts[0] == 0 and ends[-1] == target[i] and np.array_equal(starts[1:], ends[:-1])
    resumed = int(np.sum(call.generated_tokens > 0))
    assert resumed >= int(np.sum(-(-target // delta) - 1))
    assert abs(resumed - target.sum() / delta) <= n


def test_a_small_streams_decode_batch_shrinks_as_its_calls_finish() -> None:
    """rlperf.modes.stream_batch by hand: lengths 1 and 3 (n = 2), one request ahead. The calls
    settle into two that repeat: in flight [1, 1, 3] decode 1 step (3 tokens, 2 finish, the 3
    keeps 2 left), then [2, 1, 3] decode 2 steps (5 tokens): 8 tokens in 3 steps, a batch of
    8/3, between τ·n = 1 and (1 + τ)·n = 3. Equal lengths all finish together: a batch of n."""
    assert stream_calls(np.array([1, 3]), 1).decode_batch == pytest.approx(8 / 3)
    # The 3 is admitted in one call and finishes in the next: 2 calls (Streaming.expected_staleness).
    assert stream_calls(np.array([1, 3]), 1).longest_span_calls == 2
    # Two batches ahead (τ = 2) keep 3n in flight, more than one batch ahead: the extra batch
    # is admitted (it was cut to one batch), so the stream decodes more at once.
    lengths = np.arange(100, 2100, 100)
    assert stream_calls(lengths, 40).decode_batch > stream_calls(lengths, 20).decode_batch
    assert stream_calls(np.full(16, 300), 8).decode_batch == pytest.approx(16)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=40), st.sampled_from([0.25, 0.5, 1.0, 2.0]))
def test_a_streams_decode_batch_lies_within_what_it_keeps_in_flight(lengths: list[int], tau: float) -> None:
    """At least one request decodes at every step, at most the n + ⌊τ·n⌉ in flight."""
    n = len(lengths)
    ahead = round(tau * n)
    assert 1.0 <= stream_calls(np.asarray(lengths), ahead).decode_batch <= n + ahead


def test_group_admission_decodes_the_groups_used_slots() -> None:
    """Under group admission an engine decodes ``g·G·u`` requests at once, ``u`` the share of a
    group's held slot-steps its responses use (Streaming.requests_per_engine)."""
    from rlperf.sim.interface import RolloutBatch

    # two groups of 4: lengths 100,100,100,100 (u = 1) and 400,100,100,100 (u = 700/1600)
    target = np.array([100, 100, 100, 100, 400, 100, 100, 100], np.int64)
    fresh = RolloutBatch(np.full(8, 7, np.int64), target, np.zeros(8, np.int64), np.repeat(np.arange(2), 4))
    gated = mode_of(ExecutionMode(kind="streaming", staleness_threshold=0.5, groups_per_engine=16))
    assert gated.requests_per_engine(1024, fresh) == round(16 * 4 * 1100 / 2000)
    assert gated.requests_per_engine(8, fresh) == 8  # the engine's own limit binds
    free = mode_of(ExecutionMode(kind="streaming", staleness_threshold=0.5))
    assert free.requests_per_engine(1024, fresh) == 1024


def test_a_warm_up_longer_than_the_cap_runs_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # A partial rollout of budget 100 under a 2,000-token cap needs ⌈2000/100⌉ - 1 = 19 warm-up
    # calls; with the cap lowered to 3 it must get 3 (it used to get none past the cap).
    import rlperf.sim.simulate as simulate_module

    monkeypatch.setattr(simulate_module, "MAX_SETTLE_ITERATIONS", 3)
    r = run(ExecutionMode(kind="partial_rollout", token_budget=100), iterations=2, sample=toy_sampler(1))
    assert r.warmup == 3
    assert any("settles after" in n for n in r.notes)

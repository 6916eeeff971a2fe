"""Partial rollout's per-step normalisation is fair (issue 17): the planner ranks a partial
rollout by its step per B·G trained responses (``SimResult.normalized_step_time_s``); in steady
state each step must train as many tokens per response and generate as many tokens per trained
response as a synchronous step does, so its lead comes from hiding the tail, not from skipped
work."""

from __future__ import annotations

import pytest

from rlperf.scenario import load_scenario
from rlperf.sim.result import SimResult
from rlperf.sim.run import run_scenario


def _run(mode: dict[str, object]) -> SimResult:
    sc = load_scenario({
        "name": "fair",
        "model": "Qwen2.5-0.5B",
        "cluster": {"gpu": "H100", "num_nodes": 1, "gpus_per_node": 2},
        "workload": {"prompts_per_step": 32, "group_size": 4,
                     "prompt_length": {"kind": "uniform", "min_tokens": 16, "max_tokens": 256},
                     "response_length": {"kind": "lognormal", "median_tokens": 400, "sigma": 0.8, "cap_tokens": 2000}},
        "algorithm": {"name": "GRPO", "minibatches": 1},
        "plan": {"mode": mode, "layouts": {"actor": {"max_tokens_per_microbatch": 8192}}},
        "simulation": {"iterations": 8, "warmup": 2},
    })
    return run_scenario(sc, timeline=False)


@pytest.fixture(scope="module")
def runs() -> tuple[SimResult, SimResult]:
    return _run({"kind": "sync"}), _run({"kind": "partial_rollout", "token_budget": 1000})


def test_partial_rollout_trains_and_generates_what_sync_does_per_response(runs: tuple[SimResult, SimResult]) -> None:
    sync, partial = runs
    n = sync.nominal_responses_per_step
    assert sync.trained_responses_per_step == n
    assert partial.trained_responses_per_step == pytest.approx(n, rel=0.1)
    per = partial.trained_responses_per_step
    # Same tokens per trained response (prompt + response) and per generated response.
    assert partial.tokens_per_step / per == pytest.approx(sync.tokens_per_step / n, rel=0.1)
    assert partial.generated_tokens_per_step / per == pytest.approx(sync.generated_tokens_per_step / n, rel=0.1)
    # The normalised step scales the measured one by the responses it fell short of B·G.
    assert partial.normalized_step_time_s == pytest.approx(partial.step_time_s * n / per)
    print(f"responses {per:.0f}/{n}; tokens per response {partial.tokens_per_step / per:.0f} vs {sync.tokens_per_step / n:.0f}; "
          f"generated {partial.generated_tokens_per_step / per:.0f} vs {sync.generated_tokens_per_step / n:.0f}; "
          f"step {partial.normalized_step_time_s:.2f} vs {sync.step_time_s:.2f} s")


def test_partial_rollout_is_not_faster_than_its_own_work(runs: tuple[SimResult, SimResult]) -> None:
    _, partial = runs
    # No free lunch: the normalised step is above the work-depth bound of the work it did.
    assert partial.normalized_step_time_s >= partial.bounds.lower_bound_s

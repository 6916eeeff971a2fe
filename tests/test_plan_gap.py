"""What keeps a plan from its work-depth bound (rlperf.plan.gap), named from its simulation: the
parts of the least idle pool's step past the bound add up to the step (closed form), and the
largest one is named."""

from __future__ import annotations

import dataclasses

import pytest

from rlperf.plan.gap import bound_gap
from rlperf.scenario import Scenario, load_scenario
from rlperf.sim.result import SimResult
from rlperf.sim.run import run_scenario


def _scenario(placement: dict[str, object]) -> Scenario:
    return load_scenario({
        "name": "gap",
        "model": "Qwen2.5-0.5B",
        "cluster": {"gpu": "H100", "num_nodes": 1, "gpus_per_node": 2},
        "workload": {"prompts_per_step": 8, "group_size": 4,
                     "prompt_length": {"kind": "uniform", "min_tokens": 16, "max_tokens": 256},
                     "response_length": {"kind": "lognormal", "median_tokens": 300, "sigma": 0.8, "cap_tokens": 1200}},
        "algorithm": {"name": "GRPO", "minibatches": 1},
        "plan": {"placement": placement, "layouts": {"actor": {"max_tokens_per_microbatch": 4096}}},
        "simulation": {"iterations": 2, "warmup": 1},
    })


@pytest.fixture(scope="module")
def colocated() -> SimResult:
    return run_scenario(_scenario({"kind": "colocated"}), timeline=False)


@pytest.fixture(scope="module")
def split() -> SimResult:
    return run_scenario(_scenario({"kind": "disaggregated", "rollout_gpus": 1}), timeline=False)


@pytest.mark.parametrize("which", ["colocated", "split"])
def test_parts_of_the_decomposed_pool_add_up_to_its_step(which: str, request: pytest.FixtureRequest) -> None:
    r: SimResult = request.getfixturevalue(which)
    g = bound_gap(r)
    pool = next(p for p in r.pools if p.name == g.pool)
    # A synchronous step serializes its stages: idle + Σ (time - work / P) + W / P is the step.
    work = sum(s.work_s for s in r.stages if s.pool == pool.name) / pool.num_gpus
    assert sum(t.seconds for t in g.terms) + work == pytest.approx(r.step_time_s, rel=0.02)
    assert g.ratio == pytest.approx(r.bounds.ratio)
    assert [t.seconds for t in g.terms] == sorted((t.seconds for t in g.terms), reverse=True)
    assert g.terms[0].detail in g.headline()


def test_a_synchronous_split_names_the_waiting_pool(split: SimResult) -> None:
    g = bound_gap(split)
    # On split pools a synchronous step runs one pool at a time: even the busier pool waits for
    # the other, for about the other's stages (the weight sync and the reward overlap a little).
    idle = next(t for t in g.terms if t.kind == "pool_idle")
    pool = next(p for p in split.pools if p.name == g.pool)
    other = sum(s.time_s for s in split.stages if s.pool not in (g.pool, "cpu") and s.name != "weight_sync")
    assert idle.seconds == pytest.approx(pool.idle_s_per_step) and idle.seconds == pytest.approx(other, rel=0.1)
    assert f"pool {g.pool}" in idle.detail


def test_colocated_rollout_past_its_roofline_is_named(colocated: SimResult) -> None:
    g = bound_gap(colocated)
    assert g.pool == "all" and not any(t.kind == "pool_idle" and t.seconds > 1e-6 for t in g.terms)
    gen = colocated.stage("generate")
    rollout = sum(t.seconds for t in g.terms if t.kind in ("rollout_tail", "decode_below_roofline"))
    assert rollout == pytest.approx(gen.time_s - gen.work_s / 2, rel=1e-9)


def test_an_idle_pool_outweighs_the_stages_when_it_waits_longer(colocated: SimResult) -> None:
    pools = tuple(dataclasses.replace(p, idle_s_per_step=10 * colocated.step_time_s) for p in colocated.pools)
    g = bound_gap(dataclasses.replace(colocated, pools=pools))
    assert g.terms[0].kind == "pool_idle" and g.terms[0].seconds == pytest.approx(10 * colocated.step_time_s)

"""The planner: feasibility, monotonicity in GPUs, baselines, JSON schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlperf.plan.search import Mapper, PlanSearchResult, local_mapper, search
from rlperf.plan.serialize import search_json
from rlperf.plan.space import SearchOptions
from rlperf.scenario import Scenario, load_scenario
from rlperf.sim.costs import AnalyticCosts

ROOT = Path(__file__).resolve().parent.parent


def small_scenario(nodes: int, model: str = "Qwen2.5-0.5B") -> Scenario:
    return load_scenario({
        "name": f"small-{nodes}",
        "model": model,
        "cluster": {"gpu": "H100", "num_nodes": nodes, "gpus_per_node": 4},
        "workload": {
            "prompts_per_step": 16, "group_size": 4,
            "prompt_length": {"kind": "uniform", "min_tokens": 32, "max_tokens": 256},
            "response_length": {"kind": "lognormal", "median_tokens": 400, "sigma": 0.9, "cap_tokens": 2048},
            "group_length_correlation": 0.5,
        },
        "algorithm": {"name": "GRPO", "minibatches": 2},
        "plan": {"layouts": {"actor": {"max_tokens_per_microbatch": 8192}}},
    })


@pytest.fixture(scope="module")
def two_nodes() -> PlanSearchResult:
    return search(small_scenario(2), SearchOptions(top_k=2), local_mapper(1))


@pytest.fixture(scope="module")
def one_node() -> PlanSearchResult:
    return search(small_scenario(1), SearchOptions(top_k=2), local_mapper(1))


def test_best_is_no_worse_than_framework_defaults(two_nodes: PlanSearchResult) -> None:
    assert two_nodes.baselines
    for b in two_nodes.baselines:
        if b.sim is not None:
            assert two_nodes.best.step_time_s <= b.step_time_s * (1 + 1e-9)


def test_planner_never_returns_a_plan_its_memory_model_rejects(two_nodes: PlanSearchResult) -> None:
    sc = small_scenario(2)
    for e in (two_nodes.best, *two_nodes.evaluated):
        assert e.sim is not None
        sub = Scenario(sc.spec, sc.models, sc.cluster.model_copy(update={"num_nodes": e.num_gpus // 4}), sc.workload, sc.algorithm)
        AnalyticCosts(sub.with_plan(e.plan))  # layouts divide the model
        for p in e.sim.pools:
            assert p.peak_memory_bytes <= p.capacity_bytes


def test_adding_gpus_never_makes_the_best_plan_slower(one_node: PlanSearchResult, two_nodes: PlanSearchResult) -> None:
    assert two_nodes.best.step_time_s <= one_node.best.step_time_s * (1 + 1e-9)


def test_rejections_keep_their_reason() -> None:
    res = search(small_scenario(1, model="Qwen2.5-14B"), SearchOptions(top_k=1), local_mapper(1))
    assert res.rejected
    assert all(r.reason and "\n" not in r.reason for r in res.rejected)


def test_json_output_validates_against_the_documented_schema(two_nodes: PlanSearchResult) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((ROOT / "docs" / "plan.schema.json").read_text())
    doc = json.loads(json.dumps(search_json(two_nodes), default=float))
    jsonschema.validate(doc, schema)
    assert doc["best"]["step_time_s"] == pytest.approx(two_nodes.best.step_time_s)


def test_without_the_timeline_the_best_plan_is_the_same_without_engine_segments(two_nodes: PlanSearchResult) -> None:
    """``timeline=False`` (``rlperf plan`` without ``--report``) skips the best plan's second
    simulation, which only adds the engine timeline: the same plan and figures."""
    bare = search(small_scenario(2), SearchOptions(top_k=2), local_mapper(1), timeline=False)
    assert bare.best.plan == two_nodes.best.plan and bare.best.sim is not None and two_nodes.best.sim is not None
    assert bare.best.sim.to_dict() == two_nodes.best.sim.to_dict()
    assert len(bare.best.sim.segments) < len(two_nodes.best.sim.segments)


def test_a_plan_simulated_above_the_staleness_limit_defers_its_siblings() -> None:
    """Plans that differ only in training layouts share a simulated plan's lag: once one is
    simulated above ``max_staleness``, the rest of its engines/split/mode wait with the deferred
    plans instead of spending the simulation budget (at most one batch per such group)."""
    import dataclasses
    from collections import Counter

    from collections.abc import Sequence

    from rlperf.plan.search import _simulate_one
    from rlperf.specs.plan import Plan
    from rlperf.sim.result import SimResult

    over: Counter[tuple[int, str, str, str]] = Counter()

    def lagging_mapper(fn: object, items: Sequence[tuple[Scenario, Plan]]) -> list[SimResult | str]:
        # Every non-sync plan reported two versions stale, above the limit of 1.
        out: list[SimResult | str] = []
        for sc, plan in items:
            r = _simulate_one((sc, plan))
            if isinstance(r, SimResult) and plan.mode.kind != "sync":
                r = dataclasses.replace(r, staleness=(2,) * max(1, len(r.staleness)))
                over[(sc.cluster.num_gpus, plan.mode.model_dump_json(), plan.placement.model_dump_json(),
                      plan.rollout.model_dump_json())] += 1
            out.append(r)
        return out

    opts = SearchOptions(max_staleness=1, top_k=8, sim_batch=2)
    res = search(small_scenario(2), opts, lagging_mapper)
    assert over, "the scenario simulates no asynchronous plan: the test checks nothing"
    assert max(over.values()) <= opts.sim_batch, over
    assert res.best.staleness <= opts.max_staleness


def _lagging_first(n: int, calls: list[str]) -> Mapper:
    """A mapper whose first ``n`` simulated plans report two versions of lag."""
    import dataclasses
    from collections.abc import Sequence

    from rlperf.plan.search import _simulate_one
    from rlperf.sim.result import SimResult
    from rlperf.specs.plan import Plan

    def mapper(fn: object, items: Sequence[tuple[Scenario, Plan]]) -> list[SimResult | str]:
        out: list[SimResult | str] = []
        for sc, plan in items:
            r = _simulate_one((sc, plan))
            calls.append(plan.mode.kind)
            if isinstance(r, SimResult) and len(calls) <= n:
                r = dataclasses.replace(r, staleness=(2,) * max(1, len(r.staleness)))
            out.append(r)
        return out

    return mapper


def test_a_budget_spent_on_plans_over_the_staleness_limit_does_not_end_the_search() -> None:
    """The framework defaults and the one plan of the budget (top_k 1 on 4 GPUs) all simulated
    two versions stale against a limit of 1: the search answered "no feasible plan" beside
    feasible plans it had not simulated. It goes on, up to 4x the budget."""
    calls: list[str] = []
    opts = SearchOptions(max_staleness=1, top_k=1, sim_batch=1)
    res = search(small_scenario(1), opts, _lagging_first(3, calls), include_user_plan=False, timeline=False)
    assert len(calls) > 3 and res.best.staleness <= opts.max_staleness


def test_a_search_that_finds_only_lagging_plans_says_so() -> None:
    """Every simulated plan over the staleness limit: the error names them and the limit after
    4x the budget, not only the candidates the memory model refused."""
    from rlperf.errors import SpecError

    calls: list[str] = []
    with pytest.raises(SpecError) as err:
        search(small_scenario(1), SearchOptions(max_staleness=1, top_k=1, sim_batch=1), _lagging_first(10**6, calls),
               include_user_plan=False, timeline=False)
    baselines = 2
    assert len(calls) == baselines + 4
    assert f"{len(calls)} simulated plans lag up to 2 versions, above --max-staleness 1" in str(err.value)

"""Example scenarios end to end with the analytic cost models: load, simulate, trace, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlperf.errors import SpecError
from rlperf.scenario import list_scenarios, load_scenario
from rlperf.sim.run import run_scenario
from rlperf.sim.trace import chrome_trace


def small(name: str, prompts: int = 32, iterations: int = 3):  # type: ignore[no-untyped-def]
    """An example scenario with a smaller batch (same model, cluster, plan), for CI speed."""
    import yaml

    path = Path(__file__).resolve().parent.parent / "src" / "rlperf" / "scenarios" / f"{name}.yaml"
    data = yaml.safe_load(path.read_text())
    wl = dict(data["workload"])
    wl["prompts_per_step"] = prompts
    data["workload"] = wl
    data["simulation"] = {"iterations": iterations, "warmup": 1}
    return load_scenario(data)


@pytest.mark.parametrize("name", list_scenarios())
def test_every_example_scenario_resolves(name: str) -> None:
    sc = load_scenario(name)
    assert sc.cluster.num_gpus >= 1 and sc.workload.num_responses >= 1


EXAMPLES = [
    "grpo-qwen2.5-7b-colocated-sync",
    "grpo-qwen2.5-7b-one-step-off",
    "grpo-qwen2.5-7b-partial-rollout",
    "ppo-qwen2.5-7b-fusion",
    "ppo-qwen2.5-7b-hybrid",
    "remax-qwen2.5-7b",
    "prime-qwen2.5-7b",
    "gspo-qwen3-30b-a3b",
]


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_simulate_with_a_trace_span_for_every_stage(name: str) -> None:
    r = run_scenario(small(name))
    assert r.step_time_s > 0
    assert r.bounds.lower_bound_s <= r.step_time_s * (1 + 1e-9)
    for p in r.pools:
        assert 0.0 <= p.utilization <= 1.0
    trace = json.loads(json.dumps(chrome_trace(r.segments, name)))
    events = trace["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    assert {m["name"] for m in meta} >= {"process_name", "thread_name"}
    for e in spans:
        assert {"name", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert e["dur"] >= 0 and e["ts"] >= 0
    names = {e["name"].split("/", 1)[0] for e in spans}
    for s in r.stages:
        assert s.name in names, (s.name, names)


def test_same_seed_gives_byte_identical_json() -> None:
    a = run_scenario(small("grpo-qwen2.5-7b-one-step-off"))
    b = run_scenario(small("grpo-qwen2.5-7b-one-step-off"))
    ja = json.dumps(a.to_dict(with_segments=True), sort_keys=True, default=float)
    jb = json.dumps(b.to_dict(with_segments=True), sort_keys=True, default=float)
    assert ja == jb


def test_infeasible_plan_says_why() -> None:
    import yaml

    path = Path(__file__).resolve().parent.parent / "src" / "rlperf" / "scenarios" / "grpo-qwen2.5-7b-colocated-sync.yaml"
    data = yaml.safe_load(path.read_text())
    data["model"] = "Llama-3.1-405B"
    data["plan"]["rollout"] = {"tp": 1}
    with pytest.raises(SpecError) as ei:
        run_scenario(load_scenario(data))
    assert "\n" not in str(ei.value)


def test_bad_scenario_field_is_named() -> None:
    with pytest.raises(SpecError, match=r"plan\.mode\.kind"):
        load_scenario({"plan": {"mode": {"kind": "warp"}}})

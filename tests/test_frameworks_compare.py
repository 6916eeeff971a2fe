"""`rlperf compare`: each framework's default plan on the same workload and cluster; and the
import/export commands. Simulated with the toy costs of tests/helpers (closed forms), so these
tests check the plumbing, not the cost model."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import rlperf.frameworks
import rlperf.frameworks.compare as compare_mod
from rlperf.errors import SpecError
from rlperf.frameworks.compare import compare_frameworks
from rlperf.scenario import Scenario, ScenarioSpec, load_scenario_spec
from rlperf.sim.result import SimResult
from rlperf.sim.run import sim_config
from rlperf.sim.simulate import simulate
from tests.helpers.toy_costs import ToyCosts

EX = Path(rlperf.frameworks.__file__).parent / "examples"


def toy(sc: Scenario) -> SimResult:
    return simulate(sim_config(sc), ToyCosts())


def small(name: str = "grpo-qwen2.5-7b-colocated-sync") -> ScenarioSpec:
    spec = load_scenario_spec(name)
    workload = {**spec.workload, "prompts_per_step": 16, "group_size": 4}
    sim = spec.simulation.model_copy(update={"iterations": 3, "warmup": 1})
    return spec.model_copy(update={"workload": workload, "simulation": sim})


def test_compare_runs_every_framework_or_says_why() -> None:
    runs = compare_frameworks(small(), simulate=toy)
    by = {r.framework: r for r in runs}
    assert len(runs) == 10
    for name in ("DeepSpeed-Chat", "ReaL", "RLHFuse", "StreamRL"):  # PPO-only systems
        assert by[name].result is None and by[name].reason is not None and "GRPO is not among" in by[name].reason
    for name in ("verl", "OpenRLHF", "NeMo-RL", "AReaL", "slime", "TRL"):
        r = by[name]
        assert r.result is not None and r.reason is None, (name, r.reason)
        assert r.result.step_time_s > 0 and r.longest_stage in {s.name for s in r.result.stages}
        assert r.result.num_gpus == 64
    assert by["AReaL"].result is not None and by["AReaL"].result.mode.startswith("async")
    assert by["verl"].plan is not None and by["verl"].plan.placement.kind == "colocated"


def test_compare_subset_and_rejected_plan() -> None:
    def reject(sc: Scenario) -> SimResult:
        raise SpecError("plan.layouts.actor", "does not fit in memory")

    runs = compare_frameworks(small(), ["verl", "TRL"], simulate=reject)
    assert [r.framework for r in runs] == ["verl", "TRL"]
    assert all(r.result is None and r.reason and r.reason.startswith("plan rejected: plan.layouts.actor") for r in runs)


def test_cli_compare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import yaml

    from rlperf.cli.app import _register, app

    monkeypatch.setattr(compare_mod, "_default_simulate", toy)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(small("ppo-qwen2.5-7b-fusion").model_dump(mode="json")))
    _register()
    out = CliRunner().invoke(app, ["compare", str(path), "--frameworks", "verl,RLHFuse,AReaL"], env={"COLUMNS": "250"})
    assert out.exit_code == 0, out.output
    assert "verl" in out.output and "RLHFuse" in out.output and "+fusion" in out.output
    js = CliRunner().invoke(app, ["compare", str(path), "--frameworks", "TRL", "--json"])
    assert js.exit_code == 0 and '"step_time_s"' in js.output


def test_cli_import_writes_a_loadable_scenario(tmp_path: Path) -> None:
    from rlperf.cli.app import _register, app
    from rlperf.frameworks import import_verl, read_overrides

    _register()
    out = tmp_path / "imported.yaml"
    overrides = read_overrides(EX / "verl_grpo_qwen2.5_7b.overrides")
    res = CliRunner().invoke(
        app, ["import", "verl", str(EX / "verl_grpo_qwen2.5_7b.yaml"), *overrides, "--gpu", "H200", "--out", str(out)],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    assert "trainer.my_custom_flag" in res.output  # unknown keys are printed
    expected, _ = import_verl(EX / "verl_grpo_qwen2.5_7b.yaml", overrides, gpu="H200")
    assert load_scenario_spec(out) == expected


def test_cli_export_lists_what_cannot_be_said() -> None:
    from rlperf.cli.app import _register, app

    _register()
    res = CliRunner().invoke(app, ["export", "ppo-qwen2.5-7b-hybrid", "--to", "verl"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "python3 -m" in res.output and "not expressible: hybrid pools" in res.output
    res = CliRunner().invoke(app, ["export", "grpo-qwen2.5-7b-colocated-sync", "--to", "openrlhf"])
    assert res.exit_code == 0 and "--colocate_all_models" in res.output


# ---------------------------------------------------------------------- with the analytic costs
IMPORTED = [
    ("verl", "verl_grpo_qwen2.5_7b.yaml", "verl_grpo_qwen2.5_7b.overrides"),
    ("verl", "verl_ppo_megatron_qwen2.5_32b.yaml", None),
    ("verl", "verl_grpo_fully_async.yaml", None),
    ("verl", "verl_one_step_off.overrides", None),
    ("openrlhf", "openrlhf_ppo_llama3.1_8b.sh", None),
    ("openrlhf", "openrlhf_grpo_qwen2.5_7b_hybrid.sh", None),
]


@pytest.mark.parametrize("kind,config,overrides", IMPORTED)
def test_imported_examples_simulate(kind: str, config: str, overrides: str | None) -> None:
    from rlperf.frameworks import load_framework_config, read_overrides
    from rlperf.scenario import resolve
    from rlperf.sim.run import run_scenario

    spec, _ = load_framework_config(kind, EX / config, read_overrides(EX / overrides) if overrides else [])
    spec = spec.model_copy(update={"simulation": spec.simulation.model_copy(update={"iterations": 2, "warmup": 1})})
    r = run_scenario(resolve(spec))
    assert r.step_time_s > 0 and r.num_gpus == resolve(spec).cluster.num_gpus
    assert r.placement == spec.plan.placement.kind


def test_cpu_adam_runs_at_the_profiles_host_rate() -> None:
    """OpenRLHF's --adam_offload becomes a CPU optimizer, costed from the hardware profile's host
    memory figures (host_memory_bandwidth_bytes_per_s, host_adam_efficiency)."""
    from rlperf.frameworks import load_framework_config
    from rlperf.scenario import resolve
    from rlperf.sim.run import run_scenario

    spec, _ = load_framework_config("openrlhf", EX / "openrlhf_reinforce_async.sh", [])
    spec = spec.model_copy(update={"simulation": spec.simulation.model_copy(update={"iterations": 2, "warmup": 1})})
    assert spec.plan.layouts["actor"].offload_optimizer
    r = run_scenario(resolve(spec))
    assert r.step_time_s > 0
    assert r.stage("actor_update").time_s > 0


def test_compare_with_analytic_costs() -> None:
    runs = compare_frameworks(small(), ["verl", "AReaL", "TRL", "ReaL"])
    by = {r.framework: r for r in runs}
    assert by["ReaL"].result is None
    for name in ("verl", "AReaL", "TRL"):
        r = by[name].result
        assert r is not None and r.step_time_s > 0 and r.num_gpus == 64, by[name].reason
        assert r.placement == ("disaggregated" if name == "AReaL" else "colocated")

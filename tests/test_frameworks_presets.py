"""Framework presets: the registry, the support matrix, and default plans that respect both the
preset's own support entries and the cluster."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rlperf.errors import SpecError
from rlperf.frameworks import STRATEGIES, get_framework, list_frameworks, register_framework
from rlperf.frameworks.default_plan import build_default_plan
from rlperf.frameworks.presets import STRATEGY_GROUPS
from rlperf.scenario import load_scenario_spec, resolve

NAMES = ["verl", "OpenRLHF", "DeepSpeed-Chat", "NeMo-RL", "AReaL", "slime", "ReaL", "RLHFuse", "StreamRL", "TRL"]
SCENARIOS = ["grpo-qwen2.5-7b-colocated-sync", "ppo-qwen2.5-7b-fusion", "dapo-qwen2.5-32b-colocated"]


def test_all_ten_frameworks_registered_once() -> None:
    assert [p.name for p in list_frameworks()] == NAMES
    assert get_framework("hybridflow").name == "verl" and get_framework("openrlhf").name == "OpenRLHF"


def test_duplicate_registration_rejected() -> None:
    with pytest.raises(SpecError, match="already registered"):
        register_framework(lambda: get_framework("verl"))


def test_unknown_framework_suggests() -> None:
    with pytest.raises(SpecError, match="verl"):
        get_framework("verll")


def test_matrix_covers_every_strategy_once() -> None:
    grouped = [s for _, group in STRATEGY_GROUPS for s in group]
    assert sorted(grouped) == sorted(STRATEGIES) and len(grouped) == len(set(grouped))
    for p in list_frameworks():
        assert [s for s, _ in sorted(p.support)] == sorted(STRATEGIES)
        for s in STRATEGIES:
            assert p.supports(s).level in ("yes", "partial", "no", "unknown")


def test_defaults_use_supported_strategies_and_documented_algorithms() -> None:
    from rlperf.algorithms import get_algorithm

    for p in list_frameworks():
        d = p.defaults
        used = [d.placement, "sync" if d.mode == "sync" else d.mode] + (["fusion"] if d.fusion else [])
        for s in used:
            assert p.supports(s).level in ("yes", "partial"), (p.name, s)  # type: ignore[arg-type]
        for name in p.algorithms:
            assert get_algorithm(name).name == name


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name", NAMES)
def test_default_plan_fits_the_cluster(name: str, scenario: str) -> None:
    spec = load_scenario_spec(scenario)
    preset = get_framework(name)
    reason = preset.why_not(spec)
    if reason is not None:
        assert "documented algorithms" in reason
        with pytest.raises(SpecError):
            preset.default_plan(spec)
        return
    default = build_default_plan(preset, spec)
    plan = default.plan
    sc = resolve(spec.model_copy(update={"plan": plan}))
    total = sc.cluster.num_gpus
    pools, assign = plan.placement.resolve(total)
    size = {p.name: p.num_gpus for p in pools}
    e = plan.rollout
    assert e.tp * e.pp * e.replicas <= size[assign["generate"]]
    lay = plan.layout_for("actor")
    assert lay.dp * lay.tp * lay.pp * lay.cp <= size[assign["actor"]]
    assert plan.placement.kind == preset.defaults.placement
    # the framework's training backend sets the layout's (Megatron's host costs; DeepSpeed as FSDP)
    assert lay.backend == ("megatron" if preset.defaults.backend == "megatron" else "fsdp")
    assert (plan.mode.kind, plan.mode.fusion) == (preset.defaults.mode, preset.defaults.fusion)
    # the engine holds the bf16 weights in at most half its memory share, or the notes say why not
    weights = sc.models["actor"].weight_bytes("bf16") / e.tp
    fits = weights <= 0.5 * e.gpu_memory_utilization * sc.cluster.accelerator.device_memory_bytes
    assert fits or any("exceed" in n for n in default.notes)
    assert default.notes[0].startswith(f"{preset.name} defaults")


def test_default_plan_documented_numbers() -> None:
    spec = load_scenario_spec("grpo-qwen2.5-7b-colocated-sync")  # Qwen2.5-7B on 64 H100
    verl = get_framework("verl").default_plan(spec)
    assert (verl.rollout.tp, verl.rollout.gpu_memory_utilization, verl.rollout.max_num_seqs) == (2, 0.5, 1024)
    assert verl.layout_for("actor").zero_stage == 3 and verl.layout_for("actor").cp_kind == "ulysses"
    areal = get_framework("AReaL").default_plan(spec)
    assert (areal.placement.kind, areal.placement.rollout_gpus) == ("disaggregated", 48)  # 3:1
    assert (areal.mode.kind, areal.mode.staleness) == ("async", 2)
    trl = build_default_plan(get_framework("TRL"), spec)
    assert trl.plan.rollout.gpu_memory_utilization == 0.3
    assert trl.plan.rollout.tp == 2 and any("tp 1 -> 2" in n for n in trl.notes)  # 15 GB > 0.15 x 80 GB
    openrlhf = get_framework("OpenRLHF").default_plan(spec)
    assert not openrlhf.rollout.prefix_sharing and openrlhf.offload_between_phases


def test_cli_matrix_and_detail() -> None:
    from rlperf.cli.app import _register, app

    _register()
    runner = CliRunner()
    out = runner.invoke(app, ["frameworks"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    for name in NAMES:
        assert name in out.output
    detail = runner.invoke(app, ["frameworks", "AReaL"], env={"COLUMNS": "200"})
    assert detail.exit_code == 0 and "[areal-readme]" in detail.output and "max_head_offpolicyness" in detail.output
    js = runner.invoke(app, ["frameworks", "--json"])
    assert js.exit_code == 0 and '"OpenRLHF"' in js.output

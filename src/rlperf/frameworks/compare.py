"""The same workload as each framework would run it: its default plan on the same cluster.

:func:`compare_frameworks` gives one :class:`FrameworkRun` per framework: the default plan and
its simulated result, or the reason the framework cannot run the workload (an algorithm it does
not document, a cluster its default placement cannot split) or the simulation rejected the plan
(e.g. memory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlperf.errors import SpecError
from rlperf.frameworks.default_plan import build_default_plan
from rlperf.frameworks.presets import get_framework, list_frameworks
from rlperf.scenario import Scenario, ScenarioSpec, resolve
from rlperf.sim.result import SimResult
from rlperf.specs.plan import Plan

Simulate = Callable[[Scenario], SimResult]


@dataclass(frozen=True)
class FrameworkRun:
    framework: str
    plan: Plan | None
    result: SimResult | None
    reason: str | None
    """Why there is no result: the framework cannot run the workload, or the plan was rejected."""
    notes: tuple[str, ...] = ()

    @property
    def longest_stage(self) -> str | None:
        """The stage with the largest mean time per step (the bottleneck of a synchronous step)."""
        if self.result is None or not self.result.stages:
            return None
        return max(self.result.stages, key=lambda s: s.time_s).name


def _default_simulate(sc: Scenario) -> SimResult:
    from rlperf.sim.run import run_scenario

    return run_scenario(sc)


def compare_frameworks(
    spec: ScenarioSpec,
    frameworks: Sequence[str] | None = None,
    *,
    simulate: Simulate | None = None,
) -> list[FrameworkRun]:
    """Simulate ``spec``'s workload and cluster under each framework's default plan.

    ``simulate`` runs one resolved scenario (default: the analytic simulator); tests pass a
    stand-in."""
    run = simulate or _default_simulate
    presets = [get_framework(n) for n in frameworks] if frameworks else list_frameworks()
    out: list[FrameworkRun] = []
    for preset in presets:
        reason = preset.why_not(spec)
        if reason is not None:
            out.append(FrameworkRun(preset.name, None, None, f"cannot run: {reason}"))
            continue
        default = build_default_plan(preset, spec)
        scenario = resolve(spec.model_copy(update={"plan": default.plan, "name": f"{spec.name}@{preset.name}"}))
        try:
            result = run(scenario)
        except SpecError as err:
            out.append(FrameworkRun(preset.name, default.plan, None, f"plan rejected: {err}", default.notes))
            continue
        out.append(FrameworkRun(preset.name, default.plan, result, None, default.notes))
    return out

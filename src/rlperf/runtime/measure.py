"""Measured vs predicted: repeat a real step, simulate the same scenario, compare per stage.

The measured figure of a stage is its *best* time over the repeats (the least disturbed run, as
the calibration's micro-benchmarks, so both sides describe the undisturbed device); the median
is reported next to it. Every repeat runs the same step (the same length draw), so the repeats
differ only in noise and in the weights the previous updates left.

The prediction runs the simulator on the same scenario with the same hardware profile, for one
iteration without warm-up: iteration 0 draws the same lengths as the measured step 0.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from rlperf.runtime.step import RuntimeOptions, StepResult, StepRunner
from rlperf.scenario import ScenarioSpec, resolve
from rlperf.sim.result import SimResult

RUNTIME_SCENARIOS = Path(__file__).parent / "scenarios"

# What the simulator models that the reference runtime does not run (colocated, one module).
NOT_IN_RUNTIME = {
    "weight_sync": "the runtime generates with the training module itself: no weight sync",
    "offload": "the runtime keeps everything resident: no offload between phases",
    "onload": "the runtime keeps everything resident: no offload between phases",
}


@dataclass(frozen=True)
class Measurement:
    runs: tuple[StepResult, ...]
    load_average: float  # 1-minute load average after the runs (os.getloadavg), nan if unknown
    cpus: int

    @property
    def last(self) -> StepResult:
        return self.runs[-1]

    def stage_names(self) -> list[str]:
        return [s.name for s in self.runs[0].stages]

    def stage_best(self, name: str) -> float:
        return min(r.stage(name) for r in self.runs)

    def stage_median(self, name: str) -> float:
        return statistics.median(r.stage(name) for r in self.runs)

    @property
    def step_best_s(self) -> float:
        return min(r.step_time_s for r in self.runs)

    @property
    def step_median_s(self) -> float:
        return statistics.median(r.step_time_s for r in self.runs)


def measure(spec: ScenarioSpec, options: RuntimeOptions | None = None, repeats: int = 3) -> Measurement:
    assert repeats >= 1
    runner = StepRunner(spec, options)
    runs = tuple(runner.run() for _ in range(repeats))
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    return Measurement(runs, load, os.cpu_count() or 1)


def predict(spec: ScenarioSpec, profile: str | Path | None) -> SimResult:
    """The simulator's prediction of step 0 of ``spec`` with the hardware profile ``profile``."""
    from rlperf.sim.run import run_scenario

    cluster = spec.cluster if profile is None else spec.cluster.model_copy(update={"profile": str(profile)})
    sim = spec.simulation.model_copy(update={"iterations": 1, "warmup": 0})
    return run_scenario(resolve(spec.model_copy(update={"cluster": cluster, "simulation": sim})))


@dataclass(frozen=True)
class StageRow:
    name: str
    measured_s: float | None
    measured_median_s: float | None
    predicted_s: float | None

    @property
    def error(self) -> float | None:
        """predicted / measured - 1 (None unless both exist)."""
        if self.measured_s is None or self.predicted_s is None or self.measured_s <= 0:
            return None
        return self.predicted_s / self.measured_s - 1.0


@dataclass(frozen=True)
class Comparison:
    scenario: str
    rows: tuple[StageRow, ...]
    measured_step_s: float
    predicted_step_s: float
    notes: tuple[str, ...]

    @property
    def step_error(self) -> float:
        return self.predicted_step_s / self.measured_step_s - 1.0


def unmodelled(profile: str | Path | None, num_layers: int, meas: Measurement) -> list[str]:
    """What the calibration measured that the cost model has no term for, sized for this step."""
    if profile is None:
        return []
    from rlperf.inputs import load_json, load_yaml

    data = (load_json(profile, "hardware_profile") if str(profile).lower().endswith(".json")
            else load_yaml(profile, "hardware_profile")) or {}
    if not isinstance(data, dict):
        return []  # predict() has already refused a profile that is not a mapping
    m = data.get("measurements") or {}
    notes: list[str] = []
    eng = m.get("engine_step_s")
    # Profiles written by calibrate since the engine model gained a per-step term carry the cost as
    # engine_step_overhead_s: the prediction includes it, so there is nothing to note.
    if isinstance(eng, dict) and "fixed_s" in eng and "engine_step_overhead_s" not in data:
        per_step = float(eng["fixed_s"]) + num_layers * float(eng["per_layer_s"])
        steps = meas.last.decode_steps
        notes.append(
            f"generate: HF generate's framework cost per decode step, from the calibration ({1e3 * float(eng['fixed_s']):.2f} ms "
            f"+ {1e3 * float(eng['per_layer_s']):.2f} ms per layer), is ~{per_step * steps:.2f} s over the {steps} decode steps; "
            "the simulator's engine (vLLM-like: CUDA-graph decode steps, continuous batching) has no such term"
        )
    return notes


def compare(meas: Measurement, sim: SimResult, extra_notes: list[str] | None = None) -> Comparison:
    rows: list[StageRow] = []
    predicted = {s.name: s.time_s for s in sim.stages}
    notes: list[str] = list(extra_notes or [])
    for name in meas.stage_names():
        rows.append(StageRow(name, meas.stage_best(name), meas.stage_median(name), predicted.get(name)))
        if name not in predicted:
            notes.append(f"{name}: measured, but the simulator has no such stage")
    for name, t in predicted.items():
        if name not in meas.stage_names():
            rows.append(StageRow(name, None, None, t))
            notes.append(f"{name}: predicted only; {NOT_IN_RUNTIME.get(name, 'the runtime has no such stage')}")
    notes.extend(sim.notes)
    return Comparison(sim.scenario, tuple(rows), meas.step_best_s, sim.step_time_s, tuple(notes))

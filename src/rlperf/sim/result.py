"""Results of a simulation (dataclasses, not dict bags)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rlperf.sim.kernel import Segment


@dataclass(frozen=True)
class StageTime:
    """One stage, averaged over the steady-state iterations."""

    name: str
    pool: str
    time_s: float  # mean duration per iteration
    gpus: int
    work_s: float  # mean device-seconds of work at roofline
    depth_s: float  # mean critical path with unlimited devices
    flops: float
    peak_memory_bytes: float


@dataclass(frozen=True)
class PoolStats:
    name: str
    num_gpus: int
    utilization: float  # allocated GPU-time / (GPUs x steady window), in [0, 1]
    idle_s_per_step: float  # mean idle wall time per step (no GPU of the pool allocated)
    peak_memory_bytes: float
    capacity_bytes: float


@dataclass(frozen=True)
class Bounds:
    """Work-depth bounds for one steady-state step on ``num_gpus`` devices."""

    work_s: float  # device-seconds of all stages of one iteration
    depth_s: float  # longest dependency path of one iteration (unlimited devices)
    num_gpus: int
    staleness: int
    lower_bound_s: float  # max(W/P, D/(staleness+1), max stage depth)
    ratio: float  # predicted step time / lower bound (>= 1 up to modelling slack)


@dataclass(frozen=True)
class SimResult:
    scenario: str
    algorithm: str
    placement: str
    mode: str
    num_gpus: int
    iterations: int
    warmup: int
    step_time_s: float  # steady-state mean time between actor updates
    step_times_s: tuple[float, ...]  # every iteration's (end of update i) - (end of update i-1)
    stages: tuple[StageTime, ...]
    pools: tuple[PoolStats, ...]
    tokens_per_step: float  # prompt + response tokens trained per step (steady state)
    generated_tokens_per_step: float  # response tokens generated per step (incl. oversampling)
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    staleness: tuple[int, ...]  # per trained response (steady state), policy versions behind
    cost_usd_per_step: float | None
    bounds: Bounds
    rollout_tail_s: float  # mean time per step the rollout spends in its last-10% tail
    trained_responses_per_step: float  # mean over steady-state steps
    nominal_responses_per_step: int  # prompts_per_step x group_size
    segments: tuple[Segment, ...] = field(repr=False, default=())
    notes: tuple[str, ...] = ()

    def to_dict(self, with_segments: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_segments:
            d.pop("segments")
        return d

    @property
    def normalized_step_time_s(self) -> float:
        """Step time per nominal batch: a partial rollout whose steady state has not settled
        trains fewer responses in a step; this scales the step to B·G trained responses."""
        if self.trained_responses_per_step <= 0:
            return float("inf")
        return self.step_time_s * self.nominal_responses_per_step / self.trained_responses_per_step

    def stage(self, name: str) -> StageTime:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

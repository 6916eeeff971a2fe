"""Results of a simulation (dataclasses, not dict bags)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rlperf.sim.kernel import Segment


@dataclass(frozen=True)
class StageTime:
    """One stage, averaged over the steady-state iterations: ``time_s`` is the wall time its
    tasks cover per iteration (the union of their spans: fusion waves and DAPO rounds may
    overlap or repeat), ``work_s``/``depth_s``/``flops`` the sums of its costs per iteration."""

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
    """One GPU pool over the steady window ``[w0, w1]``: utilization = Σ allocated GPU·s /
    (GPUs · (w1 - w0)); idle = wall time with no GPU of the pool allocated, per step."""

    name: str
    num_gpus: int
    utilization: float  # allocated GPU-time / (GPUs x steady window), in [0, 1]
    idle_s_per_step: float  # mean idle wall time per step (no GPU of the pool allocated)
    peak_memory_bytes: float
    capacity_bytes: float


@dataclass(frozen=True)
class Bounds:
    """Work-depth lower bound of one steady-state step, for every execution mode.

    ``T >= max( max_p W_p / P_p,  max_p Σ_{whole-pool stages on p} D_stage,  D_iter / (s+1) )``

    Argument (Brent 1974 / Blelloch 1996 applied to a periodic schedule with period ``T``, one
    update per period): (1) every period pool ``p`` performs one iteration's work ``W_p`` on its
    ``P_p`` GPUs; (2) stages that hold all of a pool cannot overlap on it, and each takes at
    least its depth; (3) in a loop with staleness ``s`` the weights of update ``i - 1 - s`` are
    synced before rollout ``i`` starts, so update ``i`` ends at least ``D_iter`` after update
    ``i - 1 - s``, i.e. ``(s + 1)·T >= D_iter``. ``D_iter`` is the longest path through the
    stage graph weighted by depths (a fused stage counts only its shortest wave: the others
    overlap the rollout). ``s`` is the *effective* staleness: an engine that sleeps on the
    training GPUs wakes with the newest weights (``s = 0``). CPU stages count in ``D_iter``
    only. Measured over a finite window the means hold up to the window's end effects.
    """

    work_s: float  # GPU device-seconds of all stages of one iteration (mean over the window)
    depth_s: float  # D_iter: longest dependency path of one iteration (unlimited devices)
    num_gpus: int
    staleness: int  # s, the mode's effective staleness bound
    lower_bound_s: float  # the max above
    ratio: float  # predicted step time / lower bound (>= 1 up to modelling slack)


@dataclass(frozen=True)
class StalenessDistribution:
    """Policy lag of the trained responses: ``counts[k]`` responses were generated (started)
    with the weights ``k`` updates older than the update that trains them. ``bound`` is the
    mode's largest possible lag (None: unbounded, e.g. streaming, where a resumed request keeps
    the version it started with for as many updates as it runs)."""

    counts: tuple[int, ...]
    bound: int | None

    @classmethod
    def of(cls, staleness: tuple[int, ...], bound: int | None) -> StalenessDistribution:
        top = max(staleness, default=0)
        counts = [0] * (top + 1)
        for s in staleness:
            counts[s] += 1
        return cls(tuple(counts), bound)

    @property
    def num_responses(self) -> int:
        return sum(self.counts)

    @property
    def mean(self) -> float:
        n = self.num_responses
        return sum(k * c for k, c in enumerate(self.counts)) / n if n else 0.0

    @property
    def max(self) -> int:
        return max((k for k, c in enumerate(self.counts) if c), default=0)

    def share(self, lag: int) -> float:
        """Fraction of responses with exactly ``lag`` updates of staleness."""
        n = self.num_responses
        return self.counts[lag] / n if n and 0 <= lag < len(self.counts) else 0.0

    def summary(self) -> str:
        """One line for reports: ``0: 62%, 1: 38% (mean 0.38, max 1)``."""
        parts = ", ".join(f"{k}: {100 * self.share(k):.0f}%" for k, c in enumerate(self.counts) if c)
        return f"{parts or 'none'} (mean {self.mean:.2f}, max {self.max})"


@dataclass(frozen=True)
class SimResult:
    """A simulation's steady state. ``step_time_s = (e_{N-1} - e_{w-1}) / (N - w)`` with ``e_i``
    the end of actor update ``i``, ``w`` the warm-up and ``N`` the measured iterations (drain
    iterations, run to keep a pipeline full, are never included). Per-step figures are means
    over the same window; ``staleness`` lists every trained response's policy lag and
    ``staleness_distribution`` summarizes it."""

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
    staleness_distribution: StalenessDistribution
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

"""Run validation cases against the simulator and summarize the error (``rlperf validate``).

For every case the scenario (and, for a speedup, its baseline) is simulated with the analytic
stage costs; the metric is read from the result and compared with the published value:

    error % = 100 (predicted - measured) / measured

The summary gives, per metric kind and per side of the calibration split (see
:func:`rlperf.validation_cases.calibration_split`): the number of cases, the median absolute
percentage error, and the share of cases within 25% and within 50%. Cases whose scenario the
model rejects (e.g. does not fit in memory) are reported as failed, with the reason, and are
not in the error statistics.

Simulations run in worker processes (``jobs``); equal scenarios are simulated once; the result
does not depend on ``jobs`` (every simulation is deterministic and results are keyed, not
ordered by completion).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from rlperf.errors import SpecError
from rlperf.validation_cases import (
    METRIC_KINDS,
    CaseFile,
    Metric,
    Skipped,
    ValidationCase,
    scenario_key,
)

ProfileScale = tuple[tuple[str, float], ...]
"""(calibration parameter, value) pairs applied to every accelerator's profile
(:func:`rlperf.calibration.scale_profile`)."""


@dataclass(frozen=True)
class SimSummary:
    """What a metric needs from one simulation (small, so it crosses process boundaries cheaply)."""

    step_time_s: float
    stage_times_s: tuple[tuple[str, float], ...]
    trained_tokens_per_step: float
    generated_tokens_per_step: float
    trained_samples_per_step: float
    num_gpus: int
    lower_bound_s: float  # the step's work-depth lower bound (SimResult.bounds)
    stage_bounds_s: tuple[tuple[str, float], ...]  # per stage: max(work / its GPUs, depth)

    def stage_time(self, names: Sequence[str]) -> float:
        return self._sum(self.stage_times_s, names)

    def stage_bound(self, names: Sequence[str]) -> float:
        return self._sum(self.stage_bounds_s, names)

    @staticmethod
    def _sum(table: tuple[tuple[str, float], ...], names: Sequence[str]) -> float:
        have = dict(table)
        for n in names:
            if n not in have:
                raise SpecError("metric.stages", f"no stage {n!r} in this scenario", ", ".join(have))
        return float(sum(have[n] for n in names))


@dataclass(frozen=True)
class CaseResult:
    id: str
    metric: str  # kind
    label: str  # kind with unit and stages, for tables
    split: str
    lengths: str  # "published", "assumed" or "not_used" (see Case.lengths)
    source_url: str
    measured: float
    predicted: float  # nan when failed
    failure: str | None = None  # why the model could not predict (one line)
    # Time metrics: the simulated scenario's work-depth lower bound for the same quantity (nan
    # otherwise). A measured time below it means the scenario, as assumed, cannot be what ran
    # (e.g. more tokens than the measured time allows at the profile's efficiencies).
    bound: float = math.nan

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def below_bound(self) -> bool:
        return self.ok and self.measured < self.bound

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted - self.measured) / self.measured

    @property
    def abs_error_pct(self) -> float:
        return abs(self.error_pct)

    @property
    def log_error(self) -> float:
        """|ln(predicted / measured)|: symmetric in over- and under-prediction (the fit's loss)."""
        return abs(math.log(self.predicted / self.measured))


@dataclass(frozen=True)
class ErrorStats:
    """Error statistics of one group of cases."""

    metric: str  # a metric kind, or "all"
    split: str  # "calibration", "holdout" or "all"
    lengths: str  # "published", "assumed", "not_used" or "all"
    num_cases: int
    median_abs_error_pct: float  # nan without cases
    within_25_pct: float  # share of cases with |error| <= 25%, in [0, 1]
    within_50_pct: float


@dataclass(frozen=True)
class ValidationReport:
    cases: tuple[CaseResult, ...]
    skipped: tuple[Skipped, ...]
    summary: tuple[ErrorStats, ...]
    profile: str  # which efficiency profile was used
    notes: tuple[str, ...] = field(default=())

    def stats(self, metric: str = "all", split: str = "all", lengths: str = "all") -> ErrorStats:
        for s in self.summary:
            if s.metric == metric and s.split == split and s.lengths == lengths:
                return s
        raise KeyError((metric, split, lengths))

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "notes": list(self.notes),
            "cases": [
                {
                    "id": c.id, "metric": c.label, "split": c.split, "lengths": c.lengths, "measured": c.measured,
                    "predicted": None if not c.ok else c.predicted,
                    "error_pct": None if not c.ok else c.error_pct,
                    "bound": None if math.isnan(c.bound) else c.bound, "below_bound": c.below_bound,
                    "failure": c.failure, "source_url": c.source_url,
                }
                for c in self.cases
            ],
            "summary": [s.__dict__ for s in self.summary],
            "skipped": [s.model_dump() for s in self.skipped],
        }


# ---------------------------------------------------------------------------- statistics
def error_stats(results: Iterable[CaseResult], metric: str = "all", split: str = "all",
                lengths: str = "all") -> ErrorStats:
    """Median absolute % error and the shares within 25% / 50% of the successful cases."""
    errs = np.array([r.abs_error_pct for r in results if r.ok], dtype=float)
    if errs.size == 0:
        return ErrorStats(metric, split, lengths, 0, math.nan, math.nan, math.nan)
    return ErrorStats(
        metric,
        split,
        lengths,
        int(errs.size),
        float(np.median(errs)),
        float(np.mean(errs <= 25.0)),
        float(np.mean(errs <= 50.0)),
    )


def _select(results: Sequence[CaseResult], kind: str, split: str, lengths: str) -> list[CaseResult]:
    return [
        r for r in results
        if (kind == "all" or r.metric == kind) and (split == "all" or r.split == split)
        and (lengths == "all" or r.lengths == lengths)
    ]


def summarize(results: Sequence[CaseResult]) -> tuple[ErrorStats, ...]:
    """Stats per metric kind (in METRIC_KINDS order) and overall, for every split and all; then
    step times and all kinds again, by whether the response lengths were published or assumed."""
    out: list[ErrorStats] = []
    kinds = [k for k in METRIC_KINDS if any(r.metric == k for r in results)] + ["all"]
    splits = ("calibration", "holdout", "all")
    for kind in kinds:
        for split in splits:
            out.append(error_stats(_select(results, kind, split, "all"), kind, split, "all"))
    for kind in ("step_time_s", "all"):
        for lengths in ("published", "assumed"):
            for split in splits:
                out.append(error_stats(_select(results, kind, split, lengths), kind, split, lengths))
    return tuple(out)


# ---------------------------------------------------------------------------- simulation
def _scaled_profile_scenario(mapping: Mapping[str, Any], scale: ProfileScale) -> Any:
    from rlperf.calibration import scale_profile
    from rlperf.scenario import load_scenario

    sc = load_scenario(mapping)
    if scale:
        cluster = sc.cluster.model_copy(update={"profile": scale_profile(sc.cluster.profile, dict(scale))})
        sc = type(sc)(sc.spec, sc.models, cluster, sc.workload, sc.algorithm)
    return sc


def simulate_mapping(key: str, scale: ProfileScale = ()) -> SimSummary | str:
    """Simulate one scenario (its canonical JSON); a one-line reason instead when it is rejected."""
    from rlperf.sim.run import run_scenario

    mapping = json.loads(key)
    try:
        sc = _scaled_profile_scenario(mapping, scale)
        r = run_scenario(sc)
    except SpecError as err:
        return str(err)
    samples = float(sc.workload.prompts_per_step * sc.workload.group_size)
    return SimSummary(
        step_time_s=r.step_time_s,
        stage_times_s=tuple((s.name, s.time_s) for s in r.stages),
        trained_tokens_per_step=r.tokens_per_step,
        generated_tokens_per_step=r.generated_tokens_per_step,
        trained_samples_per_step=samples,
        num_gpus=r.num_gpus,
        lower_bound_s=r.bounds.lower_bound_s,
        stage_bounds_s=tuple((s.name, max(s.work_s / max(s.gpus, 1), s.depth_s)) for s in r.stages),
    )


def _simulate_star(args: tuple[str, ProfileScale]) -> SimSummary | str:
    return simulate_mapping(*args)


def simulate_all(keys: Sequence[str], scale: ProfileScale = (), jobs: int = 1) -> dict[str, SimSummary | str]:
    """Simulate every distinct scenario key, in ``jobs`` processes; results keyed by scenario."""
    uniq = list(dict.fromkeys(keys))
    if jobs <= 1 or len(uniq) <= 1:
        return {k: simulate_mapping(k, scale) for k in uniq}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        out = list(pool.map(_simulate_star, [(k, scale) for k in uniq], chunksize=1))
    return dict(zip(uniq, out))


def with_profile_file(mapping: Mapping[str, Any], profile_path: str | None) -> dict[str, Any]:
    m = dict(mapping)
    if profile_path is not None:
        m["cluster"] = {**dict(m.get("cluster", {})), "profile": str(profile_path)}
    return m


def _value(metric: Metric, s: SimSummary) -> float:
    """The metric's simulated value for the case's own scenario (speedups: the time it divides)."""
    if metric.kind == "step_time_s":
        return s.step_time_s
    if metric.kind == "weight_sync_time_s":
        return s.stage_time(["weight_sync"])
    if metric.kind == "stage_time_s":
        return s.stage_time(metric.stages)
    if metric.kind == "stage_share":
        return s.stage_time(metric.stages) / s.step_time_s
    if metric.kind == "speedup":
        return s.stage_time(metric.stages) if metric.stages else s.step_time_s
    assert metric.kind == "throughput" and metric.unit is not None
    t = s.stage_time(metric.stages) if metric.stages else s.step_time_s
    if metric.unit.startswith("tokens"):
        work = s.generated_tokens_per_step if metric.tokens == "generated" else s.trained_tokens_per_step
    else:
        work = s.trained_samples_per_step
    rate = work / t
    return rate / s.num_gpus if metric.unit.endswith("per_gpu") else rate


def predict(case: ValidationCase, sims: Mapping[str, SimSummary | str], profile_path: str | None = None) -> CaseResult:
    m = case.spec.metric
    result = partial(CaseResult, id=case.id, metric=m.kind, label=m.label, split=case.split,
                     lengths=case.spec.lengths, source_url=case.spec.source_url, measured=case.spec.measured)
    got = sims[scenario_key(with_profile_file(case.scenario, profile_path))]
    base: SimSummary | str | None = None
    if case.baseline is not None:
        base = sims[scenario_key(with_profile_file(case.baseline, profile_path))]
    for what, s in (("scenario", got), ("baseline", base)):
        if isinstance(s, str):
            return result(predicted=math.nan, failure=f"{what}: {s}")
    assert isinstance(got, SimSummary)
    try:
        value = _value(m, got)
        if m.kind == "speedup":
            assert isinstance(base, SimSummary)
            value = _value(m, base) / value
    except SpecError as err:
        return result(predicted=math.nan, failure=str(err))
    bound = math.nan
    if m.kind == "step_time_s":
        bound = got.lower_bound_s
    elif m.kind == "stage_time_s":
        bound = got.stage_bound(m.stages)
    return result(predicted=float(value), bound=bound)


def case_keys(cases: Iterable[ValidationCase], profile_path: str | None = None) -> list[str]:
    keys: list[str] = []
    for c in cases:
        for sc in (c.scenario, c.baseline):
            if sc is not None:
                keys.append(scenario_key(with_profile_file(sc, profile_path)))
    return keys


def run_cases(cases: Sequence[ValidationCase], scale: ProfileScale = (), jobs: int = 1,
              profile_path: str | None = None) -> tuple[CaseResult, ...]:
    sims = simulate_all(case_keys(cases, profile_path), scale, jobs)
    return tuple(predict(c, sims, profile_path) for c in cases)


def validate(case_file: CaseFile, jobs: int = 1, scale: ProfileScale = (), profile_path: str | None = None,
             profile_label: str | None = None) -> ValidationReport:
    """Run every case of ``case_file`` and summarize."""
    results = run_cases(case_file.cases, scale, jobs, profile_path)
    label = profile_label or (f"profile file {profile_path}" if profile_path else "shipped profiles (uncalibrated)")
    return ValidationReport(results, case_file.skipped, summarize(results), label)

"""Run validation cases against the simulator and summarize the error (``rlperf validate``).

For every case the scenario (and, for a speedup, its baseline) is simulated with the analytic
stage costs; the metric is read from the result and compared with the published value:

    error % = 100 (predicted - measured) / measured

Cases whose source does not publish the response lengths (``lengths: unknown``) are not scored
at a guessed mean: they are simulated at a sweep of means (:class:`rlperf.validation_cases.
LengthSweep`) and reported as a :class:`LengthFit`, the mean response length at which the
prediction equals the measurement (interpolated in log-log between the swept points) and whether
it is plausible (within ``[lower_tokens, cap]``). They do not enter the error statistics.

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
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from rlperf.errors import SpecError
from rlperf.validation_cases import (
    METRIC_KINDS,
    CaseFile,
    LengthPoint,
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
class LengthFit:
    """A case without published lengths, as a function of the mean response length."""

    means_tokens: tuple[float, ...]  # the swept means, ascending
    predicted: tuple[float, ...]  # the prediction at each
    measured: float
    lower_tokens: int  # plausible means: [lower_tokens, cap_tokens]
    cap_tokens: int

    @property
    def matching_mean_tokens(self) -> float:
        """The mean at which the prediction equals the measurement: log-log interpolation
        between swept points, else extrapolation from the nearest end segment (nan: the
        prediction does not move with the mean, or a prediction is not positive)."""
        x = np.log(np.asarray(self.means_tokens, dtype=float))
        v = np.asarray(self.predicted, dtype=float)
        if v.size < 2 or not np.all(v > 0) or not np.all(np.isfinite(v)):
            return math.nan
        y, target = np.log(v), math.log(self.measured)
        for i in range(v.size - 1):
            lo, hi = sorted((y[i], y[i + 1]))
            if lo <= target <= hi and hi > lo:
                return float(math.exp(x[i] + (target - y[i]) * (x[i + 1] - x[i]) / (y[i + 1] - y[i])))
        # outside the swept range: extend the end segment whose prediction is nearer
        i = 0 if abs(target - y[0]) <= abs(target - y[-1]) else v.size - 2
        slope = (y[i + 1] - y[i]) / (x[i + 1] - x[i])
        if abs(slope) < 1e-3:
            return math.nan
        return float(math.exp(x[i] + (target - y[i]) / slope))

    @property
    def plausible(self) -> bool:
        m = self.matching_mean_tokens
        return not math.isnan(m) and self.lower_tokens <= m <= self.cap_tokens

    @property
    def range_text(self) -> str:
        """The predicted range over the sweep, e.g. ``120..4,100``."""
        lo, hi = min(self.predicted), max(self.predicted)
        return f"{_short(lo)}..{_short(hi)}"


def _short(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


@dataclass(frozen=True)
class CaseResult:
    id: str
    metric: str  # kind
    label: str  # kind with unit and stages, for tables
    split: str
    lengths: str  # "published", "unknown" or "not_used" (see Case.lengths)
    source_url: str
    measured: float
    predicted: float  # nan when failed
    failure: str | None = None  # why the model could not predict (one line)
    # Time metrics: the simulated scenario's work-depth lower bound for the same quantity (nan
    # otherwise). A measured time below it means the scenario, as assumed, cannot be what ran
    # (e.g. more tokens than the measured time allows at the profile's efficiencies).
    bound: float = math.nan
    length_fit: LengthFit | None = None  # lengths unknown: the prediction over the swept means

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def scored(self) -> bool:
        """In the error statistics: predicted, at published lengths (or none used)."""
        return self.ok and self.length_fit is None

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
    lengths: str  # "published", "not_used" or "all" (unknown-length cases are never scored)
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

    @property
    def length_fits(self) -> tuple[CaseResult, ...]:
        """The predicted cases without published lengths (scored as a function of the mean)."""
        return tuple(c for c in self.cases if c.ok and c.length_fit is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "notes": list(self.notes),
            "cases": [_case_dict(c) for c in self.cases],
            "summary": [s.__dict__ for s in self.summary],
            "length_fits": {
                "cases": len(self.length_fits),
                "plausible": sum(c.length_fit.plausible for c in self.length_fits if c.length_fit is not None),
            },
            "skipped": [s.model_dump() for s in self.skipped],
        }


def _case_dict(c: CaseResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": c.id, "metric": c.label, "split": c.split, "lengths": c.lengths, "measured": c.measured,
        "predicted": c.predicted if c.scored else None,
        "error_pct": c.error_pct if c.scored else None,
        "bound": None if math.isnan(c.bound) else c.bound, "below_bound": c.below_bound,
        "failure": c.failure, "source_url": c.source_url,
    }
    f = c.length_fit
    if f is not None:
        m = f.matching_mean_tokens
        out["length_fit"] = {
            "means_tokens": list(f.means_tokens), "predicted": list(f.predicted),
            "matching_mean_tokens": None if math.isnan(m) else m, "plausible": f.plausible,
            "plausible_range_tokens": [f.lower_tokens, f.cap_tokens],
        }
    return out


# ---------------------------------------------------------------------------- statistics
def error_stats(results: Iterable[CaseResult], metric: str = "all", split: str = "all",
                lengths: str = "all") -> ErrorStats:
    """Median absolute % error and the shares within 25% / 50% of the successful cases."""
    errs = np.array([r.abs_error_pct for r in results if r.scored], dtype=float)
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
    step times and all kinds again, for the cases whose lengths are published and for those that
    use none. Only scored cases count (unknown-length cases are length fits, not errors)."""
    out: list[ErrorStats] = []
    kinds = [k for k in METRIC_KINDS if any(r.metric == k and r.scored for r in results)] + ["all"]
    splits = ("calibration", "holdout", "all")
    for kind in kinds:
        for split in splits:
            out.append(error_stats(_select(results, kind, split, "all"), kind, split, "all"))
    for kind in ("step_time_s", "all"):
        for lengths in ("published", "not_used"):
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
        r = run_scenario(sc, timeline=False)  # figures only: no engine segments to keep
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


def simulate_all(keys: Sequence[str], scale: ProfileScale = (), jobs: int = 1,
                 pool: Executor | None = None) -> dict[str, SimSummary | str]:
    """Simulate every distinct scenario key, in ``pool`` if given (its workers keep their stage
    caches from call to call: a calibration reuses one pool for every grid point), else in
    ``jobs`` fresh processes; results keyed by scenario."""
    uniq = list(dict.fromkeys(keys))
    if len(uniq) <= 1 or (pool is None and jobs <= 1):
        return {k: simulate_mapping(k, scale) for k in uniq}
    if pool is not None:
        return dict(zip(uniq, pool.map(_simulate_star, [(k, scale) for k in uniq], chunksize=1)))
    with ProcessPoolExecutor(max_workers=jobs) as fresh:
        return dict(zip(uniq, fresh.map(_simulate_star, [(k, scale) for k in uniq], chunksize=1)))


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


def _predict_point(m: Metric, point: LengthPoint, sims: Mapping[str, SimSummary | str],
                   profile_path: str | None) -> tuple[float, float] | str:
    """(value, work-depth bound) of the metric at one point; a one-line reason when it fails."""
    got = sims[scenario_key(with_profile_file(point.scenario, profile_path))]
    base: SimSummary | str | None = None
    if point.baseline is not None:
        base = sims[scenario_key(with_profile_file(point.baseline, profile_path))]
    for what, s in (("scenario", got), ("baseline", base)):
        if isinstance(s, str):
            return f"{what}: {s}"
    assert isinstance(got, SimSummary)
    try:
        value = _value(m, got)
        if m.kind == "speedup":
            assert isinstance(base, SimSummary)
            value = _value(m, base) / value
    except SpecError as err:
        return str(err)
    bound = math.nan
    if m.kind == "step_time_s":
        bound = got.lower_bound_s
    elif m.kind == "stage_time_s":
        bound = got.stage_bound(m.stages)
    return float(value), bound


def predict(case: ValidationCase, sims: Mapping[str, SimSummary | str], profile_path: str | None = None) -> CaseResult:
    m = case.spec.metric
    result = partial(CaseResult, id=case.id, metric=m.kind, label=m.label, split=case.split,
                     lengths=case.spec.lengths, source_url=case.spec.source_url, measured=case.spec.measured)
    got = [_predict_point(m, p, sims, profile_path) for p in case.points]
    for g in got:
        if isinstance(g, str):
            return result(predicted=math.nan, failure=g)
    values = [g for g in got if not isinstance(g, str)]
    if not case.sweep:
        return result(predicted=values[0][0], bound=values[0][1])
    fit = LengthFit(tuple(p.mean_tokens for p in case.sweep), tuple(v for v, _ in values), case.spec.measured,
                    case.lower_tokens, case.cap_tokens)
    return result(predicted=math.nan, length_fit=fit)


def case_keys(cases: Iterable[ValidationCase], profile_path: str | None = None) -> list[str]:
    keys: list[str] = []
    for c in cases:
        for p in c.points:
            for sc in (p.scenario, p.baseline):
                if sc is not None:
                    keys.append(scenario_key(with_profile_file(sc, profile_path)))
    return keys


def run_cases(cases: Sequence[ValidationCase], scale: ProfileScale = (), jobs: int = 1,
              profile_path: str | None = None, pool: Executor | None = None) -> tuple[CaseResult, ...]:
    sims = simulate_all(case_keys(cases, profile_path), scale, jobs, pool)
    return tuple(predict(c, sims, profile_path) for c in cases)


def validate(case_file: CaseFile, jobs: int = 1, scale: ProfileScale = (), profile_path: str | None = None,
             profile_label: str | None = None, pool: Executor | None = None) -> ValidationReport:
    """Run every case of ``case_file`` and summarize."""
    results = run_cases(case_file.cases, scale, jobs, profile_path, pool)
    label = profile_label or (f"profile file {profile_path}" if profile_path else "shipped profiles (uncalibrated)")
    return ValidationReport(results, case_file.skipped, summarize(results), label)

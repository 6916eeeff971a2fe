"""Calibration of generic parameters against the validation cases, with a hold-out.

What is fitted: *generic* parameters of the HardwareProfile of **every** accelerator (nothing is
per case or per accelerator); the sync and host figures each belong to one mechanism (a transfer
path, a training backend):

- ``decode`` scales ``decode_hbm_efficiency`` and ``decode_kv_hbm_efficiency`` (how close the rollout's decode steps get to HBM
  bandwidth: engine and kernel quality);
- ``compute`` scales ``matmul_efficiency``, ``matmul_efficiency_by_dtype`` and
  ``attention_efficiency`` (how close prefill, forward and training passes get to peak FLOP/s;
  no end-to-end MFU caps those kernels, so ``train_mfu_cap`` is not a parameter). Scaled
  fractions keep their per-accelerator ratios and are capped at 1;
- ``engine_step`` sets ``engine_step_overhead_s``: the rollout engine's host-side cost per
  step (scheduler, sampler bookkeeping, output processing), one value for every engine;
- ``sync_tensor`` sets ``weight_sync_tensor_overhead_s``: the host cost of one call of the
  tensor-by-tensor sync (one per checkpoint tensor);
- ``sync_bucket`` sets ``weight_sync_bucket_overhead_s``: the host cost of one bucket of the
  bucketed sync (checkpoint-engine). One figure cannot serve both paths: a per-tensor cost fitted
  on tensor-by-tensor syncs priced a 45k-tensor bucketed refit at tens of seconds;
- ``engine_load`` sets ``engine_load_tensor_overhead_s``: the engine's reload per checkpoint
  tensor after a sync (both paths). With verl's per-tensor and checkpoint-engine rows of the same
  setups the three are told apart;
- ``load_walk`` sets ``engine_load_param_walk_s``: the engine's host time per parameter tensor of
  each ``load_weights`` call (its ``named_parameters`` walk), one call per tensor, per bucket or
  per colocated sync;
- ``fsdp_layer`` sets ``fsdp_layer_overhead_s``: the FSDP training backend's host time per layer
  and micro-batch pass (Megatron's is shipped, fitted on vTrain's iterations).

The ``set`` parameters have no shipped value (no published figure), and their neutral point is 0
(nothing added), except ``engine_step`` and ``load_walk``: their neutral points are the shipped
figures (vLLM's published per-step cost; the parameter walk bench/bench_param_walk.py measures;
profiles.yaml).

On what: the cases on the ``calibration`` side of
:func:`rlperf.validation_cases.calibration_split` (decided by the source document, fixed before
any error was seen) whose response lengths the source publishes (``lengths: published``) or
that do not depend on them (``not_used``: weight-sync times). Where the lengths are unknown
there is no error to fit, only a matching mean length (rlperf.validate.LengthFit); a fit on a
guessed mean would turn a workload error into an efficiency.
The ``holdout`` cases never enter the fit; their error is reported apart, for all of them.

How: block coordinate descent over a fixed grid per parameter (``decode`` and ``engine_step``
searched jointly), minimizing the **mean** of
``|ln(predicted / measured)|`` over the fit cases (an L1 loss: symmetric in over- and
under-prediction, and every case counts, so a parameter that moves only a few cases, as the
per-tensor sync cost does, is still identified; the median of an earlier version ignored them).
Ties keep the value closest to the neutral one.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml

from rlperf.specs.hardware import HardwareProfile
from rlperf.validate import CaseResult, ProfileScale, run_cases
from rlperf.validation_cases import ValidationCase

@dataclass(frozen=True)
class Param:
    """A calibration parameter: ``scale`` multiplies the shipped fields (neutral 1), ``set``
    gives them one value (neutral: the shipped value, 0 where the fields have none: nothing is
    added). The neutral value is always on the grid."""

    kind: Literal["scale", "set"]
    fields: tuple[str, ...]
    grid: tuple[float, ...]
    shipped: float = 0.0  # a ``set`` parameter's shipped value (its neutral point)

    def __post_init__(self) -> None:
        assert self.neutral in self.grid, (self.fields, self.neutral)

    @property
    def neutral(self) -> float:
        return 1.0 if self.kind == "scale" else self.shipped

    def describe(self, name: str, value: float) -> str:
        return f"{name} x{value:g}" if self.kind == "scale" else f"{name} = {value * 1e3:g} ms"


_SHIPPED_ENGINE_STEP_S = HardwareProfile.model_fields["engine_step_overhead_s"].default or 0.0
_SHIPPED_LOAD_WALK_S = HardwareProfile.model_fields["engine_load_param_walk_s"].default or 0.0

FACTORS: tuple[float, ...] = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3)
"""Grid searched for every scale factor (a fraction scaled above 1 is capped at 1)."""

PARAMS: dict[str, Param] = {
    "decode": Param("scale", ("decode_hbm_efficiency", "decode_kv_hbm_efficiency"), FACTORS),
    "compute": Param(
        "scale", ("matmul_efficiency", "matmul_efficiency_by_dtype", "attention_efficiency"), FACTORS
    ),
    # Seconds per engine step: 0 to 8 ms (vLLM's v0.5.3 spent ~29% of a Llama-3-8B run's time
    # scheduling, i.e. milliseconds per ~10-30 ms step; the grid spans "none" to "dominant").
    # Shipped: vLLM's published single-stream figure (profiles.yaml), the neutral point.
    "engine_step": Param("set", ("engine_step_overhead_s",),
                         tuple(sorted({0.0, 0.5e-3, 1e-3, 2e-3, 3e-3, 4e-3, 6e-3, 8e-3, _SHIPPED_ENGINE_STEP_S})),
                         shipped=_SHIPPED_ENGINE_STEP_S),
    # Seconds per call of the tensor-by-tensor sync: 0 to 2 ms (verl's syncs leave 0.1-0.9 ms per
    # tensor beyond their collectives).
    "sync_tensor": Param(
        "set", ("weight_sync_tensor_overhead_s",), (0.0, 0.1e-3, 0.2e-3, 0.3e-3, 0.4e-3, 0.5e-3, 0.7e-3, 1e-3, 1.5e-3, 2e-3)
    ),
    # Seconds per bucket of the bucketed sync: 0 to 50 ms (a 512 MB bucket: one H2D copy, one
    # broadcast, one load_weights call of ~1k tensors).
    "sync_bucket": Param("set", ("weight_sync_bucket_overhead_s",), (0.0, 1e-3, 3e-3, 10e-3, 20e-3, 50e-3)),
    # Seconds per tensor reloaded by the engine (both paths): 0 to 1 ms.
    "engine_load": Param(
        "set", ("engine_load_tensor_overhead_s",), (0.0, 0.05e-3, 0.1e-3, 0.15e-3, 0.2e-3, 0.3e-3, 0.4e-3, 0.7e-3, 1e-3)
    ),
    # Seconds per engine parameter tensor walked by each load_weights call: 0 to 3 us (a Python
    # generator step and a dict insert per parameter). Shipped: the figure bench/bench_param_walk.py
    # measures (profiles.yaml), the neutral point: a grid point of 0 is none at all.
    "load_walk": Param("set", ("engine_load_param_walk_s",),
                       tuple(sorted({0.0, 0.25e-6, 0.5e-6, 0.75e-6, 1e-6, 1.5e-6, 2e-6, 3e-6, _SHIPPED_LOAD_WALK_S})),
                       shipped=_SHIPPED_LOAD_WALK_S),
    # FSDP's host time per layer and micro-batch pass (hooks, per-layer all-gather launches): the
    # training backend's own figure; Megatron's (megatron_layer_overhead_s) is shipped, fitted on
    # vTrain's iterations (docs/validation.md), and stays as shipped. 0 to 8 ms (a first fit stopped
    # at 4 ms, the edge of a 0-4 ms grid).
    "fsdp_layer": Param(
        "set", ("fsdp_layer_overhead_s",), (0.0, 0.25e-3, 0.5e-3, 1e-3, 1.5e-3, 2e-3, 3e-3, 4e-3, 6e-3, 8e-3)
    ),
}
"""Calibration parameter -> how it changes which HardwareProfile fields, and its grid."""

GROUPS: dict[str, tuple[str, ...]] = {name: p.fields for name, p in PARAMS.items()}
"""Calibration parameter -> the HardwareProfile fields it changes."""

BLOCKS: tuple[tuple[str, ...], ...] = (
    ("load_walk", "engine_load"), ("sync_tensor", "sync_bucket"), ("decode", "engine_step"), ("fsdp_layer",),
    ("compute",)
)
"""The coordinate descent's blocks, each searched on its joint grid. ``decode`` and
``engine_step`` trade off against each other (both lengthen decode steps; the overhead more for
small, fast steps): one at a time, the descent stops where neither alone improves (a first
version stopped at decode x0.6 with 1 ms, where x1.0 with 4 ms fits better). The engine's
reload costs (per load_weights call, per tensor) trade off the same way, and the per-call host
costs of the two transfer paths come next, with what the reload leaves. The sync
blocks come first and are cheap: the stage caches of rlperf.sim.costs key rollouts and training
stages without the sync figures, so the workers of one pool reuse them from grid point to grid
point (likewise the training stages across the decode block)."""

FIT_LENGTHS: tuple[str, ...] = ("published", "not_used")
"""Which cases (by Case.lengths) of the calibration split enter the fit."""


def fit_cases(cases: Sequence[ValidationCase]) -> list[ValidationCase]:
    """The cases the fit uses: calibration split, response lengths published or not used."""
    return [c for c in cases if c.split == "calibration" and c.spec.lengths in FIT_LENGTHS]


def scale_profile(profile: HardwareProfile, factors: Mapping[str, float]) -> HardwareProfile:
    """``profile`` with each parameter applied: a ``scale`` multiplies its fields (fractions
    capped at 1), a ``set`` gives them its value."""
    update: dict[str, Any] = {}
    for name, f in factors.items():
        param = PARAMS[name]
        for field in param.fields:
            value = getattr(profile, field)
            if param.kind == "set":
                update[field] = f
            elif isinstance(value, dict):
                update[field] = {k: min(1.0, v * f) for k, v in value.items()}
            else:
                update[field] = min(1.0, value * f)
    return profile.model_copy(update=update)


def as_scale(factors: Mapping[str, float]) -> ProfileScale:
    """The parameters away from their neutral value, sorted (a simulation cache key)."""
    return tuple(sorted((k, float(v)) for k, v in factors.items() if v != PARAMS[k].neutral))


def describe(factors: Mapping[str, float] | Sequence[tuple[str, float]]) -> str:
    """``decode x0.5, engine_step = 3 ms``: the fitted values, for tables and file headers."""
    items = factors.items() if isinstance(factors, Mapping) else factors
    return ", ".join(PARAMS[k].describe(k, v) for k, v in items)


def mean_log_error(results: Sequence[CaseResult]) -> float:
    """Mean of |ln(predicted / measured)| over the successful cases (the fit's loss)."""
    errs = [r.log_error for r in results if r.scored]
    return float(np.mean(errs)) if errs else math.inf


def median_log_error(results: Sequence[CaseResult]) -> float:
    errs = [r.log_error for r in results if r.scored]
    return float(np.median(errs)) if errs else math.inf


@dataclass(frozen=True)
class CalibrationResult:
    factors: tuple[tuple[str, float], ...]  # parameter -> fitted value (every parameter)
    num_cases: int  # calibration cases that entered the fit (successful ones)
    objective_before: float  # mean |ln(pred/meas)| with the shipped profiles
    objective_after: float
    evaluations: tuple[tuple[tuple[tuple[str, float], ...], float], ...]  # (factors, objective), in order

    @property
    def factor_map(self) -> dict[str, float]:
        return dict(self.factors)


def fit(cases: Sequence[ValidationCase], jobs: int = 1, sweeps: int = 2,
        progress: Callable[[dict[str, float], float], None] | None = None,
        pool: Executor | None = None) -> CalibrationResult:
    """Fit the PARAMS on :func:`fit_cases` of ``cases`` (block coordinate descent on their grids,
    :data:`BLOCKS`). A grid point that makes the median |error| of some metric kind on these
    cases worse than the shipped profiles' is infeasible (objective ``inf``): a calibration never
    makes its own split worse, and the shipped point is always feasible. Every grid point runs in
    one pool of ``jobs`` workers (``pool``, or one started here for the whole fit)."""
    if pool is None and jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as own:
            return fit(cases, jobs, sweeps, progress, own)
    calib = fit_cases(cases)
    shipped = run_cases(calib, (), jobs, pool=pool)
    seen: dict[ProfileScale, float] = {}
    order: list[tuple[tuple[tuple[str, float], ...], float]] = []

    def objective(f: dict[str, float]) -> float:
        key = as_scale(f)
        if key not in seen:
            got = run_cases(calib, key, jobs, pool=pool)
            seen[key] = math.inf if worse_than(got, shipped) else mean_log_error(got)
            order.append((tuple(sorted(f.items())), seen[key]))
            if progress is not None:
                progress(dict(f), seen[key])
        return seen[key]

    best = {name: p.neutral for name, p in PARAMS.items()}
    before = objective(best)
    for _ in range(sweeps):
        changed = False
        for block in BLOCKS:
            grids = itertools.product(*(PARAMS[name].grid for name in block))
            # Objectives equal to 1e-9 tie (a parameter no fit case depends on moves the rest
            # by rounding noise only), and ties keep the values nearest the neutral ones.
            scores = [
                (round(objective({**best, **dict(zip(block, vs))}), 9),
                 sum(_distance(PARAMS[n], v) for n, v in zip(block, vs)), vs)
                for vs in grids
            ]
            _, _, vs_best = min(scores)
            if any(best[n] != v for n, v in zip(block, vs_best)):
                best.update(zip(block, vs_best))
                changed = True
        if not changed:
            break
    ok = sum(1 for r in run_cases(calib, as_scale(best), jobs, pool=pool) if r.scored)
    after = objective(best)
    assert after <= before, "the shipped point is a feasible candidate: the fit cannot be worse"
    return CalibrationResult(tuple(sorted(best.items())), ok, before, after, tuple(order))


def worse_than(fitted: Sequence[CaseResult], shipped: Sequence[CaseResult]) -> bool:
    """Whether ``fitted`` has a larger median |error| than ``shipped`` for some metric kind (or
    over all metrics) on the same cases: a calibration must never make its own split worse."""
    kinds = {r.metric for r in shipped} | {"all"}
    for kind in kinds:
        a = [r.abs_error_pct for r in fitted if r.scored and kind in (r.metric, "all")]
        b = [r.abs_error_pct for r in shipped if r.scored and kind in (r.metric, "all")]
        if a and b and float(np.median(a)) > float(np.median(b)) + 1e-9:
            return True
    return False


def _distance(p: Param, v: float) -> float:
    """How far ``v`` is from the parameter's neutral value (ties keep the nearest)."""
    return abs(math.log(v)) if p.kind == "scale" else abs(v - p.neutral)


def write_profile(path: str | Path, result: CalibrationResult, note: str = "") -> Path:
    """Write the calibrated profiles of every accelerator as a file ``cluster.profile`` reads.

    The file holds ``profiles: {<accelerator>: {<field>: {value, rule, from}}}`` with only the
    fields the fit scaled (the others keep their shipped values when loaded), and for the
    record ``calibration: {factors, num_cases, objective_before, objective_after}``: the fit
    that the profiles apply (rlperf/data/calibrated_profiles.yaml is such a file, checked
    against the shipped profiles by the tests)."""
    from rlperf.specs.hardware_catalog import list_accelerators, load_profile

    factors = result.factor_map
    how = describe(result.factors)
    profiles: dict[str, Any] = {}
    for aid in list_accelerators():
        shipped = load_profile(aid)
        scaled = scale_profile(shipped, factors)
        entry: dict[str, Any] = {}
        for group, f in factors.items():
            for name in GROUPS[group]:
                value = getattr(scaled, name)
                src = getattr(shipped, name)
                if PARAMS[group].kind == "set":
                    entry[name] = {"value": value, "rule": "calibrated",
                                   "from": "generic value fitted by rlperf validate --calibrate"
                                           + (f" (shipped {src:g})" if src else " (no shipped figure)")}
                elif isinstance(value, dict):
                    entry[name] = {k: {"value": round(v, 4), "rule": "calibrated",
                                       "from": f"shipped {src[k]:g} x {f:g} (rlperf validate --calibrate)"}
                                   for k, v in value.items()}
                else:
                    entry[name] = {"value": round(value, 4), "rule": "calibrated",
                                   "from": f"shipped {src:g} x {f:g} (rlperf validate --calibrate)"}
        profiles[aid] = entry
    header = (
        "# rlperf hardware profiles calibrated by `rlperf validate --calibrate`.\n"
        f"# Generic parameters ({how}) fitted on {result.num_cases} calibration-split cases with published\n"
        "# (or unused) response lengths; mean |ln(pred/meas)|"
        f" {result.objective_before:.3f} -> {result.objective_after:.3f}. {note}\n"
        "# Use with cluster.profile: <this file> or `rlperf validate --profile <this file>`.\n"
    )
    from rlperf.outputs import write_text

    record = {"factors": {k: float(v) for k, v in factors.items()}, "num_cases": result.num_cases,
              "objective_before": round(result.objective_before, 6), "objective_after": round(result.objective_after, 6)}
    return write_text(Path(path), header + yaml.safe_dump({"calibration": record, "profiles": profiles}, sort_keys=True))

"""Calibration of generic efficiency parameters against the validation cases, with a hold-out.

What is fitted: two *generic* factors, each scaling a group of HardwareProfile fields of every
accelerator (the shipped per-accelerator values keep their ratios; nothing is per case):

- ``decode``: ``decode_hbm_efficiency`` (how close the rollout's decode steps get to HBM
  bandwidth: engine and kernel quality);
- ``compute``: ``matmul_efficiency``, ``matmul_efficiency_by_dtype``, ``attention_efficiency``
  and ``train_mfu_cap`` (how close prefill, forward and training passes get to peak FLOP/s).

A fraction scaled above 1 is capped at 1.

On what: the cases on the ``calibration`` side of
:func:`rlperf.validation_cases.calibration_split` (decided by the source document, fixed before
any error was seen) whose response lengths the source publishes (``lengths: published``). Where
the lengths are assumed, the error is dominated by the length assumption (most of those measured
times lie below the assumed scenario's work-depth bound), and a fit there would turn a workload
error into an efficiency. The ``holdout`` cases never enter the fit; their error is reported
apart, for all of them.

How: coordinate descent over a fixed grid of factors (:data:`FACTORS`), minimizing the median
of ``|ln(predicted / measured)|`` over the calibration cases (robust to a few cases the model
cannot express; symmetric in over- and under-prediction). Ties keep the factor closest to 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rlperf.specs.hardware import HardwareProfile
from rlperf.validate import CaseResult, ProfileScale, run_cases
from rlperf.validation_cases import ValidationCase

GROUPS: dict[str, tuple[str, ...]] = {
    "decode": ("decode_hbm_efficiency",),
    "compute": ("matmul_efficiency", "matmul_efficiency_by_dtype", "attention_efficiency", "train_mfu_cap"),
}
"""Calibration parameter -> the HardwareProfile fields it scales."""

FACTORS: tuple[float, ...] = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3)
"""Grid searched for every factor (a fraction scaled above 1 is capped at 1)."""

FIT_LENGTHS: tuple[str, ...] = ("published",)
"""Which cases (by Case.lengths) of the calibration split enter the fit."""


def fit_cases(cases: Sequence[ValidationCase]) -> list[ValidationCase]:
    """The cases the fit uses: calibration split, response lengths published."""
    return [c for c in cases if c.split == "calibration" and c.spec.lengths in FIT_LENGTHS]


def scale_profile(profile: HardwareProfile, factors: Mapping[str, float]) -> HardwareProfile:
    """``profile`` with every field of each group multiplied by the group's factor (capped at 1)."""
    update: dict[str, Any] = {}
    for group, f in factors.items():
        for name in GROUPS[group]:
            value = getattr(profile, name)
            if isinstance(value, dict):
                update[name] = {k: min(1.0, v * f) for k, v in value.items()}
            else:
                update[name] = min(1.0, value * f)
    return profile.model_copy(update=update)


def as_scale(factors: Mapping[str, float]) -> ProfileScale:
    return tuple(sorted((k, float(v)) for k, v in factors.items() if v != 1.0))


def median_log_error(results: Sequence[CaseResult]) -> float:
    errs = [r.log_error for r in results if r.ok]
    return float(np.median(errs)) if errs else math.inf


@dataclass(frozen=True)
class CalibrationResult:
    factors: tuple[tuple[str, float], ...]  # group -> fitted factor
    num_cases: int  # calibration cases that entered the fit (successful ones)
    objective_before: float  # median |ln(pred/meas)| with the shipped profiles
    objective_after: float
    evaluations: tuple[tuple[tuple[tuple[str, float], ...], float], ...]  # (factors, objective), in order

    @property
    def factor_map(self) -> dict[str, float]:
        return dict(self.factors)


def fit(cases: Sequence[ValidationCase], jobs: int = 1, sweeps: int = 2,
        progress: Callable[[dict[str, float], float], None] | None = None) -> CalibrationResult:
    """Fit the GROUPS factors on :func:`fit_cases` of ``cases`` (coordinate descent on FACTORS)."""
    calib = fit_cases(cases)
    seen: dict[ProfileScale, float] = {}
    order: list[tuple[tuple[tuple[str, float], ...], float]] = []

    def objective(f: dict[str, float]) -> float:
        key = as_scale(f)
        if key not in seen:
            seen[key] = median_log_error(run_cases(calib, key, jobs))
            order.append((tuple(sorted(f.items())), seen[key]))
            if progress is not None:
                progress(dict(f), seen[key])
        return seen[key]

    best = dict.fromkeys(GROUPS, 1.0)
    before = objective(best)
    for _ in range(sweeps):
        changed = False
        for group in GROUPS:
            scores = [(objective({**best, group: v}), abs(math.log(v)), v) for v in FACTORS]
            _, _, v_best = min(scores)
            if v_best != best[group]:
                best[group], changed = v_best, True
        if not changed:
            break
    ok = sum(1 for r in run_cases(calib, as_scale(best), jobs) if r.ok)
    return CalibrationResult(tuple(sorted(best.items())), ok, before, objective(best), tuple(order))


def write_profile(path: str | Path, result: CalibrationResult, note: str = "") -> Path:
    """Write the calibrated profiles of every accelerator as a file ``cluster.profile`` reads.

    The file holds ``profiles: {<accelerator>: {<field>: {value, rule, from}}}`` with only the
    fields the fit scaled; the others keep their shipped values when loaded."""
    from rlperf.specs.hardware_catalog import list_accelerators, load_profile

    factors = result.factor_map
    how = ", ".join(f"{g} x{v:g}" for g, v in result.factors)
    profiles: dict[str, Any] = {}
    for aid in list_accelerators():
        shipped = load_profile(aid)
        scaled = scale_profile(shipped, factors)
        entry: dict[str, Any] = {}
        for group, f in factors.items():
            for name in GROUPS[group]:
                value = getattr(scaled, name)
                src = getattr(shipped, name)
                if isinstance(value, dict):
                    entry[name] = {k: {"value": round(v, 4), "rule": "calibrated",
                                       "from": f"shipped {src[k]:g} x {f:g} (rlperf validate --calibrate)"}
                                   for k, v in value.items()}
                else:
                    entry[name] = {"value": round(value, 4), "rule": "calibrated",
                                   "from": f"shipped {src:g} x {f:g} (rlperf validate --calibrate)"}
        profiles[aid] = entry
    header = (
        "# rlperf hardware profiles calibrated by `rlperf validate --calibrate`.\n"
        f"# Generic factors ({how}) fitted on {result.num_cases} calibration-split cases with published\n"
        "# response lengths; median |ln(pred/meas)|"
        f" {result.objective_before:.3f} -> {result.objective_after:.3f}. {note}\n"
        "# Use with cluster.profile: <this file> or `rlperf validate --profile <this file>`.\n"
    )
    p = Path(path)
    p.write_text(header + yaml.safe_dump({"profiles": profiles}, sort_keys=True), encoding="utf-8")
    return p

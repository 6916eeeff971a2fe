"""Step-time ranges from the model's own measured error on published runs.

``rlperf validate`` compares predictions with published step times. Its step-time cases are
stored as data (``rlperf/data/step_time_errors.yaml``, written by ``rlperf validate
--errors-out``) in two kinds, and a plan's range uses the kind that matches how its response
lengths were obtained (docs/prediction_interval.md):

- **Lengths stated** (``--mean-response``, ``--median-response``, a preset with a published mean):
  the *scored* cases, whose source published its lengths. With ``r = measured / predicted`` over
  them, the range of a prediction ``T`` is ``[T q10(r), T q90(r)]``: the empirical 10th and 90th
  percentiles (``numpy.quantile``, linear), an 80% range if the question errs as they did.
- **Lengths assumed** (the default mean = cap/3, or a scenario's own): the cases whose source
  publishes no lengths. ``rlperf validate`` finds for each the mean response length at which the
  prediction equals the measurement (``length_fit.matching_mean_tokens``); over the plausible ones,
  ``f = matching mean / cap``. The plan is simulated at ``q10(f) cap`` and ``q90(f) cap`` (kept within
  ``[min(128, cap/4), cap/2]``, the means validate sweeps), and those
  two step times are the range: published runs of unknown length behave, *in this model*, like
  runs at means between them. The model's own error is inside ``f`` (the fit absorbs it), so it
  is not applied a second time.

Nothing is fitted to the question. After a cost-model change, rewriting the data file moves the
ranges with the model's measured accuracy.

The errors belong to the hardware profile the predictions came from: the shipped profiles'
are ``step_time_errors.yaml``, the calibrated profile's (``--hardware-profile calibrated``)
``step_time_errors_calibrated.yaml`` (``rlperf validate --profile calibrated --errors-out``). A
plan on any other profile file gets the shipped profiles' errors, and its range says that they
were not measured for that file.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

import numpy as np
import yaml

from rlperf.specs.hardware_catalog import CALIBRATED_PROFILE

LOW_Q = 0.10
HIGH_Q = 0.90
Basis = Literal["stated", "assumed"]
MIN_MEAN_TOKENS = 128
"""The shortest plausible mean response (``LengthSweep.lower_tokens`` of the validation cases)."""


@dataclass(frozen=True)
class ScoredCase:
    """A validated step time at published lengths: what was measured, what rlperf predicted."""

    id: str
    measured_s: float
    predicted_s: float

    @property
    def ratio(self) -> float:
        """measured / predicted (> 1: the model predicted too fast)."""
        return self.measured_s / self.predicted_s


@dataclass(frozen=True)
class LengthFitCase:
    """A validated step time without published lengths: the mean at which prediction = measurement."""

    id: str
    matching_mean_tokens: float
    cap_tokens: int

    @property
    def mean_over_cap(self) -> float:
        return self.matching_mean_tokens / self.cap_tokens


@dataclass(frozen=True)
class ErrorData:
    scored: tuple[ScoredCase, ...]
    length_fits: tuple[LengthFitCase, ...]
    commit: str
    note: str = ""  # whose errors, where not the shipped profiles' for a plan on them (ranges say it)

    def ratio_range(self) -> tuple[float, float]:
        """q10 and q90 of measured/predicted over the scored cases (nan without cases)."""
        if not self.scored:
            return math.nan, math.nan
        lo, hi = np.quantile([c.ratio for c in self.scored], [LOW_Q, HIGH_Q])
        return float(lo), float(hi)

    def implied_means(self, cap_tokens: int) -> tuple[float, float]:
        """q10 and q90 of (matching mean / cap) x ``cap_tokens``, kept within the plausible means
        validate uses, ``[min(128, cap/4), cap/2]`` (nan without cases)."""
        if not self.length_fits:
            return math.nan, math.nan
        lo, hi = np.quantile([c.mean_over_cap for c in self.length_fits], [LOW_Q, HIGH_Q])
        floor, ceiling = min(MIN_MEAN_TOKENS, cap_tokens / 4), cap_tokens / 2
        return (min(max(float(lo) * cap_tokens, floor), ceiling), min(max(float(hi) * cap_tokens, floor), ceiling))


@dataclass(frozen=True)
class StepInterval:
    """A predicted step time with its range and how the range was obtained."""

    predicted_s: float
    low_s: float
    high_s: float
    basis: Basis
    num_cases: int
    mean_range_tokens: tuple[float, float] | None = None  # assumed lengths: the implied means
    note: str = ""  # ErrorData.note of the errors it rests on

    @property
    def label(self) -> str:
        """How the range reads beside the point estimate: a model-error range, or the plan's time
        at other (published runs') lengths, which need not contain the estimate."""
        return "range" if self.basis == "stated" else "at published runs' lengths"

    def describe(self) -> str:
        pct = round(100 * (HIGH_Q - LOW_Q))
        note = f"; {self.note}" if self.note else ""
        if self.basis == "stated":
            return (f"{pct}% range of measured/predicted over {self.num_cases} published step times with published"
                    f" lengths (rlperf validate; docs/prediction_interval.md){note}")
        lo, hi = self.mean_range_tokens or (math.nan, math.nan)
        return (f"lengths assumed: the plan at mean {lo:,.0f} - {hi:,.0f} tokens, the {pct}% range of the means that"
                f" match {self.num_cases} published runs of unknown length (docs/prediction_interval.md);"
                f" state --mean-response for the model-error range{note}")

    def scaled(self, factor: float) -> StepInterval:
        """The same relative range around ``factor`` x the prediction (run totals)."""
        return StepInterval(self.predicted_s * factor, self.low_s * factor, self.high_s * factor, self.basis,
                            self.num_cases, self.mean_range_tokens, self.note)


def _doc(text: str) -> ErrorData:
    from rlperf.specs.hardware_catalog import SAFE_LOADER

    raw = yaml.load(text, Loader=SAFE_LOADER)
    scored = tuple(ScoredCase(str(c["id"]), float(c["measured_s"]), float(c["predicted_s"])) for c in raw["scored"])
    fits = tuple(LengthFitCase(str(c["id"]), float(c["matching_mean_tokens"]), int(c["cap_tokens"])) for c in raw["length_fits"])
    return ErrorData(scored, fits, str(raw.get("commit", "")))


# The profiles whose errors are measured (a profile-file name, None: the shipped profiles) and
# their data files.
ERROR_FILES: dict[str | None, str] = {None: "step_time_errors.yaml", CALIBRATED_PROFILE: "step_time_errors_calibrated.yaml"}


@lru_cache(maxsize=4)
def error_data(profile: str | None = None) -> ErrorData:
    """The stored step-time cases of the last recorded ``rlperf validate`` run with the hardware
    profile file ``profile`` (None: the shipped profiles); for a file whose errors were never
    measured, the shipped profiles' errors with a note that says so."""
    name = ERROR_FILES.get(profile)
    if name is None:
        return replace(error_data(None), note=f"errors measured with the shipped profiles, not with the profile file {profile}")
    data = _doc((resources.files("rlperf") / "data" / name).read_text("utf-8"))
    return data if profile is None else replace(data, note=f"errors of the {profile} profile")


def stated_interval(predicted_s: float, data: ErrorData | None = None) -> StepInterval:
    d = data or error_data()
    lo, hi = d.ratio_range()
    return StepInterval(predicted_s, predicted_s * lo, predicted_s * hi, "stated", len(d.scored), None, d.note)


def assumed_interval(predicted_s: float, at_low_mean_s: float, at_high_mean_s: float, means: tuple[float, float],
                     data: ErrorData | None = None) -> StepInterval:
    d = data or error_data()
    lo, hi = sorted((at_low_mean_s, at_high_mean_s))
    return StepInterval(predicted_s, lo, hi, "assumed", len(d.length_fits), means, d.note)


def errors_document(validation: Mapping[str, Any], commit: str, profile: str | None = None) -> str:
    """The data file's text from ``ValidationReport.to_dict()`` of a run with the hardware profile
    file ``profile`` (None: the shipped profiles, uncalibrated): the scored step-time cases, and
    the plausible length fits of the step-time cases of unknown length."""
    cases: Iterable[Mapping[str, Any]] = validation["cases"]
    scored, fits = [], []
    for c in cases:
        if not str(c["metric"]).startswith("step_time_s"):
            continue
        if c["predicted"] is not None:
            scored.append({"id": c["id"], "measured_s": c["measured"], "predicted_s": round(float(c["predicted"]), 3)})
        f = c.get("length_fit")
        if f is not None and f["plausible"]:
            fits.append({"id": c["id"], "matching_mean_tokens": round(float(f["matching_mean_tokens"]), 1),
                         "cap_tokens": int(f["plausible_range_tokens"][1])})
    which = "uncalibrated shipped profiles" if profile is None else f"profile {profile}"
    head = (
        f"# Step-time cases of `rlperf validate` ({which}), stored as data for\n"
        "# the step-time ranges of rlperf.accuracy (docs/prediction_interval.md). Written by\n"
        "# `rlperf validate --errors-out`; measured values and sources: rlperf/data/validation_cases.yaml.\n"
        "# scored: published lengths; length_fits: unknown lengths, the mean at which prediction = measurement.\n"
    )
    body = yaml.safe_dump({"commit": commit, "scored": scored, "length_fits": fits}, sort_keys=False)
    return head + str(body)

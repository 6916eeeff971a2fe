"""Prediction intervals for a step time, from the model's own measured error on published runs.

A plan's step time is a prediction; how far such predictions land from measured times is known:
``rlperf validate`` compares them on published runs. The step-time cases of one validation run
are stored as data (``rlperf/data/step_time_errors.yaml``: case id, measured, predicted, and
whether the source published its response lengths). The interval for a new prediction ``T`` is

    [T * q_lo(r), T * q_hi(r)],   r = measured / predicted over the cases of the same kind,

with ``q_lo``, ``q_hi`` the empirical 10th and 90th percentiles (linear interpolation,
``numpy.quantile``): an 80% interval *if* the new question errs like the validation cases do.
"The same kind" is whether the response lengths are stated: a question with lengths given by the
user (``--mean-response``, ``--median-response``, ``--length-preset``) is compared with the cases
whose source published its lengths (``lengths: published``); a question on assumed lengths with
the cases that assumed them. Nothing is fitted or tuned: refreshing the data file
(``rlperf validate --errors-out src/rlperf/data/step_time_errors.yaml``) after a cost-model change
moves the intervals with the model's measured accuracy. See docs/prediction_interval.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Literal

import numpy as np
import yaml

LengthsKind = Literal["published", "assumed"]
LOW_Q = 0.10
HIGH_Q = 0.90


@dataclass(frozen=True)
class ErrorCase:
    """One validated step time: what was measured, what rlperf predicted."""

    id: str
    lengths: LengthsKind
    measured_s: float
    predicted_s: float

    @property
    def ratio(self) -> float:
        """measured / predicted (> 1: the model predicted too fast)."""
        return self.measured_s / self.predicted_s


@dataclass(frozen=True)
class StepInterval:
    """A predicted step time with its interval and how the interval was obtained."""

    predicted_s: float
    low_s: float
    high_s: float
    num_cases: int
    lengths: LengthsKind

    def basis(self) -> str:
        return (f"{round(100 * (HIGH_Q - LOW_Q))}% range of measured/predicted over {self.num_cases} validated"
                f" step times with {self.lengths} response lengths (rlperf validate; docs/prediction_interval.md)")

    def scaled(self, factor: float) -> StepInterval:
        """The same relative interval around ``factor`` x the prediction (run totals)."""
        return StepInterval(self.predicted_s * factor, self.low_s * factor, self.high_s * factor, self.num_cases, self.lengths)


@lru_cache(maxsize=1)
def error_cases() -> tuple[ErrorCase, ...]:
    """The stored step-time cases of the last recorded ``rlperf validate`` run."""
    text = (resources.files("rlperf") / "data" / "step_time_errors.yaml").read_text("utf-8")
    raw = yaml.safe_load(text)["cases"]
    return tuple(ErrorCase(str(c["id"]), c["lengths"], float(c["measured_s"]), float(c["predicted_s"])) for c in raw)


def step_interval(predicted_s: float, lengths: LengthsKind, cases: Iterable[ErrorCase] | None = None) -> StepInterval:
    """The interval of the module docstring around ``predicted_s``."""
    pool = [c for c in (error_cases() if cases is None else cases) if c.lengths == lengths]
    if not pool or not math.isfinite(predicted_s):
        return StepInterval(predicted_s, math.nan, math.nan, 0, lengths)
    ratios = np.array([c.ratio for c in pool], dtype=float)
    lo, hi = np.quantile(ratios, [LOW_Q, HIGH_Q])
    return StepInterval(predicted_s, predicted_s * float(lo), predicted_s * float(hi), len(pool), lengths)


def errors_document(validation: dict[str, object], commit: str) -> str:
    """The data file's text from ``ValidationReport.to_dict()`` (uncalibrated): every step-time
    case that was predicted and whose lengths are published or assumed."""
    cases = validation["cases"]
    assert isinstance(cases, list)
    rows = [
        {"id": c["id"], "lengths": c["lengths"], "measured_s": c["measured"], "predicted_s": round(float(c["predicted"]), 3)}
        for c in cases
        if str(c["metric"]).startswith("step_time_s") and c["predicted"] is not None
        and c["lengths"] in ("published", "assumed")
    ]
    head = (
        "# Step-time cases of `rlperf validate` (uncalibrated shipped profiles), stored as data for\n"
        "# the prediction intervals of rlperf.accuracy (docs/prediction_interval.md).\n"
        f"# Written by `rlperf validate --errors-out` at commit {commit}; measured values and sources:\n"
        "# rlperf/data/validation_cases.yaml.\n"
    )
    return head + str(yaml.safe_dump({"cases": rows}, sort_keys=False))

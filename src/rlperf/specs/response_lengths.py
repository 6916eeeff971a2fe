"""The response-length assumption of a question, stated: which distribution, and where it came from.

The step time scales with the response lengths more than with any other input (a step at median
2,500 / 5,000 / 8,000 tokens under a 16k cap takes about 5 / 12 / 16 minutes), and a framework
configuration holds only the cap. So every command that builds a workload from a cap resolves
the lengths through :func:`choose_response_lengths`, and prints :meth:`LengthChoice.describe`
in its header. The rules, first match wins:

1. ``--mean-response M``: log-normal with mean ``M`` after truncation at the cap, sigma
   :data:`~rlperf.specs.workload_presets.RESPONSE_SIGMA` (what a training log reports);
2. ``--median-response M``: log-normal with median ``M`` before truncation, same sigma;
3. ``--length-preset NAME``: the preset's published mean (``rlperf workloads``), or its
   cap/3 rule when it publishes none, at the question's cap;
4. the scenario's own distribution, when the question keeps the scenario's cap;
5. otherwise the **default**: mean = cap x :data:`~rlperf.specs.workload_presets.MEAN_OVER_CAP`
   (= cap/3), sigma 1 -- the same rule ``rlperf import`` and the workload presets use
   (algorithms.md §6.2: R1-Zero's mean is roughly a third of its cap; sigma from the §6.2
   illustrative median/p99).

A mean or median above the cap is refused (one line): the cap would bind every response.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlperf.errors import SpecError
from rlperf.specs.lengths import LengthDistribution, LogNormalLength
from rlperf.specs.workload_presets import MEAN_OVER_CAP, RESPONSE_SIGMA, get_workload_preset

if TYPE_CHECKING:
    from rlperf.scenario import Scenario

DEFAULT_SOURCE = "default: mean = cap/3, sigma 1 (algorithms.md §6.2, R1-Zero; as `rlperf import`)"


@dataclass(frozen=True)
class LengthChoice:
    """A response-length distribution and the sentence saying where it comes from."""

    distribution: LengthDistribution
    source: str
    stated: bool = False
    """Given by the user (a flag or a preset), not assumed: picks the validation cases whose
    lengths were published for the prediction interval (:mod:`rlperf.accuracy`)."""

    def describe(self) -> str:
        """One line: mean, median, spread, share at the cap, and the source."""
        d = self.distribution
        cap = d.cap_tokens
        shape = f"mean {d.mean_tokens():,.0f}, median {d.quantile(0.5):,}"
        if isinstance(d, LogNormalLength):
            shape = f"log-normal, {shape}, sigma {d.sigma:g}"
        at_cap = d.fraction_at_cap()
        warn = " [median above the cap: most responses truncated]" if d.quantile(0.5) >= cap and at_cap > 0.5 else ""
        return f"response lengths: {shape}, {100 * at_cap:.1f}% at the cap {cap:,}{warn} -- {self.source}"


def choose_response_lengths(
    cap_tokens: int,
    *,
    mean_tokens: float | None = None,
    median_tokens: float | None = None,
    preset: str | None = None,
    scenario_lengths: LengthDistribution | None = None,
    scenario_name: str = "scenario",
) -> LengthChoice:
    """Resolve the response lengths of a question by the rules of the module docstring."""
    given = [n for n, v in (("--mean-response", mean_tokens), ("--median-response", median_tokens),
                            ("--length-preset", preset)) if v is not None]
    if len(given) > 1:
        raise SpecError(given[1], f"given together with {given[0]}", "one of --mean-response, --median-response, --length-preset")
    if cap_tokens < 2:
        raise SpecError("--max-response", f"{cap_tokens} tokens", ">= 2")
    if mean_tokens is not None:
        check_mean_tokens("--mean-response", mean_tokens, cap_tokens)
    if median_tokens is not None and not 1 <= median_tokens < cap_tokens:  # a median of 1 the model takes
        where = "below 1" if median_tokens < 1 else "not a number" if math.isnan(median_tokens) else \
            f"not below the response cap {cap_tokens:,}"
        raise SpecError("--median-response", f"{_tokens(median_tokens)} tokens is {where}", "1 <= median-response < max response")
    if mean_tokens is not None:
        return LengthChoice(LogNormalLength.from_mean(mean_tokens, RESPONSE_SIGMA, cap_tokens),
                            f"--mean-response {mean_tokens:,.0f} (sigma {RESPONSE_SIGMA:g})", stated=True)
    if median_tokens is not None:
        return LengthChoice(LogNormalLength(median_tokens=median_tokens, sigma=RESPONSE_SIGMA, cap_tokens=cap_tokens),
                            f"--median-response {median_tokens:,.0f} (sigma {RESPONSE_SIGMA:g})", stated=True)
    if preset is not None:
        try:
            p = get_workload_preset(preset)
        except SpecError as err:  # named after the option the user typed
            raise SpecError("--length-preset", err.problem, err.allowed) from None
        mean = p.workload.response_length.mean_tokens()
        published = any(k == "mean_response_tokens" for k, _ in p.published)
        if not published:
            check_assumed_cap("--max-response", cap_tokens)
            mean = cap_tokens * MEAN_OVER_CAP
        mean = min(mean, cap_tokens * 0.99)
        why = f"published mean of {p.name} ({p.source})" if published else f"{p.name} publishes no mean: cap/3"
        return LengthChoice(LogNormalLength.from_mean(mean, RESPONSE_SIGMA, cap_tokens), f"--length-preset {p.name}: {why}", stated=published)
    if scenario_lengths is not None and scenario_lengths.cap_tokens == cap_tokens:
        return LengthChoice(scenario_lengths, f"from {scenario_name}")
    check_assumed_cap("--max-response", cap_tokens)
    return LengthChoice(LogNormalLength.from_mean(cap_tokens * MEAN_OVER_CAP, RESPONSE_SIGMA, cap_tokens), DEFAULT_SOURCE)


def check_mean_tokens(option: str, mean_tokens: float, cap_tokens: int) -> None:
    """Refuse a mean response length the model cannot take, naming ``option``: a response has
    at least one token, so only a mean strictly above 1 has a spread (``LogNormalLength.from_mean``),
    and a mean at the cap would truncate every response."""
    if 1 < mean_tokens < cap_tokens:
        return
    where = "not above 1" if mean_tokens <= 1 else f"not below the response cap {cap_tokens:,}" if mean_tokens >= cap_tokens \
        else "not a number"
    raise SpecError(option, f"{_tokens(mean_tokens)} tokens is {where}", f"1 < {option.lstrip('-')} < max response ({cap_tokens:,})")


# Assumed (not stated) lengths need a cap above 4 tokens: their mean is cap/3, and `rlperf plan`
# simulates the step-time range of assumed lengths down to a mean of cap/4 (the floor of
# rlperf.accuracy.ErrorData.implied_means); a mean must be above 1 token (check_mean_tokens).
MIN_ASSUMED_CAP_TOKENS = 5


def check_assumed_cap(field: str, cap_tokens: int) -> None:
    """Refuse a cap too short for assumed response lengths (see :data:`MIN_ASSUMED_CAP_TOKENS`)."""
    if cap_tokens < MIN_ASSUMED_CAP_TOKENS:
        raise SpecError(field, f"{cap_tokens} tokens is too short for assumed response lengths (mean cap/3, "
                        "step-time range down to cap/4: each must be above 1 token)",
                        f">= {MIN_ASSUMED_CAP_TOKENS}, or state --mean-response (1 < mean < max response)")


def _tokens(value: float) -> str:
    """A token count as typed: whole numbers with separators, others in 6 significant digits."""
    if math.isfinite(value) and abs(value) < 1e9 and value == int(value):
        return f"{value:,.0f}"
    return f"{value:.6g}"


def scenario_lengths(sc: Scenario) -> LengthChoice:
    """The response lengths a scenario file sets (``rlperf simulate`` and ``analyze`` headers)."""
    return LengthChoice(sc.workload.response_length, f"scenario {sc.name} (its workload)")


def parse_token_count(text: str, field: str) -> int:
    """``"2k"`` -> 2000, ``"16384"`` -> 16384, ``"1.5k"`` -> 1500."""
    t = text.strip().lower()
    scale = 1000 if t.endswith("k") else 1
    try:
        value = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        raise SpecError(field, f"{text!r} is not a token count", "e.g. 5000 or 5k") from None
    from rlperf.inputs.ranges import TOKENS

    if not math.isfinite(value) or not TOKENS.lo <= value <= TOKENS.hi:
        raise SpecError(field, f"{text!r} tokens", TOKENS.allowed)
    return int(round(value))

"""Summaries of length distributions and workloads: the figures a table or report shows.

Analytic figures (mean, quantiles, fraction at the cap) come from the distribution itself; the
sampled figures come from one seeded draw, so they show what one step of that size looks like
(the longest response of a step, which sets a synchronous rollout's depth).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlperf.specs.lengths import Tokens
from rlperf.specs.workload import LengthDistribution, Workload


@dataclass(frozen=True)
class LengthSummary:
    """Analytic figures of a length distribution plus statistics of one sample of it."""

    kind: str
    cap_tokens: int
    mean_tokens: float
    p50_tokens: int
    p90_tokens: int
    p99_tokens: int
    fraction_at_cap: float
    num_samples: int
    sample_mean_tokens: float
    sample_max_tokens: int
    sample_fraction_at_cap: float


@dataclass(frozen=True)
class WorkloadSummary:
    """A workload's shape, expected token counts, and its lengths at one step."""

    step: int
    prompts_per_step: int
    group_size: int
    num_responses: int
    prompt: LengthSummary
    """Prompt lengths; the sample is the step's ``B`` prompts."""
    response: LengthSummary
    """Response lengths; the sample is the step's ``B*G`` responses."""
    expected_response_tokens_per_step: float
    expected_tokens_per_step: float
    sample_total_response_tokens: int
    sample_total_tokens: int


def summarize_lengths(dist: LengthDistribution, samples: Tokens) -> LengthSummary:
    """Analytic figures of ``dist`` and statistics of ``samples`` (drawn from it)."""
    assert samples.size > 0
    return LengthSummary(
        kind=dist.kind,
        cap_tokens=dist.cap_tokens,
        mean_tokens=dist.mean_tokens(),
        p50_tokens=dist.quantile(0.5),
        p90_tokens=dist.quantile(0.9),
        p99_tokens=dist.quantile(0.99),
        fraction_at_cap=dist.fraction_at_cap(),
        num_samples=int(samples.size),
        sample_mean_tokens=float(samples.mean()),
        sample_max_tokens=int(samples.max()),
        sample_fraction_at_cap=float(np.mean(samples == dist.cap_tokens)),
    )


def describe_lengths(
    dist: LengthDistribution, num_samples: int = 100_000, seed: int = 0
) -> LengthSummary:
    """Summary of ``dist`` with ``num_samples`` independent draws (seeded)."""
    return summarize_lengths(dist, dist.sample(np.random.default_rng(seed), num_samples))


def describe(workload: Workload, step: int = 0) -> WorkloadSummary:
    """Summary of ``workload``: analytic figures and the lengths drawn for ``step``."""
    s = workload.sample(step)
    return WorkloadSummary(
        step=step,
        prompts_per_step=workload.prompts_per_step,
        group_size=workload.group_size,
        num_responses=workload.num_responses,
        prompt=summarize_lengths(workload.prompt_length, s.prompt_tokens),
        response=summarize_lengths(workload.response_length, s.flat_response_tokens),
        expected_response_tokens_per_step=workload.expected_response_tokens_per_step,
        expected_tokens_per_step=workload.expected_tokens_per_step,
        sample_total_response_tokens=s.total_response_tokens,
        sample_total_tokens=s.total_tokens,
    )

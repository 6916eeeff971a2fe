"""Workload spec: length distributions, seeded sampling, group correlation, parsing from dicts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlperf.errors import SpecError
from rlperf.specs.workload import (
    LENGTH_KINDS,
    EmpiricalLength,
    FixedLength,
    LogNormalLength,
    UniformLength,
    Workload,
    workload_from_dict,
    workload_to_dict,
)

BASE: dict[str, Any] = {
    "prompts_per_step": 8,
    "group_size": 4,
    "prompt_length": {"kind": "uniform", "min_tokens": 50, "max_tokens": 400},
    "response_length": {"kind": "lognormal", "mean_tokens": 3000, "sigma": 1.0, "cap_tokens": 8192},
    "group_length_correlation": 0.5,
    "seed": 7,
}


def _lognormal_cdf(x: float, median: float, sigma: float) -> float:
    return 0.5 * (1.0 + math.erf((math.log(x) - math.log(median)) / (sigma * math.sqrt(2.0))))


# ---- determinism -----------------------------------------------------------------------------


def test_same_seed_and_step_give_identical_arrays() -> None:
    a, b = workload_from_dict(BASE).sample(3), workload_from_dict(BASE).sample(3)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)
    assert np.array_equal(a.response_tokens, b.response_tokens)


def test_different_step_or_seed_gives_different_draws() -> None:
    w = workload_from_dict(BASE)
    s0, s1 = w.sample(0), w.sample(1)
    other = workload_from_dict({**BASE, "seed": 8}).sample(0)
    assert not np.array_equal(s0.response_tokens, s1.response_tokens)
    assert not np.array_equal(s0.prompt_tokens, s1.prompt_tokens)
    assert not np.array_equal(s0.response_tokens, other.response_tokens)


def test_negative_step_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="step"):
        workload_from_dict(BASE).sample(-1)


# ---- single distributions --------------------------------------------------------------------

KINDS = [
    FixedLength(tokens=300),
    UniformLength(min_tokens=1, max_tokens=1000),
    LogNormalLength(median_tokens=2000, sigma=1.2, cap_tokens=4096),
    EmpiricalLength(bin_edges_tokens=(0, 100, 1000, 4095, 4096), weights=(1, 3, 2, 0.5)),
]


@pytest.mark.parametrize("dist", KINDS, ids=lambda d: d.kind)
def test_samples_are_int64_within_one_and_cap(dist: Any) -> None:
    x = dist.sample(np.random.default_rng(0), 50_000)
    assert x.dtype == np.int64 and x.shape == (50_000,)
    assert x.min() >= 1 and x.max() <= dist.cap_tokens == dist.max_tokens


@pytest.mark.parametrize("dist", KINDS, ids=lambda d: d.kind)
def test_analytic_mean_and_cap_mass_match_samples(dist: Any) -> None:
    n = 200_000
    x = dist.sample(np.random.default_rng(1), n)
    se_mean = max(float(x.std()), 1e-9) / math.sqrt(n)
    assert abs(x.mean() - dist.mean_tokens()) < 5 * se_mean + 0.5  # 0.5: rounding to whole tokens
    p = dist.fraction_at_cap()
    assert abs(np.mean(x == dist.cap_tokens) - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-12


@pytest.mark.parametrize("dist", KINDS, ids=lambda d: d.kind)
def test_quantile_is_the_inverse_cdf_of_the_samples(dist: Any) -> None:
    x = np.sort(dist.sample(np.random.default_rng(2), 100_000))
    assert (
        dist.quantile(0.0) == x.min() or dist.kind == "lognormal"
    )  # lognormal: 1 is reachable, rarely drawn
    assert dist.quantile(1.0) == dist.cap_tokens or dist.fraction_at_cap() == 0
    for q in (0.1, 0.5, 0.9, 0.99):
        k = dist.quantile(q)
        assert np.mean(x <= k) >= q - 0.01
        assert np.mean(x < k) <= q + 0.01


def test_truncated_lognormal_puts_the_tail_mass_at_the_cap() -> None:
    d = LogNormalLength(median_tokens=3000, sigma=1.0, cap_tokens=8192)
    expected = 1.0 - _lognormal_cdf(8192, 3000, 1.0)
    assert d.fraction_at_cap() == pytest.approx(expected, rel=1e-9)
    n = 200_000
    x = d.sample(np.random.default_rng(3), n)
    assert abs(np.mean(x == 8192) - expected) < 5 * math.sqrt(expected * (1 - expected) / n)
    assert np.all(x[x < 8192] <= 8191)


def test_truncated_lognormal_mean_matches_quadrature() -> None:
    """Closed form E[min(max(X,1),cap)] against a direct numerical integral over the density."""
    median, sigma, cap = 1500.0, 0.9, 6000
    d = LogNormalLength(median_tokens=median, sigma=sigma, cap_tokens=cap)
    x = np.linspace(1.0, cap, 400_001)
    pdf = np.exp(-((np.log(x) - math.log(median)) ** 2) / (2 * sigma**2)) / (
        x * sigma * math.sqrt(2 * math.pi)
    )
    y = x * pdf
    body = float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2)
    quad = (
        _lognormal_cdf(1.0, median, sigma) + body + cap * (1 - _lognormal_cdf(cap, median, sigma))
    )
    assert d.mean_tokens() == pytest.approx(quad, rel=1e-6)


def test_mean_parameterization_recovers_the_published_mean() -> None:
    d = LogNormalLength.from_mean(22386, sigma=1.0, cap_tokens=65536)
    assert d.mean_tokens() == pytest.approx(22386, rel=1e-9)
    assert LogNormalLength(mean_tokens=22386, sigma=1.0, cap_tokens=65536) == d


def test_mean_near_the_cap_needs_a_median_past_the_cap() -> None:
    # Found by the Hypothesis test below under CI: a valid mean close to the cap with a wide
    # sigma needs an untruncated median far past any real length; the median is a parameter.
    d = LogNormalLength.from_mean(87866.75, sigma=4.0, cap_tokens=100419)
    assert d.median_tokens > 4_194_304
    assert d.mean_tokens() == pytest.approx(87866.75, rel=1e-6)
    assert d.fraction_at_cap() > 0.8


def test_uniform_and_empirical_closed_forms() -> None:
    u = UniformLength(min_tokens=3, max_tokens=7)
    assert (u.mean_tokens(), u.fraction_at_cap(), u.quantile(0.2), u.quantile(0.21)) == (
        5.0,
        0.2,
        3,
        4,
    )
    e = EmpiricalLength(bin_edges_tokens=(0, 10, 20, 100), weights=(1, 0, 1))
    assert e.mean_tokens() == pytest.approx(0.5 * 5.5 + 0.5 * 60.5)  # bins hold 1..10 and 21..100
    assert e.quantile(0.5) == 10 and e.quantile(0.51) > 20
    assert e.fraction_at_cap() == pytest.approx(0.5 / 80)


# ---- group correlation -----------------------------------------------------------------------


def _with(rho: float, response: dict[str, Any], groups: int = 2000, g: int = 8) -> Workload:
    return workload_from_dict(
        {
            **BASE,
            "prompts_per_step": groups,
            "group_size": g,
            "response_length": response,
            "group_length_correlation": rho,
        }
    )


@pytest.mark.parametrize(
    "response",
    [
        BASE["response_length"],
        {"kind": "uniform", "min_tokens": 1, "max_tokens": 5000},
        {"kind": "empirical", "bin_edges_tokens": [0, 500, 4000, 8192], "weights": [2, 5, 1]},
    ],
    ids=["lognormal", "uniform", "empirical"],
)
def test_correlation_one_gives_identical_lengths_within_each_group(
    response: dict[str, Any],
) -> None:
    r = _with(1.0, response).sample().response_tokens
    assert np.all(r == r[:, :1])
    assert len(np.unique(r[:, 0])) > 1  # groups still differ from each other


def test_within_group_variance_falls_as_correlation_rises() -> None:
    def within(rho: float) -> float:
        r = np.log(_with(rho, BASE["response_length"]).sample().response_tokens)
        return float(r.var(axis=1, ddof=1).mean())

    v0, v5, v9 = within(0.0), within(0.5), within(0.9)
    assert v0 > v5 > v9 > 0
    # Below the cap log-lengths are sigma*z; the within-group variance of z is 1 - rho.
    assert v5 / v0 == pytest.approx(0.5, abs=0.06)


def test_correlation_of_log_lengths_equals_rho_and_marginals_do_not_move() -> None:
    uncapped = {"kind": "lognormal", "median_tokens": 1000, "sigma": 0.7, "cap_tokens": 2**20}  # cap at 10 sigma
    for rho in (0.0, 0.3, 0.8):
        s = _with(rho, uncapped, groups=20_000, g=2).sample()
        logs = np.log(s.response_tokens)
        assert np.corrcoef(logs[:, 0], logs[:, 1])[0, 1] == pytest.approx(rho, abs=0.03)
        d = LogNormalLength.model_validate(uncapped)
        assert s.mean_response_tokens == pytest.approx(d.mean_tokens(), rel=0.03)


# ---- the sample and its helpers --------------------------------------------------------------


def test_sample_shapes_and_totals() -> None:
    w = workload_from_dict(BASE)
    s = w.sample(2)
    assert s.prompt_tokens.shape == (8,) and s.response_tokens.shape == (8, 4)
    assert s.num_responses == w.num_responses == 32
    assert s.total_tokens == 4 * int(s.prompt_tokens.sum()) + int(s.response_tokens.sum())
    assert int(s.sequence_tokens.sum()) == s.total_tokens
    assert np.array_equal(s.flat_response_tokens[s.group_ids == 3], s.response_tokens[3])
    assert s.max_response_tokens <= w.max_response_tokens == 8192
    assert s.num_at_cap == int(np.sum(s.response_tokens == 8192))
    with pytest.raises(ValueError):
        s.response_tokens[0, 0] = 1  # read-only


def test_expected_tokens_per_step_is_b_g_times_means() -> None:
    w = workload_from_dict(BASE)
    assert w.expected_response_tokens_per_step == pytest.approx(32 * 3000)
    assert w.expected_prompt_tokens_per_step == pytest.approx(8 * 225)
    assert w.expected_tokens_per_step == pytest.approx(32 * (225 + 3000))
    assert w.max_sequence_tokens == 400 + 8192


# ---- parsing: one-line errors ----------------------------------------------------------------


def test_unknown_kind_names_the_field_and_the_allowed_kinds() -> None:
    with pytest.raises(SpecError) as ei:
        workload_from_dict({**BASE, "response_length": {"kind": "gauss"}})
    assert str(ei.value) == (
        "workload.response_length.kind: unknown 'gauss'; allowed: fixed, uniform, lognormal, empirical"
    )


def test_round_trip_through_plain_dict() -> None:
    w = workload_from_dict(BASE)
    assert workload_from_dict(workload_to_dict(w)) == w


# ---- Hypothesis: valid workloads never break, invalid dicts always name the field ------------

_lengths = st.one_of(
    st.builds(lambda t: {"kind": "fixed", "tokens": t}, st.integers(1, 200_000)),
    st.integers(1, 100_000).flatmap(
        lambda lo: st.builds(
            lambda hi: {"kind": "uniform", "min_tokens": lo, "max_tokens": hi},
            st.integers(lo, lo + 100_000),
        )
    ),
    st.builds(
        lambda m, s, c: {"kind": "lognormal", "median_tokens": m, "sigma": s, "cap_tokens": c},
        st.floats(0.01, 1e6),
        st.floats(0.01, 10.0),
        st.integers(1, 500_000),
    ),
    st.integers(2, 500_000).flatmap(
        lambda c: st.builds(
            lambda f, s: {
                "kind": "lognormal",
                "mean_tokens": 1 + f * (c - 1),
                "sigma": s,
                "cap_tokens": c,
            },
            st.floats(0.001, 0.999),
            st.floats(0.05, 4.0),
        )
    ),
    st.lists(st.integers(0, 300_000), min_size=2, max_size=8, unique=True).flatmap(
        lambda e: st.builds(
            lambda w: {"kind": "empirical", "bin_edges_tokens": sorted(e), "weights": w},
            st.lists(st.floats(0.0, 10.0), min_size=len(e) - 1, max_size=len(e) - 1).filter(
                lambda w: sum(w) > 0
            ),
        )
    ),
)

_workloads = st.fixed_dictionaries(
    {
        "prompts_per_step": st.integers(1, 12),
        "group_size": st.integers(1, 12),
        "prompt_length": _lengths,
        "response_length": _lengths,
        "group_length_correlation": st.floats(0.0, 1.0),
        "seed": st.integers(0, 2**32),
    }
)


@settings(max_examples=150, deadline=None)
@given(_workloads, st.integers(0, 1000))
def test_random_valid_workloads_sample_finite_lengths_in_range(
    d: dict[str, Any], step: int
) -> None:
    w = workload_from_dict(d)
    s = w.sample(step)
    assert s.response_tokens.shape == (d["prompts_per_step"], d["group_size"])
    for arr, cap in (
        (s.prompt_tokens, w.max_prompt_tokens),
        (s.response_tokens, w.max_response_tokens),
    ):
        assert arr.dtype == np.int64 and arr.min() >= 1 and arr.max() <= cap
    for dist in (w.prompt_length, w.response_length):
        mean = dist.mean_tokens()
        assert math.isfinite(mean) and 1.0 <= mean <= dist.cap_tokens + 1e-9
        qs = [dist.quantile(q) for q in (0.0, 0.5, 0.9, 0.99, 1.0)]
        assert qs == sorted(qs) and 1 <= qs[0] and qs[-1] <= dist.cap_tokens
        assert 0.0 <= dist.fraction_at_cap() <= 1.0
    assert workload_from_dict(workload_to_dict(w)) == w


_not_int = st.sampled_from(["abc", None, [1], {"a": 1}, 1.5])
# (path inside the dict, strategy of bad values, field named in the message)
_MUTATIONS: list[tuple[tuple[str, ...], st.SearchStrategy[Any], str]] = [
    (("prompts_per_step",), st.integers(max_value=0) | _not_int, "workload.prompts_per_step"),
    (("group_size",), st.integers(max_value=0) | _not_int, "workload.group_size"),
    (("seed",), st.integers(max_value=-1) | _not_int, "workload.seed"),
    (
        ("group_length_correlation",),
        st.floats(min_value=1.001) | st.floats(max_value=-0.001) | st.just("x"),
        "workload.group_length_correlation",
    ),
    (
        ("response_length", "kind"),
        st.text(min_size=1).filter(lambda k: k not in LENGTH_KINDS),
        "workload.response_length.kind",
    ),
    (
        ("response_length", "sigma"),
        st.floats(max_value=0.0) | st.floats(min_value=10.01),
        "workload.response_length.sigma",
    ),
    (
        ("response_length", "cap_tokens"),
        st.integers(max_value=0),
        "workload.response_length.cap_tokens",
    ),
    (
        ("response_length", "mean_tokens"),
        st.floats(min_value=8192) | st.floats(max_value=1.0) | st.just("x"),
        "workload.response_length.mean_tokens",
    ),
    (
        ("prompt_length", "min_tokens"),
        st.integers(401, 10_000),
        "workload.prompt_length.min_tokens",
    ),
    (
        ("prompt_length", "max_tokens"),
        st.integers(max_value=0),
        "workload.prompt_length.max_tokens",
    ),
]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_MUTATIONS).flatmap(lambda m: st.tuples(st.just(m[0]), m[1], st.just(m[2]))))
def test_random_invalid_dicts_raise_one_line_errors_naming_the_field(mut: tuple[Any, ...]) -> None:
    path, bad, field = mut
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    target = d
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = bad
    with pytest.raises(SpecError) as ei:
        workload_from_dict(d)
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith(field + ":"), msg


@settings(max_examples=50, deadline=None)
@given(
    st.sampled_from(["response_length", "prompt_length", None]),
    st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
)
def test_unknown_keys_are_named(where: str | None, key: str) -> None:
    d = {k: dict(v) if isinstance(v, dict) else v for k, v in BASE.items()}
    target = d if where is None else d[where]
    if key in target or key in ("mean_tokens", "median_tokens"):
        return
    target[key] = 1
    with pytest.raises(SpecError) as ei:
        workload_from_dict(d)
    prefix = "workload" if where is None else f"workload.{where}"
    assert str(ei.value).startswith(f"{prefix}.{key}: unknown field; allowed: ")

"""Token-length distributions for prompts and responses of an RL rollout.

Four kinds, one frozen spec each, told apart by their ``kind`` field (a discriminated union, so
a YAML scenario writes ``{kind: lognormal, mean_tokens: 22386, sigma: 1.0, cap_tokens: 65536}``):

- :class:`FixedLength` -- every sequence has ``tokens`` tokens.
- :class:`UniformLength` -- integers uniform on ``[min_tokens, max_tokens]``.
- :class:`LogNormalLength` -- a log-normal truncated at ``cap_tokens`` with the clipped mass
  placed *at* the cap. This is what rollouts look like: generation stops at
  ``max_response_length`` and the response is kept, truncated, so a run's lengths have a spike at
  the cap (shared/research/algorithms.md §6.2: "the cap binds the tail").
- :class:`EmpiricalLength` -- a histogram over token bins, uniform inside a bin.

Every kind draws through one map from standard-normal scores to tokens,
:meth:`from_normal_scores` (the quantile function applied to ``Phi(z)``). Independent draws feed
it i.i.d. normals; :class:`rlperf.specs.workload.Workload` feeds it normals that share a latent
per prompt group (a Gaussian copula), which correlates lengths within a group while leaving each
response's marginal distribution exactly as specified. For the log-normal the normal score is the
log-length's own score, so the copula is the shared latent on the log scale.

All lengths are whole tokens, at least 1 and at most ``cap_tokens``.
"""

from __future__ import annotations

from abc import abstractmethod

import itertools
import math
from statistics import NormalDist
from typing import Annotated, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from rlperf.inputs.ranges import MEDIAN_PARAMETER_MAX_TOKENS, LogNormalMedianF, NumTokens
from rlperf.errors import SpecError
from rlperf.specs.base import Spec

Tokens = npt.NDArray[np.int64]
Floats = npt.NDArray[np.float64]

_SQRT2 = math.sqrt(2.0)
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def std_normal_cdf(z: Floats) -> Floats:
    """``Phi(z)`` elementwise, via ``erfc`` so the upper tail keeps its precision."""
    return np.asarray(0.5 * _erfc(-np.asarray(z, dtype=np.float64) / _SQRT2), dtype=np.float64)


def _phi(x: float) -> float:
    return 0.5 * math.erfc(-x / _SQRT2)


def _check_q(q: float) -> None:
    if not 0.0 <= q <= 1.0:
        raise SpecError("q", f"quantile level {q} is outside [0, 1]", "0 <= q <= 1")


class _LengthBase(Spec):
    """Shared API. Subclasses define the quantile function and the analytic moments."""

    # Every kind has ``cap_tokens`` (largest possible length, the truncation cap) and its alias
    # ``max_tokens``; each defines them itself because one of the two is a field in some kinds.

    @abstractmethod
    def mean_tokens(self) -> float:
        """Expected length in tokens."""

    @abstractmethod
    def fraction_at_cap(self) -> float:
        """Probability that a draw equals :attr:`cap_tokens`."""

    @abstractmethod
    def quantile(self, q: float) -> int:
        """Smallest length ``k`` with ``P(length <= k) >= q`` (``q`` in ``[0, 1]``)."""

    @abstractmethod
    def from_normal_scores(self, z: Floats) -> Tokens:
        """Map standard-normal scores to lengths: ``quantile(Phi(z))`` elementwise."""

    def sample(self, rng: np.random.Generator, n: int) -> Tokens:
        """``n`` independent lengths (int64, each in ``[1, cap_tokens]``)."""
        if n < 0:
            raise SpecError("n", f"cannot draw {n} samples", ">= 0")
        return self.from_normal_scores(rng.standard_normal(n))


class FixedLength(_LengthBase):
    """Every sequence has exactly ``tokens`` tokens."""

    kind: Literal["fixed"] = "fixed"
    tokens: NumTokens
    """Length of every sequence, in tokens."""

    @property
    def cap_tokens(self) -> int:
        return self.tokens

    @property
    def max_tokens(self) -> int:
        return self.tokens

    def mean_tokens(self) -> float:
        return float(self.tokens)

    def fraction_at_cap(self) -> float:
        return 1.0

    def quantile(self, q: float) -> int:
        _check_q(q)
        return self.tokens

    def from_normal_scores(self, z: Floats) -> Tokens:
        return np.full(np.shape(z), self.tokens, dtype=np.int64)


class UniformLength(_LengthBase):
    """Integer lengths uniform on ``[min_tokens, max_tokens]`` (both ends included)."""

    kind: Literal["uniform"] = "uniform"
    min_tokens: NumTokens
    """Shortest length, in tokens."""
    max_tokens: NumTokens
    """Longest length, in tokens (the cap)."""

    @model_validator(mode="after")
    def _check(self) -> UniformLength:
        if self.min_tokens > self.max_tokens:
            raise SpecError(
                "min_tokens", f"{self.min_tokens} exceeds max_tokens ({self.max_tokens})"
            )
        return self

    @property
    def _num_values(self) -> int:
        return self.max_tokens - self.min_tokens + 1

    @property
    def cap_tokens(self) -> int:
        return self.max_tokens

    def mean_tokens(self) -> float:
        return 0.5 * (self.min_tokens + self.max_tokens)

    def fraction_at_cap(self) -> float:
        return 1.0 / self._num_values

    def quantile(self, q: float) -> int:
        _check_q(q)
        return self.min_tokens + max(0, math.ceil(q * self._num_values) - 1)

    def from_normal_scores(self, z: Floats) -> Tokens:
        u = std_normal_cdf(z)
        k = np.floor(u * self._num_values).astype(np.int64)
        return np.asarray(self.min_tokens + np.minimum(k, self._num_values - 1), dtype=np.int64)


class LogNormalLength(_LengthBase):
    """A log-normal length truncated at ``cap_tokens``, the clipped mass sitting *at* the cap.

    With ``X = exp(mu + sigma*Z)`` and ``mu = ln(median_tokens)``, a length is ``min(X, cap)``
    (and at least 1 token): the probability ``1 - CDF(cap)`` that a response would run past
    ``max_response_length`` becomes a spike at the cap, as in a real rollout where generation is
    cut off and the truncated response is kept. Lengths below the cap are rounded to the nearest
    token but kept below the cap, so the spike is exactly ``1 - CDF(cap)``.

    Give either ``median_tokens`` or ``mean_tokens``. ``mean_tokens`` is the mean *after*
    truncation (what a training log reports, e.g. Seer's 22,386 tokens under a 65,536 cap); the
    median that produces it is found by bisection, and only the median is stored.
    """

    kind: Literal["lognormal"] = "lognormal"
    median_tokens: LogNormalMedianF
    """Median of the untruncated log-normal, ``exp(mu)``, in tokens (may lie past the cap)."""
    sigma: float = Field(gt=0, le=10)
    """Standard deviation of ``ln(length)`` before truncation."""
    cap_tokens: NumTokens
    """Truncation cap (``max_response_length``); draws above it are set to it."""

    @property
    def max_tokens(self) -> int:
        return self.cap_tokens

    @model_validator(mode="before")
    @classmethod
    def _median_from_mean(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if "mean_tokens" not in data:
            if "median_tokens" not in data:
                raise SpecError("median_tokens", "missing; give median_tokens or mean_tokens")
            return data
        data = dict(data)
        mean = data.pop("mean_tokens")
        if "median_tokens" in data:
            raise SpecError("mean_tokens", "given together with median_tokens; give one of them")
        data["median_tokens"] = _median_for_mean(mean, data.get("sigma"), data.get("cap_tokens"))
        return data

    @classmethod
    def from_mean(cls, mean_tokens: float, sigma: float, cap_tokens: int) -> LogNormalLength:
        """The truncated log-normal whose mean (after truncation) is ``mean_tokens``."""
        return cls.model_validate(
            {"mean_tokens": mean_tokens, "sigma": sigma, "cap_tokens": cap_tokens}
        )

    @property
    def mu(self) -> float:
        """Mean of ``ln(length)`` before truncation."""
        return math.log(self.median_tokens)

    def mean_tokens(self) -> float:
        """``E[min(max(X, 1), cap)]`` in closed form, the spike at the cap included.

        This is the mean of the continuous capped length; rounding draws to whole tokens moves
        the sample mean by well under one token.
        """
        # Clamped to [1, cap]: the closed form can stray by an ulp at the ends.
        return min(float(self.cap_tokens), max(1.0, _capped_mean(self.mu, self.sigma, self.cap_tokens)))

    def fraction_at_cap(self) -> float:
        if self.cap_tokens == 1:
            return 1.0
        # 1 - CDF(cap) via erfc, accurate when the mass at the cap is tiny.
        return 0.5 * math.erfc((math.log(self.cap_tokens) - self.mu) / (self.sigma * _SQRT2))

    def quantile(self, q: float) -> int:
        _check_q(q)
        if q >= 1.0 - self.fraction_at_cap():
            return self.cap_tokens
        if q <= 0.0:
            return 1
        x = math.exp(self.mu + self.sigma * NormalDist().inv_cdf(q))
        return int(self._round(np.array([x]))[0])

    def from_normal_scores(self, z: Floats) -> Tokens:
        return self._round(np.exp(self.mu + self.sigma * np.asarray(z, dtype=np.float64)))

    def _round(self, x: Floats) -> Tokens:
        below = np.clip(np.rint(x), 1, max(1, self.cap_tokens - 1))
        return np.where(x >= self.cap_tokens, self.cap_tokens, below).astype(np.int64)


def _capped_mean(mu: float, sigma: float, cap: int) -> float:
    """``E[min(max(X, 1), cap)]`` for ``ln X ~ N(mu, sigma^2)``, in closed form.

    ``= P(X<1)*1 + exp(mu + sigma^2/2) * [Phi(b - sigma) - Phi(a - sigma)] + cap * P(X>cap)``
    with ``a = (ln 1 - mu)/sigma`` and ``b = (ln cap - mu)/sigma`` (the partial expectation of a
    log-normal over ``[1, cap]``).
    """
    a = -mu / sigma
    b = (math.log(cap) - mu) / sigma
    partial = math.exp(mu + 0.5 * sigma * sigma) * (_phi(b - sigma) - _phi(a - sigma))
    above = 0.5 * math.erfc(b / _SQRT2)
    return _phi(a) + partial + cap * above


def _median_for_mean(mean: Any, sigma: Any, cap: Any) -> float:
    """Median whose truncated log-normal has mean ``mean`` (bisection on ``mu``; monotone).

    ``sigma`` and ``cap`` are raw inputs; when they are not usable numbers a placeholder median
    is returned and the field validators report them.
    """
    mean_f, sigma_f, cap_f = _number(mean), _number(sigma), _number(cap)
    if mean_f is None:
        raise SpecError("mean_tokens", f"{mean!r} is not a number")
    if (
        sigma_f is None
        or not 0 < sigma_f <= 10
        or cap_f is None
        or cap_f < 1
        or cap_f != int(cap_f)
    ):
        return 1.0
    if not 1.0 < mean_f < cap_f:
        raise SpecError(
            "mean_tokens", f"{mean_f:g} is not strictly between 1 and cap_tokens ({cap_f:g})"
        )
    # E[min(max(X,1),cap)] rises from 1 to cap as mu goes from -inf to +inf.
    lo, hi = -12.0 * sigma_f - 1.0, math.log(cap_f) + 12.0 * sigma_f + 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _capped_mean(mid, sigma_f, int(cap_f)) < mean_f:
            lo = mid
        else:
            hi = mid
    median = math.exp(0.5 * (lo + hi))
    if median > MEDIAN_PARAMETER_MAX_TOKENS:
        raise SpecError(
            "mean_tokens",
            f"{mean_f:g} under cap_tokens {cap_f:g} with sigma {sigma_f:g} puts almost every response at"
            " the cap (a median past 1e15 tokens)",
            "a lower mean or a smaller sigma",
        )
    return median


def _number(x: Any) -> float | None:
    """``x`` as a finite float the way pydantic's lax mode would read it, else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        return None
    try:
        f = float(x)
    except ValueError:
        return None
    return f if math.isfinite(f) else None


class EmpiricalLength(_LengthBase):
    """A histogram: bin ``i`` holds lengths ``bin_edges_tokens[i]+1 .. bin_edges_tokens[i+1]``.

    ``weights[i]`` is bin ``i``'s relative mass (normalized here); inside a bin lengths are
    uniform. A measured length histogram (e.g. from a training log) goes here; give the cap its own
    bin ``(cap-1, cap]`` to keep a spike of truncated responses.
    """

    kind: Literal["empirical"] = "empirical"
    bin_edges_tokens: tuple[int, ...] = Field(min_length=2)
    """Increasing bin edges, the first >= 0; the last edge is the cap."""
    weights: tuple[float, ...] = Field(min_length=1)
    """Non-negative mass per bin (one fewer than edges); need not sum to 1."""

    @model_validator(mode="after")
    def _check(self) -> EmpiricalLength:
        edges, w = self.bin_edges_tokens, self.weights
        if len(w) != len(edges) - 1:
            raise SpecError("weights", f"{len(w)} entries for {len(edges) - 1} bins", "one per bin")
        if edges[0] < 0 or any(b <= a for a, b in itertools.pairwise(edges)):
            raise SpecError("bin_edges_tokens", "not strictly increasing from >= 0")
        if any(x < 0 for x in w) or not 0 < sum(w) < math.inf:
            raise SpecError("weights", "negative, non-finite or all zero", "finite, >= 0, sum > 0")
        return self

    @property
    def cap_tokens(self) -> int:
        return self.bin_edges_tokens[-1]

    @property
    def max_tokens(self) -> int:
        return self.bin_edges_tokens[-1]

    def _bins(self) -> tuple[Floats, Floats, Floats]:
        """(lower edges, upper edges, cumulative probability) of the bins with mass."""
        edges = np.asarray(self.bin_edges_tokens, dtype=np.float64)
        w = np.asarray(self.weights, dtype=np.float64)
        p = w / w.sum()
        keep = p > 0  # also drops weights so small that they underflow once normalized
        cum = np.cumsum(p[keep])
        cum[-1] = 1.0  # no rounding gap above the last bin
        return edges[:-1][keep], edges[1:][keep], cum

    def mean_tokens(self) -> float:
        lo, hi, cum = self._bins()
        p = np.diff(cum, prepend=0.0)
        mean = float(np.sum(p * (lo + hi + 1.0) / 2.0))  # mean of lo+1 .. hi
        return min(float(self.cap_tokens), max(1.0, mean))  # cumulative sums can stray by an ulp

    def fraction_at_cap(self) -> float:
        lo, hi, cum = self._bins()
        if hi[-1] != self.cap_tokens:
            return 0.0
        frac = float((cum[-1] - (cum[-2] if len(cum) > 1 else 0.0)) / (hi[-1] - lo[-1]))
        return min(1.0, max(0.0, frac))  # cumulative sums can stray by an ulp

    def quantile(self, q: float) -> int:
        _check_q(q)
        return int(self._from_uniform(np.array([q]))[0])

    def from_normal_scores(self, z: Floats) -> Tokens:
        return self._from_uniform(std_normal_cdf(z))

    def _from_uniform(self, u: Floats) -> Tokens:
        lo, hi, cum = self._bins()
        i = np.minimum(np.searchsorted(cum, u, side="left"), len(cum) - 1)
        start = np.where(i > 0, cum[np.maximum(i - 1, 0)], 0.0)
        width = cum[i] - start  # > 0 except where rounding merged a tiny bin into its neighbour
        frac = np.clip((u - start) / np.where(width > 0, width, 1.0), 0.0, 1.0)
        x = np.ceil(lo[i] + frac * (hi[i] - lo[i]))
        return np.clip(x, lo[i] + 1, hi[i]).astype(np.int64)


LengthDistribution = Annotated[
    FixedLength | UniformLength | LogNormalLength | EmpiricalLength,
    Field(discriminator="kind"),
]
"""Any length distribution, chosen by its ``kind`` field."""

LENGTH_KINDS: tuple[str, ...] = ("fixed", "uniform", "lognormal", "empirical")

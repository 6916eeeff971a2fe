"""The RL workload of one step: how many prompts, how many responses each, and how long they are.

A :class:`Workload` is ``prompts_per_step`` prompts (the train batch ``B``), each answered
``group_size`` times (``G``, GRPO's group or ``rollout.n``), with prompt and response lengths
drawn from :mod:`rlperf.specs.lengths` distributions. Response lengths are long-tailed with a
spike at the cap, and the longest one sets the rollout's depth, so a step is described by a
*sample* of lengths (:meth:`Workload.sample`), not by the mean alone.

Responses of one prompt have similar lengths (Seer, arXiv 2511.14617, Fig. 4; see
shared/research/algorithms.md §6.2). ``group_length_correlation`` (``rho``) models this with a
Gaussian copula: response ``g`` of prompt ``b`` gets the normal score
``z[b, g] = sqrt(rho) * u[b] + sqrt(1 - rho) * e[b, g]`` with ``u`` and ``e`` independent standard
normals, and its length is the response distribution's quantile at ``Phi(z)``. Each response
keeps exactly the specified distribution; ``rho`` is the correlation of the normal scores within
a group (for the log-normal: of the log-lengths before truncation). ``rho = 0`` gives independent
responses, ``rho = 1`` identical lengths within a group.

Sampling is deterministic: step ``s`` of a workload with seed ``k`` draws from
``SeedSequence(k, spawn_key=(s,))``, split into independent streams for prompt lengths, group
latents and per-response noise. The streams do not depend on ``rho``, so two workloads that
differ only in ``rho`` see the same random numbers (common random numbers for comparisons).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field, ValidationError, model_validator

from rlperf.inputs.ranges import RESPONSES, GroupSize, NumPrompts
from rlperf.errors import SpecError
from rlperf.specs.base import Spec
from rlperf.specs.lengths import (
    LENGTH_KINDS,
    EmpiricalLength,
    FixedLength,
    LengthDistribution,
    LogNormalLength,
    Tokens,
    UniformLength,
)

__all__ = [
    "LENGTH_KINDS",
    "EmpiricalLength",
    "FixedLength",
    "LengthDistribution",
    "LogNormalLength",
    "UniformLength",
    "Workload",
    "WorkloadSample",
    "workload_from_dict",
    "workload_to_dict",
]


@dataclass(frozen=True, eq=False)
class WorkloadSample:
    """The lengths of one step's prompts and responses (read-only int64 arrays)."""

    step: int
    prompt_tokens: Tokens
    """Shape ``(B,)``: length of each prompt."""
    response_tokens: Tokens
    """Shape ``(B, G)``: length of response ``g`` of prompt ``b``."""
    response_cap_tokens: int
    """The response cap the lengths were drawn under (to count truncated responses)."""

    def __post_init__(self) -> None:
        assert self.prompt_tokens.ndim == 1 and self.response_tokens.ndim == 2
        assert self.response_tokens.shape[0] == self.prompt_tokens.shape[0]
        self.prompt_tokens.setflags(write=False)
        self.response_tokens.setflags(write=False)

    @property
    def num_prompts(self) -> int:
        return int(self.response_tokens.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.response_tokens.shape[1])

    @property
    def num_responses(self) -> int:
        return int(self.response_tokens.size)

    @property
    def total_prompt_tokens(self) -> int:
        """Tokens of the distinct prompts (prefill work when a group shares its prompt's KV)."""
        return int(self.prompt_tokens.sum())

    @property
    def total_response_tokens(self) -> int:
        """Generated tokens in the step (decode work)."""
        return int(self.response_tokens.sum())

    @property
    def total_tokens(self) -> int:
        """Tokens of all ``B*G`` sequences, prompt included (what a train or log-prob pass reads)."""
        return self.group_size * self.total_prompt_tokens + self.total_response_tokens

    @property
    def max_response_tokens(self) -> int:
        """Longest response: the decode depth of a synchronous rollout."""
        return int(self.response_tokens.max())

    @property
    def mean_response_tokens(self) -> float:
        return float(self.response_tokens.mean())

    @property
    def num_at_cap(self) -> int:
        """Responses truncated at the cap."""
        return int(np.count_nonzero(self.response_tokens == self.response_cap_tokens))

    @property
    def fraction_at_cap(self) -> float:
        return self.num_at_cap / self.num_responses

    @property
    def flat_response_tokens(self) -> Tokens:
        """Shape ``(B*G,)``: responses in prompt-major order (those of prompt 0 first)."""
        return self.response_tokens.reshape(-1)

    @property
    def group_ids(self) -> Tokens:
        """Shape ``(B*G,)``: the prompt index of each entry of :attr:`flat_response_tokens`."""
        return np.repeat(np.arange(self.num_prompts, dtype=np.int64), self.group_size)

    @property
    def sequence_tokens(self) -> Tokens:
        """Shape ``(B*G,)``: prompt plus response length of each sequence, prompt-major."""
        return self.prompt_tokens[self.group_ids] + self.flat_response_tokens


class Workload(Spec):
    """Prompts per step, responses per prompt, and their length distributions."""

    prompts_per_step: NumPrompts
    """Prompts in one step's batch (verl ``data.train_batch_size``), ``B``."""
    group_size: GroupSize
    """Responses sampled per prompt (GRPO group, verl ``rollout.n``), ``G``."""
    prompt_length: LengthDistribution
    """Distribution of prompt lengths in tokens (capped at ``max_prompt_length``)."""
    response_length: LengthDistribution
    """Distribution of response lengths in tokens (capped at ``max_response_length``)."""
    group_length_correlation: float = Field(default=0.0, ge=0.0, le=1.0)
    """Correlation of response lengths within a group, on the normal-score scale (0..1)."""
    seed: int = Field(default=0, ge=0)
    """Seed of the length draws; step ``s`` uses ``SeedSequence(seed, spawn_key=(s,))``."""
    max_total_tokens: int | None = Field(default=None, gt=0)
    """Cap on prompt + response together (vLLM ``max_model_len``, OpenRLHF ``--max_len``): a
    response stops at ``max_total_tokens - prompt`` when that comes before its own cap. None: no
    joint cap. The analytic ``expected_*`` figures ignore it (an upper bound); samples obey it."""

    @model_validator(mode="after")
    def _check_total(self) -> Workload:
        if self.max_total_tokens is not None and self.max_total_tokens <= self.prompt_length.cap_tokens:
            raise SpecError(
                "max_total_tokens", f"{self.max_total_tokens} leaves no room for a response after the prompt cap",
                f"> {self.prompt_length.cap_tokens}",
            )
        RESPONSES.require("prompts_per_step", self.prompts_per_step * self.group_size)  # x group_size
        return self

    @property
    def num_responses(self) -> int:
        """Responses per step, ``B*G``."""
        return self.prompts_per_step * self.group_size

    @property
    def max_prompt_tokens(self) -> int:
        return self.prompt_length.cap_tokens

    @property
    def max_response_tokens(self) -> int:
        return self.response_length.cap_tokens

    @property
    def max_sequence_tokens(self) -> int:
        """Longest possible sequence, prompt plus response (sizes KV cache and context)."""
        both = self.max_prompt_tokens + self.max_response_tokens
        return both if self.max_total_tokens is None else min(both, self.max_total_tokens)

    @property
    def expected_prompt_tokens_per_step(self) -> float:
        """``B * E[L_p]``: tokens of the distinct prompts."""
        return self.prompts_per_step * self.prompt_length.mean_tokens()

    @property
    def expected_response_tokens_per_step(self) -> float:
        """``B * G * E[L_r]``: generated tokens."""
        return self.num_responses * self.response_length.mean_tokens()

    @property
    def expected_tokens_per_step(self) -> float:
        """``B * G * (E[L_p] + E[L_r])``: tokens of all sequences, prompts included."""
        return self.num_responses * (
            self.prompt_length.mean_tokens() + self.response_length.mean_tokens()
        )

    def sample(self, step: int = 0) -> WorkloadSample:
        """The lengths of step ``step`` (same seed and step give identical arrays)."""
        if step < 0:
            raise SpecError("step", f"{step} is negative", ">= 0")
        root = np.random.SeedSequence(self.seed, spawn_key=(step,))
        prompt_seq, latent_seq, noise_seq = (np.random.default_rng(s) for s in root.spawn(3))
        b, g, rho = self.prompts_per_step, self.group_size, self.group_length_correlation
        prompts = self.prompt_length.sample(prompt_seq, b)
        latent = latent_seq.standard_normal((b, 1))
        noise = noise_seq.standard_normal((b, g))
        scores = math.sqrt(rho) * latent + math.sqrt(1.0 - rho) * noise
        responses = self.response_length.from_normal_scores(scores)
        if self.max_total_tokens is not None:  # the joint cap cuts long responses of long prompts
            responses = np.minimum(responses, self.max_total_tokens - prompts[:, None])
        return WorkloadSample(step, prompts, responses, self.max_response_tokens)


# ---- parsing from plain dicts (YAML scenarios) ---------------------------------------------

_KIND_CLASSES: dict[str, type[Spec]] = {
    "fixed": FixedLength,
    "uniform": UniformLength,
    "lognormal": LogNormalLength,
    "empirical": EmpiricalLength,
}
_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def workload_from_dict(data: Any, where: str = "workload") -> Workload:
    """Validate a plain mapping (as YAML gives it) into a :class:`Workload`.

    Raises:
        SpecError: one line naming the offending field, e.g.
            ``workload.response_length.kind: unknown 'gauss' (allowed: fixed, uniform, ...)``.
    """
    if not isinstance(data, Mapping):
        raise SpecError(where, f"expected a mapping, got {type(data).__name__}")
    from rlperf.inputs.booleans import boolean_for_number

    flagged = boolean_for_number(Workload, data, where)
    if flagged is not None:
        raise SpecError(flagged, "true/false given for a number", "a number")
    try:
        return Workload.model_validate(dict(data))
    except ValidationError as err:
        raise _one_line(err, where) from None


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """Plain-data form of ``workload``; :func:`workload_from_dict` reads it back unchanged."""
    return workload.model_dump(mode="json")


def _one_line(err: ValidationError, where: str) -> SpecError:
    """The first validation error as a one-line SpecError with a dotted field path.

    Pydantic puts a discriminated union's tag into the error location
    (``response_length.lognormal.sigma``); the tag is dropped so the path is the YAML path.
    """
    first = err.errors()[0]
    raw = tuple(first.get("loc", ()))
    loc = [str(p) for i, p in enumerate(raw) if not (i > 0 and p in _KIND_CLASSES)]
    field = ".".join([where, *loc])
    kind, ctx = first["type"], first.get("ctx") or {}
    more = len(err.errors()) - 1
    suffix = f" (+{more} more)" if more else ""
    kinds = ", ".join(LENGTH_KINDS)
    if kind == "union_tag_invalid":
        return SpecError(f"{field}.kind", f"unknown {ctx.get('tag')!r}{suffix}", kinds)
    if kind == "union_tag_not_found":
        return SpecError(f"{field}.kind", f"missing{suffix}", kinds)
    if kind == "missing":
        return SpecError(field, f"missing (required){suffix}")
    if kind == "extra_forbidden":
        return SpecError(field, f"unknown field{suffix}", ", ".join(_field_names(raw)))
    cause = ctx.get("error")
    if isinstance(cause, SpecError):  # raised by a validator; it names the field inside its model
        return SpecError(f"{field}.{cause.field}", f"{cause.problem}{suffix}", cause.allowed)
    bound = next((f"{op} {ctx[k]}" for k, op in _BOUNDS.items() if k in ctx), None)
    problem = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return SpecError(field, f"{problem}{suffix}", bound or ctx.get("expected"))


def _field_names(raw_loc: tuple[Any, ...]) -> list[str]:
    """Fields allowed where an unknown key was found (the workload or one length kind)."""
    if len(raw_loc) >= 3 and raw_loc[1] in _KIND_CLASSES:
        cls = _KIND_CLASSES[raw_loc[1]]
        names = list(cls.model_fields)
        return names + ["mean_tokens"] if cls is LogNormalLength else names
    return list(Workload.model_fields)

"""Workload presets from published RL recipes (shared/research/algorithms.md §4 and §6).

The published numbers are data, in ``rlperf/data/workload_presets.yaml``. Each preset is a
:class:`Workload` plus where its numbers come from: ``published`` holds the
table cells *as written* in algorithms.md (§4 "Published recipe hyperparameters"; §6.2 for the
mean response lengths Seer reports), and ``assumptions`` lists every choice the source leaves
open. The open choices use the same generic rules for every preset:

- Response lengths are a log-normal truncated at the published ``max_response_length``, with
  :data:`RESPONSE_SIGMA` = 1.0. Source: §6.2 modeling guidance ("lengths are approximately
  log-normal"; its illustrative median ~500 and p99 ~5,000 give
  ``sigma = ln(10) / z_0.99 = 2.303 / 2.326 = 0.99``). No recipe publishes a spread.
- Where a recipe publishes no mean response length, the mean (after truncation) is
  :data:`MEAN_OVER_CAP` = 1/3 of the cap: §6.2 R1-Zero, "the mean is roughly a third of the cap
  (our arithmetic: ~12k / 32k)". With sigma = 1 this truncates 7.3% of responses at the cap.
- Responses of one prompt have correlated lengths (Seer Fig. 4, §6.2: "strongly correlated"; no
  coefficient is published): :data:`GROUP_CORRELATION` = 0.5 on the normal-score scale.
- Prompt lengths are never published, only their cap (a filter: longer prompts are dropped): a
  log-normal with median ``min(256, cap/4)`` tokens and sigma 0.5, truncated at the published
  ``max_prompt_length``; :data:`ASSUMED_PROMPT_CAP_TOKENS` = 2048 where no cap is published.
  Math and reasoning prompts with their chat template are a few hundred tokens.

Oversampling (DAPO, PRIME), ReMax's extra greedy response and rejection of zero-advantage groups
are algorithm stages, not workload: a preset describes the batch that is trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import Field

from rlperf.errors import parse, unknown_name
from rlperf.specs.base import Spec
from rlperf.specs.hardware_catalog import SAFE_LOADER
from rlperf.specs.lengths import LogNormalLength
from rlperf.specs.workload import Workload, workload_from_dict, workload_to_dict

RESPONSE_SIGMA = 1.0
"""Std. dev. of ln(response length) before truncation, for every preset (see module doc)."""
MEAN_OVER_CAP = 1.0 / 3.0
"""Mean response length / cap, used where a recipe publishes no mean (R1-Zero, §6.2)."""
GROUP_CORRELATION = 0.5
"""Within-group correlation of response lengths (normal-score scale), for every preset."""
PROMPT_MEDIAN_TOKENS = 256
"""Median prompt length in tokens (cap/4 where that is smaller)."""
PROMPT_SIGMA = 0.5
"""Std. dev. of ln(prompt length) before truncation."""
ASSUMED_PROMPT_CAP_TOKENS = 2048
"""Prompt cap where the source publishes none."""

PublishedKey = Literal[
    "prompts_per_step",
    "group_size",
    "max_prompt_tokens",
    "max_response_tokens",
    "mean_response_tokens",
]
"""What a preset's ``published`` cells may set: a Workload property, or the response mean."""


@dataclass(frozen=True)
class WorkloadPreset:
    """A published workload, with its source and the assumptions that fill its gaps."""

    name: str
    workload: Workload
    source: str
    """Citation: the papers or scripts, as algorithms.md cites them."""
    table_row: str
    """The algorithms.md §4 row (its "Recipe (source)" cell) the numbers are read from."""
    row_part: int | None
    """For rows that list several workloads as ``a / b / c`` (Seer): which one; else None."""
    published: tuple[tuple[str, str], ...]
    """(PublishedKey, cell text exactly as in algorithms.md)."""
    assumptions: tuple[str, ...]
    """Every value the source leaves open, and the choice made."""


class _PresetRecord(Spec):
    """One entry of ``data/workload_presets.yaml`` (validated once at load)."""

    name: str = Field(min_length=1)
    source: str = Field(min_length=1)
    table_row: str = Field(min_length=1)
    row_part: int | None = Field(default=None, ge=0)
    prompts_per_step: int = Field(gt=0)
    group_size: int = Field(gt=0)
    max_prompt_tokens: int | None = Field(gt=0)
    """None: not published (ASSUMED_PROMPT_CAP_TOKENS is used)."""
    max_response_tokens: int = Field(gt=1)
    mean_response_tokens: float | None = Field(gt=1)
    """Mean after truncation; None: not published (MEAN_OVER_CAP of the cap is used)."""
    published: dict[PublishedKey, str]
    notes: tuple[str, ...] = ()


def _prompt_length(cap_tokens: int) -> LogNormalLength:
    median = min(PROMPT_MEDIAN_TOKENS, cap_tokens / 4)
    return LogNormalLength(median_tokens=median, sigma=PROMPT_SIGMA, cap_tokens=cap_tokens)


def _build(rec: _PresetRecord) -> WorkloadPreset:
    """The preset of one record: published numbers plus the generic rules for the gaps."""
    assumptions = [
        *rec.notes,
        f"response length: log-normal, sigma {RESPONSE_SIGMA:g} (not published)",
    ]
    mean = rec.mean_response_tokens
    if mean is None:
        mean = rec.max_response_tokens * MEAN_OVER_CAP
        assumptions.append(f"mean response {mean:,.0f} tokens = cap/3 (no mean published)")
    prompt_cap = rec.max_prompt_tokens
    if prompt_cap is None:
        prompt_cap = ASSUMED_PROMPT_CAP_TOKENS
        assumptions.append(f"prompt cap {prompt_cap} tokens (not published)")
    prompt = _prompt_length(prompt_cap)
    assumptions.append(
        f"prompt length: log-normal, median {prompt.median_tokens:g}, sigma {PROMPT_SIGMA:g},"
        " capped (not published)"
    )
    assumptions.append(f"within-group length correlation {GROUP_CORRELATION:g} (not published)")
    workload = Workload(
        prompts_per_step=rec.prompts_per_step,
        group_size=rec.group_size,
        prompt_length=prompt,
        response_length=LogNormalLength.from_mean(mean, RESPONSE_SIGMA, rec.max_response_tokens),
        group_length_correlation=GROUP_CORRELATION,
    )
    published = tuple((str(k), v) for k, v in rec.published.items())
    return WorkloadPreset(
        rec.name, workload, rec.source, rec.table_row, rec.row_part, published, tuple(assumptions)
    )


@lru_cache(maxsize=1)
def _presets() -> dict[str, WorkloadPreset]:
    text = (resources.files("rlperf") / "data" / "workload_presets.yaml").read_text("utf-8")
    out: dict[str, WorkloadPreset] = {}
    for raw in yaml.load(text, Loader=SAFE_LOADER)["presets"]:
        rec = parse(_PresetRecord, raw, where=f"workload_presets.yaml[{raw.get('name', '?')}]")
        assert rec.name not in out, f"duplicate workload preset {rec.name}"
        out[rec.name] = _build(rec)
    return out


def list_workload_presets() -> list[str]:
    """Names of all workload presets, sorted."""
    return sorted(_presets())


def get_workload_preset(name: str) -> WorkloadPreset:
    """The preset record (workload, source, published cells, assumptions)."""
    presets = _presets()
    if name not in presets:
        raise unknown_name("workload.preset", name, presets)
    return presets[name]


def load_workload_preset(name: str, **overrides: Any) -> Workload:
    """The preset's workload, with fields replaced by ``overrides`` (validated like a dict).

    Example: ``load_workload_preset("dapo-qwen2.5-32b", group_size=8, seed=3)``.
    """
    workload = get_workload_preset(name).workload
    if not overrides:
        return workload
    return workload_from_dict({**workload_to_dict(workload), **overrides})

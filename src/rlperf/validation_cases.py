"""Validation cases: published measurements turned into scenarios (the file format).

A cases file (``rlperf/data/validation_cases.yaml`` ships; ``rlperf validate --cases FILE``
reads any other) is YAML:

```yaml
version: 1
simulation: {iterations: 3, warmup: 1}   # default for every scenario that sets none
templates:                               # named scenario fragments, deep-merged by `template:`
  verl-h20: {model: Qwen2.5-Math-7B, cluster: {gpu: H20, gpus_per_node: 8}, ...}
cases:
  - id: verl-1off-fsdp2-colocate         # unique
    source_url: https://...              # where the number is published
    measurement: verl-1off-fsdp2-colocate  # its id in shared/research/published_measurements.yaml
    metric: {kind: step_time_s}          # see Metric
    measured: 749
    published: "749 s (table 'step')"    # the value as written, when `measured` converts it
    lengths: unknown                     # or published (the source gives them) or not_used
    scenario: {template: verl-h20, cluster: {num_nodes: 2}, plan: {...}}
    baseline: {...}                      # speedup only: the setup the speedup is measured against
    assumptions: ["batch 512 prompts (the recipe script of the time; not in the doc)", ...]
skipped:
  - {id: verl-v030-release-speedup, reason: "no setup given"}
```

**Response lengths the source does not publish** are written ``mean_tokens: unknown`` in the
scenario's ``response_length`` (a log-normal with its published cap), and the case says
``lengths: unknown``. Such a case is not scored at one guessed mean: it is simulated at the
means of the file's ``length_sweep`` (geometric from ``lower_tokens`` to ``upper_cap_fraction``
x cap), and ``rlperf validate`` reports the mean response length at which the prediction would
equal the measurement, and whether that mean is plausible (within ``[lower_tokens, cap]``).
Only cases with published lengths (or none used) enter the error statistics.

A scenario is a :class:`rlperf.scenario.ScenarioSpec` mapping; ``template: NAME`` deep-merges
the named template under it (mappings merge key by key, everything else is replaced). Model
paths (``model``, ``algorithm.critic_model``, ``algorithm.reward.model``) that name a file next
to the cases file are resolved against the cases file's folder.

Every error is one line naming the case and the field: ``cases[ID].scenario.plan.rollout.tp: ...``.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from rlperf.errors import SpecError, parse
from rlperf.specs.base import Spec

MetricKind = Literal["step_time_s", "stage_time_s", "stage_share", "throughput", "speedup", "weight_sync_time_s"]
METRIC_KINDS: tuple[str, ...] = MetricKind.__args__  # type: ignore[attr-defined]
ThroughputUnit = Literal["tokens_per_s", "tokens_per_s_per_gpu", "samples_per_s", "samples_per_s_per_gpu"]
Split = Literal["calibration", "holdout"]


class Metric(Spec):
    """What is compared, and how the prediction is read from a simulation.

    - ``step_time_s``: the steady-state step time.
    - ``stage_time_s``: the summed mean time of ``stages`` per step.
    - ``stage_share``: that sum over the step time (e.g. the rollout's share of a step).
    - ``throughput``: ``unit`` of work per second; tokens are the ``tokens`` kind (``trained``:
      prompt + response of the trained sequences; ``generated``: response tokens generated);
      samples are the trained responses (prompts x group size). Over the step time, or over the
      summed time of ``stages`` when given.
    - ``speedup``: the baseline's value over the case's value (step time, or the summed time of
      ``stages`` when given); a published percentage gain ``+p%`` is ``1 + p/100``.
    - ``weight_sync_time_s``: the weight sync stage (trainer -> rollout engine).
    """

    kind: MetricKind
    stages: tuple[str, ...] = ()
    unit: ThroughputUnit | None = None
    tokens: Literal["trained", "generated"] = "trained"

    @model_validator(mode="after")
    def _check(self) -> Metric:
        if self.kind in ("stage_time_s", "stage_share") and not self.stages:
            raise ValueError(f"{self.kind} needs stages")
        if self.kind in ("step_time_s", "weight_sync_time_s") and self.stages:
            raise ValueError(f"{self.kind} takes no stages")
        if (self.kind == "throughput") != (self.unit is not None):
            raise ValueError("unit is required for throughput and only allowed there")
        return self

    @property
    def label(self) -> str:
        if self.kind == "throughput":
            base = f"throughput {self.unit}" + (" (generated)" if self.tokens == "generated" and "tokens" in str(self.unit) else "")
        else:
            base = self.kind
        return f"{base} [{'+'.join(self.stages)}]" if self.stages else base


class Case(Spec):
    id: str = Field(min_length=1, pattern=r"^[A-Za-z0-9._+\-]+$")
    source_url: str = Field(min_length=1)
    measurement: str | None = None  # id in shared/research/published_measurements.yaml
    metric: Metric
    measured: float = Field(gt=0)
    published: str = ""
    scenario: dict[str, Any]
    baseline: dict[str, Any] | None = None
    # Whether the source publishes the response lengths (a mean or a range), does not (the case
    # is then scored as a function of the mean: see the module docstring), or the metric does
    # not depend on them (weight sync).
    lengths: Literal["published", "unknown", "not_used"] = "unknown"
    assumptions: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> Case:
        if (self.metric.kind == "speedup") != (self.baseline is not None):
            raise ValueError("baseline is required for a speedup and only allowed there")
        return self


class Skipped(Spec):
    id: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    source_url: str = ""


class LengthSweep(Spec):
    """Mean response lengths at which a case without published lengths is simulated."""

    lower_tokens: int = Field(default=128, gt=0)  # the shortest plausible mean response
    upper_cap_fraction: float = Field(default=0.5, gt=0, lt=1)  # the longest mean simulated, x cap
    points: int = Field(default=3, ge=2, le=8)

    def means(self, cap_tokens: int) -> tuple[float, ...]:
        """``points`` means, geometric from ``lower_tokens`` to ``upper_cap_fraction x cap``."""
        lo, hi = float(min(self.lower_tokens, cap_tokens / 4)), self.upper_cap_fraction * cap_tokens
        if hi <= lo:
            return (hi,)
        r = (hi / lo) ** (1.0 / (self.points - 1))
        return tuple(round(lo * r**i, 1) for i in range(self.points))


UNKNOWN = "unknown"  # the value of ``response_length.mean_tokens`` the source does not publish


class CaseFileSpec(Spec):
    version: Literal[1] = 1
    simulation: dict[str, Any] = Field(default_factory=dict)
    length_sweep: LengthSweep = LengthSweep()
    templates: dict[str, dict[str, Any]] = Field(default_factory=dict)
    cases: tuple[dict[str, Any], ...] = ()  # validated one by one (errors name the case)
    skipped: tuple[Skipped, ...] = ()


@dataclass(frozen=True)
class LengthPoint:
    """A case's scenarios with the unknown mean response length set to ``mean_tokens``."""

    mean_tokens: float
    scenario: dict[str, Any]
    baseline: dict[str, Any] | None


@dataclass(frozen=True)
class ValidationCase:
    """A validated case with its scenarios expanded (templates merged, paths resolved).

    With published lengths ``scenario``/``baseline`` are what is simulated; with unknown lengths
    ``sweep`` holds them at each swept mean (``scenario`` is then the first point's)."""

    spec: Case
    scenario: dict[str, Any]
    baseline: dict[str, Any] | None
    split: Split
    sweep: tuple[LengthPoint, ...] = ()
    lower_tokens: int = 0  # the shortest plausible mean (unknown lengths)
    cap_tokens: int = 0  # the response cap (unknown lengths)

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def points(self) -> tuple[LengthPoint, ...]:
        """What to simulate: the sweep, or the one published point."""
        return self.sweep or (LengthPoint(math.nan, self.scenario, self.baseline),)


@dataclass(frozen=True)
class CaseFile:
    path: Path
    cases: tuple[ValidationCase, ...]
    skipped: tuple[Skipped, ...]


def calibration_split(source_url: str) -> Split:
    """Which side of the calibration a case is on, decided by its *source*, not by the case.

    ``crc32(source_url)`` even -> calibration, odd -> hold-out. All numbers of one document
    (which share hardware, framework and version) land on the same side, so the hold-out holds
    only sources the fit never saw. The rule was fixed before any error was computed."""
    return "calibration" if zlib.crc32(source_url.encode("utf-8")) % 2 == 0 else "holdout"


def shipped_cases_path() -> Path:
    return Path(str(resources.files("rlperf") / "data" / "validation_cases.yaml"))


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merge key by key, other values are replaced."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _expand(data: Mapping[str, Any], templates: Mapping[str, Mapping[str, Any]], where: str,
            seen: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise SpecError(where, f"must be a mapping, got {type(data).__name__}")
    data = dict(data)
    name = data.pop("template", None)
    if name is None:
        return data
    if not isinstance(name, str):
        raise SpecError(f"{where}.template", f"must be a template name, got a {type(name).__name__}",
                        ", ".join(sorted(templates)) or "none defined")
    if name not in templates:
        raise SpecError(f"{where}.template", f"unknown template {name!r}", ", ".join(sorted(templates)) or "none defined")
    if name in seen:
        raise SpecError(f"{where}.template", f"template cycle {' -> '.join((*seen, name))}")
    base = _expand(templates[name], templates, where, (*seen, name))
    return deep_merge(base, data)


def _resolve_paths(sc: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    def fix(value: Any) -> Any:
        if isinstance(value, str) and value.endswith(".json"):
            p = base_dir / value
            if p.is_file():
                return str(p)
        return value

    sc = dict(sc)
    if "model" in sc:
        sc["model"] = fix(sc["model"])
    alg = sc.get("algorithm")
    if isinstance(alg, Mapping):
        alg = dict(alg)
        if "critic_model" in alg:
            alg["critic_model"] = fix(alg["critic_model"])
        rew = alg.get("reward")
        if isinstance(rew, Mapping) and "model" in rew:
            alg["reward"] = {**rew, "model": fix(rew["model"])}
        sc["algorithm"] = alg
    return sc


def scenario_key(mapping: Mapping[str, Any]) -> str:
    """Canonical text of a scenario mapping without its name (equal scenarios are simulated once)."""
    return json.dumps({k: v for k, v in mapping.items() if k != "name"}, sort_keys=True, default=str)


def check_scenario(mapping: Mapping[str, Any], where: str) -> None:
    """Resolve the scenario once (catalog names, layouts, workload) so errors surface at load."""
    from rlperf.scenario import load_scenario

    try:
        load_scenario(mapping)
    except SpecError as err:
        raise SpecError(f"{where}.{err.field}", err.problem, err.allowed) from None


def _response_mean(sc: Mapping[str, Any]) -> tuple[Any, int]:
    """(mean_tokens as written, cap) of a scenario's explicit response length (None, 0 if none)."""
    rl = sc.get("workload", {}).get("response_length", {}) if isinstance(sc.get("workload"), Mapping) else {}
    if not isinstance(rl, Mapping):
        return None, 0
    return rl.get("mean_tokens"), int(rl.get("cap_tokens", 0) or 0)


def _at_mean(sc: Mapping[str, Any], mean: float) -> dict[str, Any]:
    return deep_merge(sc, {"workload": {"response_length": {"mean_tokens": mean}}})


def _sweep(case: Case, scenario: dict[str, Any], baseline: dict[str, Any] | None, sweep: LengthSweep,
           where: str) -> tuple[tuple[LengthPoint, ...], int]:
    """The sweep of an unknown-length case; checks that ``mean_tokens: unknown`` and ``lengths``
    agree in the scenario and its baseline."""
    mean, cap = _response_mean(scenario)
    unknown = mean == UNKNOWN
    for field, sc in (("scenario", scenario), ("baseline", baseline)):
        here = sc is not None and _response_mean(sc)[0] == UNKNOWN
        if sc is not None and here != (case.lengths == "unknown"):
            raise SpecError(
                f"{where}.{field}.workload.response_length.mean_tokens",
                f"is {'unknown' if here else 'given'} but the case says lengths: {case.lengths}",
                "mean_tokens: unknown exactly when lengths: unknown",
            )
    if not unknown:
        return (), 0
    if not cap:
        raise SpecError(f"{where}.scenario.workload.response_length.cap_tokens", "needed when mean_tokens is unknown")
    points = tuple(
        LengthPoint(m, _at_mean(scenario, m), None if baseline is None else _at_mean(baseline, m))
        for m in sweep.means(cap)
    )
    return points, cap


def _case(raw: Any, i: int, spec: CaseFileSpec, base_dir: Path, check: bool) -> ValidationCase:
    cid = raw.get("id", f"#{i}") if isinstance(raw, Mapping) else f"#{i}"
    where = f"cases[{cid}]"
    if not isinstance(raw, Mapping):
        raise SpecError(where, f"must be a mapping, got {type(raw).__name__}")
    case = parse(Case, raw, where=where)
    scenarios: list[dict[str, Any] | None] = []
    for field, data in (("scenario", case.scenario), ("baseline", case.baseline)):
        if data is None:
            scenarios.append(None)
            continue
        sc = _expand(data, spec.templates, f"{where}.{field}")
        if "simulation" not in sc and spec.simulation:
            sc["simulation"] = dict(spec.simulation)
        sc.setdefault("name", case.id if field == "scenario" else f"{case.id}:baseline")
        scenarios.append(_resolve_paths(sc, base_dir))
    scenario, baseline = scenarios
    assert scenario is not None
    sweep, cap = _sweep(case, scenario, baseline, spec.length_sweep, where)
    if sweep:
        scenario, baseline = sweep[0].scenario, sweep[0].baseline
    if check:
        check_scenario(scenario, f"{where}.scenario")
        if baseline is not None:
            check_scenario(baseline, f"{where}.baseline")
    return ValidationCase(case, scenario, baseline, calibration_split(case.source_url), sweep,
                          spec.length_sweep.lower_tokens, cap)


def load_cases(path: str | Path | None = None, check: bool = True) -> CaseFile:
    """Read and validate a cases file (the shipped one when ``path`` is None).

    ``check`` also resolves every scenario (models, cluster, layouts), so a malformed case fails
    here with its id and field rather than half-way through a validation run."""
    p = shipped_cases_path() if path is None else Path(path)
    from rlperf.errors import show_path
    from rlperf.inputs import load_yaml

    data = load_yaml(p, "cases")
    if not isinstance(data, Mapping):
        raise SpecError("<root>", "not a mapping", "a mapping with a 'cases' list", show_path(p))
    spec = parse(CaseFileSpec, data, where="cases_file")
    cases = tuple(_case(raw, i, spec, p.parent, check) for i, raw in enumerate(spec.cases))
    seen: set[str] = set()
    for c in cases:
        if c.id in seen:
            raise SpecError(f"cases[{c.id}].id", "duplicate id")
        seen.add(c.id)
    return CaseFile(p, cases, spec.skipped)

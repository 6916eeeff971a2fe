"""How RL post-training frameworks run a step: one frozen preset per framework, in a registry.

A preset records, from ``shared/research/frameworks_overview.md`` §1 (the at-a-glance table; a
note's ``[tag]`` is that table's source tag), which strategies of the taxonomy the framework
supports (placements, execution modes, training parallelism), its training backends, rollout
engines and weight-sync mechanism, and the algorithms it documents (those in rlperf's registry).

:class:`PlanDefaults` says how the framework runs a workload when the user changes nothing: its
documented default placement, mode and backend, and the default numbers of its configuration
(``source`` names them; numbers no document gives are listed in ``assumed``).
:meth:`FrameworkPreset.default_plan` turns that into an rlperf :class:`Plan` for a scenario
(see :mod:`rlperf.frameworks.default_plan`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlperf.errors import SpecError, unknown_name
from rlperf.specs.parallel import LogitsDtype, Recompute, ZeroStage
from rlperf.specs.plan import ModeKind, PlacementKind

if TYPE_CHECKING:
    from rlperf.scenario import ScenarioSpec
    from rlperf.specs.plan import Plan

Level = Literal["yes", "partial", "no", "unknown"]
Strategy = Literal[
    "colocated", "disaggregated", "hybrid",
    "sync", "one_step_off", "async", "partial_rollout", "fusion",
    "zero", "tp", "pp", "sp_ulysses", "cp_ring", "ep",
]
STRATEGIES: tuple[Strategy, ...] = (
    "colocated", "disaggregated", "hybrid",
    "sync", "one_step_off", "async", "partial_rollout", "fusion",
    "zero", "tp", "pp", "sp_ulysses", "cp_ring", "ep",
)
STRATEGY_GROUPS: tuple[tuple[str, tuple[Strategy, ...]], ...] = (
    ("placement", ("colocated", "disaggregated", "hybrid")),
    ("execution mode", ("sync", "one_step_off", "async", "partial_rollout", "fusion")),
    ("training parallelism", ("zero", "tp", "pp", "sp_ulysses", "cp_ring", "ep")),
)
STRATEGY_TITLES: dict[Strategy, str] = {
    "colocated": "coloc",
    "disaggregated": "disagg",
    "hybrid": "hybrid",
    "sync": "sync",
    "one_step_off": "1-off",
    "async": "async",
    "partial_rollout": "partial",
    "fusion": "fusion",
    "zero": "ZeRO",
    "tp": "TP",
    "pp": "PP",
    "sp_ulysses": "Ulysses",
    "cp_ring": "ring",
    "ep": "EP",
}
MARKS: dict[Level, str] = {"yes": "✓", "partial": "~", "no": "✗", "unknown": "?"}
LEGEND = "✓ supported, ~ partly, ✗ not supported, ? not documented"


@dataclass(frozen=True)
class Support:
    level: Level
    note: str = ""


def yes(note: str = "") -> Support:
    return Support("yes", note)


def partial(note: str) -> Support:
    return Support("partial", note)


def no(note: str = "") -> Support:
    return Support("no", note)


def unknown(note: str = "not documented in frameworks_overview.md") -> Support:
    return Support("unknown", note)


@dataclass(frozen=True)
class PlanDefaults:
    """How the framework runs a workload by default (its documented defaults)."""

    placement: PlacementKind
    mode: ModeKind
    backend: Literal["fsdp", "deepspeed", "megatron"]
    zero_stage: ZeroStage
    engine_tp: int
    gpu_memory_utilization: float
    offload_between_phases: bool
    source: str
    staleness: int = 0
    fusion: bool = False
    rollout_share: float = 0.5
    """Disaggregated: share of the GPUs that generate."""
    recompute: Recompute = "full"
    micro_batch_size: int = 1
    max_tokens_per_microbatch: int | None = None
    max_num_seqs: int | None = None
    """Engine's concurrent sequences; None: rlperf's engine default (vLLM's 256)."""
    prefix_sharing: bool = True
    forward_logits_dtype: LogitsDtype = "fp32"
    """dtype the forward-only passes take log-probs from (``TrainLayout.forward_logits_dtype``):
    fp32 where the framework upcasts the logits first (OpenRLHF's ``Actor.forward``)."""
    assumed: tuple[str, ...] = ()
    """Numbers above that no document gives (rlperf's choice, said here)."""


@dataclass(frozen=True)
class FrameworkPreset:
    name: str
    summary: str
    support: tuple[tuple[Strategy, Support], ...]
    training_backends: tuple[str, ...]
    rollout_engines: tuple[str, ...]
    weight_sync: str
    algorithms: tuple[str, ...]
    """rlperf registry names among the algorithms the framework documents."""
    defaults: PlanDefaults
    sources: tuple[str, ...]
    """frameworks_overview.md §1 source tags of this framework's row."""
    aliases: tuple[str, ...] = ()
    zero3_with_model_parallel: bool = True
    """Whether ZeRO-3 combines with tp/pp/ep or ring attention (verl: no, its Megatron backend
    shards only optimizer states; FSDP runs without model parallelism but Ulysses)."""

    def __post_init__(self) -> None:
        given = [s for s, _ in self.support]
        assert sorted(given) == sorted(STRATEGIES), f"{self.name}: support must list every strategy once"

    def supports(self, strategy: Strategy) -> Support:
        return dict(self.support)[strategy]

    def why_not(self, spec: ScenarioSpec) -> str | None:
        """Why the framework cannot run ``spec``'s workload, or None if it can."""
        from rlperf.frameworks.default_plan import why_not

        return why_not(self, spec)

    def why_not_plan(self, plan: Plan) -> str | None:
        """Why the framework cannot run ``plan``: the first strategy it uses (placement, mode,
        fusion, training parallelism of any role) that the support matrix does not mark "yes";
        None if it can. The planner's ``--framework`` filter (``SearchOptions.plan_filter``)."""
        from rlperf.modes import mode_of

        used: list[Strategy] = [plan.placement.kind, mode_of(plan.mode).family]
        if plan.mode.fusion:
            used.append("fusion")
        for lay in plan.layouts.values():
            flags: tuple[tuple[Strategy, bool], ...] = (
                ("zero", lay.zero_stage > 0), ("tp", lay.tp > 1), ("pp", lay.pp > 1),
                ("sp_ulysses", lay.cp > 1 and lay.cp_kind == "ulysses"), ("cp_ring", lay.cp > 1 and lay.cp_kind == "ring"),
                ("ep", lay.ep > 1),
            )
            used += [s for s, on in flags if on]
            model_parallel = lay.tp > 1 or lay.pp > 1 or lay.ep > 1 or (lay.cp > 1 and lay.cp_kind == "ring")
            if lay.zero_stage == 3 and model_parallel and not self.zero3_with_model_parallel:
                return f"{self.name} does not run ZeRO-3 with tp/pp/ep or ring attention (its Megatron backend shards only optimizer states)"
        for strategy in dict.fromkeys(used):
            sup = self.supports(strategy)
            if sup.level != "yes":
                why = f" ({sup.note})" if sup.note else ""
                return f"{self.name} does not run {STRATEGY_TITLES[strategy]}: {sup.level}{why}"
        return None

    def default_plan(self, spec: ScenarioSpec) -> Plan:
        """How the framework would run ``spec``'s workload on ``spec``'s cluster by default."""
        from rlperf.frameworks.default_plan import build_default_plan

        return build_default_plan(self, spec).plan


# ---------------------------------------------------------------------- registry
_REGISTRY: dict[str, FrameworkPreset] = {}


def register_framework(build: Callable[[], FrameworkPreset]) -> Callable[[], FrameworkPreset]:
    """Decorator: add the preset ``build()`` returns; a name or alias already taken is an error."""
    preset = build()
    keys = [preset.name.lower(), *(a.lower() for a in preset.aliases)]
    for key in keys:
        if key in _REGISTRY:
            raise SpecError("framework", f"{preset.name!r} is already registered (as {key!r})")
    for key in keys:
        _REGISTRY[key] = preset
    return build


def _ensure_loaded() -> None:
    if not _REGISTRY:
        import rlperf.frameworks.catalog  # noqa: F401  (registers the built-in presets)


def get_framework(name: str) -> FrameworkPreset:
    _ensure_loaded()
    key = name.strip().lower()
    if key not in _REGISTRY:
        raise unknown_name("framework", name, [p.name for p in list_frameworks()])
    return _REGISTRY[key]


def list_frameworks() -> list[FrameworkPreset]:
    """The registered presets, each once, in registration order."""
    _ensure_loaded()
    seen: dict[str, FrameworkPreset] = {}
    for preset in _REGISTRY.values():
        seen.setdefault(preset.name, preset)
    return list(seen.values())


def matrix_markdown() -> str:
    """The support matrix as a Markdown table (docs/frameworks.md embeds it; a test keeps it current)."""
    titles = [STRATEGY_TITLES[s] for s in STRATEGIES]
    lines = ["| framework | " + " | ".join(titles) + " |", "|---|" + "---|" * len(titles)]
    for p in list_frameworks():
        lines.append(f"| {p.name} | " + " | ".join(MARKS[p.supports(s).level] for s in STRATEGIES) + " |")
    return "\n".join(lines)

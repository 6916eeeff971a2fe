"""The Python API: ``rlperf.plan``, ``rlperf.simulate``, ``rlperf.analyze``, typed results.

The CLI is built on these functions (``rlperf plan`` prints :class:`PlanAnswer`), so a notebook
and the terminal get the same numbers::

    import rlperf
    ans = rlperf.plan(model="Qwen3-8B", gpu="H100", nodes=4, prompts=256, group_size=16,
                      max_response=16384, steps=100, framework="verl")
    ans.best.step_time_s, ans.interval.low_s, ans.run.hours, ans.run.cost_usd
    ans.lengths.describe()          # the response lengths assumed, and where they come from
    ans.memory                      # per role and pool: weights ... KV cache, host RAM
    ans.launch.command_line()       # verl overrides for the best plan

What a plan answer holds, and how each part is obtained:

- the search (:func:`rlperf.plan.search.search`) over the plans the framework runs
  (``FrameworkPreset.why_not_plan``), at the response lengths of
  :func:`rlperf.specs.response_lengths.choose_response_lengths`;
- the best plan's step-time interval from the model's measured validation error
  (:mod:`rlperf.accuracy`);
- run totals: the best plan simulated at the run's start, middle and end mean response length
  (linear growth from ``mean_response`` to ``end_mean_response``), step time interpolated
  linearly in the mean between them, summed over ``steps``; GPU-hours = hours x the plan's GPUs;
- a length sweep: the best plan simulated at each mean of ``lengths`` (the plan is not searched
  again per length);
- the memory breakdown of the best plan and of the scenario's own (:mod:`rlperf.plan.memory_breakdown`);
- the launch configuration: the framework's export of the best plan (verl, OpenRLHF).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from typing_extensions import Unpack

if TYPE_CHECKING:
    from rlperf.accuracy import StepInterval
    from rlperf.errors import SpecError
    from rlperf.frameworks.presets import FrameworkPreset
    from rlperf.frameworks.report import ExportResult
    from rlperf.plan.explain import Explanation
    from rlperf.plan.memory_breakdown import RoleMemory
    from rlperf.plan.search import Mapper, PlanEvaluation, PlanSearchResult
    from rlperf.scenario import Scenario
    from rlperf.sim.result import SimResult
    from rlperf.specs.lengths import LengthDistribution
    from rlperf.specs.plan import Plan
    from rlperf.specs.response_lengths import LengthChoice
    from rlperf.workdepth import WorkDepthReport

DEFAULT_SCENARIO = "grpo-qwen2.5-7b-colocated-sync"
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class RunPoint:
    """The best plan simulated at one mean response length."""

    step: int  # the run's step this mean belongs to (0-based); 0 for a sweep
    mean_response_tokens: float
    step_time_s: float
    cost_usd_per_step: float | None


@dataclass(frozen=True)
class RunTotals:
    """A whole run of ``steps`` steps of the best plan."""

    steps: int
    num_gpus: int
    points: tuple[RunPoint, ...]  # the simulated means
    step_times_s: tuple[float, ...]  # the step-time curve, one per step
    total_s: float
    cost_usd: float | None
    interval: StepInterval  # of total_s, same relative range as one step's

    @property
    def hours(self) -> float:
        return self.total_s / 3600

    @property
    def gpu_hours(self) -> float:
        return self.hours * self.num_gpus


@dataclass(frozen=True)
class PlanAnswer:
    """Everything ``rlperf plan`` prints, as values."""

    question: Scenario
    lengths: LengthChoice
    search: PlanSearchResult
    best_plan: Plan  # the best plan with dp and engine replicas of its pools
    interval: StepInterval  # of the best plan's step time
    memory: tuple[RoleMemory, ...]  # the best plan's
    user_memory: tuple[RoleMemory, ...]  # the scenario's own plan, on all GPUs
    explanation: Explanation | None  # of the best plan
    run: RunTotals | None
    sweep: tuple[RunPoint, ...]
    framework: str | None
    launch: ExportResult | None  # the framework's configuration for the best plan

    @property
    def best(self) -> PlanEvaluation:
        return self.search.best


# ---------------------------------------------------------------------------- the question
class Question(TypedDict, total=False):
    """What a user may change of the scenario (every key optional; the CLI's flags)."""

    model: str | None  # catalog name or config.json path
    gpu: str | None
    nodes: int | None
    gpus_per_node: int | None
    algorithm: str | None
    workload: str | None  # a workload preset (`rlperf workloads`)
    prompts: int | None
    group_size: int | None
    max_response: int | None  # the response cap, tokens
    mean_response: float | None  # after truncation, tokens
    median_response: float | None  # before truncation, tokens
    length_preset: str | None  # response lengths of a published recipe
    hardware_profile: Path | None


def build_scenario(
    scenario: str | Path | None = None,
    **question: Unpack[Question],
) -> tuple[Scenario, LengthChoice]:
    """The scenario to plan (a file or shipped example, default the embedded one) with the
    overrides, and the response lengths it assumes (rules: :mod:`rlperf.specs.response_lengths`)."""
    q = question
    model, gpu, nodes, gpus_per_node = q.get("model"), q.get("gpu"), q.get("nodes"), q.get("gpus_per_node")
    algorithm, workload, prompts, group_size = q.get("algorithm"), q.get("workload"), q.get("prompts"), q.get("group_size")
    max_response, hardware_profile = q.get("max_response"), q.get("hardware_profile")
    from rlperf.errors import SpecError
    from rlperf.scenario import check_sections, load_scenario, read_scenario_data, resolve_workload, scenario_path
    from rlperf.specs.response_lengths import choose_response_lengths
    from rlperf.specs.workload import workload_to_dict

    path = scenario_path(scenario or DEFAULT_SCENARIO)
    data = read_scenario_data(path)
    check_sections(data, path, ("cluster", "workload", "algorithm"))  # the sections edited below
    if model:
        data["model"] = model
    cl = dict(data.get("cluster") or {})
    for key, value in (("gpu", gpu), ("num_nodes", nodes), ("gpus_per_node", gpus_per_node),
                       ("profile", str(hardware_profile) if hardware_profile else None)):
        if value is not None:
            cl[key] = value
    data["cluster"] = cl
    if algorithm:
        data["algorithm"] = {**dict(data.get("algorithm") or {}), "name": algorithm, "minibatches": None}
    wl = dict(data.get("workload") or {})
    if workload:
        wl = {"preset": workload}
    if prompts is not None:
        wl["prompts_per_step"] = prompts
    if group_size is not None:
        wl["group_size"] = group_size
    try:
        base = resolve_workload(wl)
    except SpecError as err:
        raise _in_question(err, question, path) from None
    cap = max_response or base.max_response_tokens
    source = "workload preset " + str(wl["preset"]) if "preset" in wl else f"scenario {data.get('name', path.stem)}"
    choice = choose_response_lengths(
        cap, mean_tokens=q.get("mean_response"), median_tokens=q.get("median_response"), preset=q.get("length_preset"),
        scenario_lengths=base.response_length, scenario_name=source,
    )
    data["workload"] = workload_to_dict(base.model_copy(update={"response_length": choice.distribution}))
    if model or algorithm or gpu or nodes or gpus_per_node:
        # The question is no longer the base file's: name it by what it asks (reports, exports).
        c = data["cluster"]
        alg = dict(data.get("algorithm") or {}).get("name", "GRPO")
        gpn = f"x{c['gpus_per_node']}" if c.get("gpus_per_node") else ""
        data["name"] = f"{alg}-{Path(str(data.get('model', 'model'))).stem}-{c.get('num_nodes', 1)}{gpn}-{c.get('gpu', 'H100')}".lower()
    try:
        return load_scenario(data), choice
    except SpecError as err:
        raise _in_question(err, question, path) from None


def _in_question(err: SpecError, question: Question, path: Path) -> SpecError:
    """``err`` under the option the user gave that set its field, else under the base file."""
    from rlperf.errors import SpecError

    option = _option_behind(err.field, question)
    if option is None or err.source:
        return err.in_source(path)
    return SpecError(option, err.problem, err.allowed)


# Scenario fields an option sets (option -> the field, or a field under it): a value the
# scenario refuses is the option's, not the base file's. The caps-versus-positions checks name
# the workload (or its max_total_tokens) and come from the model or the response cap.
_OPTION_FIELDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("model", "--model", ("model",)),
    ("gpu", "--gpu", ("gpu", "cluster.gpu")),
    ("nodes", "--nodes", ("num_nodes", "cluster.num_nodes")),
    ("gpus_per_node", "--gpus-per-node", ("gpus_per_node", "cluster.gpus_per_node", "num_gpus")),
    ("algorithm", "--algorithm", ("algorithm",)),
    ("workload", "--workload", ("workload.preset",)),
)
_POSITION_FIELDS = ("workload", "workload.max_total_tokens")


def _option_behind(field: str, question: Question) -> str | None:
    """The option given in ``question`` that set scenario field ``field``, if one did."""
    for key, option, fields in _OPTION_FIELDS:
        if question.get(key) is not None and any(field == f or field.startswith(f + ".") for f in fields):
            return option
    if field in _POSITION_FIELDS:
        return "--max-response" if question.get("max_response") else "--model" if question.get("model") else None
    return None


def with_mean_response(sc: Scenario, mean_tokens: float) -> Scenario:
    """``sc`` with its response lengths rescaled to ``mean_tokens`` (same cap and spread)."""
    from rlperf.scenario import Scenario
    from rlperf.specs.lengths import LogNormalLength
    from rlperf.specs.workload import workload_to_dict
    from rlperf.specs.workload_presets import RESPONSE_SIGMA

    old: LengthDistribution = sc.workload.response_length
    sigma = old.sigma if isinstance(old, LogNormalLength) else RESPONSE_SIGMA
    cap = old.cap_tokens
    dist = LogNormalLength.from_mean(min(mean_tokens, 0.99 * cap), sigma, cap)
    wl = sc.workload.model_copy(update={"response_length": dist})
    spec = sc.spec.model_copy(update={"workload": workload_to_dict(wl)})
    return Scenario(spec, sc.models, sc.cluster, wl, sc.algorithm)


# ---------------------------------------------------------------------------- plan
def plan(
    scenario: str | Path | None = None,
    *,
    end_mean_response: float | None = None,
    steps: int | None = None,
    lengths: Sequence[float] = (),
    framework: str | None = None,
    objective: str = "time",
    max_staleness: int = 2,
    top_k: int = 3,
    fine_splits: bool = False,
    explain: bool = True,
    timeline: bool = True,
    resolved: tuple[Scenario, LengthChoice] | None = None,
    mapper: Mapper | None = None,
    progress: Progress | None = None,
    **question: Unpack[Question],
) -> PlanAnswer:
    """Search the best plan for a question and answer it whole (see the module docstring).

    ``question``: the overrides of :class:`Question`. ``resolved`` replaces the scenario and the
    question with a resolved scenario and its length choice (``rlperf plan --from verl CONFIG``
    passes an imported configuration). ``timeline=False``: the best plan's result carries no
    engine timeline segments (only the HTML report draws them; the best plan is not simulated
    again to add them), every figure the same."""
    from rlperf.errors import SpecError
    from rlperf.frameworks.presets import get_framework
    from rlperf.plan.explain import explain as explain_plan
    from rlperf.plan.memory_breakdown import concrete_plan, memory_breakdown
    from rlperf.plan.search import local_mapper, resized, search
    from rlperf.plan.space import SearchOptions
    from rlperf.scenario import scenario_path
    from rlperf.specs.response_lengths import check_assumed_cap, check_mean_tokens

    if objective not in ("time", "cost", "throughput_per_gpu"):
        raise SpecError("--objective", f"unknown {objective!r}", "time, cost, throughput_per_gpu")
    if steps is not None and steps < 1:
        raise SpecError("--steps", f"{steps}", ">= 1")
    if end_mean_response is not None and steps is None:
        raise SpecError("--end-mean-response", "needs --steps (the run it grows over)")
    preset = get_framework(framework) if framework else None
    sc, choice = resolved or build_scenario(scenario, **question)
    # Before the search: each is simulated only after it (a mean at or above the cap was read
    # as the cap, silently; a mean of 1 failed after the whole search).
    cap = sc.workload.max_response_tokens
    if end_mean_response is not None:
        check_mean_tokens("--end-mean-response", end_mean_response, cap)
    for mean in lengths or ():
        check_mean_tokens("--lengths", mean, cap)
    if not choice.stated and question.get("max_response") is None:
        # The scenario's (or an import's) own lengths, assumed: the step-time range simulates
        # them at shorter means (an option's cap was checked with the lengths it chose).
        try:
            check_assumed_cap("workload.response_length.cap_tokens", cap)
        except SpecError as err:
            raise (err if resolved else err.in_source(scenario_path(scenario or DEFAULT_SCENARIO))) from None
    mapper = mapper or local_mapper()
    opts = SearchOptions(max_staleness=max_staleness, top_k=top_k, objective=objective, plan_filter=preset,
                         fine_splits_at_gpus=sc.cluster.num_gpus if fine_splits else None)
    res = search(sc, opts, mapper, progress, timeline=timeline)
    best = res.best
    assert best.sim is not None
    on = resized(sc, best.num_gpus).with_plan(best.plan)
    explanation = None
    if explain:
        if progress:
            progress("what-ifs of the best plan", 0, 1)
        explanation = explain_plan(on, best.sim, partial(_what_if_sims, mapper, preset), max_staleness)
    # Each phase below simulates the best plan again (other means); a piped run names it.
    if progress and not choice.stated:
        progress("step-time range: the best plan at published runs' mean lengths", 0, 1)
    interval = _interval(on, best, choice.stated, mapper)
    mean0 = sc.workload.response_length.mean_tokens()
    if progress and steps and end_mean_response is not None and steps > 1:
        progress("run totals: the best plan at the run's middle and last mean lengths", 0, 1)
    run = _run_totals(on, best, mean0, end_mean_response, steps, interval, mapper) if steps else None
    if progress and lengths:
        progress(f"length sweep: the best plan at {len(lengths)} mean lengths", 0, 1)
    sweep = tuple(_simulate_at(on, [float(m) for m in lengths], [0] * len(lengths), mapper))
    # The user's plan is only compared: one the simulator refused (its reason is in the search
    # result, under the scenario's field) has no memory to show, and must not fail the answer.
    feasible_user = res.user is not None and res.user.sim is not None
    user_memory = memory_breakdown(sc, sc.plan, sc.cluster.num_gpus) if feasible_user else ()
    launch = None
    if preset is not None:
        export = _EXPORTERS.get(preset.name.lower())
        launch = export(on) if export is not None else None
    return PlanAnswer(
        question=sc, lengths=choice, search=res, best_plan=concrete_plan(best.plan, best.num_gpus),
        interval=interval, memory=memory_breakdown(sc, best.plan, best.num_gpus),
        user_memory=user_memory, explanation=explanation,
        run=run, sweep=sweep, framework=preset.name if preset else None, launch=launch,
    )


def _export_verl(sc: Scenario) -> ExportResult:
    from rlperf.frameworks.verl_export import export_verl

    return export_verl(sc)


def _export_openrlhf(sc: Scenario) -> ExportResult:
    from rlperf.frameworks.openrlhf_export import export_openrlhf

    return export_openrlhf(sc)


# Frameworks rlperf writes configurations for (rlperf.frameworks: issue 14's exporters).
_EXPORTERS: dict[str, Callable[[Scenario], ExportResult]] = {"verl": _export_verl, "openrlhf": _export_openrlhf}


def _what_if_sims(mapper: Mapper, preset: FrameworkPreset | None,
                  items: Sequence[tuple[Scenario, Plan]]) -> list[SimResult | str]:
    """Simulate the what-if variants; those the framework cannot run are not simulated: its reason."""
    from rlperf.plan.explain import simulate_plans

    why = [preset.why_not_plan(p) if preset is not None else None for _, p in items]
    runnable = [item for item, w in zip(items, why) if w is None]
    sims = iter(simulate_plans(runnable, mapper) if runnable else [])
    return [next(sims) if w is None else w for w in why]


def _interval(on: Scenario, best: PlanEvaluation, stated: bool, mapper: Mapper) -> StepInterval:
    """The best plan's step-time range (:mod:`rlperf.accuracy`): the model-error range when the
    lengths are stated, else the plan simulated at the means published runs imply for this cap."""
    from rlperf.accuracy import assumed_interval, error_data, stated_interval

    data = error_data(on.spec.cluster.profile)  # the errors of the profile the plan was simulated with
    if stated:
        return stated_interval(best.step_time_s, data)
    lo, hi = data.implied_means(on.workload.max_response_tokens)
    at = _simulate_at(on, [lo, hi], [0, 0], mapper)
    return assumed_interval(best.step_time_s, at[0].step_time_s, at[1].step_time_s, (lo, hi), data)


def _simulate_at(on: Scenario, means: list[float], steps: list[int], mapper: Mapper) -> list[RunPoint]:
    from rlperf.plan.search import _simulate_one

    scs = [with_mean_response(on, m) for m in means]
    got = mapper(_simulate_one, [(s, on.plan) for s in scs])
    out = []
    for s, step, r in zip(scs, steps, got):
        mean = s.workload.response_length.mean_tokens()
        if isinstance(r, str):
            out.append(RunPoint(step, mean, float("inf"), None))
        else:
            out.append(RunPoint(step, mean, r.normalized_step_time_s, r.cost_usd_per_step))
    return out


def _run_totals(on: Scenario, best: PlanEvaluation, start: float, end: float | None, steps: int,
                interval: StepInterval, mapper: Mapper) -> RunTotals:
    """Sum of the step-time curve over the run (module docstring)."""
    import numpy as np

    assert best.sim is not None
    first = RunPoint(0, start, best.step_time_s, best.cost_usd_per_step)
    if end is None or steps == 1:
        points: list[RunPoint] = [first]
        curve = np.full(steps, best.step_time_s)
        cost_curve = np.full(steps, best.cost_usd_per_step if best.cost_usd_per_step is not None else np.nan)
    else:
        mid = (steps - 1) // 2
        points = [first, *_simulate_at(on, [start + (end - start) * mid / (steps - 1), end], [mid, steps - 1], mapper)]
        means = start + (end - start) * np.arange(steps) / (steps - 1)
        xs = [p.mean_response_tokens for p in points]
        order = np.argsort(xs)
        x = np.array(xs)[order]
        curve = np.interp(means, x, np.array([p.step_time_s for p in points])[order])
        costs = np.array([p.cost_usd_per_step if p.cost_usd_per_step is not None else np.nan for p in points])
        cost_curve = np.interp(means, x, costs[order])
    total = float(curve.sum())
    cost = float(cost_curve.sum()) if not np.isnan(cost_curve).any() else None
    ratio = total / interval.predicted_s if interval.predicted_s > 0 else 0.0
    return RunTotals(steps, best.num_gpus, tuple(points), tuple(float(t) for t in curve), total, cost,
                     interval.scaled(ratio))


# ---------------------------------------------------------------------------- simulate, analyze
def load(scenario: str | Path | Mapping[str, Any] | Scenario) -> Scenario:
    """A resolved scenario from a file, a shipped example name, a mapping or a Scenario."""
    from rlperf.scenario import Scenario, load_scenario

    if isinstance(scenario, Scenario):
        return scenario
    return load_scenario(scenario)


def simulate(scenario: str | Path | Mapping[str, Any] | Scenario, iterations: int | None = None) -> SimResult:
    """Simulate ``iterations`` RL iterations (default: the scenario's) of a scenario."""
    from rlperf.scenario import Scenario
    from rlperf.sim.run import run_scenario

    sc = load(scenario)
    if iterations:
        sim = sc.spec.simulation.model_copy(update={"iterations": iterations,
                                                    "warmup": min(sc.spec.simulation.warmup, iterations - 1)})
        sc = Scenario(sc.spec.model_copy(update={"simulation": sim}), sc.models, sc.cluster, sc.workload, sc.algorithm)
    return run_scenario(sc)


def analyze(scenario: str | Path | Mapping[str, Any] | Scenario) -> WorkDepthReport:
    """The work-depth numbers per stage of a scenario (one simulated steady-state step)."""
    from rlperf.workdepth import analyze as workdepth

    return workdepth(load(scenario))

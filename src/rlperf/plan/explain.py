"""Explanations: what bounds a plan's step time, how far it is from the work-depth bound, and
what-if variants with their simulated effect (guidelines a user can act on)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlperf.errors import SpecError
from rlperf.modes import GenerationRounds, mode_of
from rlperf.plan.gap import BoundGap, bound_gap
from rlperf.plan.space import streaming_mode
from rlperf.scenario import Scenario
from rlperf.sim.result import SimResult
from rlperf.specs.plan import ExecutionMode, Placement, Plan


@dataclass(frozen=True)
class Bottleneck:
    kind: str  # rollout_tail | rollout | training | forward | weight_sync | pipeline_bubble | idle_pool | phase_switch
    share: float  # fraction of the step it accounts for
    detail: str


@dataclass(frozen=True)
class WhatIf:
    change: str
    step_time_s: float
    speedup: float  # baseline step time / variant step time
    staleness: int  # largest policy lag of a trained response
    note: str = ""
    # The lag of every trained response: what the speed costs in off-policyness.
    staleness_summary: str = ""


@dataclass(frozen=True)
class Explanation:
    bottlenecks: tuple[Bottleneck, ...]  # largest first
    lower_bound_s: float
    gap: float  # step time / lower bound
    what_ifs: tuple[WhatIf, ...]  # best first
    bound_gap: BoundGap | None = None  # what keeps the step from the bound (rlperf.plan.gap)

    def headline(self) -> str:
        b = self.bottlenecks[0] if self.bottlenecks else None
        head = f"bound by {b.kind} ({100 * b.share:.0f}% of the step: {b.detail})" if b else "no dominant stage"
        return f"{head}; {self.gap:.2f}x the work-depth lower bound"


def bottlenecks(r: SimResult) -> tuple[Bottleneck, ...]:
    step = r.step_time_s or 1.0
    out: list[Bottleneck] = []
    t = {s.name: s for s in r.stages}
    gen = t.get("generate")
    if gen is not None:
        tail = min(r.rollout_tail_s, gen.time_s)
        out.append(Bottleneck("rollout_tail", tail / step,
                              f"the last 10% of responses take {tail:.0f} s of a {gen.time_s:.0f} s rollout"))
        out.append(Bottleneck("rollout", (gen.time_s - tail) / step, f"bulk decode ({gen.time_s - tail:.0f} s)"))
    train = sum(s.time_s for s in r.stages if s.name.endswith("_update"))
    if train:
        out.append(Bottleneck("training", train / step, f"{train:.0f} s of fwd+bwd and optimizer steps"))
    fwd = sum(s.time_s for s in r.stages if s.name in ("old_logprob", "ref_logprob", "values", "prm_forward", "prm_ref_forward"))
    if fwd:
        out.append(Bottleneck("forward", fwd / step, f"{fwd:.0f} s of forward-only log-prob/value passes"))
    if "weight_sync" in t:
        out.append(Bottleneck("weight_sync", t["weight_sync"].time_s / step, f"{t['weight_sync'].time_s:.1f} s per step"))
    if "phase_switch" in t:
        out.append(Bottleneck("phase_switch", t["phase_switch"].time_s / step, "offload/onload between rollout and training"))
    for p in r.pools:
        if len(r.pools) > 1 and p.idle_s_per_step / step > 0.3:
            out.append(Bottleneck("idle_pool", p.idle_s_per_step / step,
                                  f"pool {p.name} ({p.num_gpus} GPUs) idles {p.idle_s_per_step:.0f} s per step"))
    out.sort(key=lambda b: -b.share)
    return tuple(out)


def variants(sc: Scenario) -> list[tuple[str, Plan]]:
    """Plans one step away from ``sc.plan`` that address the usual bottlenecks."""
    plan = sc.plan
    total = sc.cluster.num_gpus
    node = sc.cluster.gpus_per_node
    out: list[tuple[str, Plan]] = []
    split = plan.placement.kind != "colocated"
    mode = mode_of(plan.mode)
    rounds = GenerationRounds.of(sc.algorithm, sc.spec.algorithm.keep_rate)
    if split:
        if mode.staleness == 0:
            out.append(("one-step off-policy (staleness 1)", plan.model_copy(update={"mode": ExecutionMode(kind="one_step_off")})))
            out.append(("async, staleness 2", plan.model_copy(update={"mode": ExecutionMode(kind="async", staleness=2)})))
        if not mode.carries_unfinished and rounds.allows_streaming:
            streaming = streaming_mode(sc.minibatches)
            out.append((f"streaming (threshold 0.5, requests interrupted at each weight update, "
                        f"{streaming.train_parts} local updates per sync)",
                        plan.model_copy(update={"mode": streaming})))
        if plan.placement.kind == "disaggregated" and plan.placement.rollout_gpus is not None:
            g = plan.placement.rollout_gpus
            step = node if total > node else max(1, plan.rollout.tp)
            for d, word in ((step, "more"), (-step, "fewer")):
                if 0 < g + d < total:
                    out.append((f"{word} rollout GPUs ({g + d}+{total - g - d})",
                                plan.model_copy(update={"placement": Placement(kind="disaggregated", rollout_gpus=g + d)})))
    else:
        half = (total // 2 // node) * node if total > node else total // 2
        if 0 < half < total:
            out.append((f"disaggregate {half}+{total - half}, one-step off-policy",
                        plan.model_copy(update={"placement": Placement(kind="disaggregated", rollout_gpus=half),
                                                "mode": ExecutionMode(kind="one_step_off")})))
    if mode.fusion is None and rounds.allows_fusion and mode.allows_fusion:
        out.append(("stage fusion (stream finished samples into the forward passes)",
                    plan.model_copy(update={"mode": plan.mode.model_copy(update={"fusion": True})})))
    if not mode.carries_unfinished and rounds.allows_partial_rollout:
        b = max(1, sc.workload.max_response_tokens // 2)
        out.append((f"partial rollout, budget {b} tokens/response/step",
                    plan.model_copy(update={"mode": ExecutionMode(kind="partial_rollout", token_budget=b)})))
    for tp in (plan.rollout.tp * 2, plan.rollout.tp // 2):
        if 1 <= tp <= node and sc.models["actor"].num_heads % tp == 0:
            ep = tp if plan.rollout.ep > 1 else 1
            out.append((f"rollout tp={tp}", plan.model_copy(update={"rollout": plan.rollout.model_copy(update={"tp": tp, "ep": ep})})))
    return out


def explain(
    sc: Scenario,
    result: SimResult,
    simulate: Callable[[Sequence[tuple[Scenario, Plan]]], list[SimResult | str]],
    max_staleness: int | None = None,
) -> Explanation:
    """Bottlenecks of ``result`` (the simulation of ``sc.plan``) and its what-if variants.

    A variant whose trained responses lag more versions than ``max_staleness`` (the search's
    limit) is still shown, since it is what the speed would cost, but its note says the search
    would not pick it: otherwise a faster what-if reads like a plan the planner missed."""
    vs = variants(sc)
    sims = simulate([(sc, p) for _, p in vs])
    whatifs = []
    for (label, plan), r in zip(vs, sims):
        if isinstance(r, str):
            whatifs.append(WhatIf(label, float("inf"), 0.0, plan.mode.effective_staleness, note=f"infeasible: {r}"))
            continue
        stale = max(r.staleness) if r.staleness else plan.mode.effective_staleness
        t = r.normalized_step_time_s
        over = max_staleness is not None and stale > max(max_staleness, 0)
        note = f"lags {stale} versions, above the staleness limit {max(max_staleness or 0, 0)}: not a candidate" if over else ""
        whatifs.append(WhatIf(label, t, result.normalized_step_time_s / t, stale, note=note,
                              staleness_summary=r.staleness_distribution.summary()))
    whatifs.sort(key=lambda w: (-w.speedup, w.change))
    lb = result.bounds.lower_bound_s
    return Explanation(bottlenecks(result), lb, result.step_time_s / lb if lb > 0 else float("inf"), tuple(whatifs),
                       bound_gap(result))


def simulate_plans(items: Sequence[tuple[Scenario, Plan]], mapper=None) -> list[SimResult | str]:  # type: ignore[no-untyped-def]
    from rlperf.plan.search import _simulate_one, local_mapper

    m = mapper or local_mapper()
    try:
        return m(_simulate_one, list(items))
    except SpecError as err:
        return [str(err)] * len(items)

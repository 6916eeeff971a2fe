"""The planner: enumerate plans, prune, rank by the fast estimate, simulate the best, Pareto front.

GPU counts: the search also considers running on a power-of-two fraction of the cluster (down
to one node), each size searched on its own with its own top-K, so the plan space for ``P``
GPUs contains the one for ``P/2``: adding GPUs can never make the best plan slower (a test
checks it). The Pareto front is over (step time, GPUs, cost per step, staleness).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from rlperf.errors import SpecError
from rlperf.plan.estimate import Estimate, Estimator
from rlperf.plan.space import Candidate, Rejected, SearchOptions, enumerate_candidates, framework_default_plans
from rlperf.scenario import Scenario
from rlperf.sim.result import SimResult
from rlperf.specs.plan import Plan

SIM_ITERATIONS = 3  # iterations simulated per candidate (1 warm-up): enough for a steady state of s <= 2
SIM_WARMUP = 1


@dataclass(frozen=True)
class PlanEvaluation:
    label: str
    plan: Plan
    num_gpus: int
    estimate: Estimate | None
    sim: SimResult | None
    source: str  # "search" | "baseline" | "user"
    error: str | None = None

    @property
    def step_time_s(self) -> float:
        if self.sim is not None:
            return self.sim.step_time_s
        return self.estimate.step_time_s if self.estimate is not None else math.inf

    @property
    def cost_usd_per_step(self) -> float | None:
        return self.sim.cost_usd_per_step if self.sim is not None else (self.estimate.cost_usd_per_step if self.estimate else None)

    @property
    def staleness(self) -> int:
        return self.plan.mode.effective_staleness


@dataclass(frozen=True)
class PlanSearchResult:
    scenario: str
    num_gpus: int
    considered: int
    rejected: tuple[Rejected, ...]
    evaluated: tuple[PlanEvaluation, ...]  # simulated, best first
    best: PlanEvaluation
    pareto: tuple[PlanEvaluation, ...]
    baselines: tuple[PlanEvaluation, ...]
    user: PlanEvaluation | None
    estimates_per_s: float
    component_evaluations: int
    elapsed_s: float
    notes: tuple[str, ...] = field(default=())


def _objective(opts: SearchOptions) -> Callable[[PlanEvaluation], float]:
    if opts.objective == "cost":
        return lambda e: e.cost_usd_per_step if e.cost_usd_per_step is not None else e.step_time_s * e.num_gpus
    if opts.objective == "throughput_per_gpu":
        return lambda e: e.step_time_s * e.num_gpus  # tokens/s/GPU is inversely proportional
    return lambda e: e.step_time_s


def gpu_counts(sc: Scenario) -> list[int]:
    node = sc.cluster.gpus_per_node
    total = sc.cluster.num_gpus
    out = [total]
    g = total
    while g % 2 == 0 and g // 2 >= node and (g // 2) % node == 0:
        g //= 2
        out.append(g)
    return out


def resized(sc: Scenario, gpus: int) -> Scenario:
    if gpus == sc.cluster.num_gpus:
        return sc
    node = sc.cluster.gpus_per_node
    cluster = sc.cluster.model_copy(update={"num_nodes": gpus // node})
    return Scenario(sc.spec, sc.models, cluster, sc.workload, sc.algorithm)


def _simulate_one(args: tuple[Scenario, Plan]) -> SimResult | str:
    from rlperf.sim.run import run_scenario

    sc, plan = args
    sim = sc.spec.simulation.model_copy(update={"iterations": SIM_ITERATIONS, "warmup": SIM_WARMUP})
    spec = sc.spec.model_copy(update={"plan": plan, "simulation": sim})
    try:
        return run_scenario(Scenario(spec, sc.models, sc.cluster, sc.workload, sc.algorithm))
    except SpecError as err:
        return str(err)


Mapper = Callable[[Callable[[tuple[Scenario, Plan]], SimResult | str], Sequence[tuple[Scenario, Plan]]], list[SimResult | str]]


def local_mapper(jobs: int | None = None) -> Mapper:
    def run(fn, items):  # type: ignore[no-untyped-def]
        n = jobs or os.cpu_count() or 1
        if n <= 1 or len(items) <= 1:
            return [fn(x) for x in items]
        with ProcessPoolExecutor(max_workers=min(n, len(items))) as ex:
            return list(ex.map(fn, items))

    return run


def ray_mapper() -> Mapper:
    def run(fn, items):  # type: ignore[no-untyped-def]
        try:
            import ray
        except ImportError:
            raise SpecError("--executor", "ray is not installed", "pip install 'rlperf[ray]'") from None
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
        remote = ray.remote(fn)
        return ray.get([remote.remote(x) for x in items])

    return run


def search(
    sc: Scenario,
    opts: SearchOptions | None = None,
    mapper: Mapper | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    include_user_plan: bool = True,
) -> PlanSearchResult:
    opts = opts or SearchOptions()
    mapper = mapper or local_mapper()
    t0 = time.perf_counter()
    obj = _objective(opts)
    rejected: list[Rejected] = []
    shortlisted: list[tuple[Scenario, Candidate, Estimate | None, str]] = []
    considered = 0
    est_time = 0.0
    est_count = 0
    comp = 0
    for gpus in gpu_counts(sc):
        sub = resized(sc, gpus)
        est = Estimator(sub)
        ranked: list[tuple[float, Candidate, Estimate]] = []
        cands = list(enumerate_candidates(sub, opts))
        for i, c in enumerate(cands):
            considered += 1
            if progress and i % 50 == 0:
                progress(f"estimating plans on {gpus} GPUs", i, len(cands))
            if isinstance(c, Rejected):
                rejected.append(c)
                continue
            if c.staleness > opts.max_staleness:
                continue
            t1 = time.perf_counter()
            try:
                e = est.estimate(c)
            except SpecError as err:
                rejected.append(Rejected(f"{gpus} GPUs | {c.label}", str(err)))
                continue
            finally:
                est_time += time.perf_counter() - t1
                est_count += 1
            pe = PlanEvaluation(c.label, c.plan, gpus, e, None, "search")
            ranked.append((obj(pe), c, e))
        comp += est.evaluations
        ranked.sort(key=lambda x: (x[0], x[1].label))
        seen: set[str] = set()
        for _, c, e in ranked:
            if len(seen) >= opts.top_k:
                break
            if c.label in seen:
                continue
            seen.add(c.label)
            shortlisted.append((sub, c, e, "search"))
        # Framework defaults at every size, so that the space for P GPUs contains the one for P/2.
        for c in framework_default_plans(sub):
            shortlisted.append((sub, c, _try(est, c), "baseline"))
    extra: list[tuple[Scenario, Candidate, Estimate | None, str]] = []
    if include_user_plan:
        user = Candidate(sc.plan, "your plan (scenario)")
        extra.append((sc, user, _try(Estimator(sc), user), "user"))
    jobs = [(s, c.plan) for s, c, _, _ in shortlisted] + [(s, c.plan) for s, c, _, _ in extra]
    if progress:
        progress("simulating the best plans", 0, len(jobs))
    sims = mapper(_simulate_one, jobs)
    if progress:
        progress("simulating the best plans", len(jobs), len(jobs))
    evals: list[PlanEvaluation] = []
    for (s, c, e, src), r in zip(list(shortlisted) + extra, sims):
        if isinstance(r, str):
            rejected.append(Rejected(f"{s.cluster.num_gpus} GPUs | {c.label}", r))
            evals.append(PlanEvaluation(c.label, c.plan, s.cluster.num_gpus, e, None, src, error=r))
        else:
            evals.append(PlanEvaluation(c.label, c.plan, s.cluster.num_gpus, e, r, src))
    ok = [e for e in evals if e.sim is not None]
    if not ok:
        reasons = "; ".join(sorted({r.reason for r in rejected})[:3])
        raise SpecError("plan", f"no feasible plan on {sc.cluster.num_gpus} GPUs: {reasons}")
    # Best: the objective over everything simulated (searched plans and baselines alike).
    ok.sort(key=lambda e: (obj(e), e.label))
    best = ok[0]
    pareto = _pareto(ok)
    searched = tuple(e for e in ok if e.source == "search")
    notes = []
    if est_count:
        notes.append(f"fast estimate: {est_count} candidates in {est_time:.2f} s incl. {comp} stage-cost evaluations")
    return PlanSearchResult(
        scenario=sc.name,
        num_gpus=sc.cluster.num_gpus,
        considered=considered,
        rejected=tuple(rejected),
        evaluated=searched,
        best=best,
        pareto=pareto,
        baselines=tuple(e for e in evals if e.source == "baseline" and e.num_gpus == sc.cluster.num_gpus),
        user=next((e for e in evals if e.source == "user"), None),
        estimates_per_s=est_count / est_time if est_time > 0 else math.inf,
        component_evaluations=comp,
        elapsed_s=time.perf_counter() - t0,
        notes=tuple(notes),
    )


def _try(est: Estimator, c: Candidate) -> Estimate | None:
    try:
        return est.estimate(c)
    except SpecError:
        return None


def _pareto(evals: list[PlanEvaluation]) -> tuple[PlanEvaluation, ...]:
    """Plans not dominated in (step time, GPUs, cost per step, staleness), all minimized."""

    def key(e: PlanEvaluation) -> tuple[float, float, float, float]:
        cost = e.cost_usd_per_step if e.cost_usd_per_step is not None else e.step_time_s * e.num_gpus
        return (e.step_time_s, float(e.num_gpus), cost, float(e.staleness))

    keys = [key(e) for e in evals]
    front = []
    for i, e in enumerate(evals):
        ki = keys[i]
        dominated = any(
            all(a <= b for a, b in zip(kj, ki)) and any(a < b for a, b in zip(kj, ki)) for j, kj in enumerate(keys) if j != i
        )
        if not dominated:
            front.append(e)
    front.sort(key=lambda e: (e.step_time_s, e.label))
    return tuple(front)

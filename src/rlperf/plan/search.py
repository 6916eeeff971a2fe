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
from typing import Any

from rlperf.errors import SpecError
from rlperf.modes import mode_of
from rlperf.plan.estimate import Estimate, Estimator
from rlperf.plan.space import Candidate, Rejected, SearchOptions, enumerate_candidates, framework_default_plans
from rlperf.scenario import Scenario
from rlperf.sim.result import SimResult
from rlperf.specs.plan import Plan



def sim_iterations(plan: Plan) -> tuple[int, int]:
    """(warm-up, steady) iterations simulated per candidate: the mode decides
    (rlperf.modes.Mode.sim_iterations)."""
    return mode_of(plan.mode).sim_iterations()


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
        """Simulated time per step of B·G trained responses (else the estimate)."""
        if self.sim is not None:
            return self.sim.normalized_step_time_s
        return self.estimate.step_time_s if self.estimate is not None else math.inf

    @property
    def cost_usd_per_step(self) -> float | None:
        return self.sim.cost_usd_per_step if self.sim is not None else (self.estimate.cost_usd_per_step if self.estimate else None)

    @property
    def staleness(self) -> int:
        """Largest policy lag of a trained response: simulated (partial rollouts span several
        versions), else the mode's bound."""
        if self.sim is not None and self.sim.staleness:
            return max(self.sim.staleness)
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
    warmup, steady = sim_iterations(plan)
    sim = sc.spec.simulation.model_copy(update={"iterations": warmup + steady, "warmup": warmup})
    spec = sc.spec.model_copy(update={"plan": plan, "simulation": sim})
    try:
        return run_scenario(Scenario(spec, sc.models, sc.cluster, sc.workload, sc.algorithm))
    except SpecError as err:
        return str(err)


# map(fn, items) -> [fn(item) ...], in order: a process pool here, Ray tasks with --executor ray.
Mapper = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]


def local_mapper(jobs: int | None = None) -> Mapper:
    def run(fn, items):  # type: ignore[no-untyped-def]
        n = jobs or os.cpu_count() or 1
        if n <= 1 or len(items) <= 1:
            return [fn(x) for x in items]
        ex = ProcessPoolExecutor(max_workers=min(n, len(items)), initializer=_ignore_sigint)
        try:
            out = list(ex.map(fn, items))
        except BaseException:  # Ctrl-C (the workers ignore it): stop them now, not after their tasks
            ex.shutdown(wait=False, cancel_futures=True)
            for proc in list(ex._processes.values()):
                proc.terminate()
            raise
        ex.shutdown()
        return out

    return run


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops them (else each prints a traceback)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def ray_mapper() -> Mapper:
    def run(fn, items):  # type: ignore[no-untyped-def]
        try:
            import ray
        except ImportError:
            raise SpecError("--executor", "ray is not installed", "pip install 'rlperf[ray]'") from None
        if not ray.is_initialized():
            ray.init(ignore_reinit_error=True, include_dashboard=False, log_to_driver=False)
        remote = ray.remote(fn)
        refs = [remote.remote(x) for x in items]
        try:
            return ray.get(refs)
        except KeyboardInterrupt:  # stop the tasks and the local Ray instance before exiting
            for ref in refs:
                ray.cancel(ref, force=True)
            ray.shutdown()
            raise

    return run


@dataclass(frozen=True)
class _SizeSearch:
    gpus: int
    shortlisted: tuple[tuple[str, Plan, Estimate | None, str], ...]
    rejected: tuple[Rejected, ...]
    considered: int
    estimates: int
    estimate_s: float
    component_evaluations: int


def _search_size(args: tuple[Scenario, int, SearchOptions]) -> _SizeSearch:
    """Rank every candidate on ``gpus`` GPUs by the fast estimate; keep the top K and the
    framework defaults. A deterministic function of (scenario, gpus, options) only."""
    sc, gpus, opts = args
    obj = _objective(opts)
    sub = resized(sc, gpus)
    est = Estimator(sub)
    rejected: list[Rejected] = []
    ranked: list[tuple[float, Candidate, Estimate]] = []
    considered = 0
    t_est = 0.0
    n_est = 0
    for c in enumerate_candidates(sub, opts):
        considered += 1
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
            t_est += time.perf_counter() - t1
            n_est += 1
        ranked.append((obj(PlanEvaluation(c.label, c.plan, gpus, e, None, "search")), c, e))
    ranked.sort(key=lambda x: (x[0], x[1].label))
    short: list[tuple[str, Plan, Estimate | None, str]] = [(c.label, c.plan, e, "search") for _, c, e in ranked[: opts.top_k]]
    # Framework defaults at every size, so that the space for P GPUs contains the one for P/2.
    for c in framework_default_plans(sub):
        short.append((c.label, c.plan, _try(est, c), "baseline"))
    return _SizeSearch(gpus, tuple(short), tuple(rejected), considered, n_est, t_est, est.evaluations)


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
    sizes = gpu_counts(sc)
    if progress:
        progress(f"estimating plans on {', '.join(map(str, sizes))} GPUs", 0, 2)
    per_size: list[_SizeSearch] = mapper(_search_size, [(sc, g, opts) for g in sizes])
    rejected = [r for ps in per_size for r in ps.rejected]
    items: list[tuple[Scenario, str, Plan, Estimate | None, str]] = []
    for ps in per_size:
        sub = resized(sc, ps.gpus)
        items.extend((sub, label, plan, e, src) for label, plan, e, src in ps.shortlisted)
    if include_user_plan:
        user = Candidate(sc.plan, "your plan (scenario)")
        items.append((sc, user.label, user.plan, _try(Estimator(sc), user), "user"))
    t_estimated = time.perf_counter()
    # Simulate each distinct (GPUs, plan) once: a baseline is often also the user's plan.
    keys = [(s.cluster.num_gpus, plan.model_dump_json()) for s, _, plan, _, _ in items]
    uniq: dict[tuple[int, str], int] = {}
    for i, k in enumerate(keys):
        uniq.setdefault(k, i)
    if progress:
        progress(f"simulating the {len(uniq)} best plans", 1, 2)
    order = list(uniq.values())
    got = mapper(_simulate_one, [(items[i][0], items[i][2]) for i in order])
    by_key = dict(zip(uniq.keys(), got))
    sims = [by_key[k] for k in keys]
    if progress:
        progress("done", 2, 2)
    evals: list[PlanEvaluation] = []
    for (s, label, plan, e, src), r in zip(items, sims):
        if isinstance(r, str):
            rejected.append(Rejected(f"{s.cluster.num_gpus} GPUs | {label}", r))
            evals.append(PlanEvaluation(label, plan, s.cluster.num_gpus, e, None, src, error=r))
        else:
            evals.append(PlanEvaluation(label, plan, s.cluster.num_gpus, e, r, src))
    ok = [e for e in evals if e.sim is not None and e.staleness <= max(opts.max_staleness, 0)]
    ok += [e for e in evals if e.sim is not None and e.source == "user" and e not in ok]
    if not ok:
        reasons = "; ".join(sorted({r.reason for r in rejected})[:3])
        raise SpecError("plan", f"no feasible plan on {sc.cluster.num_gpus} GPUs: {reasons}")
    # Best: the objective over everything simulated (searched plans and baselines alike).
    ranked = sorted((e for e in ok if e.source != "user"), key=lambda e: (obj(e), e.label))
    best = ranked[0] if ranked else ok[0]
    n_est = sum(ps.estimates for ps in per_size)
    t_est = sum(ps.estimate_s for ps in per_size)
    comp = sum(ps.component_evaluations for ps in per_size)
    t_end = time.perf_counter()
    notes = [
        f"fast estimate: {n_est} candidates in {t_est:.1f} s ({comp} stage-cost evaluations, memoized)",
        f"wall: search {t_estimated - t0:.1f} s, simulation of {len(uniq)} plans {t_end - t_estimated:.1f} s",
    ]
    return PlanSearchResult(
        scenario=sc.name,
        num_gpus=sc.cluster.num_gpus,
        considered=sum(ps.considered for ps in per_size),
        rejected=tuple(rejected),
        evaluated=tuple(e for e in ranked if e.source == "search"),
        best=best,
        pareto=_pareto([e for e in ok if e.source != "user"]),
        baselines=tuple(e for e in evals if e.source == "baseline" and e.num_gpus == sc.cluster.num_gpus),
        user=next((e for e in evals if e.source == "user"), None),
        estimates_per_s=n_est / t_est if t_est > 0 else math.inf,
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

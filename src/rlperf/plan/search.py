"""The planner: branch and bound over the plan space, pruned by a closed-form lower bound,
ordered by the fast estimate, checked by the simulator; then the Pareto front.

GPU counts: the search also considers running on a power-of-two fraction of the cluster (down
to one node). All sizes share one branch and bound (rlperf.plan.bound): a plan is simulated
only while its lower bound could still beat the best simulated plan, so with tolerance 0 and
an unlimited budget the result is the exhaustive search's best (a test checks it on random
scenarios), and the space for ``P`` GPUs contains the one for ``P/2``. The Pareto front is over
the simulated plans, in (step time, GPUs, cost per step, staleness).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlperf.memo import BoundedMemo
from rlperf.errors import SpecError
from rlperf.modes import mode_of
from rlperf.plan.bound import Bounder, PlanBound
from rlperf.plan.estimate import Estimate, Estimator
from rlperf.plan.gap import seconds_text
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
    pruned: tuple[Pruned, ...] = field(default=())
    simulations: int = 0


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
    cluster = sc.cluster.with_gpus(gpus)  # whole nodes, a partial last one (NVL72 racks)
    return Scenario(sc.spec, sc.models, cluster, sc.workload, sc.algorithm)


def _simulate_one(args: tuple[Scenario, Plan]) -> SimResult | str:
    """Simulate ``plan`` for the planner (no engine timeline: see :func:`_with_timeline`)."""
    return _simulate(args[0], args[1], timeline=False)


# Simulations already run in this process, by everything they read: the what-ifs of the best
# plan are often plans the search simulated already (the same plan on the same GPUs). A
# simulation is deterministic and its result frozen, so sharing one is safe.
_SIMULATED: BoundedMemo[tuple[str, str, str, bool], SimResult | str] = BoundedMemo(64)


def _simulate(sc: Scenario, plan: Plan, timeline: bool) -> SimResult | str:
    from rlperf.sim.run import run_scenario

    warmup, steady = sim_iterations(plan)
    sim = sc.spec.simulation.model_copy(update={"iterations": warmup + steady, "warmup": warmup})
    spec = sc.spec.model_copy(update={"plan": plan, "simulation": sim})
    key = (spec.model_dump_json(), sc.cluster.model_dump_json(), sc.workload.model_dump_json(), timeline)
    got = _SIMULATED.get(key)
    if got is not None:
        return got
    try:
        got = run_scenario(Scenario(spec, sc.models, sc.cluster, sc.workload, sc.algorithm), timeline=timeline)
    except SpecError as err:
        got = str(err)
    return _SIMULATED.put(key, got)


def _with_timeline(sc: Scenario, e: PlanEvaluation) -> PlanEvaluation:
    """``e`` simulated again with the engine timeline (the report draws the best plan's): the
    same numbers, and cheap, as its rollouts and stage costs are memoized in this process."""
    r = _simulate(sc, e.plan, timeline=True)
    assert not isinstance(r, str) and e.sim is not None and r.step_times_s == e.sim.step_times_s
    return dataclasses.replace(e, sim=r)


# map(fn, items) -> [fn(item) ...], in order: a process pool here, Ray tasks with --executor ray.
Mapper = Callable[[Callable[[Any], Any], Sequence[Any]], list[Any]]


def default_jobs() -> int:
    """Worker processes when the user sets none: one per core this process may run on, but
    none at all (the search in this process) on one or two cores. A worker recomputes the
    rollouts and stage costs the parent memoized for the fast estimate, so on two cores two
    workers cost more CPU than one process (README plan: 12.9 against 8.8 CPU-s) and were no
    faster (19.6 against 16.7 s wall; docs/benchmarks.md)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return cores if cores > 2 else 1


class LocalMapper:
    """``map`` over a process pool on this machine, kept for the mapper's life: a branch and
    bound maps several small batches, and a fresh pool per batch would pay the workers' start
    (importing rlperf) each time and lose what they memoized (rollouts, stage costs)."""

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = jobs or default_jobs()
        self._pool: ProcessPoolExecutor | None = None

    def __call__(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        if self.jobs <= 1 or len(items) <= 1:
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, initializer=_ignore_sigint)
            weakref.finalize(self, self._pool.shutdown)
        ex = self._pool
        try:
            return list(ex.map(fn, items))
        except BaseException:  # Ctrl-C (the workers ignore it): stop them now, not after their tasks
            procs = list((ex._processes or {}).values())
            for proc in procs:
                proc.terminate()
            ex.shutdown(wait=False, cancel_futures=True)
            self._pool = None
            raise


def local_mapper(jobs: int | None = None) -> Mapper:
    return LocalMapper(jobs)


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
        # Ctrl-C propagates as KeyboardInterrupt; the CLI leaves at once (cli.app._interrupted)
        # and the local instance, in the same process group, stops with the driver.
        return ray.get(refs)

    return run


@dataclass(frozen=True)
class Pruned:
    """Plans never simulated, and why: their bound could not beat the best simulated plan by
    more than the tolerance (proven), or the simulation budget ran out first (not proven)."""

    reason: str
    count: int


@dataclass
class _Node:
    gpus: int
    cand: Candidate
    bound: PlanBound
    bound_obj: float
    estimate: Estimate | None = None
    est_obj: float = math.inf
    floor_obj: float | None = None  # objective of Estimator.floor, once computed


def _lag_key(n: _Node) -> tuple[int, str, str, str]:
    """What sets a plan's policy lag apart from its training layouts: GPUs, mode, placement, engines."""
    p = n.cand.plan
    return (n.gpus, p.mode.model_dump_json(), p.placement.model_dump_json(), p.rollout.model_dump_json())


def _bound_objective(opts: SearchOptions, b: PlanBound, gpus: int, price: float | None) -> float:
    if opts.objective == "cost":
        return b.step_s * gpus * price / 3600.0 if price is not None else b.step_s * gpus
    if opts.objective == "throughput_per_gpu":
        return b.step_s * gpus
    return b.step_s


def search(
    sc: Scenario,
    opts: SearchOptions | None = None,
    mapper: Mapper | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    include_user_plan: bool = True,
    timeline: bool = True,
) -> PlanSearchResult:
    """Branch and bound over the plan space of every GPU count (rlperf.plan.bound):

    1. every candidate gets its closed-form lower bound;
    2. the framework defaults (and the user's plan) are simulated: the first incumbent;
    3. candidates whose bound, less the tolerance, cannot beat the incumbent are pruned; the
       rest get the fast estimate and are simulated best estimate first, a batch at a time
       (one plan per worker), each batch tightening the incumbent and pruning again;
    4. it stops when nothing is left (the best is proven within the tolerance) or after
       ``top_k`` simulations per GPU count that can still win (recounted after each pruning;
       the rest are reported as not proven).

    Plans whose responses are expected to lag more versions than ``max_staleness`` allows
    (:meth:`rlperf.modes.Mode.expected_staleness`: streaming calls whose long responses span
    several steps) wait until everything else is simulated or pruned: their simulation would
    most likely refuse them, and the prediction is no proof, so with an unlimited budget they
    are still simulated (the search stays exhaustive).

    ``timeline``: the best plan simulated once more with the engine timeline (the HTML report
    draws it); without it the best plan's result has no engine segments, every figure the same.
    """
    opts = opts or SearchOptions()
    mapper = mapper or local_mapper()
    t0 = time.perf_counter()
    obj = _objective(opts)
    sizes = gpu_counts(sc)
    price = sc.cluster.accelerator.price_usd_per_hour
    rejected: list[Rejected] = []
    nodes: list[_Node] = []
    subs: dict[int, Scenario] = {}
    ests: dict[int, Estimator] = {}
    bounders: dict[int, Bounder] = {}
    considered = 0
    deferred: list[_Node] = []
    for g in sizes:
        sub = subs[g] = resized(sc, g)
        est = ests[g] = Estimator(sub)
        bounder = bounders[g] = Bounder(sub, est)
        for c in enumerate_candidates(sub, opts):
            considered += 1
            if isinstance(c, Rejected):
                rejected.append(c)
                continue
            why = opts.plan_filter.why_not_plan(c.plan) if opts.plan_filter is not None else None
            if why is not None:
                rejected.append(Rejected(f"{g} GPUs | {c.label}", why))
                continue
            if c.staleness > opts.max_staleness:
                continue
            try:
                b = bounder.bound(c)
            except SpecError as err:
                rejected.append(Rejected(f"{g} GPUs | {c.label}", str(err)))
                continue
            node = _Node(g, c, b, _bound_objective(opts, b, g, price))
            # Responses expected to lag more versions than allowed (a streaming call's long
            # responses span several calls): its simulation would most likely refuse it, so it
            # waits until every other plan is simulated or pruned (the prediction is no proof).
            (deferred if est.expected_staleness(c.plan) > opts.max_staleness else nodes).append(node)
        if progress:
            progress(f"{considered} candidates, {len(nodes)} bounded ({g} GPUs done of {', '.join(map(str, sizes))})", 0, 1)
    t_bounded = time.perf_counter()

    # The first incumbent: the framework defaults on all GPUs, and the user's plan.
    items: list[tuple[Scenario, str, Plan, Estimate | None, str]] = []
    for c in framework_default_plans(sc):
        if opts.plan_filter is not None and opts.plan_filter.why_not_plan(c.plan) is not None:
            continue
        items.append((sc, c.label, c.plan, _try(ests[sc.cluster.num_gpus], c), "baseline"))
    # The user's plan is simulated for the comparison even where the framework filter refuses
    # it, but then it may not stand in as the answer when no other plan is feasible.
    user_refused = opts.plan_filter.why_not_plan(sc.plan) if opts.plan_filter is not None and include_user_plan else None
    if include_user_plan:
        user = Candidate(sc.plan, "your plan (scenario)")
        items.append((sc, user.label, user.plan, _try(ests[sc.cluster.num_gpus], user), "user"))
    sims = 0
    evals: list[PlanEvaluation] = []

    def simulate_batch(batch: list[tuple[Scenario, str, Plan, Estimate | None, str]]) -> None:
        nonlocal sims
        keys = [(s.cluster.num_gpus, plan.model_dump_json()) for s, _, plan, _, _ in batch]
        uniq: dict[tuple[int, str], int] = {}
        for i, k in enumerate(keys):
            uniq.setdefault(k, i)
        order = list(uniq.values())
        got = mapper(_simulate_one, [(batch[i][0], batch[i][2]) for i in order])
        sims += len(order)
        by_key = dict(zip(uniq.keys(), got))
        for (s, label, plan, e, src), k in zip(batch, keys):
            r = by_key[k]
            if isinstance(r, str):
                rejected.append(Rejected(f"{s.cluster.num_gpus} GPUs | {label}", r))
                evals.append(PlanEvaluation(label, plan, s.cluster.num_gpus, e, None, src, error=r))
            else:
                evals.append(PlanEvaluation(label, plan, s.cluster.num_gpus, e, r, src))

    def eligible() -> list[PlanEvaluation]:
        """Simulated plans the answer may name best: within the staleness limit, not the user's."""
        return [e for e in evals if e.sim is not None and e.source != "user" and e.staleness <= max(opts.max_staleness, 0)]

    def incumbent() -> float:
        return min((obj(e) for e in eligible()), default=math.inf)

    simulate_batch(items)
    budget = 0
    batch_size = max(1, opts.sim_batch)
    pruned_terms: dict[str, int] = {}
    searched = 0
    live = sorted(nodes, key=lambda n: (n.bound_obj, n.gpus, n.cand.label))
    estimated: set[int] = set()
    while True:
        best = incumbent()
        keep = [n for n in live if n.bound_obj * (1 + opts.tolerance) < best]
        for n in live:
            if n.bound_obj * (1 + opts.tolerance) >= best:
                pruned_terms[n.bound.term] = pruned_terms.get(n.bound.term, 0) + 1
        live = keep
        # top_k simulations per GPU count that can still win: recounted after every pruning
        # (a GPU count whose plans the bound has all pruned no longer earns simulations).
        if not live and deferred:  # everything else is simulated or pruned
            live = sorted(deferred, key=lambda n: (n.bound_obj, n.gpus, n.cand.label))
            deferred = []
            continue
        budget = opts.top_k * len({n.gpus for n in live}) if live else budget
        # A budget spent on plans that all simulated over the staleness limit has found nothing
        # the answer may name: the search goes on, up to 4x the budget, before it gives up and
        # says why (with the framework defaults and its one plan over the limit, a 4-GPU search
        # of top_k 1 answered "no feasible plan" beside feasible plans it had not simulated;
        # a better-ranked small stream that lags more than predicted does the same).
        limit = budget if eligible() else 4 * budget
        if not live or searched >= limit:
            break
        # Best first: estimate in order of bound while a bound is below the best estimate so
        # far (a plan whose bound exceeds it would not be simulated next anyway); the rest wait
        # for later rounds, by which time the incumbent may have pruned them.
        # A plan whose floor (its estimate with the bound's training work: Estimator.floor) is
        # above the best estimate waits the same way, without paying for its layouts' costs.
        best_est = min((n.est_obj for n in live if id(n) in estimated), default=math.inf)
        for n in live:  # sorted by bound
            if n.bound_obj >= best_est:
                break
            if id(n) in estimated:
                continue
            try:
                if n.floor_obj is None:
                    f = ests[n.gpus].floor(n.cand, bounders[n.gpus].training_work(n.cand.plan))
                    n.floor_obj = obj(PlanEvaluation(n.cand.label, n.cand.plan, n.gpus, f, None, "search"))
                if n.floor_obj > best_est:  # ties estimated: a rollout-bound plan's floor is its estimate
                    continue
                estimated.add(id(n))
                e = ests[n.gpus].estimate(n.cand)
            except SpecError as err:
                estimated.add(id(n))
                rejected.append(Rejected(f"{n.gpus} GPUs | {n.cand.label}", str(err)))
                continue
            n.estimate = e
            n.est_obj = obj(PlanEvaluation(n.cand.label, n.cand.plan, n.gpus, e, None, "search"))
            best_est = min(best_est, n.est_obj)
        live = [n for n in live if n.estimate is not None or id(n) not in estimated]
        live.sort(key=lambda n: (n.est_obj, n.bound_obj, n.gpus, n.cand.label))
        ready = [n for n in live if n.estimate is not None]
        take = ready[: min(batch_size, limit - searched)]
        live = [n for n in live if not any(n is t for t in take)]
        if not take:
            break
        if progress:
            # The best so far is one the answer could name (a plan over the staleness limit is not).
            lead = min(eligible(), key=lambda e: (obj(e), e.label), default=None)
            so_far = f"; best so far: {lead.label} on {lead.num_gpus} GPUs, {seconds_text(lead.step_time_s)}/step" if lead else ""
            progress(f"{sims} plans simulated, {len(live)} could still win{so_far}", searched, budget)
        simulate_batch([(subs[n.gpus], n.cand.label, n.cand.plan, n.estimate, "search") for n in take])
        searched += len(take)
        # A plan simulated above the staleness limit: the plans that differ from it only in their
        # training layouts share its rollout engines, split and mode, hence its lag, so they wait
        # with the deferred plans instead of spending the budget one by one (a verl DAPO search
        # spent all 15 simulations on one streaming split that lags 3 versions against a limit of 2).
        lagging = {_lag_key(n) for n, e in zip(take, evals[len(evals) - len(take):])
                   if e.sim is not None and e.staleness > max(opts.max_staleness, 0)}
        if lagging:
            deferred += [n for n in live if _lag_key(n) in lagging]
            live = [n for n in live if _lag_key(n) not in lagging]
        live.sort(key=lambda n: (n.bound_obj, n.gpus, n.cand.label))
    if progress:
        progress("done", 1, 1)
    unproven = len(live)
    best_left = min((n.bound_obj for n in live), default=math.inf)

    ok = [e for e in evals if e.sim is not None and e.staleness <= max(opts.max_staleness, 0)
          and (e.source != "user" or user_refused is None)]
    if user_refused is None:
        ok += [e for e in evals if e.sim is not None and e.source == "user" and e not in ok]
    if not ok:
        lags = [e.staleness for e in evals if e.sim is not None and e.source != "user"]
        raise _nothing_feasible(sc, opts, considered, rejected, lags)
    ranked = sorted((e for e in ok if e.source != "user"), key=lambda e: (obj(e), e.label, e.num_gpus))
    first = ranked[0] if ranked else ok[0]
    best_eval = _with_timeline(subs[first.num_gpus], first) if timeline else first
    ok = [best_eval if e is first else e for e in ok]
    evals = [best_eval if e is first else e for e in evals]
    ranked = [best_eval if e is first else e for e in ranked]
    n_est = len(estimated)
    comp = sum(e.evaluations for e in ests.values())
    t_end = time.perf_counter()
    pruned = [Pruned(f"bound ({term}) within {opts.tolerance:.0%} of the best simulated plan or above it", k)
              for term, k in sorted(pruned_terms.items())]
    if unproven:
        pruned.append(Pruned(f"not simulated: simulation budget of {budget} plans spent (best remaining bound "
                             f"{best_left / obj(best_eval):.2f}x the best plan)", unproven))
    if deferred:
        pruned.append(Pruned(f"not simulated: expected staleness above the limit {opts.max_staleness} "
                             "(rlperf.modes.Mode.expected_staleness, or simulated so for a plan with the same engines, "
                             "split and mode), simulation budget spent first", len(deferred)))
    notes = [
        f"branch and bound: {len(nodes)} plans bounded in {t_bounded - t0:.1f} s, {n_est} estimated, {sims} simulated, "
        f"{sum(p.count for p in pruned[: len(pruned_terms)])} pruned by bound"
        + (f", {len(deferred)} expected above the staleness limit not simulated" if deferred else "")
        + (f", {unproven} left unproven" if unproven else ", best proven within the tolerance"),
        f"wall: {t_end - t0:.1f} s; fast estimate {comp} stage-cost evaluations (memoized)",
    ]
    if user_refused is not None:
        notes.append(f"your plan is shown for comparison only: {user_refused}")
    if best_eval.sim is not None:
        wd = best_eval.sim.bounds
        notes.append(f"best plan: {wd.ratio:.2f}x its simulated work-depth bound (W/P {wd.work_s / wd.num_gpus:.0f} s, "
                     f"D/(s+1) {wd.depth_s / (wd.staleness + 1):.0f} s)")
    return PlanSearchResult(
        scenario=sc.name,
        num_gpus=sc.cluster.num_gpus,
        considered=considered,
        rejected=tuple(rejected),
        evaluated=tuple(e for e in ranked if e.source == "search"),
        best=best_eval,
        pareto=_pareto([e for e in ok if e.source != "user"]),
        baselines=tuple(e for e in evals if e.source == "baseline"),
        user=next((e for e in evals if e.source == "user"), None),
        estimates_per_s=math.inf,
        component_evaluations=comp,
        elapsed_s=time.perf_counter() - t0,
        notes=tuple(notes),
        pruned=tuple(pruned),
        simulations=sims,
    )


def _nothing_feasible(sc: Scenario, opts: SearchOptions, considered: int, rejected: list[Rejected],
                      lags: list[int]) -> SpecError:
    """The error of a search that found no plan it may answer with: its most common reasons,
    first the plans it simulated over the staleness limit (``lags``: the simulated plans' largest
    lags). With a framework filter it is the ``--framework`` option's (the reasons name the
    framework)."""
    from collections import Counter

    counts = Counter(r.reason for r in rejected).most_common(3)
    parts = [f"{reason} ({n} plan{'s' if n > 1 else ''})" for reason, n in counts]
    if lags:
        parts.insert(0, f"{len(lags)} simulated plan{'s' if len(lags) > 1 else ''} lag up to {max(lags)} versions, "
                        f"above --max-staleness {opts.max_staleness}")
    reasons = "; ".join(parts) or "none simulated"
    where = f"on {sc.cluster.num_gpus} GPUs ({considered} candidates)"
    if opts.plan_filter is None:
        return SpecError("plan", f"no feasible plan {where}: {reasons}")
    return SpecError("--framework", f"no plan the framework runs is feasible {where}: {reasons}",
                     "a framework that runs these plans (`rlperf frameworks`), or a plan it runs in the scenario")


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

"""The planner's fast estimate: memoized stage costs composed in closed form per mode.

Stage costs depend only on (stage, layout, number of GPUs) for a fixed workload sample, and
the plan space reuses the same few of them many times (a pool size and a layout appear in
hundreds of candidates). So each is computed once with the same cost models the simulator
uses, and a candidate's step time is composed in closed form:

- synchronous: ``sync + generate + max_pools(Σ forward-only) + max_pools(Σ train)`` (stages on
  one pool serialize, different pools run in parallel, a CPU reward overlaps);
- stage fusion: forward-only passes on a separate pool hide behind the rollout except the last
  wave (``Σ forward / waves``); on the rollout's own pool they hide in its tail, at most the
  tail's length;
- asynchronous with staleness ``s`` on split pools: ``max(generate + sync, training-pool work,
  iteration / (s + 1))`` (the work-depth bound of a pipelined loop);
- partial rollout and streaming: the rollout is the mode's steady call (rlperf.modes.Mode.steady_call):
  the step's fresh requests and the pieces carried from earlier calls, each capped at the
  call's token budget (streaming: the budget of ``(1 + τ)·B·G`` requests in flight, of which
  the engines decode at most their slots at once: ``R`` engines x ``max_num_seqs``, under
  group admission x ``g·G``, the engine's batch then capped at that too).

A rollout on many replicas is simulated on a few of them (the most loaded, and a spread of
the rest for its tail: rlperf.plan.rollout_sample): the estimate's cost per candidate does not
grow with the pool.

The simulator then checks the best candidates (rlperf.plan.search); the estimate only ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from rlperf.errors import SpecError
from rlperf.modes import GenerationRounds, Mode, StepParts, mode_of
from rlperf.plan.rollout_sample import ReplicaSample
from rlperf.plan.space import Candidate
from rlperf.scenario import Scenario
from rlperf.sim.costs import AnalyticCosts
from rlperf.sim.interface import RolloutBatch
from rlperf.specs.plan import ExecutionMode, Plan
from rlperf.stages.base import StageCost


# Device-seconds of (forward passes, updates) per pool name.
PoolWork = tuple[dict[str, float], dict[str, float]]


def pool_sizes(plan: Plan, total_gpus: int) -> tuple[dict[str, int], dict[str, str]]:
    """(GPUs of each pool, pool of each placement key) of ``plan`` on ``total_gpus``."""
    pools, assign = plan.placement.resolve(total_gpus)
    return {p.name: p.num_gpus for p in pools}, assign


# The batch the estimate costs: iteration 1's (the simulator draws iteration ``i``'s batch with
# seed ``1000·i``, rlperf.sim.simulate), the first a synchronous plan's simulation measures
# (its warm-up is iteration 0: rlperf.modes.Mode.sim_iterations). A synchronous step ends with
# its batch's longest response, which at short means is one draw's extreme: at a 325-token mean
# and an 8,192-token cap, iteration 0's batch holds two responses of the cap and iteration 1's
# longest has 6,195 tokens, so costing iteration 0's ranked a 4-node plan at 88 s that
# simulates at 65 s. Asynchronous plans measure later iterations (two or more), averaged.
MEASURED_SEED = 1000


@dataclass(frozen=True)
class Estimate:
    step_time_s: float
    num_gpus: int
    cost_usd_per_step: float | None
    staleness: int  # the largest policy lag the simulator is expected to give (Mode.expected_staleness)
    generate_s: float
    forward_s: float
    train_s: float
    sync_s: float
    tail_s: float


class Estimator:
    """Memoized component costs for one scenario (one workload sample)."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.n_prompts = sc.workload.prompts_per_step
        self.g = sc.workload.group_size
        self._memo: dict[tuple[object, ...], object] = {}
        self._placed: dict[tuple[object, ...], tuple[dict[str, int], dict[str, str]]] = {}
        self._modes: dict[ExecutionMode, Mode] = {}
        self._lags: dict[tuple[ExecutionMode, bool, int], int] = {}
        self.evaluations = 0  # component cost evaluations (cache misses)
        gen_rounds = GenerationRounds.of(sc.algorithm, sc.spec.algorithm.keep_rate)
        self.gen_rounds = gen_rounds
        self.rounds = gen_rounds.rounds
        gen_prompts = gen_rounds.prompts_per_round(self.n_prompts)
        w = sc.workload if gen_prompts == self.n_prompts else sc.workload.model_copy(update={"prompts_per_step": gen_prompts})
        s = w.sample(MEASURED_SEED)
        p = np.asarray(s.prompt_tokens, np.int64)
        r = np.asarray(s.response_tokens, np.int64)
        self.batch = RolloutBatch(np.repeat(p, r.shape[1]), r.reshape(-1), np.zeros(r.size, np.int64),
                                  np.repeat(np.arange(len(p), dtype=np.int64), r.shape[1]))
        kept = (np.repeat(p, r.shape[1]) + r.reshape(-1))[: self.n_prompts * self.g]
        self.kept_tokens = kept
        self.greedy = RolloutBatch(p[: self.n_prompts], r[: self.n_prompts, 0].copy(), np.zeros(self.n_prompts, np.int64),
                                   np.arange(self.n_prompts, dtype=np.int64))

    def _costs(self, plan: Plan) -> AnalyticCosts:
        key = ("costs", plan.rollout, tuple(sorted((k, v) for k, v in plan.layouts.items())))
        c = self._memo.get(key)
        if c is None:
            c = AnalyticCosts(self.sc.with_plan(plan), timeline=False)
            self._memo[key] = c
        return c  # type: ignore[return-value]

    def _cached(self, key: tuple[object, ...], fn):  # type: ignore[no-untyped-def]
        if key in self._memo:
            v = self._memo[key]
            if isinstance(v, SpecError):
                raise v
            return v
        self.evaluations += 1
        try:
            v = fn()
        except SpecError as err:
            self._memo[key] = err
            raise
        self._memo[key] = v
        return v

    def requests_per_engine(self, plan: Plan) -> int:
        """Requests one rollout engine decodes at once under ``plan``'s mode
        (rlperf.modes.Mode.requests_per_engine over the step's batch), once per mode and
        ``max_num_seqs``."""
        key = ("per_engine", plan.mode, plan.rollout.max_num_seqs)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self.mode(plan).requests_per_engine(plan.rollout.max_num_seqs, self.batch)
        return got  # type: ignore[return-value]

    def slots(self, plan: Plan, gen_gpus: int) -> int:
        """Requests the rollout engines on ``gen_gpus`` decode at once under ``plan``'s mode."""
        lay = plan.rollout
        return max(1, gen_gpus // (lay.tp * lay.pp)) * self.requests_per_engine(plan)

    def rollout(self, plan: Plan, gpus: int, budget: int | None, greedy: bool = False,
                slots: int | None = None, shared: bool = False) -> tuple[float, float]:
        """(time, tail) of the step's rollout call on ``gpus`` (``shared``: its engine sleeps
        while training on the same GPUs). A mode that keeps its engines full
        (:meth:`rlperf.modes.Mode.full_window`) gets its call timed at the full-batch rate and
        no tail."""
        # A rollouter that admits fewer requests than the engine's slots (whole prompt groups)
        # runs the engine at that batch.
        per_engine = self.requests_per_engine(plan)
        if per_engine < plan.rollout.max_num_seqs and not greedy:
            plan = plan.model_copy(update={"rollout": plan.rollout.model_copy(update={"max_num_seqs": per_engine})})
        costs = self._costs(plan)
        # ReMax's greedy baseline is never budgeted; the step's batch is the mode's steady call.
        batch = self.greedy if greedy else self._steady_batch(plan, budget, slots)
        mode = self.mode(plan)

        def run() -> tuple[float, float]:
            # A few replicas stand for all (rlperf.plan.rollout_sample); all of them when few.
            lay = plan.rollout
            per = lay.tp * lay.pp
            sample = ReplicaSample.of(batch, gpus // per, budget)
            sub, sub_gpus = (batch, gpus) if sample is None else (sample.batch, len(sample.replicas) * per)
            full = None if greedy else mode.full_window(sub.num_requests, sub_gpus // per * lay.max_num_seqs, shared)
            if full is not None:
                # (time, new tokens decoded) at both stops; the first is the call's start when 0.
                (t0, d0), (t1, d1) = ((0.0, 0.0) if k == 0 else self._stopped(costs, sub, sub_gpus, budget, k) for k in full)
                new = float(np.sum(sub.target_tokens - sub.generated_tokens))
                return t0 + (new - d0) * (t1 - t0) / max(d1 - d0, 1.0), 0.0
            if sample is not None:
                return sample.makespan_and_tail_s(costs.rollout(sub, sub_gpus, budget))
            o = costs.rollout(batch, gpus, budget)
            return o.cost.time_s, o.tail_s

        call = None if greedy else type(mode).steady_call
        return self._cached(("gen", plan.rollout, gpus, budget, greedy, call, shared), run)  # type: ignore[no-any-return]

    @staticmethod
    def _stopped(costs: AnalyticCosts, batch: RolloutBatch, gpus: int, budget: int | None, stop: int) -> tuple[float, float]:
        """(time, new tokens decoded) of ``batch``'s call stopped after ``stop`` finished."""
        o = costs.rollout(batch, gpus, budget, stop)
        return o.cost.time_s, float(np.sum(o.generated_tokens - batch.generated_tokens))

    def _steady_batch(self, plan: Plan, budget: int | None, slots: int | None) -> RolloutBatch:
        """The mode's steady-state rollout call (carried requests included), one per budget and
        kind of call (a partial rollout's pieces start at the response's start, a stream's at
        its own phase; the call depends on ``slots`` only through its budget)."""
        key = ("steady", budget, type(self.mode(plan)).steady_call)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self.mode(plan).steady_call(self.batch, slots)
        return got  # type: ignore[return-value]

    def stage(self, plan: Plan, kind: str, role: str, gpus: int) -> StageCost:
        costs = self._costs(plan)
        lay = plan.layout_for(role)
        if kind == "forward":
            fn = lambda: costs.forward(role, self.kept_tokens, gpus, role)
        elif kind == "train":
            fn = lambda: costs.train(role, self.kept_tokens, gpus, role)
        else:
            fn = lambda: costs.reward(self.kept_tokens, gpus)
        # Keyed by what the cost depends on: the reference and the actor share a model and layout,
        # so their forward passes are one evaluation.
        head = "value" if role == "critic" else "logprobs"
        model = self.sc.models[role] if kind != "reward" else None
        return self._cached((kind, model, head, lay, gpus), fn)  # type: ignore[no-any-return]

    def sync(self, plan: Plan, gen_gpus: int, train_gpus: int, same: bool) -> float:
        costs = self._costs(plan)
        return self._cached(("sync", plan.layouts["actor"], plan.rollout, gen_gpus, train_gpus, same),  # type: ignore[no-any-return]
                            lambda: costs.weight_sync(gen_gpus, train_gpus, same).time_s)

    def switch(self, plan: Plan, gpus: int, to: Literal["rollout", "train"]) -> float:
        costs = self._costs(plan)
        return self._cached(("switch", plan.layouts["actor"], gpus, to),  # type: ignore[no-any-return]
                            lambda: costs.phase_switch(gpus, to).time_s)

    def placed(self, plan: Plan) -> tuple[dict[str, int], dict[str, str]]:
        """:func:`pool_sizes` of ``plan`` on the scenario's GPUs, memoized by the placement's
        fields (thousands of candidates share a few placements; the callers only read it)."""
        where = plan.placement  # its fields as a key (the assign dict is not hashable)
        key = (where.kind, where.rollout_gpus, where.pools, tuple(sorted(where.assign.items())))
        got = self._placed.get(key)
        if got is None:
            got = self._placed[key] = pool_sizes(plan, self.sc.cluster.num_gpus)
        return got

    def mode(self, plan: Plan) -> Mode:
        """``mode_of(plan.mode)``, memoized (a mode is a frozen value of its spec)."""
        got = self._modes.get(plan.mode)
        if got is None:
            got = self._modes[plan.mode] = mode_of(plan.mode)
        return got

    def expected_staleness(self, plan: Plan) -> int:
        """The largest policy lag the simulator is expected to give ``plan``'s trained responses
        (rlperf.modes.Mode.expected_staleness); needs no stage cost."""
        size, assign = self.placed(plan)
        shared = assign["generate"] == assign["actor"] and plan.offload_between_phases
        slots = self.slots(plan, size[assign["generate"]])
        key = (plan.mode, shared, slots)
        got = self._lags.get(key)
        if got is None:
            got = self._lags[key] = self.mode(plan).expected_staleness(self.batch, shared, slots)
        return got

    def floor(self, cand: Candidate, training: PoolWork = ({}, {})) -> Estimate:
        """:meth:`estimate` with its forward passes and updates at ``training`` (device-seconds
        of (forward passes, updates) per pool, at most what their stage costs give: the bound's
        weight-matmul FLOPs at the large-GEMM rate, rlperf.plan.bound.Bounder.training_work, on
        this estimate's sample) and no CPU reward: never above the estimate, as every mode's
        closed form grows with each part (rlperf.modes.Mode.compose_step), and it needs no stage
        cost of a training layout, the most of an estimate's cost (memoized per layout and
        pool). The search estimates a plan only once this floor could beat the best estimate so
        far."""
        return self.estimate(cand, training)

    def estimate(self, cand: Candidate, floor: PoolWork | None = None) -> Estimate:
        """Closed-form step time of ``cand``; raises SpecError (with the reason) if infeasible.
        ``floor``: the training work of :meth:`floor` instead of the stage costs."""
        sc = self.sc
        plan = cand.plan
        total = sc.cluster.num_gpus
        size, assign = self.placed(plan)
        gen_pool = assign["generate"]
        g_gen = size[gen_pool]
        mode = self.mode(plan)
        slots = self.slots(plan, g_gen)
        budget = mode.steady_budget(self.batch, slots)
        updates = sc.epochs * sc.minibatches
        stages = sc.algorithm.active_stages(updates)
        shared_engine = gen_pool == assign["actor"] and plan.offload_between_phases
        gen_s, tail_s = self.rollout(plan, g_gen, budget, slots=slots, shared=shared_engine)
        gen_s *= self.rounds
        if any(s.name == "generate_greedy" for s in stages):
            gen_s += self.rollout(plan, g_gen, None, greedy=True)[0]
        fwd_by_pool: dict[str, float] = {}
        train_by_pool: dict[str, float] = {}
        cpu_s = 0.0
        if floor is not None:
            fwd_by_pool = {p: w / size[p] for p, w in floor[0].items()}
            train_by_pool = {p: w / size[p] for p, w in floor[1].items()}
        for st in () if floor is not None else stages:
            if st.kind == "forward" or (st.kind == "reward" and sc.spec.algorithm.reward.kind == "model"):
                role = st.role
                pool = assign[role]
                t = self.stage(plan, "forward", role, size[pool]).time_s
                fwd_by_pool[pool] = fwd_by_pool.get(pool, 0.0) + t
            elif st.kind == "reward":
                cpu_s += self.stage(plan, "reward", "actor", 1).time_s
            elif st.kind == "train":
                pool = assign[st.role]
                train_by_pool[pool] = train_by_pool.get(pool, 0.0) + self.stage(plan, "train", st.role, size[pool]).time_s
        same = gen_pool == assign["actor"]
        sync_s = self.sync(plan, g_gen, size[assign["actor"]], same)
        switch_s = 0.0
        if same and plan.offload_between_phases:
            switch_s = self.switch(plan, g_gen, "rollout") + self.switch(plan, g_gen, "train")
        fwd_total = sum(fwd_by_pool.values())
        if mode.fusion is not None and mode.allows_fusion and self.gen_rounds.allows_fusion:
            fusion = mode.fusion
            fused = max((fusion.hidden_forward_s(t, pool == gen_pool, tail_s) for pool, t in fwd_by_pool.items()), default=0.0)
            fwd_s = max(fused, fusion.hidden_forward_s(cpu_s, False, tail_s))
        else:
            fwd_s = max(max(fwd_by_pool.values(), default=0.0), cpu_s)
        train_s = max(train_by_pool.values(), default=0.0)
        iteration = sync_s + switch_s + gen_s + fwd_s + train_s
        s = mode.expected_staleness(self.batch, shared_engine, slots)
        # A pipelined step's training side: each training pool's own work (its forward passes and
        # updates), the pools side by side (a hybrid's frozen reference forwards on its own node
        # while the actor's pool runs its passes and updates, each on its own iteration).
        pools = (set(fwd_by_pool) | set(train_by_pool)) - {gen_pool}
        train_side = sync_s + max((fwd_by_pool.get(p, 0.0) + train_by_pool.get(p, 0.0) for p in pools), default=0.0)
        gen_side = gen_s + sync_s + fwd_by_pool.get(gen_pool, 0.0)
        step = mode.compose_step(StepParts(iteration, gen_side, train_side, same, tail_s, sync_s))
        price = sc.cluster.accelerator.price_usd_per_hour
        cost = None if price is None else step * total * price / 3600.0
        return Estimate(step, total, cost, s, gen_s, fwd_total, train_s, sync_s, tail_s)

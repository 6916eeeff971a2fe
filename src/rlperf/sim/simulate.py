"""Build the task graph of several RL iterations and run it on the discrete-event kernel.

One iteration of an algorithm is its stage graph (rlperf.algorithms). The plan decides
- where each stage runs (placement: pools of GPUs; colocated stages time-share one pool);
- which policy version a rollout may use (execution mode): rollout ``i`` waits for the weights
  of update ``i - 1 - s`` where ``s`` is the staleness bound (0 = synchronous, 1 = one-step
  off-policy, s = fully asynchronous with bound s). A rollout always uses the newest weights
  synced before it starts;
- partial rollout: each response generates at most ``token_budget`` new tokens per iteration,
  the unfinished ones continue in the next iteration (with their KV re-prefilled);
- stage fusion: forward-only passes and the reward that depend only on the rollout run in
  waves on the responses finished so far, on GPUs the rollout has released;
- streaming (rlperf.modes.Streaming): a rollout may split into an *ahead* call with the previous
  weights and a *main* call with the new ones, and the stages after the rollout run in
  ``train_parts`` local updates, part ``c`` once ``⌈(c+1)·B·G/k⌉`` responses have finished;
  requests carried into a call that starts with the weights the previous one ended with keep
  their KV (rlperf.modes.Mode.keeps_kv_between_syncs); after a sync they are re-prefilled;
  with whole prompt groups (verl's rollouter) the engine admits ``M`` groups at a time, the
  calls stop after complete groups and training receives each group whole, when its last
  response finishes.

Dynamic sampling (DAPO) runs generation in rounds of ``gen_batch_multiplier`` x prompts until
``ceil(1 / (multiplier * keep_rate))`` rounds have produced enough mixed groups (the expected
number, capped at ``max_gen_rounds``); oversampling (PRIME) generates ``oversample`` x prompts
once and keeps the first share.

The execution mode is an object (rlperf.modes): it says which weights rollout ``i`` waits for,
whether unfinished requests carry over, whether forward passes fuse into the rollout, and how
many iterations stay in flight. The simulator runs ``iterations`` measured iterations (the first
``warmup`` of them excluded from results) plus the mode's drain iterations, so a pipelined loop
keeps its rollout pool busy through the last measured step (steady state, not the end of a run).

The simulation is deterministic: workload draws are seeded by (seed, iteration) and the kernel
orders simultaneous events by insertion.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
import numpy as np

from rlperf.algorithms.spec import AlgorithmSpec, StageDef
from rlperf.errors import SpecError
from rlperf.modes import GenerationRounds, mode_of
from rlperf.sim.interface import RolloutBatch, RolloutOutcome, StageCosts
from rlperf.sim.kernel import Kernel, Segment, Task, TaskFn, TaskRun
from rlperf.sim.result import Bounds, PoolStats, SimResult, StageTime, StalenessDistribution
from rlperf.sim.rollout_state import Delivered, RolloutState
from rlperf.specs.plan import Plan
from rlperf.stages.base import StageCost


# Workload draws: (step, number of prompts) -> (prompt lengths (B,), response lengths (B, G)),
# deterministic in ``step``.
Sampler = Callable[[int, int], tuple[np.ndarray, np.ndarray]]


def _instant(now: float, grant: dict[str, int]) -> TaskRun:
    """A driver step or a join point: takes no time."""
    return TaskRun(0.0)


@dataclass(frozen=True)
class SimConfig:
    """Everything the simulator needs besides the cost models (already validated).

    ``iterations`` are measured, the first ``warmup`` of them excluded from results (raised to
    what the execution mode needs, within ``iterations``); the mode's drain iterations run
    after them and are never reported. Each iteration draws ``sample(1000·i + round,
    prompts)``; ``keep_rate`` sets DAPO's rounds (rlperf.modes.GenerationRounds)."""

    name: str
    algorithm: AlgorithmSpec
    plan: Plan
    num_gpus: int
    prompts_per_step: int
    group_size: int
    sample: Sampler
    epochs: int = 1
    minibatches: int = 1
    keep_rate: float = 0.5  # dynamic sampling: expected share of groups kept per round
    reward_on_gpu: bool = False
    iterations: int = 4
    warmup: int = 1
    price_usd_per_gpu_hour: float | None = None
    max_response_tokens: int | None = None  # the length cap (None: the longest of the first draw)

    def __post_init__(self) -> None:
        if self.iterations < 1:
            raise SpecError("iterations", "must be >= 1")
        if not 0 <= self.warmup < self.iterations:
            raise SpecError("warmup", f"must be in [0, iterations) = [0, {self.iterations})")
        if not 0 < self.keep_rate <= 1:
            raise SpecError("algorithm.keep_rate", "must be in (0, 1]")


@dataclass
class _Iter:
    """Per-iteration data filled as tasks run (generation decides what training sees)."""

    kept_seq_tokens: np.ndarray | None = None  # prompt + response tokens per kept response
    kept_order: np.ndarray | None = None  # kept responses sorted by finish time (fusion chunks), once read
    kept_order_by: np.ndarray | None = None  # the finish times kept_order sorts (None: batch order)
    kept_finish_s: np.ndarray | None = None  # absolute finish time per kept response (train parts)
    kept_finish_order: np.ndarray | None = None  # argsort of kept_finish_s (stable), once per batch
    finished: int = 0  # responses of this iteration finished by the rollout calls so far
    round_seq_tokens: np.ndarray | None = None  # every response finished by the latest rollout call
    generated_tokens: float = 0.0
    # Per finished response, one array per rollout call (numpy, not lists of ints: the settle
    # test and the result read them all, every iteration of every simulation):
    staleness: list[np.ndarray] = field(default_factory=list)  # its policy lag
    lagged_tokens: list[np.ndarray] = field(default_factory=list)  # its response tokens
    tail_s: float = 0.0
    stage_costs: dict[str, list[StageCost]] = field(default_factory=dict)

    def copy(self) -> _Iter:
        """A copy that the tasks of this iteration can go on changing apart (arrays are
        replaced or appended, never written in place; the lists are appended to)."""
        return replace(self, staleness=list(self.staleness), lagged_tokens=list(self.lagged_tokens),
                       stage_costs={n: list(cs) for n, cs in self.stage_costs.items()})


@dataclass(frozen=True)
class _Saved:
    """A simulation's state at a kernel checkpoint, besides the kernel's own."""

    iters: list[_Iter]
    engine: RolloutState


def _no_work(name: str, gpus: int) -> StageCost:
    """A pass over zero responses (no response finished this iteration, or an empty fusion
    wave): nothing to compute."""
    return StageCost(name, 0.0, max(gpus, 1), 0.0, 0.0)


def _pool_key(stage: StageDef) -> str:
    if stage.kind == "generate":
        return "generate"
    return stage.role


class Simulator:
    """One simulation: ``build`` adds every iteration's tasks to the kernel (the weight sync of
    version ``i``, then the algorithm's stages, rollout ``i`` waiting for the sync the mode
    names), ``run`` executes them and summarizes the measured window as a :class:`SimResult`.

    State that tasks update as they run lives in named objects: ``iters[i]`` (what iteration
    ``i`` generated and trained, its stage costs) and ``engine`` (the rollout engine's weights
    version and the requests it carries, :class:`rlperf.sim.rollout_state.RolloutState`)."""

    def __init__(self, cfg: SimConfig, costs: StageCosts) -> None:
        self.cfg = cfg
        self.costs = costs
        self.mode = mode_of(cfg.plan.mode)
        self.gen_rounds = GenerationRounds.of(cfg.algorithm, cfg.keep_rate)
        self.rounds = self.gen_rounds.rounds
        self.pools, self.assign = cfg.plan.placement.resolve(cfg.num_gpus)
        self.pool_gpus = {p.name: p.num_gpus for p in self.pools}
        self.stages = cfg.algorithm.active_stages(cfg.epochs * cfg.minibatches)
        self.colocated_switch = (
            cfg.plan.offload_between_phases and self.assign["generate"] == self.assign["actor"]
        )
        # The engine sleeps while training on its GPUs; waking it loads the newest weights.
        self.staleness_bound = self.mode.effective_staleness(self.colocated_switch)
        # Streaming: the share of a batch generated ahead with the previous weights, and the
        # local updates that consume a batch as it streams in (1: the whole batch at once).
        self.ahead = self.mode.ahead_share(self.colocated_switch) if self.rounds == 1 else 0.0
        self.parts = self.mode.train_parts(self.colocated_switch)
        # Streaming whole prompt groups (verl fully_async): a few groups in flight at a time,
        # training receives complete groups (rlperf.sim.rollout_state).
        self.groups = self.mode.group_admission(cfg.prompts_per_step, self.colocated_switch)
        self.budget = self.mode.token_budget
        self.fusion = self.mode.fusion if self.mode.allows_fusion and self.gen_rounds.allows_fusion else None
        self.drain = self.mode.drain_iterations(self.colocated_switch)
        self.cap = cfg.max_response_tokens or int(cfg.sample(0, cfg.prompts_per_step)[1].max(initial=1))
        self.warmup_needed = self.mode.warmup_iterations(self.cap, self.colocated_switch)
        self._set_length(cfg)
        self.built = self.num_iterations  # iterations in the task graph (more are held, see run())
        self.iters: list[_Iter] = []
        self.kernel = Kernel(self.pool_gpus)
        self.engine = RolloutState()
        self.task_pool: dict[str, str | None] = {}
        self.task_stage: dict[str, str] = {}
        self.task_iteration: dict[str, int] = {}
        self.fused_stages: set[str] = set()
        for key in ("generate", "actor"):
            need = costs.min_gpus(key)
            have = self.pool_gpus[self.assign[key]]
            if need > have:
                raise SpecError(f"plan.placement ({key})", f"needs at least {need} GPUs, its pool has {have}")

    def _set_length(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        # Measured iterations, then the drain that keeps the pipeline full (not reported).
        self.num_iterations = cfg.iterations + self.drain
        # Warm-up the mode needs before its loop is periodic, within the configured iterations.
        self.warmup = max(cfg.warmup, min(self.warmup_needed, cfg.iterations - 1))

    @property
    def may_settle_later(self) -> bool:
        """Whether the warm-up needed depends on the run (:meth:`settle_iterations`): requests
        carried across calls without a lag bound. Otherwise it is ``warmup_needed``."""
        return self.mode.staleness_bound(self.cap) is None and self.mode.carries_unfinished

    @property
    def carry(self) -> RolloutBatch | None:
        """Unfinished responses carried to the next rollout call (partial rollout)."""
        return self.engine.carry

    # ------------------------------------------------------------------ helpers
    def _need(self, key: str | None, elastic: bool = False) -> dict[str, tuple[int, int]]:
        if key is None:
            return {}
        pool = self.assign[key]
        n = self.pool_gpus[pool]
        if not elastic:
            return {pool: (n, n)}
        # A fusion wave starts once half the pool is free (rounded up to whole model replicas):
        # starting on the first freed GPUs would run a quarter of the batch on a handful of
        # devices and hold them long after the rollout has drained.
        unit = self.costs.min_gpus(key)
        lo = min(n, max(unit, -(-(n // 2) // unit) * unit))
        return {pool: (lo, n)}

    def _add(self, name: str, stage: str, prio: tuple[int, ...], deps: tuple[str, ...],
             key: str | None, run: TaskFn, it: int, elastic: bool = False) -> None:
        needs = self._need(key, elastic)
        self.kernel.add(Task(name, prio, deps, needs, run, it))
        self.task_pool[name] = next(iter(needs)) if needs else None
        self.task_stage[name] = stage
        self.task_iteration[name] = it

    def _record(self, it: int, stage: str, cost: StageCost) -> None:
        self.iters[it].stage_costs.setdefault(stage, []).append(cost)

    def _simple_run(self, it: int, stage: str, fn: Callable[[int], StageCost]) -> TaskFn:
        def run(now: float, grant: dict[str, int]) -> TaskRun:
            gpus = sum(grant.values())
            cost: StageCost = fn(gpus)
            self._record(it, stage, cost)
            pool = next(iter(grant), "cpu")
            seg = Segment(pool, stage, now, now + cost.time_s, gpus, it, self._staleness_args(it, stage))
            return TaskRun(duration_s=cost.time_s, segments=(seg,))

        return run

    def _staleness_args(self, it: int, stage: str) -> tuple[tuple[str, float], ...]:
        """Trace arguments of the update that trains iteration ``it``'s responses: the policy
        lag of those responses (mean, max), so a trace shows what each update trained on."""
        if stage != "actor_update":
            return ()
        lags = _joined(self.iters[it].staleness)
        if not len(lags):
            return ()
        return (("staleness_mean", float(np.mean(lags))), ("staleness_max", float(lags.max())))

    # ------------------------------------------------------------------ rollout
    def _new_requests(self, it: int, rnd: int) -> tuple[np.ndarray, np.ndarray]:
        cfg = self.cfg
        prompts = self.gen_rounds.prompts_per_round(cfg.prompts_per_step)
        if it == 0 and rnd == 0:
            prompts += self.mode.prompts_ahead(cfg.prompts_per_step)
        p, r = cfg.sample(it * 1000 + rnd, prompts)
        return np.asarray(p, dtype=np.int64), np.asarray(r, dtype=np.int64)

    def _fresh_batch(self, it: int, rnd: int, greedy: bool) -> RolloutBatch:
        p, r = self._new_requests(it, rnd)
        g = r.shape[1]
        if greedy:  # ReMax: one greedy response per prompt; its length follows the first sample
            return RolloutBatch(p, r[:, 0].copy(), np.zeros(len(p), np.int64), np.arange(len(p), dtype=np.int64))
        return RolloutBatch(
            np.repeat(p, g), r.reshape(-1), np.zeros(r.size, np.int64), np.repeat(np.arange(len(p), dtype=np.int64), g)
        )

    def _stop_after(self, it: int, phase: str) -> int | None:
        """Finished responses after which a streaming call stops: the ahead share, or what the
        batch still lacks (the main call); other modes ask the mode."""
        want = self.cfg.prompts_per_step * self.cfg.group_size
        if phase == "ahead":
            return max(1, math.ceil(self.ahead * want))
        if phase == "main":
            return want - self.iters[it].finished
        return self.mode.stop_after_finished(want)

    def _rollout_run(self, it: int, rnd: int, greedy: bool, phase: str = "whole") -> TaskFn:
        """One rollout call. ``phase``: ``whole`` (the iteration's only call), ``ahead``
        (streaming: admits the fresh requests, stops after the ahead share) or ``main``
        (streaming: resumes the requests in flight with the new weights)."""
        budget = self.budget
        engine = self.engine

        def run(now: float, grant: dict[str, int]) -> TaskRun:
            gpus = sum(grant.values())
            pool = next(iter(grant))
            state = self.iters[it]
            fresh = self._fresh_batch(it, rnd, greedy if phase != "main" else False)
            if phase == "main":  # nothing new: the batch's requests were admitted by the ahead call
                fresh = fresh.take(slice(0, 0))
            carry_over = self.mode.carries_unfinished and not greedy
            # An engine that sleeps while training (colocated) drops its KV between calls.
            admitted = engine.admit(fresh, carry_over, self.mode.keeps_kv_between_syncs and not self.colocated_switch)
            batch, versions = admitted.batch, admitted.versions
            stop = self._stop_after(it, phase) if carry_over else None
            if batch.num_requests == 0 or (stop is not None and stop <= 0):
                # The ahead call already finished the batch (or nothing is in flight).
                return TaskRun(0.0, milestones=self._part_milestones(it, np.zeros(0), 0.0, final=True))
            before = int(batch.generated_tokens.sum())
            # ReMax's greedy baseline is needed whole in the same step: never budgeted.
            if carry_over and self.groups is not None:
                # The stop in whole groups: the responses still wanted, ⌈k / G⌉ groups.
                groups = replace(self.groups, stop_after_groups=None if stop is None else -(-stop // self.cfg.group_size))
                out: RolloutOutcome = self.costs.rollout(batch, gpus, budget, None, groups, admitted.kv_cached)
            elif carry_over:
                out = self.costs.rollout(batch, gpus, budget, stop, kv_cached=admitted.kv_cached)
            else:
                out = self.costs.rollout(batch, gpus, None)
            assert out.generated_tokens.shape == batch.target_tokens.shape
            assert np.all(out.generated_tokens <= batch.target_tokens)
            state.generated_tokens += float(out.generated_tokens.sum() - before)
            self._record(it, "generate_greedy" if greedy else "generate", out.cost)
            state.tail_s += out.tail_s
            delivered = engine.settle(batch, out, versions, carry_over, whole_groups=self.groups is not None and carry_over)
            prior = state.finished
            if not greedy:
                self._collect(it, delivered, now, accumulate=phase == "main")
            duration = out.cost.time_s
            releases = tuple(
                (float(t), pool, out.gpus_per_replica) for t in np.sort(out.replica_finish_s) if t < duration - 1e-12
            )
            milestones = self._milestones(it, rnd, out)
            if not greedy and self.parts > 1:
                fin = np.sort(delivered.finish_s)
                milestones += self._part_milestones(it, np.minimum(fin, duration), duration,
                                                    final=phase != "ahead", prior=prior)
            track = f"{pool}"
            stage = "generate_greedy" if greedy else "generate"
            # Engine segments are named "<stage>/<prefill|decode>", one track per replica.
            segs = tuple(
                Segment(f"{track}/{s.track}", f"{stage}/{s.name}", now + s.start_s, now + s.end_s, s.gpus, it, s.args)
                for s in out.segments
            ) or (Segment(track, stage, now, now + duration, gpus, it),)
            return TaskRun(duration_s=duration, releases=releases, milestones=milestones, segments=segs)

        return run

    def _part_milestones(self, it: int, fin: np.ndarray, end_s: float, final: bool,
                         prior: int = 0) -> tuple[tuple[float, str], ...]:
        """Events ``gen#<it>:part<c>`` for the local updates of a streamed batch: part ``c``
        fires when the batch's ``⌈(c+1)·B·G/k⌉``-th response finishes (``fin``: this call's
        finish offsets, sorted; ``prior``: responses finished by earlier calls). The call that
        completes the batch (``final``) fires the parts not reached yet at its end."""
        if self.parts <= 1:
            return ()
        want = self.cfg.prompts_per_step * self.cfg.group_size
        out: list[tuple[float, str]] = []
        for c in range(self.parts):
            need = math.ceil((c + 1) * want / self.parts)
            if need <= prior:
                continue  # fired by an earlier call
            if need - prior <= len(fin) and c < self.parts - 1:
                out.append((float(fin[need - prior - 1]), f"gen#{it}:part{c}"))
            elif final:
                out.append((float(end_s), f"gen#{it}:part{c}"))
        return tuple(out)

    def _collect(self, it: int, delivered: Delivered, start_s: float = 0.0, accumulate: bool = False) -> None:
        """Decide which delivered responses training sees in iteration ``it`` (``accumulate``:
        a streaming main call adds to what its ahead call delivered)."""
        state = self.iters[it]
        seq = delivered.seq_tokens
        fin_t = delivered.finish_s
        ver = delivered.versions
        cfg = self.cfg
        want = cfg.prompts_per_step * cfg.group_size
        state.finished += delivered.count
        fin_abs = start_s + fin_t
        resp = delivered.response_tokens
        if accumulate and state.kept_seq_tokens is not None and state.kept_finish_s is not None:
            seq = np.concatenate([state.kept_seq_tokens, seq])
            fin_abs = np.concatenate([state.kept_finish_s, fin_abs])
            fin_t = fin_abs
        if self.gen_rounds.filters:
            # Kept groups: the first ones generated (filtering keeps whole groups; which ones is
            # decided by rewards, which the performance model does not know, so take them in order).
            prev = state.kept_seq_tokens
            prev_n = 0 if prev is None else len(prev)
            take = max(0, min(want - prev_n, len(seq)))
            seq, fin_t, ver, resp, fin_abs = seq[:take], fin_t[:take], ver[:take], resp[:take], fin_abs[:take]
            if prev is not None:
                seq = np.concatenate([prev, seq])
                if state.kept_finish_s is not None:
                    fin_abs = np.concatenate([state.kept_finish_s, fin_abs])
        round_seq = delivered.seq_tokens
        if accumulate and state.round_seq_tokens is not None:
            round_seq = np.concatenate([state.round_seq_tokens, round_seq])
        state.round_seq_tokens = round_seq
        state.kept_seq_tokens = seq
        state.kept_finish_s = fin_abs if len(fin_abs) == len(seq) else None
        state.kept_finish_order = None
        # Completion order of the kept responses: fusion waves take them in this order (sorted
        # when a wave reads it: only fused modes do, and a streamed batch is collected twice).
        state.kept_order = None
        state.kept_order_by = fin_t if len(fin_t) == len(seq) else None
        state.staleness.append(it - np.asarray(ver, np.int64))
        state.lagged_tokens.append(np.array(resp, np.int64))

    def _milestones(self, it: int, rnd: int, out: RolloutOutcome) -> tuple[tuple[float, str], ...]:
        if self.fusion is None or rnd != self.rounds - 1:
            return ()
        waves = self.fusion.waves
        fin = np.sort(out.finish_s[np.isfinite(out.finish_s)])
        if len(fin) == 0:
            return tuple((out.cost.time_s, f"gen#{it}:chunk{c}") for c in range(waves))
        ms = []
        for c in range(waves):
            k = math.ceil((c + 1) * len(fin) / waves) - 1
            ms.append((float(min(fin[k], out.cost.time_s)), f"gen#{it}:chunk{c}"))
        return tuple(ms)

    # ------------------------------------------------------------------ graph
    def build(self) -> None:
        gen_pool = self.assign["generate"]
        actor_pool = self.assign["actor"]
        self.iters = [_Iter() for _ in range(self.built)]
        for it in range(self.built):
            # Weights of version ``it`` reach the rollout engine after update ``it - 1``.
            if it >= 1:
                self._add_sync(it, gen_pool, actor_pool)
            gen_deps: tuple[str, ...] = ()
            v_needed = self.mode.weights_for_rollout(it, self.colocated_switch)
            if v_needed >= 1:
                gen_deps = (f"sync#{v_needed}",)
            for order, st in enumerate(self.stages):
                self._add_stage(it, order, st, gen_deps)

    def _add_sync(self, v: int, gen_pool: str, actor_pool: str) -> None:
        it = v
        deps = (f"actor_update#{v - 1}",)
        same = gen_pool == actor_pool

        def run(now: float, grant: dict[str, int]) -> TaskRun:
            if same and self.colocated_switch:
                cost = self.costs.phase_switch(self.pool_gpus[gen_pool], "rollout")
                sync = self.costs.weight_sync(self.pool_gpus[gen_pool], self.pool_gpus[actor_pool], True)
                cost = StageCost("weight_sync", cost.time_s + sync.time_s, cost.num_gpus, cost.work_s + sync.work_s,
                                 cost.depth_s + sync.depth_s, comm_bytes=sync.comm_bytes,
                                 breakdown=(("offload", cost.time_s), ("reshard", sync.time_s)))
            else:
                cost = self.costs.weight_sync(self.pool_gpus[gen_pool], self.pool_gpus[actor_pool], same)
            self._record(it, "weight_sync", cost)
            self.engine.synced(v)
            segs = tuple(Segment(p, "weight_sync", now, now + cost.time_s, g, it) for p, g in grant.items())
            return TaskRun(duration_s=cost.time_s, segments=segs)

        needs = {gen_pool: (self.pool_gpus[gen_pool],) * 2}
        if not same:
            needs[actor_pool] = (self.pool_gpus[actor_pool],) * 2
            if not self.mode.sync_pauses_engine:  # pushed while the engine keeps decoding
                del needs[gen_pool]
        self.kernel.add(Task(f"sync#{v}", (v, 0, 0), deps, needs, run, it))
        self.task_pool[f"sync#{v}"] = next(iter(needs))
        self.task_stage[f"sync#{v}"] = "weight_sync"
        self.task_iteration[f"sync#{v}"] = it

    def _add_stage(self, it: int, order: int, st: StageDef, gen_deps: tuple[str, ...]) -> None:
        prio = (it, 1 + order)
        name = f"{st.name}#{it}"
        deps = tuple(f"{d}#{it}" for d in st.deps)
        if st.kind == "generate":
            greedy = st.tokens == "greedy"
            rounds = 1 if greedy else self.rounds
            for rnd in range(rounds):
                rdeps = deps + gen_deps
                if rnd > 0:  # another round only after the previous one was scored
                    rdeps = rdeps + (f"reward#{it}.r{rnd - 1}",)
                tname = name if rnd == rounds - 1 else f"{name}.r{rnd}"
                if self.ahead > 0 and not greedy:
                    # Streaming: the ahead call follows the previous batch's last call, with
                    # the weights synced so far; the main call waits for this batch's weights.
                    adeps = deps + ((f"{st.name}#{it - 1}",) if it else ())
                    v_ahead = self.mode.weights_for_rollout(it, self.colocated_switch) - 1
                    adeps += (f"sync#{v_ahead}",) if v_ahead >= 1 else ()
                    self._add(f"{name}.ahead", st.name, prio + (rnd, -1), adeps, "generate",
                              self._rollout_run(it, rnd, greedy, "ahead"), it)
                    rdeps = rdeps + (f"{name}.ahead",)
                    self._add(tname, st.name, prio + (rnd,), rdeps, "generate", self._rollout_run(it, rnd, greedy, "main"), it)
                    continue
                self._add(tname, st.name, prio + (rnd,), rdeps, "generate", self._rollout_run(it, rnd, greedy), it)
                if rnd < rounds - 1:
                    self._add(f"reward#{it}.r{rnd}", "reward", (it, 1 + order, rnd, 1), (tname,),
                              self._reward_key(), self._simple_run(it, "reward", partial(self._reward_cost, it)), it)
            if self.colocated_switch and not greedy:
                # Colocated: after the rollout, free the engine and onload training states.
                self._add(f"to_train#{it}", "phase_switch", prio + (99,), (name,), "actor",
                          self._simple_run(it, "phase_switch", lambda g: self.costs.phase_switch(g, "train")), it)
            return
        extra: tuple[str, ...] = ()
        if self.colocated_switch and self.assign[_pool_key(st)] == self.assign["generate"]:
            extra = (f"to_train#{it}",)
        if self.parts > 1:
            self._add_parts(it, name, st, prio, extra)
            return
        if st.kind == "driver":
            self._add(name, st.name, prio, deps, None, _instant, it)
            return
        key: str | None = st.role
        fn: Callable[[int], StageCost]
        if st.kind == "reward":
            key = self._reward_key()
            fn = partial(self._reward_cost, it)
        elif st.kind == "forward":
            fn = partial(self._pass_cost, self.costs.forward, it, st)
        else:
            fn = partial(self._pass_cost, self.costs.train, it, st)
        fused = self.fusion is not None and st.kind in ("forward", "reward") and set(st.deps) <= {"generate"}
        if self.fusion is None or not fused:
            self._add(name, st.name, prio, deps + extra, key, self._simple_run(it, st.name, fn), it)
            return
        self.fused_stages.add(st.name)
        chunks = self.fusion.waves
        for c in range(chunks):
            cfn: Callable[[int], StageCost] = (
                partial(self._reward_cost, it, chunk=c) if st.kind == "reward" else partial(self._pass_cost, self.costs.forward, it, st, chunk=c)
            )
            self._add(f"{name}.c{c}", st.name, prio + (c,), (f"gen#{it}:chunk{c}",), key,
                      self._simple_run(it, st.name, cfn), it, elastic=True)
        self._add(name, st.name, prio + (chunks,), tuple(f"{name}.c{c}" for c in range(chunks)), None,
                  _instant, it)

    def _add_parts(self, it: int, name: str, st: StageDef, prio: tuple[int, ...], extra: tuple[str, ...]) -> None:
        """A stage after a streamed rollout as ``train_parts`` local updates: part ``c`` waits
        for the batch's part-``c`` responses (or part ``c`` of the stages it reads) and for its
        own part ``c - 1``; a join named like the stage closes them."""
        names = [f"{name}.p{c}" for c in range(self.parts)]
        for c, pname in enumerate(names):
            deps = tuple(
                f"gen#{it}:part{c}" if d == "generate"
                else f"{d}#{it}" if self.cfg.algorithm.stage(d).kind == "generate"
                else f"{d}#{it}.p{c}"
                for d in st.deps
            ) + ((names[c - 1],) if c else ()) + extra
            if st.kind == "driver":
                self._add(pname, st.name, prio + (c,), deps, None, _instant, it)
                continue
            key = self._reward_key() if st.kind == "reward" else st.role
            pfn: Callable[[int], StageCost]
            if st.kind == "reward":
                pfn = partial(self._reward_cost, it, part=c)
            elif st.kind == "forward":
                pfn = partial(self._pass_cost, self.costs.forward, it, st, part=c)
            else:
                # A local update makes its share of the step's optimizer updates (verl:
                # require_batches mini-batches), not all of them on a fraction of the data.
                mb = self.cfg.minibatches
                share = mb // self.parts + (1 if c < mb % self.parts else 0)
                pfn = partial(self._pass_cost, partial(self.costs.train, num_minibatches=max(1, share)), it, st, part=c)
            self._add(pname, st.name, prio + (c,), deps, key, self._simple_run(it, st.name, pfn), it)
        self._add(name, st.name, prio + (self.parts,), tuple(names), None, _instant, it)

    def _pass_cost(self, cost: Callable[[str, np.ndarray, int, str], StageCost], it: int, st: StageDef, gpus: int,
                   chunk: int | None = None, part: int | None = None) -> StageCost:
        seq = self._kept(it, chunk, part)
        if len(seq) == 0:
            return _no_work(st.name, gpus)
        return cost(st.role, seq, gpus, st.name)

    def _reward_key(self) -> str | None:
        return "reward_model" if self.cfg.reward_on_gpu else None

    def _reward_cost(self, it: int, gpus: int, chunk: int | None = None, part: int | None = None) -> StageCost:
        # The reward scores everything generated (incl. responses later filtered out).
        st = self.iters[it]
        whole = chunk is None and part is None
        seq = st.round_seq_tokens if whole and st.round_seq_tokens is not None else self._kept(it, chunk, part)
        if len(seq) == 0:
            return _no_work("reward", gpus)
        return self.costs.reward(seq, gpus)

    def _kept(self, it: int, chunk: int | None = None, part: int | None = None) -> np.ndarray:
        st = self.iters[it]
        assert st.kept_seq_tokens is not None, f"iteration {it}: no rollout data yet"
        if part is not None:
            # Local update ``part``: the responses ranked ``[⌈c·n/k⌉, ⌈(c+1)·n/k⌉)`` in finishing
            # order (n = B·G); the last part takes every response left.
            assert st.kept_finish_s is not None
            if st.kept_finish_order is None:  # every part of every stage after the stream reads it
                st.kept_finish_order = np.argsort(st.kept_finish_s, kind="stable")
            order = st.kept_finish_order
            want = self.cfg.prompts_per_step * self.cfg.group_size
            lo = math.ceil(part * want / self.parts)
            hi = len(order) if part == self.parts - 1 else math.ceil((part + 1) * want / self.parts)
            part_tokens: np.ndarray = st.kept_seq_tokens[order[lo:hi]]
            return part_tokens
        if chunk is None:
            return st.kept_seq_tokens
        assert self.fusion is not None
        if st.kept_order is None:
            by = st.kept_order_by
            st.kept_order = np.argsort(by, kind="stable") if by is not None else np.arange(len(st.kept_seq_tokens))
        parts = np.array_split(st.kept_order, self.fusion.waves)
        chunk_tokens: np.ndarray = st.kept_seq_tokens[parts[chunk]]
        return chunk_tokens

    # ------------------------------------------------------------------ results
    def run(self, longest: int | None = None) -> SimResult:
        """Simulate and summarize. ``longest``: the most measured iterations :meth:`extend` may
        ask for later; the iterations past this run's are built too but held (not started,
        rlperf.sim.kernel.Kernel.hold), so that the run can be continued instead of repeated."""
        self.start(longest)
        return self._result()

    def start(self, longest: int | None = None) -> None:
        """:meth:`run` without its summary (a run that may be continued summarizes once, at
        its end)."""
        if longest is not None:
            self.built = max(self.built, longest + self.drain)
        self.build()
        self._hold()
        self.kernel.run()

    def _hold(self) -> None:
        more = self.built > self.num_iterations
        self.kernel.hold(self.num_iterations if more else None, self._save if more else None)

    def can_extend(self, cfg: SimConfig) -> bool:
        """Whether :meth:`extend` can run ``cfg`` (this run with more iterations)."""
        return self.kernel.checkpoint is not None and cfg.iterations + self.drain <= self.built

    def extend(self, cfg: SimConfig) -> SimResult:
        """The result of ``Simulator(cfg, costs).run()``, where ``cfg`` is this run's
        configuration with more iterations (a longer warm-up), without simulating again what
        the two runs share. The longer run schedules the same tasks, plus those of the
        iterations it adds; up to the first pass in which one of those would start, the two
        runs are the same (rlperf.sim.kernel.Kernel.hold). This run kept its state (the
        kernel's, every iteration's data and the rollout engine's) at the beginning of that
        pass; it goes back there and goes on with the added iterations released."""
        self.go_on(cfg)
        return self._result()

    def go_on(self, cfg: SimConfig) -> None:
        """:meth:`extend` without its summary."""
        assert self.can_extend(cfg)
        cp = self.kernel.checkpoint
        assert cp is not None and isinstance(cp.saved, _Saved)
        self._set_length(cfg)
        self.iters[:] = cp.saved.iters
        vars(self.engine).update(vars(cp.saved.engine))
        self.kernel.restore(cp)
        self._hold()
        self.kernel.run()

    def summary(self) -> SimResult:
        """The result of the iterations run so far (:meth:`start`, :meth:`go_on`)."""
        return self._result()

    def _save(self) -> _Saved:
        """What tasks change as they run, copied (the kernel keeps its own state)."""
        return _Saved([it.copy() for it in self.iters], copy.copy(self.engine))

    def _result(self) -> SimResult:
        cfg = self.cfg
        k = self.kernel
        ends = [k.task(f"actor_update#{i}").end_s for i in range(cfg.iterations)]
        step_times = tuple(float(e - (ends[i - 1] if i else 0.0)) for i, e in enumerate(ends))
        w0 = ends[self.warmup - 1] if self.warmup else 0.0
        w1 = ends[-1]
        steps = cfg.iterations - self.warmup
        step_time = (w1 - w0) / steps

        steady = range(self.warmup, cfg.iterations)
        stage_rows: list[StageTime] = []
        names: list[str] = []
        for it in steady:
            for n in self.iters[it].stage_costs:
                if n not in names:
                    names.append(n)
        stage_pool: dict[str, str] = {}
        for n, p in self._active_pools():
            if p is not None:
                stage_pool.setdefault(n, p)
        for n in names:
            durs: list[float] = []
            costs: list[StageCost] = []
            for it in steady:
                # Wall time of the stage: the union of its tasks' spans (fusion waves overlap).
                durs.append(_union_length([(t.start_s, t.end_s) for t in k.done
                                           if t.iteration == it and self.task_stage.get(t.name) == n]))
                costs.extend(self.iters[it].stage_costs.get(n, []))
            stage_rows.append(StageTime(
                name=n,
                pool=stage_pool.get(n) or "cpu",
                time_s=float(np.mean(durs)),
                gpus=max((c.num_gpus for c in costs), default=0),
                work_s=sum(c.work_s for c in costs) / steps,
                depth_s=sum(c.depth_s for c in costs) / steps,
                flops=sum(c.flops for c in costs) / steps,
                peak_memory_bytes=max((c.peak_memory_bytes for c in costs), default=0.0),
            ))

        pools = tuple(self._pool_stats(p.name, p.num_gpus, w0, w1, steps) for p in self.pools)
        kept = [self.iters[it].kept_seq_tokens for it in steady]
        kept_tokens = [float(k.sum()) for k in kept if k is not None]
        tokens_per_step = float(np.mean(kept_tokens)) if kept_tokens else 0.0
        gen_tokens = float(np.mean([self.iters[it].generated_tokens for it in steady]))
        staleness = tuple(_joined([a for it in steady for a in self.iters[it].staleness]).tolist())
        price = cfg.price_usd_per_gpu_hour
        cost = None if price is None else step_time * cfg.num_gpus * price / 3600.0
        bounds = self._bounds(step_time, steady, stage_pool)
        segments = tuple(seg for t in sorted(k.done, key=lambda t: (t.start_s, t.name)) if t.result for seg in t.result.segments)
        notes: list[str] = []
        if self.rounds > 1:
            notes.append(f"dynamic sampling: {self.rounds} generation rounds per step (keep rate {cfg.keep_rate})")
        settle = self.settle_iterations()
        if settle > self.warmup:
            notes.append(f"{self.mode.label}: requests carried across syncs settle after about {settle} warm-up "
                         f"iterations; {self.warmup} simulated (trained batches may be short-biased)")
        if not self.mode.carries_unfinished and self.staleness_bound < self.mode.effective_staleness(False):
            # The label is the mode asked for; what ran is synchronous (scenario._warn_shared_engine).
            notes.append(f"{self.mode.label} runs synchronously here (staleness {self.staleness_bound}): its engine "
                         "sleeps on the actor's GPUs during training and wakes with the newest weights")
        if self.warmup_needed > self.warmup:
            notes.append(f"{self.mode.label} settles after {self.warmup_needed} warm-up iterations; "
                         f"{cfg.iterations} simulated are too few for a steady state")
        return SimResult(
            scenario=cfg.name,
            algorithm=cfg.algorithm.name,
            placement=cfg.plan.placement.kind,
            mode=self.mode.label_for(self.fusion is not None),
            num_gpus=cfg.num_gpus,
            iterations=cfg.iterations,
            warmup=self.warmup,
            step_time_s=step_time,
            step_times_s=step_times,
            stages=tuple(stage_rows),
            pools=pools,
            tokens_per_step=tokens_per_step,
            generated_tokens_per_step=gen_tokens,
            tokens_per_s=tokens_per_step / step_time if step_time > 0 else 0.0,
            tokens_per_s_per_gpu=tokens_per_step / step_time / cfg.num_gpus if step_time > 0 else 0.0,
            staleness=staleness,
            staleness_distribution=StalenessDistribution.of(staleness, self.mode.staleness_bound(self.cap)),
            cost_usd_per_step=cost,
            bounds=bounds,
            rollout_tail_s=float(np.mean([self.iters[it].tail_s for it in steady])),
            trained_responses_per_step=float(np.mean([0 if k is None else len(k) for k in kept])),
            nominal_responses_per_step=cfg.prompts_per_step * cfg.group_size,
            segments=segments,
            notes=tuple(notes),
        )

    def _intervals(self, pool: str) -> list[tuple[float, float, int]]:
        out: list[tuple[float, float, int]] = []
        for t in self.kernel.done:
            g = t.granted.get(pool, 0)
            if not g:
                continue
            assert t.result is not None
            rest = g
            for off, p, rg in t.result.releases:
                if p == pool:
                    out.append((t.start_s, t.start_s + off, rg))
                    rest -= rg
            out.append((t.start_s, t.end_s, rest))
        return out

    def _pool_stats(self, pool: str, gpus: int, w0: float, w1: float, steps: int) -> PoolStats:
        iv = self._intervals(pool)
        busy = sum(max(0.0, min(b, w1) - max(a, w0)) * g for a, b, g in iv)
        util = busy / (gpus * max(w1 - w0, 1e-12))
        assert util <= 1.0 + 1e-6, (pool, util)
        # Idle wall time: no GPU of the pool allocated.
        spans = sorted((max(a, w0), min(b, w1)) for a, b, g in iv if g > 0 and min(b, w1) > max(a, w0))
        covered, cur_a, cur_b = 0.0, None, None
        for a, b in spans:
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    covered += cur_b - cur_a  # type: ignore[operator]
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        if cur_b is not None:
            covered += cur_b - cur_a  # type: ignore[operator]
        idle = max(0.0, (w1 - w0) - covered) / steps
        on_pool = {n for n, p in self._active_pools() if p == pool}
        peak = max(
            (c.peak_memory_bytes for it in self.iters for n, cs in it.stage_costs.items() if n in on_pool for c in cs),
            default=0.0,
        )
        if pool == self.assign["generate"]:
            peak = max(peak, self.costs.engine_memory_bytes(self.pool_gpus[pool]))
        return PoolStats(pool, gpus, float(min(util, 1.0)), idle, peak, self.costs.device_memory_bytes())

    def _bounds(self, step_time: float, steady: range, stage_pool: dict[str, str]) -> Bounds:
        """Work-depth lower bound of a steady-state step; see :class:`rlperf.sim.result.Bounds`
        for the argument. Per iteration ``i`` of the window (means over the window):

        - ``W_p / P_p`` for every pool ``p``: the pool does one iteration's work per step;
        - ``Σ D_stage`` over the stages holding all of pool ``p``: they serialize on it;
        - ``D_iter / (s + 1)``: update ``i`` ends at least ``D_iter`` after update ``i-1-s``
          (the sync of version ``i - s`` waits for it, rollout ``i`` for the sync, update ``i``
          for the rollout), ``s`` the mode's effective staleness.
        """
        steps = len(steady)

        def chain_depth(it: int, n: str) -> float:
            # A fused stage runs in waves on GPUs the rollout frees; only its last wave is
            # certain to start after the rollout's last response: count the shortest wave.
            pick = min if n in self.fused_stages else sum
            return pick([c.depth_s for c in self.iters[it].stage_costs.get(n, [])] or [0.0])

        paths: list[float] = []
        work_by_pool: dict[str, list[float]] = {}
        serial_by_pool: dict[str, list[float]] = {}
        for it in steady:
            longest: dict[str, float] = {}
            for st in self.stages:
                base = max((longest.get(d, 0.0) for d in st.deps), default=chain_depth(it, "weight_sync"))
                longest[st.name] = base + chain_depth(it, st.name)
            paths.append(max(longest.values(), default=0.0))
            work: dict[str, float] = {}
            serial: dict[str, float] = {}
            for n, cs in self.iters[it].stage_costs.items():
                pool = stage_pool.get(n)  # the pool of the stage's first task on one
                if pool is None:  # CPU stages: not GPU work
                    continue
                work[pool] = work.get(pool, 0.0) + sum(c.work_s for c in cs)
                if n not in self.fused_stages:  # whole-pool tasks serialize on their pool
                    serial[pool] = serial.get(pool, 0.0) + sum(c.depth_s for c in cs)
            for p in self.pool_gpus:
                work_by_pool.setdefault(p, []).append(work.get(p, 0.0))
                serial_by_pool.setdefault(p, []).append(serial.get(p, 0.0))
        s = self.mode.bound_staleness(self.colocated_switch)
        # Iterations differ (each draws its own lengths): the least of them bounds every step
        # of the window, whose mean the simulator reports.
        lb = max(
            max((min(w) / self.pool_gpus[p] for p, w in work_by_pool.items()), default=0.0),
            max((min(d) for d in serial_by_pool.values()), default=0.0),
            min(paths) / (s + 1),
        )
        work_mean = sum(sum(w) for w in work_by_pool.values()) / steps
        path = sum(paths) / steps
        return Bounds(work_mean, path, self.cfg.num_gpus, s, lb, step_time / lb if lb > 0 else math.inf)

    def settle_iterations(self) -> int:
        """Warm-up after which the requests carried across calls have their steady mix: in the
        first calls only short responses finish while long ones accumulate in flight, so the
        trained batches are short-biased until a request of the longest observed lag (trained,
        or still in flight at the end) has passed through. 0 for modes with a lag bound (their
        warm-up is exact)."""
        if self.mode.staleness_bound(self.cap) is not None or not self.mode.carries_unfinished:
            return 0
        lags = _joined([a for it in self.iters for a in it.staleness])
        tokens = _joined([a for it in self.iters for a in it.lagged_tokens])
        last = self.num_iterations - 1
        longest = int(max(lags.max(initial=0), (last - self.engine.carry_version).max(initial=0)))
        # A response of the cap may not have finished in a short run: extrapolate its lag from
        # the tokens per version of the responses that spanned two versions or more.
        spanned = lags >= 2
        if spanned.any():
            rates = tokens[spanned] / lags[spanned]  # float64 division of exact integers, as t / s
            longest = max(longest, math.ceil(self.cap / float(np.median(rates))))
        return longest + self.mode.bound_staleness(self.colocated_switch) + 1

    def _active_pools(self) -> list[tuple[str, str | None]]:
        """(stage, pool) of every task of this run's iterations (not the held ones), in the
        order they were built."""
        n = self.num_iterations
        return [(self.task_stage[t], p) for t, p in self.task_pool.items() if self.task_iteration[t] < n]


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    """The int64 arrays ``parts`` end to end (empty for none)."""
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _union_length(spans: list[tuple[float, float]]) -> float:
    """Total length covered by a set of intervals."""
    total, end = 0.0, -math.inf
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


# At most this many warm-up iterations are simulated to let the carried requests settle or a
# partial rollout fill its pipeline (a longer need runs this many, and the notes say how many
# it needed).
MAX_SETTLE_ITERATIONS = 24


def simulate(cfg: SimConfig, costs: StageCosts) -> SimResult:
    """Run the simulation; when the mode needs more warm-up than the configured iterations
    leave (a partial rollout's ``⌈cap/β⌉ - 1 + s`` calls, or, for streaming, the longest lag the
    carried requests turned out to have), run it again with that warm-up (at most twice), so
    the result does not depend on the configured length once past warm-up.

    Running again is continuing: the longer run is the same as this one up to the first moment
    it starts a task of an added iteration (:meth:`Simulator.extend`), so the simulation goes
    on from there instead of from the start, with the same result. A mode whose need does not
    depend on the run (no carried requests without a lag bound) runs once, with it."""
    sim = Simulator(cfg, costs)
    if not sim.may_settle_later:
        # The need is known before the run: simulate the run the loop below would end with.
        need = min(sim.warmup_needed, MAX_SETTLE_ITERATIONS)
        if need > sim.warmup:
            sim = Simulator(replace(cfg, iterations=need + cfg.iterations - sim.warmup, warmup=need), costs)
        return sim.run()
    # A re-run measures as many iterations as this one (or fewer), after a warm-up <= the cap.
    longest = MAX_SETTLE_ITERATIONS + cfg.iterations - sim.warmup
    sim.start(longest)
    for _ in range(2):
        # A longer need is simulated up to the cap (not skipped: skipping made a need of 25
        # get no warm-up at all while a need of 24 got 24), and the result's notes say so.
        need = min(max(sim.settle_iterations(), sim.warmup_needed), MAX_SETTLE_ITERATIONS)
        if need <= sim.warmup:
            break
        measured = cfg.iterations - sim.warmup
        cfg = replace(cfg, iterations=need + measured, warmup=need)
        if sim.can_extend(cfg):
            sim.go_on(cfg)
        else:  # nothing held ever became ready (not seen): simulate it from the start
            sim = Simulator(cfg, costs)
            sim.start(longest)
    return sim.summary()

"""A lower bound on a plan's simulated step time, in closed form, for branch and bound.

Work-depth (Brent 1974; Blelloch 1996): no schedule on ``P`` devices beats ``max(W/P, D)``. The
planner needs the bound *before* it simulates anything, so every term here is a closed form
from the model, the hardware peaks and the sampled lengths, never from a simulation:

- rollout on ``g`` GPUs (``r = g / tp`` tensor-parallel groups): ``max(F_gen / (r · R_mm),
  Σ ctx · kv / (g · B_hbm), Σ (L - 1) / M · t_1 / (g / (tp·pp)), D_gen)`` with ``F_gen =
  linear FLOPs per token · tokens`` (prefill and decode), ``R_mm`` the engine's matmul rate per
  replica, ``Σ ctx`` the KV read by every decode step of every request (``p·L + L²/2``),
  ``B_hbm`` the decode bandwidth per GPU, and ``D_gen`` the time of the longest request alone on
  a replica (capped at the token budget for partial rollouts). The third term counts engine
  steps: a request's tokens after its first (which the prefill samples) take one step each, a
  step decodes at most ``M = max_num_seqs`` sequences, and a step that decodes costs at least
  ``t_1``, the step of one sequence at no context (its weights streamed, its host and sampler
  time: every term of :mod:`rlperf.stages.rollout_step` grows with the batch and the context),
  so the replicas together run at least ``Σ (L - 1) / M`` steps of ``t_1`` (``L`` capped at the
  token budget of a partial rollout's call). Decode is memory bound and runs far from the FLOP
  term; this one sees a pool too small for the batch. Dynamic sampling multiplies the work by
  its rounds;
- a forward pass or a training update of a role on ``g`` GPUs: ``2·N·T`` (forward) or
  ``6·N·T·e`` (update; ``4·N·T·e`` with LoRA, whose frozen weights get no weight gradient)
  FLOPs at the large-GEMM rate (the dense peak times the profile's ``matmul_efficiency``, which
  no GEMM of :mod:`rlperf.stages.pass_cost` exceeds: its size factor is at most 1), ``N`` the
  weights that multiply a token (the LM head only for the actor and the reference: a value or
  reward head is one column), ``T`` trained tokens, ``e`` epochs; attention, elementwise
  kernels, communication and host time only add to it;
- a mode whose rollout call stops at the first ``B·G`` finished responses (streaming) keeps
  the work terms and drops the depth: a long response is decoded over as many calls as it lags,
  but every admitted request finishes once and a step admits ``B·G``, so in steady state a step
  still generates and trains one batch's tokens on average (the simulator's warm-up lasts until
  the carried requests settle: rlperf.sim.simulate). Bound / simulated step on streaming plans:
  0.02-0.70 over the 20 random scenarios of tests/test_planner_bound.py, 0.37-0.65 over 31 of
  the README question's (all GPU counts); it had no bound (0), so streaming plans were never
  pruned and kept every GPU count's simulation budget (``top_k`` each) open;
- composition per execution mode: a synchronous step serializes the rollout and each pool's
  training work (``gen + max_pool(fwd + train)``; with stage fusion the forward passes may hide
  in the rollout, so only the updates count after it); a pipelined mode (staleness >= 1,
  partial rollout) can overlap everything, so only ``max(gen, max_pool(fwd + train),
  W_total / P)``.

The bound is loose where a stage runs far from its peak (decode is memory bound; the FLOP
term then says little): it prunes whole GPU counts and placements whose pools are too small
for the work, while the fast estimate (rlperf.plan.estimate) orders the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlperf.plan.estimate import Estimator, PoolWork
from rlperf.plan.space import Candidate
from rlperf.scenario import Scenario
from rlperf.specs.parallel import EngineLayout
from rlperf.specs.plan import Plan
from rlperf.stages.rollout import solo_times_s
from rlperf.stages.rollout_step import StepModel


def decode_steps_floor_s(step: StepModel, response_tokens: np.ndarray, max_num_seqs: int) -> float:
    """Replica-seconds of engine steps that decoding ``response_tokens`` needs at the least (the
    step-count term of the module docstring): ``Σ (L - 1) / M`` steps of ``t_1``."""
    decode_steps = float(np.sum(np.maximum(response_tokens - 1, 0))) / max_num_seqs
    return decode_steps * step.run(1, 0, 0, 0.0).step_s(0)


@dataclass(frozen=True)
class PlanBound:
    step_s: float  # lower bound on the simulated time per step
    term: str  # the term that sets it: "rollout depth", "rollout work", "training work", "total work"


class Bounder:
    """Closed-form lower bounds for the plans of one scenario (memoized per engine and pool)."""

    def __init__(self, sc: Scenario, est: Estimator | None = None) -> None:
        self.sc = sc
        self.est = est or Estimator(sc)
        wl = sc.workload
        gen_prompts = self.est.batch.num_requests // wl.group_size
        self._wl = wl if gen_prompts == wl.prompts_per_step else wl.model_copy(update={"prompts_per_step": gen_prompts})
        self._samples: dict[int, tuple[np.ndarray, np.ndarray, float]] = {}
        self._gen: dict[tuple[EngineLayout, int | None, int], tuple[float, float]] = {}
        self._train: dict[tuple[str, int], tuple[float, float]] = {}
        self._stages = sc.algorithm.active_stages(sc.epochs * sc.minibatches)
        self._pools: dict[tuple[tuple[tuple[str, str], ...], int], tuple[dict[str, float], dict[str, float]]] = {}
        self._bounds: dict[tuple[object, ...], PlanBound] = {}

    def _sample(self, it: int) -> tuple[np.ndarray, np.ndarray, float]:
        """(prompt, response) lengths per request and the trained tokens of iteration ``it``:
        the simulator draws iteration ``it``'s batch with seed ``1000·it`` (rlperf.sim)."""
        got = self._samples.get(it)
        if got is None:
            s = self._wl.sample(1000 * it)
            p = np.asarray(s.prompt_tokens, np.int64)
            r = np.asarray(s.response_tokens, np.int64)
            prompt, target = np.repeat(p, r.shape[1]), r.reshape(-1)
            kept = float(np.sum((prompt + target)[: self.sc.workload.prompts_per_step * self.sc.workload.group_size]))
            got = (prompt, target, kept)
            self._samples[it] = got
        return got

    def _rollout_terms(self, engine: EngineLayout, budget: int | None, it: int) -> tuple[float, float]:
        """(work device-seconds: the largest of the matmul, KV-read and step-count terms;
        depth) of iteration ``it``'s rollout."""
        key = (engine, budget, it)
        got = self._gen.get(key)
        if got is None:
            sc = self.sc
            one = sc.cluster.with_gpus(min(sc.cluster.gpus_per_node, engine.tp * engine.pp))
            step = StepModel.build(sc.models["actor"], one, engine.model_copy(update={"replicas": 1}))
            prompt, target, _ = self._sample(it)
            resp = target if budget is None else np.minimum(target, budget)
            tokens = float(np.sum(prompt) + np.sum(target))
            # One tensor-parallel group computes at matmul_flops_per_s: device-seconds x tp.
            mm = step.decode_linear_flops_per_token * tokens / step.matmul_flops_per_s * engine.tp
            p, r = prompt.astype(np.float64), target.astype(np.float64)
            ctx_reads = float(np.sum(p * r + 0.5 * r * r))
            kv = ctx_reads * step.kv_bytes_per_token_per_gpu * engine.tp / step.kv_hbm_bytes_per_s
            steps = decode_steps_floor_s(step, resp, engine.max_num_seqs) * engine.tp * engine.pp
            i = int(np.argmax(resp))
            pre, dec = solo_times_s(step, prompt[i : i + 1], np.maximum(resp[i : i + 1] - 1, 0),
                                    engine.max_num_batched_tokens)
            got = (max(mm, kv, steps) * self.est.rounds, float(pre[0] + dec[0]))
            self._gen[key] = got
        return got

    def _role_terms(self, role: str, it: int) -> tuple[float, float]:
        """(forward, update) device-seconds of one role's weight matmuls at the large-GEMM rate."""
        got = self._train.get((role, it))
        if got is None:
            sc = self.sc
            acc = sc.cluster.accelerator
            lay = sc.plan.layout_for(role)
            dtype = lay.compute_dtype if lay.compute_dtype in acc.peak_flops else lay.param_dtype
            peak = acc.peak_flops.get(dtype) or max(acc.peak_flops.values())
            rate = peak * sc.cluster.profile.matmul_eff(dtype)
            model = sc.models[role]
            # Only the actor and the reference compute log-probs over the vocabulary; a value or
            # reward head is one column.
            head = 0 if role in ("actor", "ref") else model.vocab_size * model.token_embedding_size
            fwd = 2.0 * float(model.matmul_params_per_token - head) * self._sample(it)[2] / rate
            # Frozen weights (LoRA) get no weight gradient: the backward is dX only.
            backward = 1.0 if lay.lora_rank > 0 else 2.0
            got = (fwd, (1.0 + backward) * fwd * sc.epochs)
            self._train[(role, it)] = got
        return got

    def _pool_terms(self, assign: dict[str, str], it: int) -> tuple[dict[str, float], dict[str, float]]:
        """(forward, update) device-seconds per pool of iteration ``it``, the roles placed by
        ``assign`` (memoized: thousands of candidates share a few placements)."""
        key = (tuple(sorted(assign.items())), it)
        got = self._pools.get(key)
        if got is None:
            fwd: dict[str, float] = {}
            upd: dict[str, float] = {}
            for st in self._stages:
                if st.kind == "forward" or (st.kind == "reward" and self.sc.spec.algorithm.reward.kind == "model"):
                    pool = assign[st.role]
                    fwd[pool] = fwd.get(pool, 0.0) + self._role_terms(st.role, it)[0]
                elif st.kind == "train":
                    pool = assign[st.role]
                    upd[pool] = upd.get(pool, 0.0) + self._role_terms(st.role, it)[1]
            got = self._pools[key] = (fwd, upd)
        return got

    def training_work(self, plan: Plan) -> PoolWork:
        """(forward, update) device-seconds per pool of ``plan`` on the fast estimate's sample
        (iteration 0: rlperf.plan.estimate.Estimator.floor)."""
        return self._pool_terms(self.est.placed(plan)[1], 0)

    def bound(self, cand: Candidate) -> PlanBound:
        """The smallest of the per-iteration bounds over the iterations the simulator averages
        (each draws its own batch): a lower bound on their mean. It reads only the plan's
        placement, rollout engine, execution mode and phase offload (the training terms are the
        scenario's: :meth:`_role_terms`), so it is kept by those: the candidates that differ in
        their training layouts alone (most of them) share it."""
        plan = cand.plan
        where = plan.placement
        key = (where.kind, where.rollout_gpus, where.pools, tuple(sorted(where.assign.items())), plan.rollout,
               plan.mode, plan.offload_between_phases)
        got = self._bounds.get(key)
        if got is None:
            mode = self.est.mode(plan)
            warmup, steady = mode.sim_iterations()
            got = self._bounds[key] = min((self._bound_at(plan, it) for it in range(warmup, warmup + steady)),
                                          key=lambda b: b.step_s)
        return got

    def _bound_at(self, plan: Plan, it: int) -> PlanBound:
        sc = self.sc
        total = sc.cluster.num_gpus
        size, assign = self.est.placed(plan)
        gen_pool = assign["generate"]
        mode = self.est.mode(plan)
        gen_work, depth = self._rollout_terms(plan.rollout, mode.token_budget, it)
        # A pipelined loop overlaps up to s + 1 iterations: only depth / (s + 1) is sure per step.
        # Partial rollouts carry requests over: counted as pipelined with at least s = 1.
        s = mode.effective_staleness(assign["actor"] == gen_pool and plan.offload_between_phases)
        pipelined = s > 0 or mode.carries_unfinished
        depth /= max(s, 1) + 1 if pipelined else 1
        wl = sc.workload
        if mode.stop_after_finished(wl.prompts_per_step * wl.group_size) is not None:
            depth = 0.0  # a long response spans as many calls as it lags (module docstring)
        fused = mode.fusion is not None and mode.allows_fusion and self.est.gen_rounds.allows_fusion
        g_gen = size[gen_pool]
        gen_s = max(gen_work / g_gen, depth)
        gen_term = "rollout depth" if depth >= gen_work / g_gen else "rollout work"
        fwd, upd = self._pool_terms(assign, it)
        train_work = sum(fwd.values()) + sum(upd.values())
        total_s = (gen_work + train_work) / total
        busy = set(fwd) | set(upd)
        if not pipelined:
            train_s = max(((upd.get(p, 0.0) + (0.0 if fused else fwd.get(p, 0.0))) / size[p] for p in busy), default=0.0)
            step = max(gen_s + train_s, total_s)
            term = gen_term if gen_s >= train_s else "training work"
            return PlanBound(step, term if step > total_s else "total work")
        train_s = max(((fwd.get(p, 0.0) + upd.get(p, 0.0)) / size[p] for p in busy), default=0.0)
        step = max(gen_s, train_s, total_s)
        term = gen_term if step == gen_s else ("training work" if step == train_s else "total work")
        return PlanBound(step, term)

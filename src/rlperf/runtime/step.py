"""One real RL step on the local device (CPU, or CUDA when available), stage by stage, timed.

The step follows the scenario's algorithm stage graph (:meth:`AlgorithmSpec.active_stages`),
so the measured stages are the ones the simulator predicts:

- ``generate``: HF ``generate`` with a KV cache, static batches, lengths forced to the workload's
  draw (:mod:`rlperf.runtime.rollout`);
- ``reward``: the rule-based arithmetic verifier (:mod:`rlperf.runtime.arith`);
- ``old_logprob`` / ``ref_logprob`` / ``values``: forward-only passes in micro-batches;
- ``advantage``: the algorithm's estimator (:mod:`rlperf.runtime.algo_math`);
- ``critic_update`` / ``actor_update``: ``epochs x minibatches`` AdamW steps with gradient
  accumulation over micro-batches, the algorithm's clipped loss, aggregation and KL term.

Models are built from the scenario's ``config.json`` with random weights (nothing downloaded).
Before the timed step an untimed warm-up runs every stage once on two short requests (first-call
costs: kernel selection, allocator growth, optimizer state allocation); its optimizer step has
learning rate 0 and the optimizer state is reset afterwards, so the timed step starts from the
initial weights. Everything is seeded: the same scenario and options give the same tokens,
rewards and losses on the same device.

Hyperparameters without a scenario field take verl's defaults (algorithms.md §3): actor lr 1e-6,
critic lr 1e-5, weight decay 0.01, gradient clipping 1.0, KL coefficient 0.001, gamma = lambda
= 1, dual-clip c = 3, value clip 0.5.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from pydantic import Field

from rlperf.algorithms import AlgorithmSpec, get_algorithm
from rlperf.errors import SpecError
from rlperf.runtime import algo_math as am
from rlperf.runtime.arith import ArithVocab, make_prompt, score
from rlperf.runtime.batching import microbatch_indices, minibatch_indices
from rlperf.runtime.models import (
    Critic,
    HFModel,
    Padded,
    build_causal_lm,
    frozen,
    pad,
    token_logprobs,
    token_values,
    torch_dtype,
)
from rlperf.runtime.rollout import generate_batch
from rlperf.runtime.timeline import DETAIL, Timeline
from rlperf.scenario import ScenarioSpec, resolve_workload
from rlperf.sim.kernel import Segment
from rlperf.specs.base import Spec
from rlperf.specs.parallel import TrainLayout
from rlperf.specs.workload import Workload, WorkloadSample

SUPPORTED_STAGES = frozenset(
    {"generate", "reward", "old_logprob", "ref_logprob", "values", "advantage", "critic_update", "actor_update"}
)
IN_LOSS_KL = {"k3_loss": "k3", "k2_loss": "k2"}


class RuntimeOptions(Spec):
    seed: int = Field(default=0, ge=0)
    step: int = Field(default=0, ge=0)  # which step of the workload's length draws to run
    device: str = "auto"  # auto (CUDA if available), cpu, cuda, cuda:N
    threads: int | None = Field(default=None, gt=0)  # torch intra-op threads; None: torch's default
    warmup: bool = True
    actor_lr: float = Field(default=1e-6, ge=0)
    critic_lr: float = Field(default=1e-5, ge=0)
    weight_decay: float = Field(default=0.01, ge=0)
    grad_clip: float = Field(default=1.0, gt=0)
    kl_coef: float = Field(default=1e-3, ge=0)
    gamma: float = Field(default=1.0, ge=0, le=1)
    lam: float = Field(default=1.0, ge=0, le=1)
    clip_ratio_c: float = Field(default=3.0, gt=1)
    value_clip: float = Field(default=0.5, gt=0)
    adv_eps: float = Field(default=1e-6, gt=0)
    format_reward: float = Field(default=0.1, ge=0, le=1)


@dataclass(frozen=True)
class StageMeasure:
    name: str
    time_s: float


@dataclass(frozen=True)
class StepResult:
    """One measured step: per-stage wall times, what was computed, and the timeline."""

    scenario: str
    algorithm: str
    model: str
    device: str
    step_time_s: float  # first stage start to last stage end
    stages: tuple[StageMeasure, ...]
    num_responses: int
    prompt_tokens: int  # all B*G prompts (each request prefills its own)
    response_tokens: int
    decode_steps: int  # generate() steps summed over the static batches
    train_tokens: int  # real tokens of one pass over the batch (prompt + response)
    padded_train_tokens: int  # tokens one pass computes, padding included
    reward_mean: float
    policy_loss: float
    kl: float  # mean in-loss KL estimate (nan without one)
    critic_loss: float  # nan without a critic
    grad_norm: float  # actor, last optimizer step, before clipping
    optimizer_steps: int
    segments: tuple[Segment, ...] = field(repr=False, default=())
    notes: tuple[str, ...] = ()

    def stage(self, name: str) -> float:
        for s in self.stages:
            if s.name == name:
                return s.time_s
        raise KeyError(name)


def set_threads(threads: int | None) -> None:
    """Use ``threads`` intra-op threads (process-wide). On a CPU shared with other work, one
    thread avoids OpenMP barrier waits on a descheduled core (many small ops slow down 10-100x)."""
    if threads is not None:
        torch.set_num_threads(threads)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SpecError("device", f"{name} requested but torch sees no CUDA device", "auto, cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise SpecError("device", f"unknown device {name!r}", "auto, cpu, cuda, cuda:N")
    return torch.device(name)


def _check_layout(layout: TrainLayout, where: str) -> None:
    for f in ("dp", "tp", "pp", "cp", "ep"):
        if getattr(layout, f) != 1:
            raise SpecError(f"{where}.{f}", "the runtime runs on one device", "1")
    if layout.recompute == "selective":
        raise SpecError(f"{where}.recompute", "HF eager models have no selective recompute", "none, full")
    if layout.offload_params or layout.offload_optimizer:
        raise SpecError(f"{where}.offload_params", "the runtime does not offload", "false")


def _check_spec(spec: ScenarioSpec, alg: AlgorithmSpec, active: tuple[str, ...]) -> None:
    if spec.cluster.num_nodes != 1 or (spec.cluster.gpus_per_node or 1) != 1:
        raise SpecError("cluster", "the runtime runs on one device", "num_nodes 1, gpus_per_node 1")
    missing = [s for s in active if s not in SUPPORTED_STAGES]
    if missing or alg.advantage == "greedy_baseline":
        raise SpecError("algorithm.name", f"{alg.name} needs stages the runtime lacks ({', '.join(missing) or 'greedy rollout'})",
                        "PPO, GRPO, Dr.GRPO, RLOO, REINFORCE++, GSPO, VAPO")
    if spec.algorithm.reward.kind != "rule":
        raise SpecError("algorithm.reward.kind", "the runtime has only the rule-based arithmetic verifier", "rule")
    if spec.algorithm.critic_model not in (None, spec.model):
        raise SpecError("algorithm.critic_model", "the runtime's critic is the actor's backbone", spec.model)
    eng = spec.plan.rollout
    if eng.tp != 1 or eng.pp != 1 or eng.replicas != 1:
        raise SpecError("plan.rollout", "the runtime has one engine on one device", "tp 1, pp 1, replicas 1")
    for role in ("actor", "critic", "ref"):
        _check_layout(spec.plan.layout_for(role), f"plan.layouts.{role}")


class StepRunner:
    """Builds the models of a scenario once; :meth:`run` measures one step."""

    def __init__(self, spec: ScenarioSpec, options: RuntimeOptions | None = None) -> None:
        self.spec = spec
        self.opts = options or RuntimeOptions()
        self.alg = get_algorithm(spec.algorithm.name)
        self.workload: Workload = resolve_workload(spec.workload)
        self.epochs = spec.algorithm.epochs or self.alg.default_epochs
        self.minibatches = spec.algorithm.minibatches or self.alg.default_minibatches
        updates = self.epochs * self.minibatches
        self.notes: list[str] = []
        if self.alg.kl == "k1_reward" and updates == 1:
            # KL in the reward needs log pi_old before the update (verl always computes it).
            updates = 2
            self.notes.append("old_logprob runs although there is one update per rollout: the KL in the reward needs it (the stage graph drops it)")
        self.active = tuple(s.name for s in self.alg.active_stages(updates))
        _check_spec(spec, self.alg, self.active)
        self.device = _resolve_device(self.opts.device)
        set_threads(self.opts.threads)
        self.engine_dtype = torch_dtype(spec.plan.rollout.dtype, "plan.rollout.dtype")
        self.layouts = {r: spec.plan.layout_for(r) for r in ("actor", "critic", "ref")}
        self.train_dtype = {r: torch_dtype(lay.param_dtype, f"plan.layouts.{r}.param_dtype") for r, lay in self.layouts.items()}
        self._build_models()
        if spec.plan.rollout.prefix_sharing:
            self.notes.append("plan.rollout.prefix_sharing is on, but HF generate prefills every request's prompt")

    # ------------------------------------------------------------------ models
    def _build_models(self) -> None:
        o = self.opts
        self.actor: HFModel = build_causal_lm(self.spec.model, o.seed, self.device)
        cfg = self.actor.config
        eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, list) else cfg.eos_token_id
        if eos is None:
            raise SpecError("model", "its config.json has no eos_token_id")
        self.eos = int(eos)
        self.pad_id = int(cfg.pad_token_id) if cfg.pad_token_id is not None else self.eos
        specials = [x for x in (cfg.bos_token_id, self.eos, self.pad_id) if x is not None]
        self.vocab = ArithVocab.for_model(cfg.vocab_size, specials, self.eos)
        self.ref: HFModel | None = None
        if "ref_logprob" in self.active:
            self.ref = copy.deepcopy(self.actor).eval().requires_grad_(False)
        self.critic: Critic | None = Critic(self.actor) if "critic" in self.alg.trained else None
        if self.layouts["actor"].recompute == "full":
            self.actor.activation_checkpointing_enable()
        if self.critic is not None and self.layouts["critic"].recompute == "full":
            self.critic.backbone.activation_checkpointing_enable()
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=o.actor_lr, weight_decay=o.weight_decay)
        self.critic_opt = (
            torch.optim.AdamW(self.critic.parameters(), lr=o.critic_lr, weight_decay=o.weight_decay)
            if self.critic is not None else None
        )
        self._warm = not o.warmup

    # ------------------------------------------------------------------ public
    def run(self) -> StepResult:
        """Measure one step (after the untimed warm-up on the first call)."""
        if not self._warm:
            self._warmup()
        sample = self.workload.sample(self.opts.step)
        tl = Timeline(self.device, iteration=self.opts.step)
        state = _StepState(self, sample, tl, self.minibatches)
        state.execute()
        return state.result()

    def _warmup(self) -> None:
        """Every stage once on two short requests; no parameter changes (lr 0, state reset)."""
        cap = self.workload.max_response_tokens
        g = min(2, self.workload.group_size)
        resp = np.full((1, g), min(4, cap), dtype=np.int64)
        prm = np.array([max(8, int(self.workload.sample(0).prompt_tokens.min()))], dtype=np.int64)
        tiny = WorkloadSample(0, prm, resp, cap)
        opts = [o for o in (self.actor_opt, self.critic_opt) if o is not None]
        saved = [[grp["lr"] for grp in o.param_groups] for o in opts]
        for o in opts:
            for grp in o.param_groups:
                grp["lr"] = 0.0
        _StepState(self, tiny, Timeline(self.device), 1).execute()
        for o, lrs in zip(opts, saved):
            for grp, lr in zip(o.param_groups, lrs):
                grp["lr"] = lr
            for st in o.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor):
                        v.zero_()
        self._warm = True


class _StepState:
    """The data of one step as it flows through the stages."""

    def __init__(self, rt: StepRunner, sample: WorkloadSample, tl: Timeline, minibatches: int) -> None:
        self.rt = rt
        self.tl = tl
        self.minibatches = minibatches
        self.cap = sample.response_cap_tokens
        self.sample = sample
        rng = np.random.default_rng([rt.opts.seed, sample.step])
        made = [make_prompt(rng, int(n), rt.vocab) for n in sample.prompt_tokens]
        g = sample.group_size
        self.prompts = [made[i // g][0] for i in range(sample.num_responses)]
        self.answers = [made[i // g][1] for i in range(sample.num_responses)]
        self.targets = [int(t) for t in sample.flat_response_tokens]
        self.n = len(self.targets)
        self.r_max = max(self.targets)
        self.seq_tokens = np.array([len(p) for p in self.prompts], dtype=np.int64) + np.array(self.targets)
        self.responses: list[tuple[int, ...]] = []
        self.mask = torch.zeros(self.n, self.r_max, device=rt.device)
        for i, t in enumerate(self.targets):
            self.mask[i, :t] = 1.0
        self.decode_steps = 0
        self.padded_tokens = 0
        self.real_tokens = 0
        self.tensors: dict[str, torch.Tensor] = {}
        self.metrics: dict[str, float] = {"policy_loss": 0.0, "kl": math.nan, "critic_loss": math.nan, "grad_norm": math.nan}
        self.optimizer_steps = 0

    # ------------------------------------------------------------------ driver
    def execute(self) -> None:
        fns: dict[str, Callable[[], None]] = {
            "generate": self.generate,
            "reward": self.reward,
            "old_logprob": lambda: self.forward_pass("old_logprob", "actor"),
            "ref_logprob": lambda: self.forward_pass("ref_logprob", "ref"),
            "values": lambda: self.forward_pass("values", "critic"),
            "advantage": self.advantage,
            "critic_update": self.critic_update,
            "actor_update": self.actor_update,
        }
        for name in self.rt.active:
            with self.tl.span(name):
                fns[name]()

    def result(self) -> StepResult:
        times = self.tl.stage_times()
        top = [s for s in self.tl.segments if s.track == "all"]
        rt = self.rt
        notes = [
            *rt.notes,
            "generate: HF generate, static batches (no continuous batching); finished requests compute padding until their batch's longest ends",
            f"train passes compute {self.padded_tokens:,} tokens for {self.real_tokens:,} real ones (HF eager pads each micro-batch)"
            + ("" if not any(lay.packing for lay in rt.layouts.values()) else
               "; the scenario's layouts pack sequences (packing: true), so the prediction counts only real tokens: "
               "set packing: false to predict what this runtime computes"),
        ]
        return StepResult(
            scenario=rt.spec.name,
            algorithm=rt.alg.name,
            model=rt.spec.model,
            device=str(rt.device),
            step_time_s=max(s.end_s for s in top) - min(s.start_s for s in top),
            stages=tuple(StageMeasure(k, v) for k, v in times.items()),
            num_responses=self.n,
            prompt_tokens=int(sum(len(p) for p in self.prompts)),
            response_tokens=int(sum(self.targets)),
            decode_steps=self.decode_steps,
            train_tokens=int(self.seq_tokens.sum()),
            padded_train_tokens=self._one_pass_padded(),
            reward_mean=float(self.tensors["scores"].mean()),
            policy_loss=self.metrics["policy_loss"],
            kl=self.metrics["kl"],
            critic_loss=self.metrics["critic_loss"],
            grad_norm=self.metrics["grad_norm"],
            optimizer_steps=self.optimizer_steps,
            segments=tuple(self.tl.segments),
            notes=tuple(notes),
        )

    def _one_pass_padded(self) -> int:
        mbs = microbatch_indices(self.seq_tokens, np.arange(self.n), self.rt.layouts["actor"])
        return sum(self._padded(rows).padded_tokens for rows in mbs)

    def _padded(self, rows: np.ndarray) -> Padded:
        return pad(self.prompts, self.responses, rows, self.rt.pad_id, self.rt.device)

    # ------------------------------------------------------------------ stages
    def generate(self) -> None:
        rt = self.rt
        size = rt.spec.plan.rollout.max_num_seqs
        self.responses = [()] * self.n
        torch.manual_seed(rt.opts.seed * 1_000_003 + self.sample.step)
        for k, lo in enumerate(range(0, self.n, size)):
            rows = list(range(lo, min(lo + size, self.n)))
            tg = [self.targets[i] for i in rows]
            with self.tl.span(f"generate#batch{k}", DETAIL, requests=len(rows), decode_steps=max(tg)):
                out = generate_batch(rt.actor, [self.prompts[i] for i in rows], tg, self.cap, rt.eos, rt.pad_id, rt.engine_dtype)
            for i, r in zip(rows, out):
                self.responses[i] = r
            self.decode_steps += max(tg)

    def reward(self) -> None:
        s = [score(r, a, self.rt.vocab, self.rt.opts.format_reward) for r, a in zip(self.responses, self.answers)]
        self.tensors["scores"] = torch.tensor(s, dtype=torch.float32, device=self.rt.device)

    def forward_pass(self, name: str, role: str) -> None:
        rt = self.rt
        out = torch.zeros(self.n, self.r_max, device=rt.device)
        model = {"actor": rt.actor, "ref": rt.ref, "critic": rt.critic}[role]
        assert model is not None
        mbs = microbatch_indices(self.seq_tokens, np.arange(self.n), rt.layouts[role])
        with frozen(model):
            for j, rows in enumerate(mbs):
                with self.tl.span(f"{name}#mb{j}", DETAIL, sequences=len(rows)):
                    b = self._padded(rows)
                    if role == "critic":
                        assert isinstance(model, Critic)
                        vals = token_values(model, b, rt.train_dtype[role])
                    else:
                        vals = token_logprobs(model, b, rt.train_dtype[role])
                    out[torch.as_tensor(rows, device=rt.device), : vals.shape[1]] = vals
        self.tensors[name] = out

    def advantage(self) -> None:
        rt, alg, o = self.rt, self.rt.alg, self.rt.opts
        scores = self.tensors["scores"]
        mask = self.mask
        g = self.sample.group_size
        if alg.kl == "k1_reward":
            token_rewards = am.kl_shaped_rewards(scores, self.tensors["old_logprob"], self.tensors["ref_logprob"], mask, o.kl_coef)
        else:
            token_rewards = am.kl_shaped_rewards(scores, torch.zeros_like(mask), torch.zeros_like(mask), mask, 0.0)
        outcome = am.masked_sum(token_rewards, mask, dim=1)  # verl: score = token-sum of token rewards
        kind = alg.advantage
        if kind in ("group_norm", "group_mean"):
            adv = am.group_norm_advantages(outcome.reshape(-1, g), o.adv_eps, by_std=kind == "group_norm")
            self.tensors["advantages"] = am.broadcast_to_tokens(adv.reshape(-1), mask)
        elif kind == "leave_one_out":
            adv = am.leave_one_out_advantages(outcome.reshape(-1, g))
            self.tensors["advantages"] = am.broadcast_to_tokens(adv.reshape(-1), mask)
        elif kind == "batch_znorm":
            returns = am.discounted_returns(token_rewards, mask, o.gamma)
            self.tensors["advantages"] = am.masked_whiten(returns, mask)
        elif kind == "gae":
            adv, ret = am.gae(token_rewards, self.tensors["values"], mask, o.gamma, o.lam)
            self.tensors["advantages"] = am.masked_whiten(adv, mask)
            self.tensors["returns"] = ret
        else:
            raise AssertionError(f"unsupported advantage {kind}")
        del rt

    def _update(self, role: str, opt: torch.optim.Optimizer, micro_loss: Callable[[np.ndarray, float], dict[str, float]], mode: am.LossAgg) -> dict[str, float]:
        """epochs x minibatches optimizer steps; returns the mean of each reported loss."""
        rt = self.rt
        model = rt.critic if role == "critic" else rt.actor
        assert model is not None
        model.train()
        sums: dict[str, float] = {}
        count = 0
        grad_norm = math.nan
        for _ in range(rt.epochs):
            for mb_k, mini in enumerate(minibatch_indices(self.n, self.minibatches)):
                whole_tokens = float(self.mask[torch.as_tensor(mini, device=rt.device)].sum())
                for j, rows in enumerate(microbatch_indices(self.seq_tokens, mini, rt.layouts[role])):
                    w = am.aggregation_weight(self.mask[torch.as_tensor(rows, device=rt.device)], mode, whole_tokens, len(mini))
                    with self.tl.span(f"{role}_update#mini{mb_k}.mb{j}", DETAIL, sequences=len(rows)):
                        for k, v in micro_loss(rows, w).items():
                            sums[k] = sums.get(k, 0.0) + w * v
                with self.tl.span(f"{role}_update#optimizer{mb_k}", DETAIL):
                    grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), rt.opts.grad_clip))
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                self.optimizer_steps += 1
                count += 1
        out = {k: v / count for k, v in sums.items()}
        out["grad_norm"] = grad_norm
        return out

    def actor_update(self) -> None:
        rt, alg, o = self.rt, self.rt.alg, self.rt.opts
        mode: am.LossAgg = alg.loss_agg
        kl_kind = IN_LOSS_KL.get(alg.kl)
        dev = rt.device

        def micro(rows: np.ndarray, w: float) -> dict[str, float]:
            b = self._padded(rows)
            r_w = b.response_ids.shape[1]
            idx = torch.as_tensor(rows, device=dev)
            logp = token_logprobs(rt.actor, b, rt.train_dtype["actor"])
            old = self.tensors["old_logprob"][idx, :r_w] if "old_logprob" in self.tensors else logp.detach()
            adv = self.tensors["advantages"][idx, :r_w]
            m = b.response_mask
            if mode == "sequence_ratio":
                tok = am.gspo_token_losses(logp, old, adv, m, alg.clip_low, alg.clip_high)
            else:
                tok = am.ppo_token_losses(logp, old, adv, alg.clip_low, alg.clip_high, o.clip_ratio_c)
            pg = am.aggregate(tok, m, mode, norm_tokens=self.cap)
            loss = pg
            out = {"policy_loss": float(pg.detach())}
            if kl_kind is not None:
                kl = am.aggregate(am.kl_estimate(logp, self.tensors["ref_logprob"][idx, :r_w], kl_kind), m, mode, norm_tokens=self.cap)  # type: ignore[arg-type]
                loss = loss + o.kl_coef * kl
                out["kl"] = float(kl.detach())
            torch.autograd.backward(w * loss)
            self._count(b)
            return out

        stats = self._update("actor", rt.actor_opt, micro, mode)
        self.metrics.update(stats)

    def critic_update(self) -> None:
        rt, o = self.rt, self.rt.opts
        critic, opt = rt.critic, rt.critic_opt
        assert critic is not None and opt is not None
        dev = rt.device

        def micro(rows: np.ndarray, w: float) -> dict[str, float]:
            b = self._padded(rows)
            r_w = b.response_ids.shape[1]
            idx = torch.as_tensor(rows, device=dev)
            v = token_values(critic, b, rt.train_dtype["critic"])
            tok = am.value_token_losses(v, self.tensors["values"][idx, :r_w], self.tensors["returns"][idx, :r_w], o.value_clip)
            loss = am.aggregate(tok, b.response_mask, "token_mean")
            torch.autograd.backward(w * loss)
            self._count(b)
            return {"critic_loss": float(loss.detach())}

        stats = self._update("critic", opt, micro, "token_mean")
        self.metrics["critic_loss"] = stats["critic_loss"]

    def _count(self, b: Padded) -> None:
        self.padded_tokens += b.padded_tokens
        self.real_tokens += b.real_tokens

"""The stage graph of one RL iteration (compute-centric view, shared/research/algorithms.md §1-2).

A stage names the *role* of the model it runs (actor, critic, ref, reward_model, prm), the pass
(generate, forward-only, train, reward, driver), which tokens it touches, and the stages it
waits for. Costs are attached later (rlperf.stages); placement and execution mode are decided by
the plan, not here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

Role = Literal["actor", "critic", "ref", "reward_model", "prm"]
PassKind = Literal["generate", "forward", "train", "reward", "driver"]
# sampled: every response generated this iteration (incl. oversampling rounds);
# kept: the responses that survive filtering (what training sees);
# greedy: one extra greedy response per prompt (ReMax).
TokenSet = Literal["sampled", "kept", "greedy"]
# When a stage runs: always; only with a KL term; only with more than one update per rollout.
Condition = Literal["always", "kl", "multi_update"]
Advantage = Literal["gae", "group_norm", "group_mean", "leave_one_out", "batch_znorm", "greedy_baseline"]
LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "sequence_ratio"]
KL = Literal["none", "k1_reward", "k2_loss", "k3_loss"]


@dataclass(frozen=True)
class StageDef:
    name: str
    role: Role
    kind: PassKind
    tokens: TokenSet
    deps: tuple[str, ...] = ()
    condition: Condition = "always"


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    summary: str
    trained: tuple[Role, ...]
    frozen: tuple[Role, ...]
    stages: tuple[StageDef, ...]
    advantage: Advantage
    loss_agg: LossAgg
    kl: KL
    clip_low: float = 0.2
    clip_high: float = 0.2
    # Generated responses per kept response (PRIME samples 4x and keeps 1/4). DAPO's dynamic
    # sampling is not a fixed ratio: see ``dynamic_sampling``.
    oversample: float = 1.0
    # DAPO: generate rounds of ``gen_batch_multiplier`` x prompts until enough groups are kept
    # (groups whose rewards are not all equal); rounds = ceil(1 / (multiplier * keep_rate)).
    dynamic_sampling: bool = False
    gen_batch_multiplier: float = 1.0
    max_gen_rounds: int = 1
    default_epochs: int = 1
    default_minibatches: int = 1
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        names = [s.name for s in self.stages]
        assert len(names) == len(set(names)), f"{self.name}: duplicate stage names"
        for s in self.stages:
            for d in s.deps:
                assert d in names[: names.index(s.name)], f"{self.name}.{s.name}: dep {d} must come earlier"

    def stage(self, name: str) -> StageDef:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def roles(self) -> tuple[Role, ...]:
        seen: list[Role] = []
        for s in self.stages:
            if s.role not in seen:
                seen.append(s.role)
        return tuple(seen)

    def with_old_logprob_always(self) -> AlgorithmSpec:
        """This algorithm with its old-policy log-prob pass kept at one update per rollout too
        (verl computes ``old_log_prob`` every step for its metrics and KL; some frameworks
        always run it)."""
        stages = tuple(
            StageDef(s.name, s.role, s.kind, s.tokens, s.deps, "always") if s.condition == "multi_update" else s
            for s in self.stages
        )
        return replace(self, stages=stages)

    def with_rollout_logprobs(self) -> AlgorithmSpec:
        """This algorithm with the old-policy log-probs taken from the rollout engine (verl
        fully_async ``use_rollout_log_probs``, the default there): the trainer's old-policy
        log-prob pass never runs, and the stages that read it wait for the rollout instead."""
        dropped = {s.name for s in self.stages if s.condition == "multi_update"}
        stages = tuple(
            StageDef(s.name, s.role, s.kind, s.tokens, tuple(d for d in s.deps if d not in dropped), s.condition)
            for s in self.stages if s.name not in dropped
        )
        return replace(self, stages=stages)

    def with_kl(self, kl: KL) -> AlgorithmSpec:
        """This algorithm with another KL term: ``none`` drops the reference model and its
        log-prob pass (verl with ``use_kl_loss=False`` and ``use_kl_in_reward=False``;
        OpenRLHF with ``init_kl_coef 0``); a KL term needs the algorithm's reference stage."""
        if kl == self.kl:
            return self
        if kl != "none" and not any(s.condition == "kl" for s in self.stages):
            raise ValueError(f"{self.name} has no reference log-prob stage to run a KL term with")
        ref: tuple[Role, ...] = ("ref",) if kl != "none" else ()
        frozen = tuple(r for r in self.frozen if r != "ref") + ref
        return replace(self, kl=kl, frozen=frozen)

    def active_stages(self, updates_per_rollout: int, kl_enabled: bool | None = None) -> tuple[StageDef, ...]:
        """The stages that run, given the number of optimizer updates per rollout.

        ``multi_update`` stages (old-policy log-probs) are needed when the ratio can differ from 1
        (more than one update per rollout) or when a KL penalty sits in the reward; verl still
        runs it for metrics. Dependencies on dropped stages are removed (they are satisfied
        trivially)."""
        kl_on = (self.kl != "none") if kl_enabled is None else kl_enabled
        # A KL penalty in the reward is log pi_old - log pi_ref per token: it needs the old-policy
        # log-probs even when the ratio is trivially 1 (one update per rollout).
        needs_old = updates_per_rollout > 1 or (kl_on and self.kl == "k1_reward")
        keep: list[StageDef] = []
        dropped: set[str] = set()
        for s in self.stages:
            if (s.condition == "kl" and not kl_on) or (s.condition == "multi_update" and not needs_old):
                dropped.add(s.name)
                continue
            keep.append(s)
        return tuple(
            StageDef(s.name, s.role, s.kind, s.tokens, tuple(d for d in s.deps if d not in dropped), s.condition)
            for s in keep
        )

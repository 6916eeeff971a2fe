"""The built-in algorithms. Facts from shared/research/algorithms.md (§1 summary table, §3 per
algorithm, §4 recipes); each spec cites its source.

Stage names are shared across algorithms so that placement and cost code can refer to them:
generate, generate_greedy, reward, filter, old_logprob, ref_logprob, values, prm_update,
prm_forward, prm_ref_forward, advantage, critic_update, actor_update.
"""

from __future__ import annotations

from rlperf.algorithms.registry import register_algorithm
from rlperf.algorithms.spec import AlgorithmSpec, StageDef

GEN = StageDef("generate", "actor", "generate", "sampled")
REWARD = StageDef("reward", "reward_model", "reward", "sampled", ("generate",))
OLD = StageDef("old_logprob", "actor", "forward", "kept", ("generate",), "multi_update")
REF = StageDef("ref_logprob", "ref", "forward", "kept", ("generate",), "kl")
VALUES = StageDef("values", "critic", "forward", "kept", ("generate",))


def _adv(*deps: str) -> StageDef:
    return StageDef("advantage", "actor", "driver", "kept", deps)


ACTOR = StageDef("actor_update", "actor", "train", "kept", ("advantage", "old_logprob", "ref_logprob"))
CRITIC = StageDef("critic_update", "critic", "train", "kept", ("advantage",))


def _critic_free(
    name: str,
    summary: str,
    advantage: str,
    loss_agg: str,
    kl: str,
    source: str,
    **kw: object,
) -> AlgorithmSpec:
    stages = (GEN, REWARD, OLD, REF, _adv("reward", "ref_logprob"), ACTOR)
    frozen = ("ref",) if kl != "none" else ()
    return AlgorithmSpec(
        name=name,
        summary=summary,
        trained=("actor",),
        frozen=frozen,  # type: ignore[arg-type]
        stages=stages,
        advantage=advantage,  # type: ignore[arg-type]
        loss_agg=loss_agg,  # type: ignore[arg-type]
        kl=kl,  # type: ignore[arg-type]
        source=source,
        **kw,  # type: ignore[arg-type]
    )


@register_algorithm
def ppo() -> AlgorithmSpec:
    return AlgorithmSpec(
        name="PPO",
        summary="actor + critic + ref + reward model; GAE on KL-shaped token rewards",
        trained=("actor", "critic"),
        frozen=("ref", "reward_model"),
        stages=(GEN, REWARD, OLD, REF, VALUES, _adv("reward", "ref_logprob", "values"), CRITIC, ACTOR),
        advantage="gae",
        loss_agg="token_mean",
        kl="k1_reward",
        default_epochs=1,
        default_minibatches=4,
        source="algorithms.md §3.1 (verl compute_gae_advantage_return; ppo_mini_batch_size 256 of 1024)",
    )


@register_algorithm
def grpo() -> AlgorithmSpec:
    return _critic_free(
        "GRPO",
        "group-normalized advantages (r - mean)/std, KL (k3) in the loss",
        "group_norm",
        "token_mean",
        "k3_loss",
        "algorithms.md §3.2 (DeepSeekMath eq. 3; verl default token-mean)",
        default_minibatches=4,
    )


@register_algorithm
def dr_grpo() -> AlgorithmSpec:
    return _critic_free(
        "Dr.GRPO",
        "GRPO without std normalization and length bias; no KL, no reference",
        "group_mean",
        "seq_mean_token_sum_norm",
        "none",
        "algorithms.md §3.3 (Liu et al. 2025, Oat-Zero)",
    )


@register_algorithm
def dapo() -> AlgorithmSpec:
    stages = (
        GEN,
        REWARD,
        StageDef("filter", "actor", "driver", "sampled", ("reward",)),
        StageDef("old_logprob", "actor", "forward", "kept", ("filter",), "multi_update"),
        _adv("filter"),
        StageDef("actor_update", "actor", "train", "kept", ("advantage", "old_logprob")),
    )
    return AlgorithmSpec(
        name="DAPO",
        summary="dynamic sampling (regenerate until enough mixed groups), clip-higher, token-level loss",
        trained=("actor",),
        frozen=(),
        stages=stages,
        advantage="group_norm",
        loss_agg="token_mean",
        kl="none",
        clip_low=0.2,
        clip_high=0.28,
        dynamic_sampling=True,
        gen_batch_multiplier=3.0,
        max_gen_rounds=10,
        default_minibatches=16,
        source="algorithms.md §3.4 (DAPO paper §4.1; verl recipe/dapo: gen_batch_size = 3x train, <= 10 rounds)",
    )


@register_algorithm
def rloo() -> AlgorithmSpec:
    return _critic_free(
        "RLOO",
        "leave-one-out baseline r_i - mean_{j!=i} r_j; KL (k1) in the reward",
        "leave_one_out",
        "token_mean",
        "k1_reward",
        "algorithms.md §3.5 (Ahmadian et al. 2024; verl example)",
        default_minibatches=4,
    )


@register_algorithm
def reinforce_pp() -> AlgorithmSpec:
    return _critic_free(
        "REINFORCE++",
        "token returns with k1 KL in the reward, global batch z-normalization",
        "batch_znorm",
        "token_mean",
        "k1_reward",
        "algorithms.md §3.6 (Hu 2025; verl example)",
    )


@register_algorithm
def remax() -> AlgorithmSpec:
    stages = (
        GEN,
        StageDef("generate_greedy", "actor", "generate", "greedy", ("generate",)),
        StageDef("reward", "reward_model", "reward", "sampled", ("generate", "generate_greedy")),
        OLD,
        REF,
        _adv("reward", "ref_logprob"),
        ACTOR,
    )
    return AlgorithmSpec(
        name="ReMax",
        summary="REINFORCE with a greedy-rollout baseline: one extra greedy generation per prompt",
        trained=("actor",),
        frozen=("ref", "reward_model"),
        stages=stages,
        advantage="greedy_baseline",
        loss_agg="token_mean",
        kl="k1_reward",
        default_minibatches=4,
        source="algorithms.md §3.7 (Li et al. 2023; verl runs gen_max after generation)",
    )


@register_algorithm
def gspo() -> AlgorithmSpec:
    return _critic_free(
        "GSPO",
        "sequence-level importance ratio exp(mean_t log rho_t), clipped per sequence",
        "group_norm",
        "sequence_ratio",
        "none",
        "algorithms.md §3.8 (Qwen 2025; verl example: 8 mini-batches, clip 3e-4/4e-4)",
        clip_low=3e-4,
        clip_high=4e-4,
        default_minibatches=8,
    )


@register_algorithm
def prime() -> AlgorithmSpec:
    stages = (
        GEN,
        REWARD,
        StageDef("filter", "actor", "driver", "sampled", ("reward",)),
        StageDef("old_logprob", "actor", "forward", "kept", ("filter",), "multi_update"),
        StageDef("ref_logprob", "ref", "forward", "kept", ("filter",)),
        StageDef("prm_update", "prm", "train", "kept", ("filter", "ref_logprob")),
        StageDef("prm_forward", "prm", "forward", "kept", ("prm_update",)),
        StageDef("prm_ref_forward", "ref", "forward", "kept", ("filter",)),
        _adv("prm_forward", "prm_ref_forward"),
        StageDef("actor_update", "actor", "train", "kept", ("advantage", "old_logprob", "ref_logprob")),
    )
    return AlgorithmSpec(
        name="PRIME",
        summary="online implicit PRM (trained every step, double forward) + RLOO; 4x oversampling",
        trained=("actor", "prm"),
        frozen=("ref",),
        stages=stages,
        advantage="leave_one_out",
        loss_agg="token_mean",
        kl="k1_reward",
        oversample=4.0,
        source="algorithms.md §3.10 (Cui et al. 2025; verl recipe/prime: 64 kept of 256 prompts, update=before)",
    )


@register_algorithm
def vapo() -> AlgorithmSpec:
    return AlgorithmSpec(
        name="VAPO",
        summary="PPO with a critic, decoupled and length-adaptive GAE, clip-higher; rule reward, no KL",
        trained=("actor", "critic"),
        frozen=(),
        stages=(GEN, REWARD, OLD, VALUES, _adv("reward", "values"), CRITIC,
                StageDef("actor_update", "actor", "train", "kept", ("advantage", "old_logprob"))),
        advantage="gae",
        loss_agg="token_mean",
        kl="none",
        clip_low=0.2,
        clip_high=0.28,
        default_minibatches=16,
        source="algorithms.md §3.9 (VAPO; several hyperparameters from secondary summaries)",
    )

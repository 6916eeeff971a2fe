"""The algorithm math of one RL step, in torch: advantages, returns, losses, KL estimators.

Formulas from shared/research/algorithms.md §3 (verl / OpenRLHF implementations, papers cited
there). Shapes: ``(N, T)`` tensors hold one row per response and one column per response token;
``mask`` is 1 on real tokens and 0 on padding. Per-response tensors are ``(B, G)`` (prompts x
group) or ``(N,)``.

Conventions:

- log-ratio of policy to reference ``lr = log pi(y) - log pi_ref(y)``; with the probability
  ratio ``r = pi_ref / pi = exp(-lr)`` Schulman's estimators of KL(pi || pi_ref) on samples
  ``y ~ pi`` are (J. Schulman, "Approximating KL Divergence", 2020; algorithms.md §3.11)
  ``k1 = -log r = lr`` (unbiased, can be negative), ``k2 = (log r)^2 / 2`` (biased, low
  variance) and ``k3 = (r - 1) - log r`` (unbiased and >= 0, verl's ``low_var_kl``).
- Losses are *minimized*: the PPO surrogate is ``max(-A rho, -A clip(rho))``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

KLKind = Literal["k1", "k2", "k3"]
LossAgg = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm", "sequence_ratio"]


# ---------------------------------------------------------------- masked reductions
def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over the positions where ``mask`` is 1 (all of them, or along ``dim``)."""
    if dim is None:
        return masked_sum(x, mask) / mask.sum()
    return masked_sum(x, mask, dim) / mask.sum(dim)


def masked_whiten(x: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the masked entries, unbiased variance (verl
    ``masked_whiten``); padding stays 0."""
    n = mask.sum()
    mean = masked_sum(x, mask) / n
    var = masked_sum((x - mean) ** 2, mask) / (n - 1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


# ---------------------------------------------------------------- outcome advantages
def group_norm_advantages(scores: Tensor, eps: float = 1e-6, by_std: bool = True) -> Tensor:
    """GRPO: ``(r_i - mean(r)) / (std(r) + eps)`` within each group (rows of ``(B, G)``
    ``scores``); unbiased std as ``torch.std`` (verl ``compute_grpo_outcome_advantage``). A group
    of one gets mean 0 and std 1. ``by_std=False`` is Dr. GRPO's ``r_i - mean(r)``."""
    assert scores.ndim == 2
    if scores.shape[1] == 1:
        mean, std = torch.zeros_like(scores), torch.ones_like(scores)
    else:
        mean = scores.mean(dim=1, keepdim=True)
        std = scores.std(dim=1, keepdim=True)
    centred = scores - mean
    return centred / (std + eps) if by_std else centred


def leave_one_out_advantages(scores: Tensor) -> Tensor:
    """RLOO: ``r_i - (sum_j r_j - r_i) / (G - 1)`` per group (Ahmadian et al. 2024)."""
    assert scores.ndim == 2 and scores.shape[1] >= 2, "RLOO needs at least two samples per prompt"
    g = scores.shape[1]
    return scores - (scores.sum(dim=1, keepdim=True) - scores) / (g - 1)


def broadcast_to_tokens(per_response: Tensor, mask: Tensor) -> Tensor:
    """A per-response value ``(N,)`` copied onto each of its valid tokens ``(N, T)``."""
    return per_response.reshape(-1, 1) * mask


# ---------------------------------------------------------------- token rewards and returns
def kl_shaped_rewards(scores: Tensor, logp_old: Tensor, logp_ref: Tensor, mask: Tensor, beta: float) -> Tensor:
    """PPO / REINFORCE++ / RLOO token rewards: ``-beta * k1`` on every token and the outcome
    score added at the last valid token (verl ``compute_rewards``)."""
    rewards = -beta * (logp_old - logp_ref) * mask
    last = mask.sum(dim=1).long() - 1
    rows = torch.arange(mask.shape[0])
    rewards[rows, last] += scores
    return rewards


def discounted_returns(token_rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """``G_t = sum_{s >= t} gamma^(s-t) r_s`` over valid tokens (reverse scan; responses are
    right-padded, so padding after the last token adds nothing)."""
    out = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype, device=token_rewards.device)
    for t in range(token_rewards.shape[1] - 1, -1, -1):
        running = token_rewards[:, t] * mask[:, t] + gamma * running
        out[:, t] = running
    return out * mask


def gae(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 1.0) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016; verl ``compute_gae_advantage_return``).

    ``delta_t = r_t + gamma V_{t+1} - V_t`` and ``A_t = delta_t + gamma lam A_{t+1}``, a reverse
    scan; the value after the last valid token is 0 and padded positions are skipped (they pass
    the next value and advantage through unchanged). Returns ``(advantages, returns)`` with
    ``returns = A + V``, both zero on padding; whitening is left to the caller."""
    n, t_len = token_rewards.shape
    next_value = torch.zeros(n, dtype=values.dtype, device=values.device)
    last_adv = torch.zeros_like(next_value)
    adv = torch.zeros_like(token_rewards)
    for t in range(t_len - 1, -1, -1):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        a_t = delta + gamma * lam * last_adv
        next_value = m * values[:, t] + (1 - m) * next_value
        last_adv = m * a_t + (1 - m) * last_adv
        adv[:, t] = last_adv
    adv = adv * mask
    return adv, (adv + values) * mask


# ---------------------------------------------------------------- KL estimators
def kl_estimate(logp: Tensor, logp_ref: Tensor, kind: KLKind) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (see the module docstring)."""
    lr = logp - logp_ref  # = -log r, r = pi_ref / pi
    if kind == "k1":
        return lr
    if kind == "k2":
        return 0.5 * lr * lr
    if kind == "k3":
        # (r - 1) - log r, >= 0 exactly; expm1 keeps small |lr| accurate and the clamp removes
        # rounding below 0
        return (torch.expm1(-lr) + lr).clamp_min(0.0)
    raise AssertionError(f"unknown KL estimator {kind!r}")


# ---------------------------------------------------------------- loss aggregation
def aggregate(loss: Tensor, mask: Tensor, mode: LossAgg, norm_tokens: float | None = None) -> Tensor:
    """Reduce per-token losses ``(N, T)`` to a scalar (verl ``agg_loss``).

    - ``token_mean``: sum over all valid tokens / their count (DAPO's token-level loss).
    - ``seq_mean_token_mean`` (and ``sequence_ratio``, GSPO): mean over responses of the mean
      over each response's tokens (the GRPO paper's ``1/G sum_i 1/|o_i| sum_t``).
    - ``seq_mean_token_sum_norm`` (Dr. GRPO): mean over responses of the token *sum* divided by a
      constant ``norm_tokens`` (e.g. the response cap), removing the length bias."""
    if mode == "token_mean":
        return masked_mean(loss, mask)
    if mode in ("seq_mean_token_mean", "sequence_ratio"):
        return masked_mean(loss, mask, dim=1).mean()
    if mode == "seq_mean_token_sum_norm":
        assert norm_tokens is not None and norm_tokens > 0, "seq_mean_token_sum_norm needs norm_tokens"
        return masked_sum(loss, mask, dim=1).mean() / norm_tokens
    raise AssertionError(f"unknown loss aggregation {mode!r}")


def aggregation_weight(mask: Tensor, mode: LossAgg, whole_tokens: float, whole_seqs: int) -> float:
    """Share of a micro-batch in its mini-batch's loss, so that summing ``weight * aggregate``
    over the micro-batches equals ``aggregate`` over the whole mini-batch: tokens for
    ``token_mean``, responses for the per-sequence modes."""
    if mode == "token_mean":
        return float(mask.sum()) / whole_tokens
    return mask.shape[0] / whole_seqs


# ---------------------------------------------------------------- policy and value losses
def ppo_token_losses(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    clip_c: float | None = None,
) -> Tensor:
    """Per-token clipped surrogate (verl ``compute_policy_loss_vanilla``):

    ``rho = exp(logp - logp_old)``, ``l = max(-A rho, -A clip(rho, 1 - clip_low, 1 + clip_high))``
    (``clip_high > clip_low`` is DAPO's clip-higher) and, with dual clip ``c > 1`` for ``A < 0``,
    ``l = min(l, -A c)`` (Ye et al. 2020)."""
    rho = torch.exp(logp - logp_old)
    l1 = -advantages * rho
    l2 = -advantages * torch.clamp(rho, 1 - clip_low, 1 + clip_high)
    loss = torch.maximum(l1, l2)
    if clip_c is not None:
        assert clip_c > 1, "dual-clip c must exceed 1"
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * clip_c), loss)
    return loss


def gspo_token_losses(
    logp: Tensor, logp_old: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> Tensor:
    """GSPO (Qwen 2025), GSPO-token form: the sequence ratio
    ``s_i = exp(mean_t (logp - logp_old))`` on every token as ``sg[s_i] pi / sg[pi]`` (same value
    as ``s_i``, and the same gradient when the advantage is per sequence), clipped like PPO."""
    log_s = masked_mean(logp - logp_old, mask, dim=1).detach().reshape(-1, 1)
    log_ratio = log_s + logp - logp.detach()
    rho = torch.exp(log_ratio)
    return torch.maximum(-advantages * rho, -advantages * torch.clamp(rho, 1 - clip_low, 1 + clip_high))


def value_token_losses(values: Tensor, values_old: Tensor, returns: Tensor, clip_eps: float) -> Tensor:
    """Clipped value loss per token: ``0.5 max((V - R)^2, (clip(V, V_old - eps, V_old + eps) - R)^2)``
    (verl ``compute_value_loss``, ``cliprange_value``)."""
    clipped = values_old + torch.clamp(values - values_old, -clip_eps, clip_eps)
    return 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)


__all__ = [
    "KLKind",
    "LossAgg",
    "aggregate",
    "aggregation_weight",
    "broadcast_to_tokens",
    "discounted_returns",
    "gae",
    "group_norm_advantages",
    "gspo_token_losses",
    "kl_estimate",
    "kl_shaped_rewards",
    "leave_one_out_advantages",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "ppo_token_losses",
    "value_token_losses",
]

"""The RL algorithm math against hand-computed cases (algorithms.md §3)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rlperf.runtime.algo_math import (  # noqa: E402
    aggregate,
    aggregation_weight,
    discounted_returns,
    gae,
    group_norm_advantages,
    gspo_token_losses,
    kl_estimate,
    kl_shaped_rewards,
    leave_one_out_advantages,
    masked_whiten,
    ppo_token_losses,
    value_token_losses,
)

T = torch.tensor


def close(a: torch.Tensor, b: list[float] | list[list[float]] | float, tol: float = 1e-6) -> None:
    assert torch.allclose(a.double(), torch.as_tensor(b, dtype=torch.float64), atol=tol), (a, b)


# ------------------------------------------------------------------ advantages
def test_grpo_group_normalization_by_hand() -> None:
    # mean 0.5; unbiased std = sqrt(4 x 0.25 / 3) = sqrt(1/3); 0.5 / sqrt(1/3) = 0.8660254
    adv = group_norm_advantages(T([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]), eps=0.0 + 1e-12)
    close(adv[0], [0.8660254, -0.8660254, -0.8660254, 0.8660254])
    close(adv[1], [0.0, 0.0, 0.0, 0.0])  # equal rewards carry no signal


def test_grpo_eps_and_group_of_one() -> None:
    adv = group_norm_advantages(T([[1.0, 0.0]]), eps=0.5)
    # std of (1, 0), unbiased = sqrt(0.5) = 0.70711; 0.5 / (0.70711 + 0.5) = 0.41421
    close(adv, [[0.41421356, -0.41421356]])
    close(group_norm_advantages(T([[3.0], [5.0]])), [[3.0], [5.0]], tol=1e-5)  # mean 0, std 1


def test_dr_grpo_has_no_std() -> None:
    close(group_norm_advantages(T([[1.0, 0.0, 0.0, 1.0]]), by_std=False), [[0.5, -0.5, -0.5, 0.5]])


def test_rloo_leave_one_out_by_hand() -> None:
    # r_0 = 1 - (0 + 0 + 1)/3 = 2/3; r_1 = 0 - (1 + 0 + 1)/3 = -2/3
    adv = leave_one_out_advantages(T([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]]))
    close(adv[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3])
    close(adv[1], [3 - 5 / 3, 1 - 7 / 3, 2 - 2, 2 - 2])


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=2, max_size=8))
def test_rloo_equals_scaled_mean_baseline(rs: list[float]) -> None:
    # verl's form: k/(k-1) (r_i - mean r)
    r = torch.tensor([rs], dtype=torch.float64)
    k = len(rs)
    close(leave_one_out_advantages(r), (k / (k - 1) * (r - r.mean())).tolist(), tol=1e-9)


def test_gae_three_steps_by_hand() -> None:
    # gamma 0.9, lambda 0.8, reward 1 at the end, V = (0.5, 0.6, 0.7):
    # d2 = 1 - 0.7 = 0.3                 A2 = 0.3
    # d1 = 0.9*0.7 - 0.6 = 0.03          A1 = 0.03 + 0.72*0.3   = 0.246
    # d0 = 0.9*0.6 - 0.5 = 0.04          A0 = 0.04 + 0.72*0.246 = 0.21712
    r = T([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    v = T([[0.5, 0.6, 0.7, 9.0], [0.5, 0.6, 0.7, 9.0]])
    mask = T([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv, ret = gae(r, v, mask, gamma=0.9, lam=0.8)
    close(adv[0], [0.21712, 0.246, 0.3, 0.0])
    close(ret[0], [0.71712, 0.846, 1.0, 0.0])
    # the second row has a 4th real token with V = 9: d3 = -9, A2 = 1 + 0.9*9 - 0.7 + 0.72*(-9)
    assert adv[1, 3].item() == pytest.approx(-9.0)
    assert adv[1, 2].item() == pytest.approx(1 + 8.1 - 0.7 - 6.48)


def test_gae_with_lambda_one_is_return_minus_value() -> None:
    # gamma = lambda = 1 (verl defaults): A_t = sum_{s>=t} r_s - V_t
    r = T([[0.1, -0.2, 1.0]])
    v = T([[0.3, 0.2, 0.4]])
    adv, ret = gae(r, v, torch.ones(1, 3), 1.0, 1.0)
    close(adv, [[0.9 - 0.3, 0.8 - 0.2, 1.0 - 0.4]])
    close(ret, [[0.9, 0.8, 1.0]])


def test_discounted_returns_and_kl_shaped_rewards_by_hand() -> None:
    close(discounted_returns(T([[1.0, 2.0, 3.0, 0.0]]), T([[1.0, 1.0, 1.0, 0.0]]), gamma=0.5), [[2.75, 3.5, 3.0, 0.0]])
    # k1 = old - ref = (0.5, 0, -1); -0.1 k1 = (-0.05, 0, 0.1); score 1 at the last token
    rw = kl_shaped_rewards(T([1.0]), T([[-1.0, -2.0, -3.0, 0.0]]), T([[-1.5, -2.0, -2.0, 0.0]]), T([[1.0, 1.0, 1.0, 0.0]]), beta=0.1)
    close(rw, [[-0.05, 0.0, 1.1, 0.0]])


def test_masked_whiten_by_hand() -> None:
    # mean 2, unbiased var 1; padding ignored and left at 0
    close(masked_whiten(T([[1.0, 2.0], [3.0, 100.0]]), T([[1.0, 1.0], [1.0, 0.0]])), [[-1.0, 0.0], [1.0, 0.0]], tol=1e-6)


# ------------------------------------------------------------------ policy loss
def _ppo(rho: float, a: float, **kw: float) -> float:
    return ppo_token_losses(T([math.log(rho)]), T([0.0]), T([a]), **kw).item()


def test_ppo_clipping_regions() -> None:
    assert _ppo(1.5, 1.0) == pytest.approx(-1.2)  # A > 0, rho above 1 + eps: clipped
    assert _ppo(0.5, 1.0) == pytest.approx(-0.5)  # A > 0, rho below 1 - eps: unclipped (pessimistic)
    assert _ppo(1.5, -1.0) == pytest.approx(1.5)  # A < 0, rho above: unclipped
    assert _ppo(0.5, -1.0) == pytest.approx(0.8)  # A < 0, rho below 1 - eps: clipped
    assert _ppo(1.1, 2.0) == pytest.approx(-2.2)  # inside the trust region: -A rho


def test_dapo_clip_higher() -> None:
    assert _ppo(1.25, 1.0, clip_low=0.2, clip_high=0.2) == pytest.approx(-1.2)
    assert _ppo(1.25, 1.0, clip_low=0.2, clip_high=0.28) == pytest.approx(-1.25)  # room up to 1.28
    assert _ppo(1.5, 1.0, clip_low=0.2, clip_high=0.28) == pytest.approx(-1.28)
    assert _ppo(0.5, -1.0, clip_low=0.2, clip_high=0.28) == pytest.approx(0.8)  # low side unchanged


def test_dual_clip_bounds_negative_advantages() -> None:
    assert _ppo(5.0, -1.0) == pytest.approx(5.0)
    assert _ppo(5.0, -1.0, clip_c=3.0) == pytest.approx(3.0)  # min(5, -A c)
    assert _ppo(5.0, 1.0, clip_c=3.0) == pytest.approx(-1.2)  # A > 0 untouched


def test_clipped_tokens_have_no_gradient() -> None:
    logp = torch.tensor([math.log(1.5), math.log(1.1)], requires_grad=True)
    ppo_token_losses(logp, torch.zeros(2), torch.ones(2)).sum().backward()
    assert logp.grad is not None
    close(logp.grad, [0.0, -1.1])  # d(-A rho)/d logp = -A rho


def test_gspo_sequence_ratio() -> None:
    # s = exp(mean(0.1, 0.3)) = exp(0.2) = 1.2214 > 1.2: clipped on both tokens
    close(gspo_token_losses(T([[0.1, 0.3]]), torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2), 0.2, 0.2), [[-1.2, -1.2]])
    logp = torch.tensor([[0.05, 0.05, 7.0]], requires_grad=True)
    mask = T([[1.0, 1.0, 0.0]])
    loss = gspo_token_losses(logp, torch.zeros(1, 3), torch.ones(1, 3), mask, 0.2, 0.2)
    s = math.exp(0.05)
    close(loss[:, :2], [[-s, -s]])
    aggregate(loss, mask, "sequence_ratio").backward()
    assert logp.grad is not None
    close(logp.grad, [[-s / 2, -s / 2, 0.0]])  # d/dlogp_t of -A s_i = -A s_i / |y|


# ------------------------------------------------------------------ aggregation
LOSS = T([[1.0, 1.0, 1.0, 1.0], [3.0, 5.0, 5.0, 5.0]])
MASK = T([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])


def test_token_mean_vs_sequence_mean() -> None:
    assert aggregate(LOSS, MASK, "token_mean").item() == pytest.approx(7 / 5)  # long responses weigh more
    assert aggregate(LOSS, MASK, "seq_mean_token_mean").item() == pytest.approx((1 + 3) / 2)
    assert aggregate(LOSS, MASK, "seq_mean_token_sum_norm", norm_tokens=4).item() == pytest.approx((4 + 3) / 2 / 4)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batch_weights_recover_the_whole(mode: str) -> None:
    loss = torch.arange(15, dtype=torch.float64).reshape(5, 3)
    mask = T([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1], [1, 0, 0]]).double()
    whole = aggregate(loss, mask, mode, norm_tokens=3)  # type: ignore[arg-type]
    parts = 0.0
    for rows in ([0, 1], [2], [3, 4]):
        m = mask[rows]
        w = aggregation_weight(m, mode, float(mask.sum()), 5)  # type: ignore[arg-type]
        parts += w * aggregate(loss[rows], m, mode, norm_tokens=3).item()  # type: ignore[arg-type]
    assert parts == pytest.approx(whole.item())


# ------------------------------------------------------------------ value loss
def test_clipped_value_loss_by_hand() -> None:
    # V=1, V_old=0.5, R=0, eps 0.2: max((1-0)^2, (0.7-0)^2) / 2 = 0.5
    # V=0.2, V_old=0.5, R=1: max(0.64, (0.3-1)^2 = 0.49) / 2 = 0.32
    # V=0.6, V_old=0.5, R=2: max(1.96, (0.6-2)^2) / 2 = 0.98 (inside the clip range)
    close(value_token_losses(T([1.0, 0.2, 0.6]), T([0.5, 0.5, 0.5]), T([0.0, 1.0, 2.0]), 0.2), [0.5, 0.32, 0.98])


# ------------------------------------------------------------------ KL estimators
def test_kl_estimators_by_hand() -> None:
    # log pi = -1, log pi_ref = -2: lr = 1, r = pi_ref/pi = e^-1
    lp, lref = T([-1.0]), T([-2.0])
    assert kl_estimate(lp, lref, "k1").item() == pytest.approx(1.0)
    assert kl_estimate(lp, lref, "k2").item() == pytest.approx(0.5)
    assert kl_estimate(lp, lref, "k3").item() == pytest.approx(math.exp(-1) - 1 + 1)
    for k in ("k1", "k2", "k3"):
        assert kl_estimate(T([-0.7]), T([-0.7]), k).item() == 0.0  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.floats(-30, 0), st.floats(-30, 0))
def test_k2_and_k3_are_nonnegative(lp: float, lref: float) -> None:
    for k in ("k2", "k3"):
        assert kl_estimate(torch.tensor([lp], dtype=torch.float64), torch.tensor([lref], dtype=torch.float64), k).item() >= 0  # type: ignore[arg-type]


def test_k1_and_k3_are_unbiased_k2_is_not() -> None:
    p = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
    q = torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2], dtype=torch.float64)
    true_kl = float((p * (p / q).log()).sum())
    lp, lq = p.log(), q.log()
    # exact expectation under pi
    for k in ("k1", "k3"):
        assert float((p * kl_estimate(lp, lq, k)).sum()) == pytest.approx(true_kl, rel=1e-12)  # type: ignore[arg-type]
    assert abs(float((p * kl_estimate(lp, lq, "k2")).sum()) - true_kl) > 0.01
    # Monte-Carlo: seeded samples from pi, within 4 standard errors
    gen = torch.Generator().manual_seed(0)
    y = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    for k in ("k1", "k3"):
        est = kl_estimate(lp[y], lq[y], k)  # type: ignore[arg-type]
        se = float(est.std()) / math.sqrt(y.numel())
        assert abs(float(est.mean()) - true_kl) < 4 * se
    # k3 has the lower variance here (the reason for verl's "low_var_kl")
    assert float(kl_estimate(lp[y], lq[y], "k3").var()) < float(kl_estimate(lp[y], lq[y], "k1").var())

"""Preference and RL losses against their published formulas, written out by hand with `math`."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from self_improve.pairs import group_advantages
from self_improve.training.losses import (
    cream_loss,
    dpo_loss,
    grpo_loss,
    ipo_loss,
    sft_loss,
    spin_loss,
    with_nll,
)

F64 = torch.float64

# Two pairs: summed log-probs of chosen / rejected under the policy and the reference.
PC, PR, RC, RR = [-3.0, -5.0], [-4.0, -4.5], [-3.5, -4.0], [-3.8, -4.2]


def t(values, grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=grad)


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def dpo_by_hand(pc, pr, rc, rr, beta) -> list[float]:
    return [-log_sigmoid(beta * ((a - c) - (b - d))) for a, b, c, d in zip(pc, pr, rc, rr)]


def test_dpo_matches_formula():
    beta = 0.1
    loss, stats = dpo_loss(t(PC), t(PR), t(RC), t(RR), beta)
    assert loss.item() == pytest.approx(statistics.fmean(dpo_by_hand(PC, PR, RC, RR, beta)), rel=1e-12)
    assert stats["chosen_reward"].tolist() == pytest.approx([beta * (a - c) for a, c in zip(PC, RC)])
    assert stats["reward_accuracy"].tolist() == [1.0, 0.0]


def test_nll_term_matches_formula():
    """Iterative RPO: DPO + w * mean(NLL of the chosen answer); w = 0 is the loss unchanged."""
    beta, w, nll = 0.5, 0.7, [1.2, 0.4]
    dpo, _ = dpo_loss(t(PC), t(PR), t(RC), t(RR), beta)
    expected = statistics.fmean(d + w * n for d, n in zip(dpo_by_hand(PC, PR, RC, RR, beta), nll))
    assert with_nll(dpo, t(nll), w).item() == pytest.approx(expected, rel=1e-12)
    assert with_nll(dpo, t(nll), 0.0) is dpo
    with pytest.raises(ValueError, match="weight"):
        with_nll(dpo, t(nll), -1.0)


def test_dpo_prefers_chosen():
    ref = t([-4.0])
    chosen_up, _ = dpo_loss(t([-2.0]), t([-6.0]), ref, ref, 0.1)
    rejected_up, _ = dpo_loss(t([-6.0]), t([-2.0]), ref, ref, 0.1)
    assert chosen_up < rejected_up
    good, bad = t([-1.0] * 3, grad=True), t([-5.0] * 3, grad=True)
    loss, _ = dpo_loss(good, bad, t([0.0] * 3), t([0.0] * 3), 0.1)
    loss.backward()
    assert good.grad.lt(0).all() and bad.grad.gt(0).all()  # descent raises chosen, lowers rejected


def test_sft_loss_is_token_mean():
    logps = torch.tensor([[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert sft_loss(logps, mask).item() == pytest.approx(2.0)


@pytest.mark.parametrize("fn", [dpo_loss, ipo_loss, spin_loss])
def test_stats_are_detached_and_loss_has_gradient(fn):
    pc, pr = t(PC, grad=True), t(PR, grad=True)
    loss, stats = fn(pc, pr, t(RC), t(RR), 0.1)
    assert loss.requires_grad
    assert all(not v.requires_grad for v in stats.values())
    loss.backward()
    assert pc.grad is not None and pc.grad.abs().sum() > 0


def test_ipo_matches_formula():
    beta = 0.25
    loss, stats = ipo_loss(t(PC), t(PR), t(RC), t(RR), beta)
    expected = statistics.fmean(((a - c) - (b - d) - 1 / (2 * beta)) ** 2 for a, b, c, d in zip(PC, PR, RC, RR))
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert stats["reward_margin"].tolist() == pytest.approx(
        [beta * ((a - c) - (b - d)) for a, b, c, d in zip(PC, PR, RC, RR)]
    )
    # The optimum sits at h = 1/(2 beta), where the loss and its gradient vanish.
    pc = t([2.0], grad=True)
    at_target, _ = ipo_loss(pc, t([0.0]), t([0.0]), t([0.0]), beta)
    at_target.backward()
    assert at_target.item() == 0.0 and pc.grad.item() == 0.0


def test_spin_is_dpo_real_vs_generated():
    beta = 0.3
    loss, stats = spin_loss(t(PC), t(PR), t(RC), t(RR), beta)
    assert loss.item() == pytest.approx(statistics.fmean(dpo_by_hand(PC, PR, RC, RR, beta)), rel=1e-12)
    assert stats["chosen_reward"].tolist() == pytest.approx([beta * (a - c) for a, c in zip(PC, RC)])


def test_cream_matches_formula():
    beta, cons = 0.2, [0.9, 0.3]
    loss, stats = cream_loss(t(PC), t(PR), t(RC), t(RR), t(cons), beta)
    expected = statistics.fmean(
        c * -log_sigmoid(beta * ((a - x) - (b - y))) + (1 - c) * -log_sigmoid(beta * ((b - y) - (a - x)))
        for a, b, x, y, c in zip(PC, PR, RC, RR, cons)
    )
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert not any(v.requires_grad for v in stats.values())


def test_cream_extremes_are_dpo_and_swapped_dpo():
    beta = 0.2
    ones, zeros = t([1.0, 1.0]), t([0.0, 0.0])
    c1, _ = cream_loss(t(PC), t(PR), t(RC), t(RR), ones, beta)
    c0, _ = cream_loss(t(PC), t(PR), t(RC), t(RR), zeros, beta)
    dpo, _ = dpo_loss(t(PC), t(PR), t(RC), t(RR), beta)
    swapped, _ = dpo_loss(t(PR), t(PC), t(RR), t(RC), beta)
    assert c1.item() == pytest.approx(dpo.item(), rel=1e-12)
    assert c0.item() == pytest.approx(swapped.item(), rel=1e-12)


def test_cream_half_consistency_pulls_margin_to_zero():
    half = t([0.5])
    # At margin 0 the gradient is exactly 0.
    pc = t([-4.0], grad=True)
    loss, _ = cream_loss(pc, t([-4.0]), t([-4.0]), t([-4.0]), half, 1.0)
    loss.backward()
    assert pc.grad.item() == 0.0
    # Elsewhere d loss / d margin = 0.5 * (sigmoid(m) - sigmoid(-m)) = 0.5 * tanh(m / 2): towards 0.
    pc = t([-3.0], grad=True)
    loss, _ = cream_loss(pc, t([-4.0]), t([-4.0]), t([-4.0]), half, 1.0)
    loss.backward()
    assert pc.grad.item() == pytest.approx(0.5 * math.tanh(0.5), rel=1e-12)


def test_cream_rejects_consistency_outside_unit_interval():
    for bad in ([1.5, 0.5], [-0.1, 0.5], [float("nan"), 0.5]):
        with pytest.raises(ValueError):
            cream_loss(t(PC), t(PR), t(RC), t(RR), t(bad), 0.1)


def test_group_advantages_unbiased_std():
    rewards = [1.0, 0.0, 0.0, 1.0]
    mean = 0.5
    std = math.sqrt(sum((x - mean) ** 2 for x in rewards) / 3)
    assert group_advantages(rewards).tolist() == pytest.approx([(r - mean) / (std + 1e-4) for r in rewards],
                                                               rel=1e-12)
    # mean 0.5833, std 0.3819 (n - 1): by hand
    assert group_advantages([1.0, 0.5, 0.25]).tolist() == pytest.approx([1.0908, -0.2182, -0.8726], abs=1e-4)


def test_group_advantages_flat_and_singleton_groups_are_zero():
    assert group_advantages([0.1, 0.1, 0.1]).tolist() == [0.0, 0.0, 0.0]
    assert group_advantages([0.7]).tolist() == [0.0]
    adv = group_advantages([1.0, 0.0])
    assert adv[0] > 0 > adv[1]


def test_grpo_flat_group_gives_zero_gradient():
    adv = t(group_advantages([0.5, 0.5]).tolist())
    logps = t([[-1.0, -2.0], [-0.5, 0.0]], grad=True)
    mask = t([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = grpo_loss(logps, logps.detach() - 0.1, adv, mask)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(logps.grad, torch.zeros_like(logps))


def test_grpo_matches_formula():
    lp = [[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]]
    old = [[-1.1, -0.9, -2.0], [-0.2, -1.0, 0.0]]
    ref = [[-1.3, -0.4, -1.5], [-0.6, -1.1, 0.0]]
    mask = [[1, 1, 1], [1, 1, 0]]
    adv, eps, beta = [1.5, -0.8], 0.2, 0.05
    loss, stats = grpo_loss(t(lp), t(old), t(adv), t(mask), eps, t(ref), beta)
    terms, kls, clipped = [], [], []
    for i in range(2):
        for j in range(3):
            if not mask[i][j]:
                continue
            ratio = math.exp(lp[i][j] - old[i][j])
            surrogate = min(ratio * adv[i], min(max(ratio, 1 - eps), 1 + eps) * adv[i])
            d = ref[i][j] - lp[i][j]
            kl = math.exp(d) - d - 1
            terms.append(-surrogate + beta * kl)
            kls.append(kl)
            clipped.append(ratio * adv[i] > min(max(ratio, 1 - eps), 1 + eps) * adv[i])
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)
    assert stats["kl"].item() == pytest.approx(sum(kls) / len(kls), rel=1e-12)
    assert stats["clip_fraction"].item() == pytest.approx(sum(clipped) / len(clipped))
    assert 0 < stats["clip_fraction"].item() < 1
    with pytest.raises(ValueError):
        grpo_loss(t(lp), t(old), t(adv), t(mask), kl_beta=0.1)


def test_grpo_kl_zero_at_reference():
    logps = t([[-1.0, -2.0, -0.7]], grad=True)
    mask = t([[1.0, 1.0, 1.0]])
    loss, stats = grpo_loss(logps, logps.detach(), t([0.0]), mask, ref_logps=logps.detach(), kl_beta=1.0)
    loss.backward()
    assert loss.item() == 0.0 and stats["kl"].item() == 0.0
    assert torch.equal(logps.grad, torch.zeros_like(logps))


def test_grpo_clipped_ratio_has_no_gradient():
    logps = t([[-0.5, -1.0]], grad=True)
    old = t([[-1.0, -1.0]])  # ratio e^0.5 > 1.2 on token 0, 1 on token 1
    loss, stats = grpo_loss(logps, old, t([2.0]), t([[1.0, 0.0]]), clip_eps=0.2)
    loss.backward()
    assert loss.item() == pytest.approx(-1.2 * 2.0, rel=1e-12)
    assert logps.grad.tolist() == [[0.0, 0.0]]
    assert stats["clip_fraction"].item() == 1.0


def test_grpo_on_policy_is_minus_token_weighted_advantage():
    logps = t([[-1.0, -2.0, -3.0], [-0.5, -0.1, 0.0]], grad=True)
    mask = t([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = [0.4, -1.0]
    loss, stats = grpo_loss(logps, logps.detach(), t(adv), mask)
    assert stats["ratio_mean"].item() == 1.0 and stats["clip_fraction"].item() == 0.0
    assert loss.item() == pytest.approx(-(3 * adv[0] + 2 * adv[1]) / 5, rel=1e-12)
    loss.backward()
    # d/dlogp of -ratio * A at ratio 1 is -A / n_tokens on each unmasked token.
    assert logps.grad.flatten().tolist() == pytest.approx([-0.4 / 5] * 3 + [1.0 / 5, 1.0 / 5, 0.0])


# NFT (arXiv 2505.18116): right samples -log R, wrong ones -log max_v((1 - r R) / (1 - r), eps), times omega(q)


def test_nft_matches_a_hand_computed_case():
    from self_improve.training.losses import nft_loss

    # one token each; right sample R = 2, wrong sample R = 0.5, r_q = 0.5, omega = 1 - r_q = 0.5
    logps = torch.tensor([[math.log(2.0)], [math.log(0.5)]], dtype=F64, requires_grad=True)
    old = torch.zeros(2, 1, dtype=F64)
    labels, rate, mask = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5]), torch.ones(2, 1)
    loss, stats = nft_loss(logps, old, labels, rate, mask)
    proxy = (1 - 0.5 * 0.5) / (1 - 0.5)  # 1.5, above eps = 1
    assert loss.item() == pytest.approx((0.5 * -math.log(2.0) + 0.5 * -math.log(proxy)) / 2)
    loss.backward()
    # d/dlogp: right -omega; wrong -omega / proxy * (-r R / (1 - r)); token mean over 2
    assert logps.grad[:, 0].tolist() == pytest.approx([-0.5 / 2, -0.5 / proxy * (-0.5 * 0.5 / 0.5) / 2])
    assert stats["negative_clipped"].item() == 0.0


def test_nft_floor_keeps_the_gradient_below_eps():
    from self_improve.training.losses import nft_loss

    # wrong sample pushed up to R = 1.8 with r_q = 0.5: proxy 0.2 < eps 1, value log(1) = 0, gradient of x kept
    logps = torch.tensor([[math.log(1.8)]], dtype=F64, requires_grad=True)
    loss, stats = nft_loss(logps, torch.zeros(1, 1, dtype=F64), torch.tensor([0.0]), torch.tensor([0.5]),
                           torch.ones(1, 1))
    assert loss.item() == pytest.approx(0.0)
    loss.backward()
    assert logps.grad.item() == pytest.approx(-0.5 / 1.0 * (-0.5 * 1.8 / 0.5))
    assert stats["negative_clipped"].item() == 1.0


def test_nft_on_policy_gradient_is_grpo_with_unnormalised_advantages():
    """The paper's Prop. 4.2: at R = 1, NFT's gradient (omega = 1 - r_q) is GRPO's with A = label - r_q."""
    from self_improve.training.losses import nft_loss

    g = torch.Generator().manual_seed(0)
    logps = (-torch.rand(4, 5, generator=g, dtype=F64) * 3)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=F64)
    labels, rate = torch.tensor([1.0, 0.0, 1.0, 0.0]), torch.tensor([0.25, 0.25, 0.75, 0.75])
    a = logps.clone().requires_grad_(True)
    nft_loss(a * mask, (logps * mask).detach(), labels, rate, mask)[0].backward()
    b = logps.clone().requires_grad_(True)
    grpo_loss(b * mask, (logps * mask).detach(), (labels - rate).to(F64), mask)[0].backward()
    assert torch.allclose(a.grad, b.grad)


def test_nft_without_negatives_is_rejection_sampling_fine_tuning():
    from self_improve.training.losses import nft_loss

    g = torch.Generator().manual_seed(1)
    logps = (-torch.rand(3, 4, generator=g, dtype=F64) * 2)
    old = (logps - 0.3).detach()  # off-policy: R != 1, so the negatives would matter
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=F64)
    labels, rate = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0.6, 0.6, 0.6])
    a = logps.clone().requires_grad_(True)
    nft_loss(a * mask, old * mask, labels, rate, mask, neg_weight=0.0, omega="none")[0].backward()
    b = logps.clone().requires_grad_(True)
    right = labels.bool()
    sft_loss((b * mask)[right], mask[right]).backward()
    # token-mean over every token vs over the right samples' tokens: the same direction, scaled
    assert torch.allclose(a.grad, b.grad * mask[right].sum() / mask.sum())
    c = logps.clone().requires_grad_(True)
    nft_loss(c * mask, old * mask, labels, rate, mask, neg_weight=1.0, omega="none")[0].backward()
    assert not torch.allclose(c.grad[1], torch.zeros(4, dtype=F64))  # the wrong sample is trained on


def test_nft_weights_and_rate_clamp():
    from self_improve.training.losses import nft_weights

    r = torch.tensor([0.0, 0.5, 1.0])
    assert nft_weights(r).tolist() == pytest.approx([0.98, 0.5, 0.02])
    assert nft_weights(r, "sqrt").tolist() == pytest.approx([math.sqrt(0.98 / 0.02), 1.0, math.sqrt(0.02 / 0.98)])
    assert nft_weights(r, "none").tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(ValueError, match="omega"):
        nft_weights(r, "bad")

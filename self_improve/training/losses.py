"""Training losses as pure functions. Shapes: B = batch, T = tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sft_loss(token_logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token-mean negative log-likelihood of the response tokens (RAFT / ReST / STaR).

    token_logps: (B, T) log-probs of the target tokens, 0 where masked.
    mask: (B, T) 1 on response tokens.
    Returns a scalar.
    """
    return -(token_logps * mask).sum() / mask.sum().clamp(min=1)


def weighted_mean(losses: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """mean(weight * losses) over the batch; no weight: the plain mean.

    losses: (B,) per-pair losses. weight: (B,) per-pair weights >= 0, no gradient (ScPO weighs each
    pair by its vote margin (v+ - v-) / k; the mean is over pairs, as ScPO's loss averages over them).
    """
    if weight is None:
        return losses.mean()
    w = weight.detach().to(losses.dtype)
    if w.shape != losses.shape:
        raise ValueError(f"weighted_mean: weight shape {tuple(w.shape)} != {tuple(losses.shape)}")
    if bool((w < 0).any()):
        raise ValueError("weighted_mean: weights must be >= 0")
    return (w * losses).mean()


def _pair_rewards(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Implicit rewards beta * (pi - ref) (B,) of both responses and their detached diagnostics:
    chosen_reward, rejected_reward, reward_margin and reward_accuracy (B,), as TRL logs them."""
    chosen_reward = beta * (policy_chosen - ref_chosen)
    rejected_reward = beta * (policy_rejected - ref_rejected)
    stats = {
        "chosen_reward": chosen_reward.detach(),
        "rejected_reward": rejected_reward.detach(),
        "reward_margin": (chosen_reward - rejected_reward).detach(),
        "reward_accuracy": (chosen_reward > rejected_reward).float().detach(),
    }
    return chosen_reward, rejected_reward, stats


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sigmoid DPO (Rafailov et al. 2023).

    loss = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r)))

    policy_chosen, policy_rejected, ref_chosen, ref_rejected: (B,) summed log-probs of each
    response under the policy and the reference.
    weight: (B,) optional per-pair weights (`weighted_mean`).
    Returns the mean loss (scalar) and detached diagnostics: implicit rewards (B,) and margins.
    The NLL term of iterative RPO is `with_nll`, added by the caller for every algorithm alike.
    """
    chosen_reward, rejected_reward, stats = _pair_rewards(
        policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta
    )
    return weighted_mean(-F.logsigmoid(chosen_reward - rejected_reward), weight), stats


def with_nll(loss: torch.Tensor, chosen_nll: torch.Tensor, weight: float,
             pair_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Iterative RPO's NLL term (Pang et al. 2024): loss + weight * mean(pair_weight * chosen_nll).

    loss: a preference loss (scalar, already a batch mean). chosen_nll: (B,) length-normalised
    NLL of the chosen response under the policy. weight >= 0; 0 gives `loss` unchanged.
    pair_weight: (B,) the pairs' own weights, as the preference term got them (ScPO weighs both).
    """
    if weight < 0:
        raise ValueError("with_nll: weight must be >= 0")
    return loss + weight * weighted_mean(chosen_nll, pair_weight) if weight > 0 else loss


def ipo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """IPO, the squared-loss preference objective of Azar et al. 2023 ("A General Theoretical Paradigm").

    h = (pi_c - ref_c) - (pi_r - ref_r)
    loss = mean((h - 1 / (2 * beta)) ** 2)

    policy_chosen, policy_rejected, ref_chosen, ref_rejected: (B,) log-probs of each response under
    the policy and the reference. As in TRL's DPOTrainer (loss_type="ipo"), callers pass
    length-normalised log-probs (the token mean, not the sum), so the target margin 1/(2 beta) does
    not depend on the response length. beta > 0 (here it is the regularisation strength tau).
    Returns the mean loss (scalar) and detached diagnostics like dpo_loss: implicit rewards
    beta * (pi - ref) (B,), their margin and accuracy.
    """
    if beta <= 0:
        raise ValueError("ipo_loss: beta must be > 0")
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    losses = (h - 1 / (2 * beta)) ** 2
    _, _, stats = _pair_rewards(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
    return weighted_mean(losses, weight), stats


def spin_loss(
    policy_real: torch.Tensor,
    policy_generated: torch.Tensor,
    ref_real: torch.Tensor,
    ref_generated: torch.Tensor,
    beta: float,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """SPIN, self-play fine-tuning (Chen et al. 2024), with the logistic loss.

    loss = -log sigmoid(beta * ((pi_real - ref_real) - (pi_gen - ref_gen)))

    i.e. sigmoid DPO with chosen = the real (reference) answer and rejected = the answer generated
    by the previous iterate, which is also the reference model; no NLL term.
    policy_real, policy_generated, ref_real, ref_generated: (B,) summed log-probs.
    Returns the mean loss (scalar) and dpo_loss's detached diagnostics ("chosen" = real).
    """
    return dpo_loss(policy_real, policy_generated, ref_real, ref_generated, beta, weight)


def cream_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    consistency: torch.Tensor,
    beta: float,
    weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CREAM, consistency-regularised self-rewarding DPO (Wang et al. 2024).

    DPO(a, b) = -log sigmoid(beta * ((pi_a - ref_a) - (pi_b - ref_b)))
    loss = mean(C * DPO(y+, y-) + (1 - C) * DPO(y-, y+))

    With C = 1 this is DPO, with C = 0 DPO on the swapped pair; C = 0.5 pulls the margin towards 0
    (its gradient vanishes at margin 0), so an unreliable self-reward label is not over-fitted.
    policy_chosen, policy_rejected, ref_chosen, ref_rejected: (B,) summed log-probs of y+ and y-.
    consistency: (B,) per-pair consistency C in [0, 1] of the self-rewarding judge (no gradient).
    Returns the mean loss (scalar) and dpo_loss's detached diagnostics plus the mean consistency.
    """
    c = consistency.detach()
    if c.shape != policy_chosen.shape:
        raise ValueError(f"cream_loss: consistency shape {tuple(c.shape)} != {tuple(policy_chosen.shape)}")
    if not bool(((c >= 0) & (c <= 1)).all()):
        raise ValueError("cream_loss: consistency must lie in [0, 1]")
    chosen_reward, rejected_reward, stats = _pair_rewards(
        policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta
    )
    margin = chosen_reward - rejected_reward
    c = c.to(margin.dtype)
    losses = -c * F.logsigmoid(margin) - (1 - c) * F.logsigmoid(-margin)
    stats["consistency"] = c.mean()
    return weighted_mean(losses, weight), stats


def grpo_loss(
    token_logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    ref_logps: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO clipped surrogate (Shao et al. 2024), token-mean aggregated as TRL's GRPOTrainer ("bnpo").

    ratio = exp(logp - old)
    per_token = -min(ratio * A, clamp(ratio, 1 - eps, 1 + eps) * A) + kl_beta * kl
    kl = exp(ref - logp) - (ref - logp) - 1          (k3 estimator of KL(pi || ref), 0 at the reference)
    loss = sum(per_token * mask) / max(sum(mask), 1)

    token_logps: (B, T) per-token log-probs of the sampled response tokens under the policy,
    0 where masked. old_logps: (B, T) the same under the sampling policy (treated as constant;
    equal to token_logps.detach() on the first update). ref_logps: (B, T) the same under the
    reference model (constant), needed when kl_beta > 0. advantages: (B,) one per sequence,
    e.g. from self_improve.pairs.group_advantages. mask: (B, T) 1 on response tokens.
    Returns the loss (scalar) and detached diagnostics over the unmasked tokens: mean kl (0 without
    ref_logps), clip_fraction (share of tokens where the clipped term is the minimum: ratio > 1 + eps
    with A > 0 or ratio < 1 - eps with A < 0) and ratio_mean.
    """
    if kl_beta > 0 and ref_logps is None:
        raise ValueError("grpo_loss: kl_beta > 0 needs ref_logps")
    m = mask.to(token_logps.dtype)
    on = m > 0
    zero = torch.zeros_like(token_logps)
    log_ratio = torch.where(on, token_logps - old_logps.detach(), zero)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach().to(token_logps.dtype).unsqueeze(1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv
    per_token = -torch.min(unclipped, clipped)
    if ref_logps is not None:
        delta = torch.where(on, ref_logps.detach() - token_logps, zero)
        kl = torch.exp(delta) - delta - 1
    else:
        kl = zero
    if kl_beta > 0:
        per_token = per_token + kl_beta * kl
    n = m.sum().clamp(min=1)
    loss = (per_token * m).sum() / n
    is_clipped = ((ratio > 1 + clip_eps) & (adv > 0)) | ((ratio < 1 - clip_eps) & (adv < 0))
    stats = {
        "kl": ((kl * m).sum() / n).detach(),
        "clip_fraction": ((is_clipped.to(m.dtype) * m).sum() / n).detach(),
        "ratio_mean": ((ratio * m).sum() / n).detach(),
    }
    return loss, stats


NFT_RATE_CLIP = (0.02, 0.98)  # r_q clamped as the official code does: 1 - r_q R stays away from 0 and 1
NFT_MAX_LOG_RATIO = 10.0  # log R clamped before exp, as the official code does


def _keep_grad_max(x: torch.Tensor, floor: float) -> torch.Tensor:
    """max(x, floor) in value, the gradient of x everywhere (NFT's max_v: x + stopgrad(max(x, floor) - x))."""
    return x + (torch.clamp(x, min=floor) - x).detach()


def nft_weights(rate: torch.Tensor, omega: str = "one_minus_r") -> torch.Tensor:
    """NFT's prompt weight omega(q) from the prompt's (clamped) rate of right samples r_q:
    `one_minus_r` (the paper's default, normalize=1), `sqrt` (sqrt((1 - r_q) / r_q), normalize=2), `none` (1)."""
    r = rate.clamp(*NFT_RATE_CLIP)
    if omega == "one_minus_r":
        return 1 - r
    if omega == "sqrt":
        return ((1 - r) / r).sqrt()
    if omega == "none":
        return torch.ones_like(r)
    raise ValueError(f"nft: omega must be one_minus_r, sqrt or none, not {omega!r}")


def nft_loss(
    token_logps: torch.Tensor,
    old_logps: torch.Tensor,
    labels: torch.Tensor,
    rate: torch.Tensor,
    mask: torch.Tensor,
    eps: float = 1.0,
    neg_weight: float = 1.0,
    omega: str = "one_minus_r",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative-aware Fine-Tuning (Chen et al. 2025, arXiv 2505.18116; NVlabs/NFT, token ratios).

    R = exp(min(logp - old, 10)) per token (pi_theta / pi_old, old: the policy that sampled).
    right samples (label 1):  -log R
    wrong samples (label 0):  -log max_v((1 - r_q R) / (1 - r_q), eps) * neg_weight
        the implicit negative policy's likelihood; max_v keeps the gradient of x below eps
    per token loss * omega(q), masked, token-mean over the batch (the aggregation of grpo_loss;
    the official code sums tokens / 1000, a constant, which Adam's scale-invariance makes alike).

    token_logps, old_logps, mask: (B, T). labels: (B,) 1 right / 0 wrong. rate: (B,) r_q, the mean
    label of the sample's prompt (clamped to [0.02, 0.98] here). neg_weight 1: NFT; 0: rejection
    sampling fine-tuning (RFT, wrong samples dropped). At R = 1 (the first step) the gradient is
    GRPO's with advantage label - r_q and no std normalisation (the paper's Prop. 4.2).
    Returns the loss and detached diagnostics: ratio_mean, negative_clipped (share of wrong-sample
    tokens whose proxy fell below eps).
    """
    if not 0 < eps:
        raise ValueError("nft_loss: eps must be > 0")
    m = mask.to(token_logps.dtype)
    on = m > 0
    zero = torch.zeros_like(token_logps)
    log_ratio = torch.where(on, token_logps - old_logps.detach(), zero).clamp(max=NFT_MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    r = rate.detach().to(token_logps.dtype).clamp(*NFT_RATE_CLIP).unsqueeze(1)
    y = labels.detach().to(token_logps.dtype).unsqueeze(1)
    proxy = (1 - r * ratio) / (1 - r)
    positive = -torch.log(ratio)
    negative = -torch.log(_keep_grad_max(proxy, eps))
    w = nft_weights(rate.detach().to(token_logps.dtype), omega).unsqueeze(1)
    per_token = w * (y * positive + (1 - y) * neg_weight * negative)
    n = m.sum().clamp(min=1)
    loss = (per_token * m).sum() / n
    neg_tokens = ((1 - y) * m).sum().clamp(min=1)
    stats = {
        "ratio_mean": ((ratio * m).sum() / n).detach(),
        "negative_clipped": ((((proxy < eps) & on).to(m.dtype) * (1 - y)).sum() / neg_tokens).detach(),
    }
    return loss, stats

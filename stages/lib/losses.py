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


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
    chosen_nll: torch.Tensor | None = None,
    nll_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Sigmoid DPO (Rafailov et al. 2023), with the NLL term of iterative RPO (Pang et al. 2024).

    loss = -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))) + nll_weight * nll_c

    policy_chosen, policy_rejected, ref_chosen, ref_rejected: (B,) summed log-probs of each
    response under the policy and the reference. chosen_nll: (B,) length-normalised NLL of the
    chosen response under the policy (needed when nll_weight > 0).
    Returns the mean loss (scalar) and detached diagnostics: implicit rewards (B,) and margins.
    """
    chosen_reward = beta * (policy_chosen - ref_chosen)
    rejected_reward = beta * (policy_rejected - ref_rejected)
    losses = -F.logsigmoid(chosen_reward - rejected_reward)
    if nll_weight > 0:
        if chosen_nll is None:
            raise ValueError("dpo_loss: nll_weight > 0 needs chosen_nll")
        losses = losses + nll_weight * chosen_nll
    stats = {
        "chosen_reward": chosen_reward.detach(),
        "rejected_reward": rejected_reward.detach(),
        "reward_margin": (chosen_reward - rejected_reward).detach(),
        "reward_accuracy": (chosen_reward > rejected_reward).float().detach(),
    }
    return losses.mean(), stats

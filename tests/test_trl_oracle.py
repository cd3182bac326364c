"""TRL as the losses' oracle: each loss TRL also has, computed by TRL's own trainer code on the same fixed
tensors, equals ours in value and gradient (DPO, IPO, SPIN as DPO, the SFT term, GRPO as bnpo). The
trainers run their real loss code (`DPOTrainer._compute_loss`, `GRPOTrainer._compute_loss`); only the
model forward is replaced by the fixed per-token log-probs it would have returned."""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from self_improve.training.losses import dpo_loss, grpo_loss, ipo_loss, sft_loss, spin_loss, with_nll

trl = pytest.importorskip("trl")

TOL = 1e-6


class _Accelerator:
    device = torch.device("cpu")
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def _tokens(seed: int = 0, pairs: int = 4, width: int = 7):
    """Per-token log-probs of chosen then rejected responses (2B, T) under the policy (a leaf with a
    gradient) and the reference, and their masks: responses of different lengths, 0 past their end."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([1, 3, 7, 5, 6, 2, 4, 7][: 2 * pairs])
    mask = (torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)).float()
    policy = (-torch.rand(2 * pairs, width, generator=g) * 3 * mask).requires_grad_(True)
    ref = -torch.rand(2 * pairs, width, generator=g) * 3 * mask
    return policy, ref, mask


def _trl_dpo(loss_type: str, beta: float, policy: torch.Tensor, ref: torch.Tensor, mask: torch.Tensor):
    """TRL 1.16's DPOTrainer loss on these log-probs: its `_compute_loss` with the forward replaced."""
    trainer = trl.DPOTrainer.__new__(trl.DPOTrainer)
    net = torch.nn.Module().eval()  # eval: no token counting, no accumulation scaling
    zeros = torch.zeros_like(policy)
    outputs = SimpleNamespace(log_probs=policy * mask, entropy=zeros, mean_logits=zeros, is_top1=zeros.bool())
    vars(trainer).update(
        model=net, accelerator=_Accelerator(), aux_loss_enabled=False, ld_alpha=None, precompute_ref_logps=True,
        f_divergence_type="reverse_kl", loss_types=[loss_type], loss_weights=[1.0], beta=beta,
        label_smoothing=0.0, use_weighting=False, _metrics=defaultdict(lambda: defaultdict(list)),
        _total_train_tokens=0, _tp_size=1)
    rows, width = policy.shape
    completion = torch.cat([torch.zeros(rows, 1), mask], dim=1)  # the prompt's last token, then the response
    ref_seq = (ref * mask).sum(1)
    inputs = {"input_ids": torch.zeros(rows, width + 1, dtype=torch.long), "attention_mask": torch.ones(rows, width + 1),
              "completion_mask": completion, "ref_chosen_logps": ref_seq[: rows // 2],
              "ref_rejected_logps": ref_seq[rows // 2:]}
    return trainer._compute_loss(lambda **kw: outputs, inputs, return_outputs=False), trainer._metrics["eval"]


def _same(ours: torch.Tensor, theirs: torch.Tensor, leaf: torch.Tensor) -> None:
    g_ours, = torch.autograd.grad(ours, leaf)
    g_theirs, = torch.autograd.grad(theirs, leaf)
    assert abs(ours.item() - theirs.item()) < TOL, (ours.item(), theirs.item())
    assert torch.allclose(g_ours, g_theirs, atol=TOL), (g_ours - g_theirs).abs().max()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dpo_equals_trls_sigmoid_loss(seed):
    policy, ref, mask = _tokens(seed)
    seq, ref_seq = (policy * mask).sum(1), (ref * mask).sum(1)
    b = len(seq) // 2
    ours, stats = dpo_loss(seq[:b], seq[b:], ref_seq[:b], ref_seq[b:], beta=0.1)
    theirs, logged = _trl_dpo("sigmoid", 0.1, policy, ref, mask)
    _same(ours, theirs, policy)
    assert abs(stats["reward_margin"].mean().item() - logged["rewards/margins"][0]) < TOL
    assert abs(stats["reward_accuracy"].mean().item() - logged["rewards/accuracies"][0]) < TOL


@pytest.mark.parametrize("seed", [0, 1])
def test_spin_is_trls_sigmoid_loss_with_the_real_answer_chosen(seed):
    policy, ref, mask = _tokens(seed)
    seq, ref_seq = (policy * mask).sum(1), (ref * mask).sum(1)
    b = len(seq) // 2
    ours, _ = spin_loss(seq[:b], seq[b:], ref_seq[:b], ref_seq[b:], beta=0.5)
    theirs, _ = _trl_dpo("sigmoid", 0.5, policy, ref, mask)
    _same(ours, theirs, policy)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ipo_equals_trls_ipo_loss_on_token_mean_log_probs(seed):
    """IPO on token-mean log-probs, as TRL normalises it. Its logged rewards differ on purpose: TRL
    logs beta * (sum - ref sum), ours beta * (mean - ref mean), the quantities of the loss (docs/loop.md)."""
    policy, ref, mask = _tokens(seed)
    n = mask.sum(1)
    mean, ref_mean = (policy * mask).sum(1) / n, (ref * mask).sum(1) / n
    b = len(mean) // 2
    ours, stats = ipo_loss(mean[:b], mean[b:], ref_mean[:b], ref_mean[b:], beta=0.1)
    theirs, logged = _trl_dpo("ipo", 0.1, policy, ref, mask)
    _same(ours, theirs, policy)
    summed = 0.1 * (((policy - ref) * mask).sum(1))
    assert abs(logged["rewards/chosen"][0] - summed[:b].mean().item()) < TOL
    assert abs(stats["chosen_reward"].mean().item() - summed[:b].mean().item()) > 1e-3


def test_the_sft_term_is_trls_per_token_mean_and_rpo_alpha_averages_per_pair():
    """RAFT's loss (sft_loss) is TRL's `sft` term: the mean NLL over all chosen tokens of the batch. The
    NLL term of `rpo_alpha` averages each chosen answer's token mean over pairs (Iterative RPO, Pang et
    al. 2024): answers of 1 and 9 tokens at -1 and -3 per token give 2.0 here, 2.8 in TRL."""
    policy, ref, mask = _tokens(3)
    b = len(policy) // 2
    # the sft term alone: TRL's loss_types=["sft"]
    ours = sft_loss(policy[:b], mask[:b])
    theirs, _ = _trl_dpo("sft", 0.1, policy, ref, mask)
    _same(ours, theirs, policy)
    lengths = torch.tensor([1.0, 9.0])
    token_mask = (torch.arange(9).unsqueeze(0) < lengths.unsqueeze(1)).float()
    chosen = torch.cat([torch.full((1, 9), -1.0), torch.full((1, 9), -3.0)]) * token_mask
    per_token = sft_loss(chosen, token_mask)
    per_pair = with_nll(torch.tensor(0.0), -(chosen.sum(1) / lengths), 1.0)
    assert per_token.item() == pytest.approx(2.8) and per_pair.item() == pytest.approx(2.0)


def _trl_grpo(policy, old, ref, advantages, mask, epsilon: float, beta: float):
    """TRL 1.16's GRPOTrainer loss (loss_type bnpo, token level) on these log-probs."""
    trainer = trl.GRPOTrainer.__new__(trl.GRPOTrainer)
    zeros = torch.zeros_like(policy)
    vars(trainer).update(
        model=torch.nn.Module().eval(), accelerator=_Accelerator(), aux_loss_enabled=False,
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
        beta=beta, loss_type="bnpo", epsilon_low=epsilon, epsilon_high=epsilon, use_vllm=False,
        _entropy_bonus_enabled=False, args=SimpleNamespace(delta=None, use_bias_correction_kl=False),
        _metrics=defaultdict(lambda: defaultdict(list)))
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (policy, zeros, None)
    rows, width = policy.shape
    inputs = {"prompt_ids": torch.zeros(rows, 1, dtype=torch.long), "prompt_mask": torch.ones(rows, 1),
              "completion_ids": torch.zeros(rows, width, dtype=torch.long), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": ref}
    return trainer._compute_loss(None, inputs), trainer._metrics["eval"]


@pytest.mark.parametrize("seed,beta", [(0, 0.0), (1, 0.04), (2, 0.1)])
def test_grpo_equals_trls_bnpo_loss(seed, beta):
    """GRPO's clipped surrogate with token-mean aggregation over the batch (TRL's `bnpo`), the k3 KL to
    the reference, and ratios off 1 so that clipping acts on some tokens."""
    policy, ref, mask = _tokens(seed)
    g = torch.Generator().manual_seed(100 + seed)
    old = (policy.detach() + (torch.rand(policy.shape, generator=g) - 0.5)) * mask
    advantages = torch.randn(len(policy), generator=g)
    ours, stats = grpo_loss(policy, old, advantages, mask, clip_eps=0.2, ref_logps=ref, kl_beta=beta)
    theirs, logged = _trl_grpo(policy, old, ref, advantages, mask, epsilon=0.2, beta=beta)
    _same(ours, theirs, policy)
    assert stats["clip_fraction"].item() > 0
    assert abs(stats["clip_fraction"].item() - logged["clip_ratio/region_mean"][0]) < TOL
    if beta:
        assert abs(stats["kl"].item() - logged["kl"][0]) < TOL

"""The trainers' shape: one run context, a trainer per family, the loss table, chosen and rejected in one
forward pass, transformers' LR schedule, and checkpoints that keep every RNG."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
import yaml

from self_improve.config import ALGORITHMS, ConfigError, DpoConfig, parse_params
from self_improve.engines.hf import token_logprobs
from self_improve.training.iteration import TRAINERS
from self_improve.training.loop import Checkpoints, Schedule, rng_state, set_rng_state
from self_improve.training.losses import cream_loss, dpo_loss, ipo_loss, spin_loss
from self_improve.training.trainers import (
    OnPolicyTrainer,
    PreferenceTrainer,
    RunContext,
    concatenated,
)

from .conftest import ROOT

PROMPTS = ["12+34=", "40+41=", "7+8=", "23+19="]
CHOSEN = ["46", "81", "15", "42"]
REJECTED = ["4", "8111", "1", "4200"]


def test_every_algorithm_has_a_trainer_and_every_preference_algorithm_a_loss():
    assert {a.family for a in ALGORITHMS.values()} == set(TRAINERS)
    preference = {n for n, a in ALGORITHMS.items() if a.family == "preference"}
    assert preference == {"dpo", "ipo", "spin", "cream"}
    assert ALGORITHMS["dpo"].loss_function() is dpo_loss and ALGORITHMS["spin"].loss_function() is spin_loss
    assert ALGORITHMS["cream"].loss_function() is cream_loss and ALGORITHMS["cream"].consistency
    assert ALGORITHMS["spin"].reference_pairs and ALGORITHMS["spin"].seed_prompts == 300
    ipo = ALGORITHMS["ipo"]
    assert ipo.loss_function() is ipo_loss and ipo.mean_logps and not ipo.nll  # TRL's loss_type="ipo"
    with pytest.raises(ValueError, match="not a preference algorithm"):
        PreferenceTrainer(RunContext(None, Schedule(1e-3, 1), 4), "grpo", DpoConfig())
    with pytest.raises(TypeError, match="abstract"):  # a trainer of samples needs its loss
        OnPolicyTrainer(RunContext(None, Schedule(1e-3, 1), 4))


def test_chosen_and_rejected_in_one_forward_pass_give_each_ones_own_log_probs(tok, trained):
    ctx = RunContext(tok, Schedule(1e-3, 1), 4)
    enc_c, enc_r = ctx.encode(PROMPTS, CHOSEN), ctx.encode(PROMPTS, REJECTED)
    idx = [2, 0, 3]
    with torch.no_grad():
        both, mask = token_logprobs(trained, concatenated(enc_c, enc_r, idx, torch.device("cpu")))
        alone_c, mask_c = token_logprobs(trained, enc_c.batch(idx, torch.device("cpu")))
        alone_r, mask_r = token_logprobs(trained, enc_r.batch(idx, torch.device("cpu")))
    assert both.shape[0] == 2 * len(idx)
    torch.testing.assert_close(both[:3].sum(-1), alone_c.sum(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(both[3:].sum(-1), alone_r.sum(-1), atol=1e-5, rtol=0)
    assert torch.equal(mask[:3].sum(-1), mask_c.sum(-1)) and torch.equal(mask[3:].sum(-1), mask_r.sum(-1))


def test_one_dpo_step_moves_the_model_as_the_loss_computed_by_hand_says(tok, trained):
    """The trainer's first update (lr warm-up off) equals the gradient of sigmoid DPO + RPO's NLL term
    written out here from two separate forward passes: the concatenated pass changes nothing."""
    beta, alpha = 0.5, 1.0
    by_hand = copy.deepcopy(trained)
    ctx = RunContext(tok, Schedule(1e-2, 1), batch_size=4, seed=0)
    enc_c, enc_r = ctx.encode(PROMPTS, CHOSEN), ctx.encode(PROMPTS, REJECTED)
    idx = list(range(4))
    with torch.no_grad():
        ref_c = token_logprobs(by_hand, enc_c.batch(idx, "cpu"))[0].sum(-1)
        ref_r = token_logprobs(by_hand, enc_r.batch(idx, "cpu"))[0].sum(-1)
    lc, mc = token_logprobs(by_hand, enc_c.batch(idx, "cpu"))
    lr_, _ = token_logprobs(by_hand, enc_r.batch(idx, "cpu"))
    margin = beta * ((lc.sum(-1) - ref_c) - (lr_.sum(-1) - ref_r))
    loss = -torch.nn.functional.logsigmoid(margin).mean() + alpha * (-lc.sum(-1) / mc.sum(-1)).mean()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in by_hand.named_parameters()}

    model = copy.deepcopy(trained)
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    log = PreferenceTrainer(ctx, "dpo", DpoConfig(beta=beta, rpo_alpha=alpha)).train(
        model, PROMPTS, CHOSEN, REJECTED)
    assert log.losses[0] == pytest.approx(loss.item(), abs=1e-5)
    # AdamW's first step moves each weight by lr * sign(grad) (where the grad is well above eps)
    for k, p in model.named_parameters():
        g = grads[k]
        big = g.abs() > 1e-4
        step = (before[k] - p.detach())[big]
        torch.testing.assert_close(torch.sign(step), torch.sign(g[big]))


def test_bf16_runs_the_forward_passes_in_bfloat16_and_keeps_float32_weights(tok, trained):
    """train.bf16: the linear layers compute in bfloat16 while training and while scoring the reference,
    the weights stay float32 and move, and the first DPO loss is log 2 (the reference is scored in the
    precision the policy trains in, so their log-ratio starts at 0) and near the float32 run's."""
    seen: list[torch.dtype] = []
    losses = {}
    for dtype in (None, torch.bfloat16):
        model = copy.deepcopy(trained)
        before = {k: p.detach().clone() for k, p in model.named_parameters()}
        linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        hook = linear.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
        ctx = RunContext(tok, Schedule(1e-2, 1), batch_size=4, seed=0, autocast=dtype)
        log = PreferenceTrainer(ctx, "dpo", DpoConfig(beta=0.5, rpo_alpha=0.0)).train(
            model, PROMPTS, CHOSEN, REJECTED)
        hook.remove()
        losses[dtype] = log.losses[0]
        assert all(p.dtype == torch.float32 for p in model.parameters())
        assert any(not torch.equal(before[k], p.detach()) for k, p in model.named_parameters())
        assert set(seen) == {dtype or torch.float32}, seen
        seen.clear()
    assert losses[None] == pytest.approx(np.log(2), abs=1e-5)
    assert losses[torch.bfloat16] == pytest.approx(np.log(2), abs=1e-2)


def test_frozen_weights_held_in_bfloat16_change_no_bfloat16_step_and_are_put_back(tok, trained):
    """frozen_in: a LoRA model's frozen linear weights held in bfloat16 while training under bfloat16
    autocast give the losses and adapter weights of the run that casts them in every forward pass, bit
    for bit; the tied output layer (shared with the input embedding) stays float32, and on exit every
    frozen weight is the very tensor it was."""
    from self_improve.config.training import LoraConfig
    from self_improve.models.loading import attach_lora
    from self_improve.training.loop import frozen_in

    runs = []
    for hold in (None, torch.bfloat16):
        torch.manual_seed(0)
        tied = copy.deepcopy(trained)
        tied.lm_head.weight = tied.get_input_embeddings().weight  # as SmolLM2's: one tensor for both
        model = attach_lora(tied, LoraConfig(r=4, alpha=8))
        frozen = {k: p for k, p in model.named_parameters() if not p.requires_grad}
        ctx = RunContext(tok, Schedule(1e-2, 2), batch_size=2, seed=0, autocast=torch.bfloat16)
        with frozen_in(model, hold):
            dtypes = {p.dtype for k, p in model.named_parameters() if "base_layer" in k}
            assert dtypes == {hold or torch.float32}
            assert model.get_input_embeddings().weight.dtype == torch.float32
            assert tied.lm_head.weight is tied.get_input_embeddings().weight
            log = PreferenceTrainer(ctx, "dpo", DpoConfig(beta=0.5)).train(model, PROMPTS, CHOSEN, REJECTED)
        assert all(p is frozen[k] for k, p in model.named_parameters() if not p.requires_grad)
        runs.append((log.losses, {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}))
    assert len(runs[0][0]) == 2 and runs[0][0] == runs[1][0]
    assert all(torch.equal(p, runs[1][1][k]) for k, p in runs[0][1].items())


def test_the_schedule_is_transformers_warm_up_and_cosine_to_a_floor():
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = Schedule(1.0, steps=10, warmup_steps=2, min_lr_ratio=0.5).scheduler(opt)
    lrs = []
    for _ in range(11):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:3] == pytest.approx([0.0, 0.5, 1.0])  # warm-up from 0, as TRL and the HF Trainer
    assert lrs[6] == pytest.approx(0.5 + 0.5 * 0.5)  # half way through the cosine: (1 + cos(pi/2)) / 2
    assert lrs[10] == pytest.approx(0.5)  # the floor at the last step


def test_a_checkpoint_keeps_every_rng_and_restores_it(tmp_path):
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    ckpt = Checkpoints(tmp_path / "ckpt", "inputs", 1)
    ckpt.save({"step": 1, "rng": rng_state()})
    expected = (random.random(), float(np.random.rand()), torch.rand(1).item())
    random.seed(9)
    np.random.seed(9)
    torch.manual_seed(9)
    set_rng_state(ckpt.load()["rng"])  # read back with weights_only=True
    assert (random.random(), float(np.random.rand()), torch.rand(1).item()) == expected


def test_a_checkpoint_that_kept_only_torchs_rng_still_resumes():
    torch.manual_seed(5)
    state = torch.get_rng_state()
    expected = torch.rand(1).item()
    set_rng_state(state)
    assert torch.rand(1).item() == expected


@pytest.mark.parametrize("old,new", [("beta", "train.dpo.beta"), ("nll_weight", "train.dpo.rpo_alpha"),
                                     ("clip_eps", "train.grpo.epsilon"), ("kl_beta", "train.grpo.beta")])
def test_a_params_file_with_a_moved_train_key_is_told_where_it_went(old, new):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["train"][old] = 0.1
    with pytest.raises(ConfigError, match=rf"train.{old} is now {new}"):
        parse_params(raw)

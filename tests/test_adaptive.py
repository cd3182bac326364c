"""Adaptive sampling (self_improve/adaptive.py) and the answer stop (tasks/answers.py's answer_end):
a vote group's label and pairs with and without adaptive sampling on a fixed sample stream, and a stop
that never cuts a complete answer."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from self_improve import adaptive
from self_improve.config import JudgeConfig, PairsConfig
from self_improve.cpu import cpu_flags
from self_improve.judges import judge_samples
from self_improve.pairs import build
from self_improve.tasks.answers import answer_end, extract

pytestmark = pytest.mark.unit


def test_settle_reasons():
    # the leader cannot be caught, passes the gate, and each prompt has a pair already
    assert adaptive.settle([["5", "5", "5", "7"]], k=5, min_share=0.2, window=4) == "settled"
    assert adaptive.settle([["5", "5", "5", "7"]], k=6, min_share=0.2, window=4) is None  # 3 against 1 + 2 to come: a tie
    # the same leader, but no prompt has a sample against it yet: only the window's agreement stops it
    assert adaptive.settle([["5", "5", "5", "5"]], k=8, min_share=0.2, window=4) == "unanimous"
    assert adaptive.settle([["5", "5", "5", "5"], ["5", "5", "5", "7"]], k=8, min_share=0.2, window=4) is None
    # no answer can reach a 0.5 gate any more: 2 + 3 to come < 5.5 of 11; with 4 to come it still can, but its
    # leader's share so far (2 of 8) is under the gate: at that rate it ends under it
    assert adaptive.settle([["1", "2", "3", "4", "1", "2", "3", "4"]], k=11, min_share=0.5, window=4) == "no_label"
    assert adaptive.settle([["1", "2", "3", "4", "1", "2", "3", "4"]], k=12, min_share=0.5, window=4) == "below_gate"
    assert adaptive.settle([["1", "1", "1", "1", "2", "3", "4", "5"]], k=12, min_share=0.5, window=4) is None
    # a window with an invalid vote (None) is not unanimous
    assert adaptive.settle([["5", "5", None, "5"]], k=8, min_share=0.2, window=4) is None
    assert adaptive.settle([["5"] * 8], k=8, min_share=0.2, window=4) == "full"
    # Self-Harmony's label is not a pooled share: only unanimity stops it early
    assert adaptive.settle([["5", "5", "5", "7"]], k=6, min_share=0.2, window=4, harmonic=True) is None
    # without ESC's stop an agreeing window draws on: the sample that would make a pair may come later
    assert adaptive.settle([["5", "5", "5", "5"]], k=8, min_share=0.2, window=4, unanimous=False) is None
    assert adaptive.settle([["5", "5", "5", "7"]], k=5, min_share=0.2, window=4, unanimous=False) == "settled"


def test_without_the_unanimous_stop_a_group_keeps_the_pair_a_late_dissent_makes():
    """A prompt whose first window agrees and whose sixth sample dissents: ESC's stop ends it with no pair;
    with `unanimous=False` it draws on until its label and pair are settled, the pair all k samples give."""
    stream = {0: ["5", "5", "5", "5", "5", "7", "5", "5"]}

    def run(unanimous):
        drawn = {0: []}

        def generate(idx, n, seed):
            got = [stream[i][len(drawn[i]):len(drawn[i]) + n] for i in idx]
            for i, xs in zip(idx, got):
                drawn[i] += xs
            return got, [[False] * len(x) for x in got], 0

        return adaptive.draw(generate, ["g0"], lambda i, r: r, 8, 2, 0.5, seed=0, unanimous=unanimous)

    esc, kept = run(True), run(False)
    assert esc.texts[0] == ["5", "5"] and esc.stats["stopped_unanimous"] == 1
    assert kept.texts[0] == ["5", "5", "5", "5", "5", "7"] and kept.stats["stopped_settled"] == 1
    assert "7" in kept.texts[0]  # the rejected side of the pair that k samples make


def test_the_vote_key_and_who_keeps_k():
    assert adaptive.vote_key(JudgeConfig(method="co_reward")) == "group_id"
    assert adaptive.vote_key(JudgeConfig(method="majority_vote")) == "prompt_id"
    assert adaptive.vote_key(JudgeConfig(method="vote_share")) == "prompt_id"
    assert adaptive.vote_key(JudgeConfig(method="verifier")) is None
    assert adaptive.vote_key(JudgeConfig(method="random")) is None
    assert adaptive.vote_key(JudgeConfig(method="co_reward", frozen="yes_logprob")) is None


def _stream(n_groups: int, k: int, seed: int) -> dict[int, list[str]]:
    """A fixed stream of k answers for each of two prompts per group: mostly one answer, some noise."""
    rng = random.Random(seed)
    out = {}
    for g in range(n_groups):
        right, p = str(rng.randrange(100)), rng.choice([0.3, 0.6, 0.9, 1.0])
        for v in range(2):
            out[2 * g + v] = [right if rng.random() < p else str(rng.randrange(100)) for _ in range(k)]
    return out


def _table(answers: dict[int, list[str]]) -> pd.DataFrame:
    rows = [{"iteration": "it1", "prompt_id": f"g{i // 2}/v{i % 2}", "group_id": f"g{i // 2}", "variant": i % 2,
             "source": "ttt", "category": None, "prompt": f"q{i}", "answer": None, "sample_id": f"g{i // 2}/v{i % 2}/s{j}",
             "response": f"The answer is {a}. ({j})", "pred": a, "pred_form": "answer_is", "truncated": False}
            for i, xs in answers.items() for j, a in enumerate(xs)]
    return pd.DataFrame(rows)


def _what_the_judge_makes(table: pd.DataFrame, cfg: JudgeConfig) -> tuple[dict, dict]:
    judged = judge_samples(table, cfg)
    labels = judged.drop_duplicates("group_id").set_index("group_id")["label"].to_dict()
    pairs, _ = build(judged, PairsConfig(), 0)
    made = {pid: (extract(c).answer, extract(r).answer) for pid, c, r in zip(pairs["prompt_id"], pairs["chosen"], pairs["rejected"])}
    return labels, made


@pytest.mark.parametrize("window", [2, 4])
def test_on_a_fixed_stream_settled_groups_keep_their_label_and_pairs(window):
    """Adaptive sampling reads a prefix of each prompt's stream; a group stopped as `settled` or `no_label`
    gets the label and the pairs (which prompts, chosen answers) of all k samples. Groups stopped by a
    unanimous window or a leader under the gate are bets: their label is measured, not promised."""
    k, cfg = 8, JudgeConfig(method="co_reward", min_share=0.2)
    stream = _stream(60, k, seed=window)
    groups = [f"g{i // 2}" for i in range(len(stream))]

    def generate(idx, n, seed):
        got = [stream[i][len(drawn[i]):len(drawn[i]) + n] for i in idx]
        for i, xs in zip(idx, got):
            drawn[i] += xs
        return got, [[False] * len(x) for x in got], 0

    drawn: dict[int, list[str]] = {i: [] for i in stream}
    got = adaptive.draw(generate, groups, lambda i, r: r, k, window, cfg.min_share, seed=0)
    assert got.stats["samples"] < got.stats["samples_at_k"] and got.stats["groups"] == 60
    assert sum(got.stats[f"stopped_{r}"] for r in adaptive.REASONS) == 60
    assert got.stats["stopped_unanimous"] and got.stats["stopped_below_gate"]
    assert window == 4 or got.stats["stopped_settled"]  # 16 votes cannot be settled after 8: with 2 windows of 4, no
    full_labels, full_pairs = _what_the_judge_makes(_table(stream), cfg)
    part = {i: got.texts[i] for i in stream}
    part_labels, part_pairs = _what_the_judge_makes(_table(part), cfg)
    for g in set(groups):
        members = [i for i in stream if groups[i] == g]
        reason = adaptive.settle([part[i] for i in members], k, cfg.min_share, window)
        if reason in ("settled", "no_label", "full"):
            assert part_labels[g] == full_labels[g] or (pd.isna(part_labels[g]) and pd.isna(full_labels[g])), g
            for i in members:
                pid = f"{g}/v{i % 2}"
                assert (pid in part_pairs) == (pid in full_pairs), pid
                if pid in full_pairs:
                    assert part_pairs[pid][0] == full_pairs[pid][0]  # chosen: the label
        else:  # the bets, measured on the real model (benchmarks/iteration.py)
            assert reason in ("unanimous", "below_gate")


def test_answer_end_waits_for_a_complete_answer():
    assert answer_end("The answer is 2") is None  # 2, 20 or 2.5: not yet complete
    assert answer_end("The answer is 20.") is None  # 20.5 may follow
    text = "5 + 15 = 20. The answer is 20.\nSo Tom has"
    assert text[:answer_end(text)] == "5 + 15 = 20. The answer is 20."
    assert answer_end("#### 1,000\nmore") == len("#### 1,000")
    assert answer_end("so \\boxed{\\frac{3}{4}} and") == len("so \\boxed{\\frac{3}{4}}")
    assert answer_end("Tom has 20 apples.\nHe eats") is None  # a bare last number is never complete
    for text in ["The answer is 3.5 apples", "Final answer: -12\n", "the answer is 3/4 of it", "#### 72\n####"]:
        cut = text[:answer_end(text)]
        assert extract(cut).answer == extract(text.split("\n")[0]).answer, text  # the answer as stated, whole


def test_bf16_auto_follows_the_cpu_and_the_pin_is_lifted_only_where_this_project_set_it(monkeypatch):
    import torch

    from self_improve import cpu
    from self_improve.training import iteration

    cpu_only = torch.device("cpu")
    monkeypatch.setattr(iteration, "cpu_flags", lambda: {"avx2", "avx512_bf16", "amx_bf16"})
    monkeypatch.setattr(iteration, "bf16_kernels_ready", lambda: True)
    assert iteration.bf16_on("auto", cpu_only) and iteration.bf16_on(True, cpu_only)
    monkeypatch.setattr(iteration, "cpu_flags", lambda: {"avx2", "avx512_bf16"})
    assert iteration.bf16_on("auto", cpu_only)
    monkeypatch.setattr(iteration, "bf16_kernels_ready", lambda: False)  # a matmul ran before the lift
    assert not iteration.bf16_on("auto", cpu_only) and iteration.bf16_on(True, cpu_only)
    monkeypatch.setattr(iteration, "cpu_flags", lambda: {"avx2"})
    assert not iteration.bf16_on("auto", cpu_only) and not iteration.bf16_on(False, cpu_only)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv(cpu.PINNED_BY, raising=False)
    assert not cpu.allow_bf16_kernels()  # the user's own pin stays
    monkeypatch.setenv(cpu.PINNED_BY, "1")
    assert cpu.allow_bf16_kernels() and cpu.os.environ["ONEDNN_MAX_CPU_ISA"] == "ALL"


_FIRST_MATMUL = """
import sys, torch
from self_improve.training.iteration import bf16_kernels_ready, bf16_on, prepare_precision
cpu = torch.device("cpu")
if sys.argv[1] == "after":  # a LoRA chain merged while loading, before the lift
    torch.randn(64, 8) @ torch.randn(8, 576)
prepare_precision("auto", cpu)
torch.randn(64, 8) @ torch.randn(8, 576)
print(bf16_kernels_ready(), bf16_on("auto", cpu))
"""


@pytest.mark.skipif(not {"amx_bf16", "avx512_bf16"} & cpu_flags(), reason="the CPU has no bfloat16 instructions")
@pytest.mark.skipif(os.environ.get("SELF_IMPROVE_CPU_ISA", "").lower() == "native", reason="nothing pinned")
def test_bf16_kernels_are_reachable_only_when_the_pin_is_lifted_before_the_first_matmul():
    """oneDNN fixes its instruction set at a process's first matmul: the train stage lifts the AVX2 pin
    before loading (which merges the adapter chain), else bfloat16 ran in torch's reference GEMM."""
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "SELF_IMPROVE_PINNED")}
    for order, expected in (("before", "True True"), ("after", "False False")):
        out = subprocess.run([sys.executable, "-c", _FIRST_MATMUL, order], env=env, capture_output=True,
                             text=True, check=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
        assert out == expected, order


_BF16_ATTENTION = """
from self_improve.training.iteration import prepare_precision
import torch
prepare_precision("auto", torch.device("cpu"))
q = torch.randn(2, 9, 300, 64, requires_grad=True)
with torch.autocast("cpu", dtype=torch.bfloat16):
    out = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
out.float().sum().backward()
print(torch.backends.cpu.get_cpu_capability(), q.grad.shape[2])
"""


@pytest.mark.skipif(not {"amx_bf16", "avx512_bf16"} & cpu_flags(), reason="the CPU has no bfloat16 instructions")
@pytest.mark.skipif(os.environ.get("SELF_IMPROVE_CPU_ISA", "").lower() == "native", reason="nothing pinned")
def test_bf16_attention_trains_under_the_lifted_pin():
    """With oneDNN lifted to the CPU's bfloat16 kernels and ATen held at AVX2, torch's flash attention
    packed blocks for AMX with a routine ATen's AVX2 build lacks, and the train stage of a bf16 recipe
    died at its first batch on an AMX machine; prepare_precision now sends attention to the math backend."""
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "SELF_IMPROVE_PINNED")}
    out = subprocess.run([sys.executable, "-c", _BF16_ATTENTION], env=env, capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["AVX2", "300"]


def test_training_reports_its_share_of_the_machines_matmul_rate(tok, trained):
    """train() measures tokens/s and the GEMM rate of the machine in its dtype (training/throughput.py);
    the figures go to the stage's timing record, not to train_metrics.json, which must not change on a rerun."""
    import copy

    from self_improve import artifacts as art
    from self_improve.config import TrainConfig
    from self_improve.training.iteration import train

    prompts = [f"{a}+{b}=" for a, b in zip(range(10, 26), range(30, 46))]
    pairs = pd.DataFrame([{"iteration": "it1", "prompt_id": p, "prompt": p, "chosen": str(eval(p[:-1])),
                           "rejected": "7", "chosen_reward": 1.0, "rejected_reward": 0.0, "chosen_correct": 1.0,
                           "rejected_correct": 0.0, "consistency": None, "weight": None} for p in prompts],
                         columns=art.PAIRS.names)
    empty = pd.DataFrame(columns=art.SFT.names), pd.DataFrame(columns=art.GROUPS.names)
    cfg = TrainConfig(algorithm="dpo", epochs=1, batch_size=8, checkpoint_every=0)
    _, log, n, _ = train(copy.deepcopy(trained), tok, pairs, *empty, cfg, seed=0)
    assert n == 16 and log.speed["train_tokens_per_s"] > 0 and log.speed["train_gemm_flops_per_s"] > 0
    assert 0 < log.speed["train_matmul_share"] < 1 and log.speed["train_bf16"] == 0.0
    assert not set(log.speed) & set(log.summary())

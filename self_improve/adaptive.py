"""Adaptive sampling: draw only the samples a vote judge can still use (`sample.adaptive`).

A vote judge (majority_vote, vote_share, co_reward and their gates) labels a vote group (a prompt, or
for co_reward a problem with its rewrites) with its plurality answer, and the pairs stage makes one
pair per prompt from a sample that agrees with the label and one that does not. Each prompt is sampled
`window` responses at a time; after each window a group stops when

- `no_label`: no answer can reach the `judge.min_share` gate any more (its label is None at k);
- `below_gate`: the leader's share of the votes drawn so far is under the gate: at that rate it ends
  under it (on SmolLM2's it0 samples of V3's dev set, 1 of 35 such groups got a label at k);
- `settled`: its leader can no longer be overtaken or tied, already passes the gate, and every prompt
  of the group already has a sample that agrees with it and one that does not (its label and which
  prompts have a pair are those of k samples; only which samples make a pair may differ);
- `unanimous`: the last window of every prompt agrees on one valid answer (ESC, arXiv 2401.10480:
  -80% samples on GSM8K at comparable accuracy); `sample.adaptive.unanimous: false` turns it off, as a
  prompt it stops never draws the dissenting sample its pair would need.

`below_gate` and `unanimous` are bets (a later sample could still give a label or a pair), as ESC's
and Adaptive-Consistency's stops are; how often they lose one is measured on the real model
(benchmarks/iteration.py, `adaptive` in reports/benchmark_smollm2.json).

Votes are read as the judge reads them: with `judge.validity` an invalid response does not vote.
Judges whose votes a model weighs (`judge.frozen`, `judge.inverse`) and judges that are not votes
keep `sample.k`. `settle` is pure; `draw` runs the windows on a sampler.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

from self_improve.config import CrossView, FrozenJudge, JudgeConfig

REASONS = ("no_label", "below_gate", "settled", "unanimous", "full")
ROUND_SEED_STEP = 1_000_033  # window r of a stage draws with seed + r * this

# the column each vote judge pools its votes over
VOTE_KEYS = {"majority_vote": "prompt_id", "vote_share": "prompt_id", "co_reward": "group_id"}


def vote_key(cfg: JudgeConfig) -> Optional[str]:
    """The column `cfg`'s judge pools votes over, or None where adaptive sampling keeps k."""
    if cfg.frozen != FrozenJudge.none or cfg.inverse:
        return None
    return VOTE_KEYS.get(cfg.method)


def settle(votes: list[list[Optional[str]]], k: int, min_share: float, window: int,
           harmonic: bool = False, unanimous: bool = True) -> Optional[str]:
    """Why a vote group may stop (a REASONS entry), or None while more samples could change it.

    `votes`: each prompt's answers so far, None where a sample has no (valid) answer; every prompt of
    the group is to have `k`. With `harmonic` (Self-Harmony's cross-view score) only `unanimous` and
    `full` apply, as its label is not a share of the pooled votes; without `unanimous` the ESC stop is off."""
    total = k * len(votes)
    remaining = total - sum(len(v) for v in votes)
    if remaining <= 0:
        return "full"
    ranked = sorted(Counter(p for v in votes for p in v if p is not None).items(), key=lambda kv: (-kv[1], kv[0]))
    first = ranked[0][1] if ranked else 0
    second = ranked[1][1] if len(ranked) > 1 else 0
    gate = min_share * total
    if not harmonic:
        if first + remaining < gate:
            return "no_label"
        if first < min_share * (total - remaining):
            return "below_gate"
        if ranked and first > second + remaining and first >= gate:
            label = ranked[0][0]
            if all(any(p == label for p in v) and any(p != label for p in v) for v in votes):
                return "settled"
    last = [p for v in votes for p in v[-window:]] if unanimous else []
    if last and all(p is not None for p in last) and len(set(last)) == 1:
        return "unanimous"
    return None


@dataclass
class Drawn:
    """Each prompt's responses (variable length) and truncation, with what the windows did."""

    texts: list[list[str]]
    truncated: list[list[bool]]
    new_tokens: int = 0
    stats: dict = field(default_factory=dict)


def draw(generate: Callable[[list[int], int, int], tuple[list[list[str]], list[list[bool]], int]],
         groups: list[str], vote: Callable[[int, str], Optional[str]], k: int, window: int, min_share: float,
         seed: int, harmonic: bool = False, unanimous: bool = True) -> Drawn:
    """Sample in windows until every group settles (or has k per prompt).

    `generate(prompt_indices, n, seed) -> (texts, truncated, new_tokens)` draws n more responses for
    each listed prompt; `groups[i]` is prompt i's vote group; `vote(i, response)` is the answer that
    response of prompt i votes for (None: no vote)."""
    n = len(groups)
    texts: list[list[str]] = [[] for _ in range(n)]
    cut: list[list[bool]] = [[] for _ in range(n)]
    votes: list[list[Optional[str]]] = [[] for _ in range(n)]
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    open_groups, reasons, tokens, r = list(members), Counter(), 0, 0
    while open_groups:
        todo = [i for g in open_groups for i in members[g]]
        size = min(window, k - len(texts[todo[0]]))
        got, got_cut, spent = generate(todo, size, (seed + r * ROUND_SEED_STEP) % 2**31)
        tokens += spent
        for i, rs, cs in zip(todo, got, got_cut, strict=True):
            texts[i] += rs
            cut[i] += cs
            votes[i] += [vote(i, x) for x in rs]
        still = []
        for g in open_groups:
            why = settle([votes[i] for i in members[g]], k, min_share, window, harmonic, unanimous)
            if why is None:
                still.append(g)
            else:
                reasons[why] += 1
        open_groups, r = still, r + 1
    drawn = sum(len(t) for t in texts)
    stats = {"samples": drawn, "samples_at_k": n * k, "saved_share": 1 - drawn / (n * k) if n else 0.0,
             "windows": r, "groups": len(members), **{f"stopped_{why}": reasons[why] for why in REASONS}}
    return Drawn(texts, cut, tokens, stats)


def harmonic_of(cfg: JudgeConfig) -> bool:
    return cfg.method == "co_reward" and cfg.cross_view == CrossView.harmonic

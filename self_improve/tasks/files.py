"""Tasks over the user's own file: `instructions` (open prompts, answers optional) and `math_file`
(GSM8K- or MATH-style problems with gold answers).

The file is JSONL or parquet, checked row by row (self_improve/tasks/prompt_files.py: every problem names
the file, the row and the column); `task.columns` maps `prompt`, `answer` and `category` to the
file's own columns (GSM8K: ``{prompt: question, answer: answer}``; MATH: ``{prompt: problem,
answer: solution, category: type}``). The gold answer is read from the answer text the way data sets
write it: after ``####``, inside ``\\boxed{}``, or the text as written; the whole answer text is the
seed data's reference solution (SPIN). The held-out set is `task.heldout_file`, or a seeded
`task.heldout_fraction` of the file; a training row whose question is held out is dropped.

An iteration's prompts are the file's training rows (`sec`: drawn by category from the bandit). `eva`
adds new problems that the current model writes from the most informative ones
(self_improve/templates/rewrite_prompt.txt). For co_reward the current model paraphrases every problem
(self_improve/templates/paraphrase_prompt.txt); a paraphrase is kept when it keeps every number of the
original (math_file) and is neither empty nor a near-duplicate, and it shares the original's group
and answer.
"""

from __future__ import annotations

import logging
import random
import re

import pandas as pd

from self_improve import artifacts as art
from self_improve import templates
from self_improve.config import EvolveStrategy, TaskConfig
from self_improve.curriculum import NO_CATEGORY, allocate
from self_improve.errors import ConfigError
from self_improve.tasks.answers import gold_answer
from self_improve.tasks.base import (
    ProposeInput,
    TaskSets,
    by_category,
    check_scope,
    frame,
    most_informative,
    prompt_rows,
    seed_frame,
)
from self_improve.tasks.free_text import FreeTextAnswers
from self_improve.tasks.prompt_files import load_prompt_file
from self_improve.tasks.rewrites import filter_rewrites, near_any

log = logging.getLogger(__name__)

_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def numbers(text: str) -> set[str]:
    return {n.replace(",", "") for n in _NUMBER.findall(text)}


def first_line(text: str) -> str:
    """The model's reply as one line: its first non-empty line, without a label or quotes."""
    for line in (text or "").splitlines():
        line = re.sub(r"^(?:rewritten question|new instruction|question)\s*:\s*", "", line.strip(),
                      flags=re.IGNORECASE).strip().strip('"').strip()
        if line:
            return line
    return ""


class FileTask(FreeTextAnswers):
    """A task over the user's file; `math_file` needs a gold answer in every row."""

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg
        self.name = cfg.kind
        self.math = cfg.entry.math
        self.open_ended = not self.math
        self.instruction = cfg.instruction
        default = {"prompt": "prompt", "answer": "answer", "category": "category"}
        self.columns = cfg.columns or default

    def _load(self, path: str) -> pd.DataFrame:
        rows, skipped = load_prompt_file(path, self.cfg.max_prompt_chars, self.cfg.on_error.value,
                                         self.columns, require_answer=self.math)
        if skipped:
            log.warning("%s: skipped %s", path, skipped)
        return rows

    def _frame(self, df: pd.DataFrame, source: str) -> pd.DataFrame:
        rows = []
        for i, (prompt, answer, category) in enumerate(zip(df["prompt"], df["answer"], df["category"])):
            gold = gold_answer(answer) if isinstance(answer, str) else None
            rows += prompt_rows("it0", f"{source}-{i:05d}", source, category, [(self.show(prompt), gold)])
        return frame(rows)

    def sets(self, seed: int, train_size: int) -> TaskSets:
        rows = self._load(self.cfg.prompt_file)
        if self.cfg.heldout_file:
            held = self._load(self.cfg.heldout_file)
            overlap = rows["prompt"].isin(set(held["prompt"]))
            if overlap.any():
                log.warning("%s: %d row(s) also in %s dropped from training", self.cfg.prompt_file,
                            int(overlap.sum()), self.cfg.heldout_file)
            train = rows[~overlap].reset_index(drop=True)
            if train.empty:
                raise ConfigError(f"{self.cfg.prompt_file}: every question is also in task.heldout_file")
        else:
            if len(rows) < 2:
                raise ConfigError(f"{self.cfg.prompt_file}: {len(rows)} usable prompt(s); at least 2 are "
                                  "needed (one held out, one to train on)")
            order = rows.sample(frac=1.0, random_state=seed % 2**32).reset_index(drop=True)
            n_held = min(len(rows) - 1, max(1, round(self.cfg.heldout_fraction * len(rows))))
            held, train = order.iloc[:n_held], order.iloc[n_held:]
        heldout, ttt = self._frame(held, "heldout"), self._frame(train, "ttt")
        for df in (heldout, ttt):
            df["prompt_id"] = df["group_id"] + "/v0"
        solved = train[train["answer"].notna()]
        seed_sft = seed_frame([self.show(p) for p in solved["prompt"]], list(solved["answer"]))
        return TaskSets(heldout, ttt, seed_sft)

    def categories(self, sets: TaskSets) -> list[str]:
        return by_category(sets.ttt)


    def paraphrases(self, questions: list[str], n: int, writer, existing: list[str]) -> tuple[list[list[str]], dict]:
        """Up to `n` model-written paraphrases per question, filtered; and counts of what was dropped.

        A paraphrase must keep every number of its question (math), differ from it, and not be a
        near-duplicate of any of `existing` (the held-out questions: no paraphrase may carry one
        into training)."""
        texts = writer(templates.PARAPHRASE, questions, n)
        out, dropped = [], {}
        for q, cands in zip(questions, texts):
            lines = [first_line(c) for c in cands]
            if self.math:  # (empty ones are counted as empty below)
                need = numbers(q)
                ok = [c for c in lines if not c or need <= numbers(c)]
                if len(ok) < len(lines):
                    dropped["changed_numbers"] = dropped.get("changed_numbers", 0) + len(lines) - len(ok)
                lines = ok
            kept, why = filter_rewrites(lines, [q], self.cfg.max_prompt_chars, max_overlap=0.9)
            if existing and kept:
                leak = near_any(kept, existing)
                if any(leak):
                    why = {**why, "near_heldout": sum(leak)}
                    kept = [k for k, bad in zip(kept, leak) if not bad]
            for k, v in why.items():
                dropped[k] = dropped.get(k, 0) + v
            out.append(kept)
        return out, dropped

    def pick(self, inp: ProposeInput, rng: random.Random) -> list[tuple]:
        """The iteration's problems, (group_id, source, category, prompt, answer): the test-time rows, or
        under `sec` `evolve.fresh` of them drawn by category from the bandit (the pool is the file)."""
        pool = inp.ttt
        if inp.cfg.strategy == EvolveStrategy.sec:
            counts = allocate(inp.curriculum, inp.cfg.fresh, rng)
            cats = pool["category"].fillna(NO_CATEGORY)
            keep: list[int] = []
            for cat in sorted(counts):
                idx = list(pool.index[cats == cat])
                keep += rng.sample(idx, min(counts[cat], len(idx)))
            pool = pool.loc[sorted(keep)]
        return list(zip(pool["group_id"], pool["source"], pool["category"], pool["prompt"], pool["answer"]))

    def propose(self, inp: ProposeInput) -> pd.DataFrame:
        cfg = inp.cfg
        rng = random.Random(inp.seed)
        check_scope(self, cfg)
        problems = self.pick(inp, rng)
        if cfg.strategy == EvolveStrategy.eva and inp.writer is not None:
            parents = most_informative(inp.prev_judgments, cfg.keep_top)
            if parents:
                texts = [t[0] for t in inp.writer(templates.REWRITE, [self.question(p) for p in parents], 1)]
                existing = [self.question(p) for p in list(inp.ttt["prompt"]) + list(inp.heldout["prompt"])]
                candidates = [first_line(t) for t in texts]
                kept, dropped = filter_rewrites(candidates, existing, self.cfg.max_prompt_chars)
                inp.stats["rewrites_dropped"] = dropped
                category = dict(zip(inp.prev_judgments["prompt"], inp.prev_judgments["category"]))
                parent_of = {c.strip(): p for p, c in zip(parents, candidates)}
                problems += [(f"{inp.iteration}-evolved-{i:05d}", "evolved", category.get(parent_of.get(text)),
                              self.show(text), None) for i, text in enumerate(kept)]
        variants: list[list[str]] = [[] for _ in problems]
        if inp.rewrites and cfg.rewrites and inp.writer is not None and problems:
            existing = [self.question(p) for p in inp.heldout["prompt"]]
            variants, dropped = self.paraphrases([self.question(p[3]) for p in problems], cfg.rewrites,
                                                 inp.writer, existing)
            asked = cfg.rewrites * len(problems)
            kept = sum(len(v) for v in variants)
            inp.stats.update(paraphrases_asked=asked, paraphrases_kept=kept, paraphrases_dropped=dropped)
        rows: list[dict] = []
        for (gid, source, category, prompt, answer), extra in zip(problems, variants):
            rows += prompt_rows(inp.iteration, gid, source, category,
                                [(prompt, answer)] + [(self.show(v), answer) for v in extra])
        return frame(rows) if rows else pd.DataFrame(columns=art.PROMPTS.names)

"""docs/results.md, generated: one section per study, each a table copied from its generated file and
a verdict of at most three sentences.

    python -m research.results_page           # writes docs/results.md
    python -m research.results_page --check   # exits 1 when docs/results.md differs from what it would write

Each study names the file its table comes from (written by the command the section gives) and which
of that file's rows it shows, verbatim: the header and the rows whose first two cells match. The
verdicts are written here, beside the study; every figure in them is a figure of a kept file
(tests/test_docs.py checks that, and that the page is fresh). The story of how the studies were run,
in order, is research/LOG.md.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "results.md"


@dataclass(frozen=True)
class Study:
    title: str
    command: str
    source: str  # the generated file the table comes from (repo-relative)
    rows: tuple[str, ...]  # the rows shown: a row is shown when its first cell, or its first two joined by " / ", is listed; () for all
    verdict: str
    table: int = 0  # which table of the file


INTRO = """# Results

One section per study: the command that made it, its table (copied from the generated file it
names), and what it shows. Words claim only what exceeds the spread: mean +- sd over seeds, and
each seed's paired 95% interval problem by problem. On the real model a gain counts over the
*floor*, the best policy that reads only the question (on word problems the sum of its numbers),
and over the *control arms*, which train on preferences that carry no judgment (random, format,
the validity check alone, the plain vote). A control counts toward an arm's bar (bar.md, `python -m
runners.arms DIR`) only when it ran under the arm's task and evolve settings: for an arm under a
curriculum, the control with the same `-S evolve.*` and a tag of its own. The story of how each study
was run is [research/LOG.md](../research/LOG.md).
"""

STUDIES = (
    Study(
        "The tiny model: every variant over seeds",
        "make variants  # python -m runners.experiments --variants configs/variants.yaml --seeds 0 1 2",
        "reports/seeds/comparison.md", (),
        "Only four variants differ from the default beyond noise over seeds 0-2: gold labels (`judge-verifier`, "
        "+0.279 +- 0.031 at it3) and three that collapse on every seed: IPO at beta 0.1, SPIN without its NLL "
        "term and `implicit_reward`. The reward-hacking alarm fires on all nine runs of those three."),
    Study(
        "B-STaR: the temperature and threshold chosen each iteration",
        "python -m runners.experiments --variants configs/variants_bstar.yaml --seeds 0 1 2 --out research/results/bstar",
        "research/results/bstar/comparison.md", (),
        "Choosing the temperature and threshold each iteration ends level with the fixed temperature, by the "
        "judge's labels (-0.011 +- 0.019 at the same seed) and by the truth (-0.001 +- 0.022). On `co_reward`'s "
        "0/1 rewards it can move only the temperature."),
    Study(
        "Recipe V2 and the label-free rules, diagnosed before any loop",
        "python -m research.reread_kept",
        "research/reread_kept.md", (),
        "On recipe V2 every label-free rule ends below the floor of 0.441 (the sum of the question's numbers), "
        "and its gain is on addition only. V2's training prompts held no multiplication; recipe V3 draws every "
        "set a third per operation."),
    Study(
        "Real tasks on a real model: does self-judging work?",
        "python -m research.real_loops --recipe smollm2-v3 --judges co_reward+validity_any verifier random format "
        "validity_only majority_vote --seeds 0 1 2 --out research/results/smollm2_v3_arms",
        "research/results/smollm2_v3_arms/categories.md",
        ("co_reward+validity_any (3 seeds, it3) / (all)", "sec-co_reward+validity_any (3 seeds, it3) / (all)",
         "random (3 seeds, it3) / (all)", "format (3 seeds, it3) / (all)", "validity_only (3 seeds, it3) / (all)",
         "majority_vote (3 seeds, it3) / (all)", "verifier (3 seeds, it3) / (all)"),
        "SmolLM2-135M-Instruct on word problems (recipe V3). With the `sec` curriculum the label-free rule ends "
        "+0.036 +- 0.022 over the floor, clear of it on one seed of three. It ends above every control arm on every "
        "seed, controls run on the recipe's fixed problems, not under the curriculum, so bar.md does not read them. "
        "Gold labels end +0.087 +- 0.043 over the floor, clear on every seed."),
    Study(
        "The reasoning-gym mix with the floor and the control arms",
        "python -m research.real_loops --recipe smollm2-gym --judges scpo scpo+validity_any "
        "scpo+validity_any+category_gate random format majority_vote validity_only verifier --seeds 0 1 2 "
        "--out research/results/smollm2_gym_arms",
        "research/results/smollm2_gym_arms/categories.md",
        ("scpo (3 seeds, it3) / (all)", "scpo+validity_any+category_gate (3 seeds, it3) / (all)",
         "nft1-scpo+validity_any+category_gate (3 seeds, it3) / (all)", "random (3 seeds, it3) / (all)",
         "format (3 seeds, it3) / (all)", "validity_only (3 seeds, it3) / (all)", "verifier (3 seeds, it3) / (all)"),
        "No label-free arm clears the floor on every seed: the best, NFT on the gated vote, ends +0.042 +- 0.020 "
        "over it. Gold labels end +0.061 +- 0.020. The validity check alone ends below it0 (-0.036 +- 0.031)."),
    Study(
        "Does the reasoning-gym mix grow the sum shortcut?",
        "python -m research.sum_share research/results/smollm2_gym_arms",
        "research/results/smollm2_gym_arms/sum_share.md",
        tuple(f"nft1-scpo-validity_any-category_gate-s{seed} / {it}" for seed in (0, 1, 2) for it in ("it0", "it3")),
        "No: unlike V3's word problems, no kept gym arm or control answers the sum more often at it3 where it is "
        "wrong beyond a few problems (multiplication 0.08-0.12 at it0, 0.06-0.19 at it3). The share rises on "
        "additions only, with their accuracy. The gym recipe needs no shortcut gate at three iterations."),
    Study(
        "A weak reasoning-gym ladder: gold, the label-free rule, the curriculum over levels (one seed)",
        "python -m research.real_loops --recipe smollm2-gym gym-ladder --judges verifier --tag ladder --seeds 0 "
        "--out research/results/smollm2_gym_ladder  # the same with: --judges format; --judges random -S "
        "pairs.max_pairs=53; --judges scpo+validity_any+category_gate --tag ladder-nft1 -S train.algorithm=nft -S "
        "train.epochs=1; the curriculum: --tag ladder-mix(-nft1) -S evolve.strategy=sec -S evolve.sec_scope=mix "
        "(ladder-mix-t05: -S evolve.sec_temperature=0.05)",
        "research/results/smollm2_gym_ladder/categories.md",
        ("ladder-verifier (1 seed, it3) / (all)", "ladder-mix-verifier (1 seed, it3) / (all)",
         "ladder-mix-t05-verifier (1 seed, it3) / (all)",
         "ladder-nft1-scpo+validity_any+category_gate (1 seed, it3) / (all)",
         "ladder-mix-nft1-scpo+validity_any+category_gate (1 seed, it3) / (all)",
         "format (1 seed, it3) / (all)", "random (1 seed, it3) / (all)"),
        "Gold rewards lift the ladder 0.135 -> 0.195 by it3 (+0.061 [+0.029, +0.094]), still under the sum floor 0.311; "
        "the hardest level stays near 0. The curriculum over levels ends level with the fixed mix (-0.002 [-0.016, "
        "+0.010]): SEC's signal steers to the level the model half solves. The label-free rule on the fixed mix gains "
        "+0.051 [+0.018, +0.082], above `random` by +0.043 [+0.008, +0.078] and `format` by +0.074 [+0.039, +0.109]; "
        "with the curriculum it ends -0.029 [-0.051, -0.010] under that. One seed."),
    Study(
        "Six iterations on the gym recipe: the label-free rule at the iteration its choice keeps",
        "python -m research.real_loops --recipe smollm2-gym long --judges scpo+validity_any+category_gate --seeds 0 1 2 "
        "--tag long-nft1 -S train.algorithm=nft -S train.epochs=1 --out research/results/smollm2_gym_long  # fresh "
        "draws (recipe fresh-mix): --tag long-nft1-mix128 ... -S evolve.strategy=sec -S evolve.sec_scope=mix -S "
        "evolve.fresh=128 (its controls the same with --tag mix128); controls: --judges random -S pairs.max_pairs=53 --seeds 0 1 2; --judges format --seeds 0 1 2; "
        "--judges majority_vote --seeds 0 1 2; --judges validity_only --seeds 0 1; oracle: --judges verifier --seeds 0 1",
        "research/results/smollm2_gym_long/bar.md", (),
        "On the recipe's 128 fixed problems the choice keeps it6 at every seed, +0.059 +- 0.021 over the floor; seed 2 "
        "does not clear it (+0.035 [-0.012, +0.080] in its summary.md), as the gated vote runs out of pairs from it3. "
        "With 128 fresh problems drawn each iteration (`fresh-mix`) the rule clears the floor on every seed at the "
        "iteration its choice keeps, +0.074 +- 0.015, and ends above the fixed-problem rule at seed 2 (it6 +0.049 "
        "[+0.027, +0.070], paired_mix128_s2.md). Both end above `random`, `format` and `majority_vote` at every seed; "
        "those controls posed the fixed problems, and `validity_only` (0.254 and 0.258 at it6) is run at seeds 0-1. "
        "Under the fresh-draw settings, `random` (seeds 0-2) ends under the floor (-0.044 +- 0.033) and the rule above "
        "it at it6 on every seed (+0.135 +- 0.027, lowest low end +0.088). `format` there (seeds 0-2) learns "
        "the format at it1 and then finds 0-3 pairs an iteration; the rule ends above it at it6 on every seed, +0.165 "
        "+- 0.074 (lowest low end +0.084). `validity_only` there (seeds 0-2) stops after it3 at 0.252, 0.240 and 0.324; the rule ends "
        "above it at it6 on every seed, +0.281 +- 0.061 (lowest low end +0.176). The plain vote there "
        "(seeds 0-2) gains at it1 (0.498, 0.521, 0.439) and then holds or slips (0.488, 0.465, 0.428 at it6); the rule "
        "ends above it at it6 on every seed, +0.092 +- 0.036 (lowest low end +0.025). So the fresh-draw rule clears the "
        "whole bar: at the iteration its choice keeps, above the floor (lowest low end +0.014) and all four controls "
        "under its settings (+0.025) on every seed, no category below it0. Gold labels (seeds 0 and 1) end level with the fresh-draw rule (+0.008 "
        "+- 0.014 in controls.md).", table=1),
    Study(
        "Six iterations on V3: the gated rule at the iteration its choice keeps, before its controls",
        "python -m research.real_loops --recipe smollm2-v3 long --judges co_reward+validity_any+shortcut "
        "-S evolve.strategy=sec --seeds 0 1 --tag long1-sec --plain /tmp/loops --out research/results/smollm2_v3_long; "
        "python -m runners.arms research/results/smollm2_v3_long  # seed 2: the seed-2 study below",
        "research/results/smollm2_v3_long/bar.md",
        ("long-sec-co_reward+validity_any+shortcut", "long1-sec-co_reward+validity_any+shortcut"),
        "With the shortcut gate from it4 the rule ends +0.146 +- 0.032 over the floor at seeds 0 and 1. The gated rule "
        "from it1 under today's stop (seeds 0-2) rises from 0.155 +- 0.015 to 0.478 +- 0.040 at it6, +0.144 +- 0.040 "
        "over the floor (lowest paired low end +0.047). Its seed 2 is the run the old stop cut, carried on "
        "(same_loop.yaml beside bar.md). Its choice keeps it6 on every seed, where each seed is at its best so far. "
        "Addition and multiplication end above it0 beyond noise on every seed, subtraction on seeds 0 and 2 (seed 1: "
        "+0.053, interval from -0.012). All four of its controls have run at seed 0, "
        "each held to the rule's largest pair count (`-S pairs.max_pairs=115`). By it6 `random`, `format`, "
        "`validity_only` and the plain vote fall from 0.143 to 0.010, 0.092, 0.100 and 0.004 (`validity_only` peaked "
        "at 0.250 at it3; the vote collapsed at it2); the rule ends +0.424, +0.342, +0.334 and +0.430 above them "
        "(paired low ends +0.383, +0.299, +0.289 and +0.389, controls.md). At seed 1 `format` goes 0.150 -> 0.160 "
        "on 115, 8, 7, 3, 4, 4 pairs; over seeds 0-1 the rule ends +0.336 +- 0.008 above it (low ends +0.299, "
        "+0.281). At seed 1 `random` goes 0.150 -> 0.068 on 115 pairs an iteration (restated answers 0.219 -> "
        "0.695 while its agreement rises; the choice keeps it0); over seeds 0-1 the rule ends +0.423 +- 0.001 above "
        "it (low ends +0.383, +0.375). `validity_only` and the vote at seed 1, and all four at seed 2, are still to "
        "run (30-100 minutes a loop on two CPU cores), so the bar is not measured there.",
        table=1),
    Study(
        "Faster loops: adaptive sampling and the answer stop",
        "python -m research.real_loops --recipe smollm2-v3 --judges co_reward+validity_any -S evolve.strategy=sec "
        "--tag fast --seeds 0 1 --plain /tmp/loops --out research/results/smollm2_v3_fast",
        "research/results/smollm2_v3_fast/paired_s1.md", (),
        "At seed 1 the loop with adaptive sampling and the answer stop ends level with the kept one at it3 "
        "(+0.016 [-0.023, +0.055]); at seed 0 too (-0.014 [-0.051, +0.021], in paired_s0.md beside it). Both are on "
        "in recipe V3."),
    Study(
        "The curriculum over the whole training mix (one seed)",
        "python -m research.real_loops --recipe smollm2-v3 --judges co_reward+validity_any --seeds 0 --tag mix-sec "
        "-S evolve.strategy=sec -S evolve.sec_scope=mix --plain /tmp/loops --out research/results/smollm2_v3_fast",
        "research/results/smollm2_v3_fast/paired_mix_s0.md", (),
        "No gain at seed 0: with `evolve.sec_scope: mix` the curriculum allocates the whole training mix, and "
        "held-out ends -0.062 [-0.105, -0.016] below the same loop steering only the fresh problems at it3. "
        "Addition and subtraction fell behind (its summary.md). One seed; `fresh` stays the default."),
    Study(
        "Six iterations: does the closest label-free arm keep improving?",
        "python -m research.extend_loop /tmp/loops/smol-fast-sec-co_reward-validity_any-s0 --finished "
        "research/results/smollm2_v3_fast/fast-sec-co_reward-validity_any-s0.json --recipe smollm2-v3 long "
        "--judge co_reward+validity_any -S evolve.strategy=sec -S train.bf16=auto --seed 0 --tag long-sec "
        "--out research/results/smollm2_v3_long  # and --seed 1",
        "research/results/smollm2_v3_long/sum_share.md",
        tuple(f"long-sec-co_reward-validity_any-s{seed} / {it}" for seed in (0, 1) for it in ("it0", "it6")),
        "No: past it3 both seeds drift into the shortcut. At it6, 0.789 and 0.518 of held-out answers equal the "
        "sum of the question's numbers, and subtraction and multiplication fall. The agreement signal rises "
        "throughout, so the stop never fires and the choice picks it6."),
    Study(
        "The shortcut gate from it4 on (two seeds)",
        "python -m research.extend_loop /tmp/loops/smol-fast-sec-co_reward-validity_any-s1 --finished "
        "research/results/smollm2_v3_fast/fast-sec-co_reward-validity_any-s1.json --recipe smollm2-v3 long "
        "--judge co_reward+validity_any+shortcut --switch judge.shortcut train.bf16 -S evolve.strategy=sec "
        "-S train.bf16=false --seed 1 --tag long-sec --out research/results/smollm2_v3_long  # seed 0: paired_shortcut_s0.md",
        "research/results/smollm2_v3_long/paired_shortcut_s1.md", (),
        "At seed 1 too, `judge.shortcut` from it4 on keeps the loop rising where it fell without it: 0.502 at it6, "
        "+0.137 [+0.094, +0.178] over the same loop without the gate (seed 0: 0.457, +0.180 [+0.141, +0.221]). "
        "Both gated runs were still rising at it6, and at seed 1 every operation ends above it0 beyond noise "
        "(its summary.md)."),
    Study(
        "The stop that cut a rising loop short (seed 2)",
        "python -m research.real_loops --recipe smollm2-v3 long --judges co_reward+validity_any+shortcut -S "
        "evolve.strategy=sec --seeds 2 --tag long1-sec --plain /tmp/loops7 --out research/results/smollm2_v3_long; "
        "python -m research.extend_loop /tmp/loops9/src-long1-s2 --finished "
        "research/results/smollm2_v3_long/long1-sec-co_reward-validity_any-shortcut-s2.json --recipe smollm2-v3 long "
        "--judge co_reward+validity_any+shortcut -S evolve.strategy=sec -S stop.enabled=false --seed 2 "
        "--tag long1-nostop-sec --out research/results/smollm2_v3_long --workdir /tmp/loops9  "
        "# src: the first run's workspace with it4-it6 removed",
        "research/results/smollm2_v3_long/choice_shortcut.md",
        ("long1-sec-co_reward-validity_any-shortcut-s2", "long1-nostop-sec-co_reward-validity_any-shortcut-s2"),
        "The gated rule from it1 at seed 2 stopped after it3 at held-out 0.307: its agreement rose 0.133 -> 0.180, "
        "short of the rule's interval, and the choice handed back it0 (0.172). Carried on, the loop reached 0.510 at "
        "it6, +0.176 over the floor (paired low end +0.123), every operation above it0, still rising; the choice picks it6. "
        "The stop now goes on while the agreement sets new highs (`stop.while_rising`), at iterations no veto of the "
        "choice holds back. Replayed on the kept runs (choice_check.md), patience 3 then stops the V3 `random`, "
        "`format` and plain-vote controls after it3, whose agreement rose with restated answers. It cuts no run "
        "short of its best."),
    Study(
        "CoMAS: two agents that solve, evaluate and score each other",
        "make loop-comas",
        "reports/comas/summary.md", (),
        "Neither agent gains over it0 beyond noise by it2. SmolLM2 rarely writes a score the rubric parses "
        "(0.042 of agent0's scores at most, none of agent1's), so the agents train mostly on the parse penalty."),
    Study(
        "Which iteration to keep, chosen without labels",
        "python -m research.choice_check",
        "research/results/choice_check.md", (),
        "The rule picks within one standard error of the best iteration in 150 of the 175 kept runs that gained, "
        "and below it0 beyond noise in 2 of 285. The second is the gym ladder's `format` control: without rewrites "
        "the rule reads base support, a guard that a falling run can pass. Six-iteration `random` at seed 2 passes "
        "it too, on the fixed problems and on fresh draws: kept it6 at 0.406 and 0.375, its best 0.447 and 0.453. So does the fresh-draw plain vote at seed 1 (it6 at 0.465, "
        "its best it1 at 0.521). Refitted with each recipe left out its recall falls to 91 "
        "of 175; refitted without the gym recipe, it picks none of that recipe's 70 gains. The gym alone reads base "
        "support, so without it nothing fits that setting; over the other recipes, each left out in turn, it keeps "
        "91 of 105. By what each run trained on, it keeps 102 of 112 label-free arms' gains (1 pick below it0), 27 of "
        "30 under gold labels and 21 of 33 controls' (1 below). Five of those 12 misses are V3's three-iteration "
        "`format` and `validity_only` runs, which learned the answer format while their agreement stayed flat."),
    Study(
        "An invalid-share drop as a second way into the choice",
        "python -m research.choice_invalid_drop",
        "research/results/choice_invalid_drop.md", (),
        "Also taking an iteration whose invalid share fell beyond noise, its signal held, lifts held-out recall to "
        "152 of 175, but picks below it0 rise from 2 to 9: the `validity_only` loops answer validly and "
        "wrongly. On the target the fit reads, it ties the product's rule within one standard error, so the "
        "product keeps its rule."),
    Study(
        "The restatement veto's scope",
        "python -m research.choice_check",
        "research/results/choice_check.md", (),
        "Letting a rise in restated answers pass where the agreement rose by more lifts held-out recall to 153 of "
        "175, with no new pick below it0. The three runs it gains are the gym ladder's four-level runs under gold "
        "and under the label-free rule, whose right answers often restate an operand, and V3's `format` at seed 0. "
        "On the target the two forms "
        "tie, so the fit and the product keep the veto on any rise.", table=3),
    Study(
        "A second wording of each gym problem for the choice (eight six-iteration runs)",
        "python -m research.gym_views /tmp/loops75/smol-long-nft1-mix128-scpo-validity_any-category_gate-s0 --finished "
        "research/results/smollm2_gym_long/long-nft1-mix128-scpo-validity_any-category_gate-s0.json --out "
        "research/results/smollm2_gym_long/views  # and each kept workspace (research/LOG.md)",
        "research/results/smollm2_gym_long/views/views.md", (),
        "The other template of each gym problem, operands swapped where they commute, gives the gym the cross-view "
        "agreement that word problems read. Over eight runs it picks within one standard error of the best "
        "iteration in 7 of 8, as base support does. It keeps the fresh-draw rule's seed 1 at its best (0.578, base "
        "support: 0.547) and lets random's seed 0 slip to 0.420 (best 0.447). Evaluate now answers these views on "
        "every gym loop (the task's `view`), so its choice reads agreement; the gym runs kept before read base support. "
        "A whole loop on that code (the fresh-draw rule, seed 1, views/live/) repeats the study's signals at it0-it5. "
        "There the stop no longer fires after it5, it6 trains on 10 pairs (0.586), and the choice keeps it6, where "
        "base support kept it2 (0.547)."),
    Study(
        "Choosing past the shortcut: the agreement on answers the task does not rule out",
        "python -m research.shortcut_choice research/results/smollm2_v3_long  # and smollm2_v3_arms",
        "research/results/smollm2_v3_long/choice_shortcut.md", (),
        "Over six iterations the recorded rule picks the collapsed it6 on both ungated seeds (0.277 and 0.365). "
        "Reading the clean agreement and taking the latest candidate near its highest picks it3 (0.334, the best) "
        "and it4 (0.418, best 0.432). On the three-iteration V3 arms it loses two picks, so the fitted rule keeps "
        "the recorded signal."),
    Study(
        "Is the self-judge fooling itself?",
        "python -m research.alarm_check",
        "research/results/alarm_check.md",
        ("seeds_holdout/algo-ipo/s3", "seeds_holdout/algo-spin-nll0/s3", "bstar/default/s0"),
        "The reward-hacking alarm fired on every one of the 65 kept runs that lost held-out accuracy beyond two "
        "standard errors, and on none of the 24 runs trained on gold labels."),
)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _tables(text: str) -> list[list[str]]:
    out, cur = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            out.append(cur)
            cur = []
    return out


def section(study: Study, root: Path = ROOT) -> str:
    path = root / study.source
    if not path.exists():
        raise SystemExit(f"{study.source}: missing; run `{study.command}`")
    tables = _tables(path.read_text(encoding="utf-8"))
    if len(tables) <= study.table:
        raise SystemExit(f"{study.source}: no table {study.table}")
    table = tables[study.table]
    rows = table[2:]
    if study.rows:
        def key(line: str) -> set[str]:
            c = _cells(line)
            return {c[0], f"{c[0]} / {c[1]}" if len(c) > 1 else c[0]}
        rows = [line for line in rows if key(line) & set(study.rows)]
        if len(rows) != len(study.rows):
            raise SystemExit(f"{study.source}: {len(rows)} of the {len(study.rows)} rows named were found")
    rel = "../" + study.source
    return (f"## {study.title}\n\n```bash\n{study.command}\n```\n\n"
            f"From [{study.source}]({rel}):\n\n" + "\n".join(table[:2] + rows) + f"\n\n{study.verdict}\n")


def page(root: Path = ROOT) -> str:
    return INTRO + "\n" + "\n".join(section(s, root) for s in STUDIES)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/results.md is stale")
    args = ap.parse_args(argv)
    text = page()
    if args.check:
        if PAGE.read_text(encoding="utf-8") != text:
            sys.exit("docs/results.md differs from the kept results' tables; run python -m research.results_page")
        return
    PAGE.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()

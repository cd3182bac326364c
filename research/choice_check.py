"""The label-free choice of an iteration on every kept run: its settings fitted, and how close to the
best held-out iteration it lands.

    python -m research.choice_check      # research/results/choice_check.md and choice_check.json

Reads every kept result (research/results/<dir>/<variant>/s<seed>.json, research/results/<dir>/<name>-s<seed>.json
and the same under reports/), and scores `choice.recommend` on its per-iteration metrics (label-free
signals only) against two truths the rule never reads:

- the target the settings are fitted on: test-time accuracy (gold answers to the test-time problems,
  the problems the signals are read on, disjoint from held-out: the dev side of a run);
- held-out accuracy, on which the fitted rule is scored and nothing is fitted.

On either, a run *gained* when its best iteration is above it0 beyond noise (paired 95% interval of
the gain with low end > 0; 2 s.e. of the difference where no interval was kept); the rule's *recall*
is the share of those runs where it picks an iteration within one s.e. of the best (the best's
binomial s.e.), and its *misses below it0* count picks below it0 beyond noise (high end < 0), over
every run. The fit: every `choice.Rule` of the grid is scored on the target; the chosen one has at
most `--max-below` picks below it0, and of those within one standard error of the highest recall
(the one-standard-error rule: a run more or less is noise), the first in the grid's order. Leave one
recipe out: for each recipe, the rule fitted on the other recipes' targets, scored on that recipe's
held-out, so each recipe is scored by a rule that never saw it.
The real-model loops `research.base_support` replayed with the base support are read with their
replayed signals, and the kept word-problem runs with the base model's samples with their signals
computed again with the answers the task rules out (research.shortcut_choice): what evaluate now
records.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import pandas as pd

from research.alarm_check import KEPT, ROOT, history, runs as kept_runs
from research.shortcut_choice import replay as shortcut_replay
from runners.arms import CONTROLS, ORACLE
from self_improve.config import ConfigError
from self_improve.choice import PICKS, RESTATE_VETOES, RULE, Rule, recommend, signal_of, unsupported_agreement
from self_improve.config import StopConfig
from self_improve.stopping import decide

# the grid the settings are fitted over
AGREEMENT_GAINS = (0.0, 0.02, 0.03, 0.05, 0.08, 0.10)
SUPPORT_GAINS = (None, 0.02, 0.0, -0.02, -0.05, -0.10, -0.15, -0.20)  # cautious first
REPLAYED = "research/results/base_support_smollm2.json"  # research.base_support's replay of real-model loops
# a result's recipe, from the folder it was kept in: the unit left out
RECIPES = (("smollm2_gym", "SmolLM2 reasoning-gym"), ("smollm2_v3", "SmolLM2 V3"), ("smollm2_v2", "SmolLM2 V2"),
           ("smollm2", "SmolLM2 V1"), ("engine_loop", "SmolLM2 V1"), ("", "tiny arithmetic"))


def recipe_of(name: str) -> str:
    folder = name.split("/", 1)[0]
    return next(label for prefix, label in RECIPES if folder.startswith(prefix))


KINDS = ("label-free arm", "control arm", "gold labels")


def kind_of(name: str, result: dict) -> str:
    """What a kept run trained on: a control arm (runners.arms.CONTROLS: random, format, validity_only, the
    plain vote), gold labels (the verifier, or a variant named oracle), else a label-free arm. The judge is the
    result's own, or a variant's `judge-<name>` (`<dir>/<variant>/s<seed>`)."""
    variant = name.split("/")[1] if name.count("/") == 2 else ""
    judge = result.get("judge") or (variant[len("judge-"):] if variant.startswith("judge-") else "")
    if judge in CONTROLS:
        return KINDS[1]
    if judge == ORACLE or "oracle" in name:
        return KINDS[2]
    return KINDS[0]


def _with_se(rows: list[dict], key: str) -> bool:
    """Fill `<key>_se` from the run's sizes where it was not kept; False when it cannot be."""
    n_key = {"accuracy": "heldout_n", "ttt_accuracy": "ttt_n"}[key]
    for r in rows:
        if r.get(key) is None:
            return False
        if r.get(f"{key}_se") is None:
            n = r.get(n_key)
            if not n:
                return False
            r[f"{key}_se"] = math.sqrt(max(r[key] * (1 - r[key]), 1e-12) / n)
    return True


def _gain_bounds(rows: list[dict], row: dict, key: str) -> tuple[float, float]:
    """The paired 95% interval of `row`'s gain over it0 in `key` (2 s.e. of the difference where none was kept)."""
    if row.get(f"{key}_gain_lo") is not None and row.get(f"{key}_gain_hi") is not None:
        return row[f"{key}_gain_lo"], row[f"{key}_gain_hi"]
    base = rows[0]
    d, s = row[key] - base[key], math.hypot(row[f"{key}_se"], base[f"{key}_se"])
    return d - 2 * s, d + 2 * s


def score(rows: list[dict], it: str, key: str) -> dict:
    """Where the pick `it` lands on truth `key`: gained (the best beyond noise over it0), within one s.e. of
    the best, below it0 beyond noise."""
    best = max(rows, key=lambda r: r[key])
    chosen = next(r for r in rows if r["iteration"] == it)
    gained = best is not rows[0] and _gain_bounds(rows, best, key)[0] > 0
    below = chosen is not rows[0] and _gain_bounds(rows, chosen, key)[1] < 0
    return {"best": best["iteration"], "gained": gained, "within": best[key] - chosen[key] <= best[f"{key}_se"],
            "below": below, "picked": chosen[key], "best_value": best[key]}


def tally(runs: list[tuple[str, list[dict]]], rule: Rule, key: str, choose=None) -> dict:
    """Recall and misses below it0 of `rule` over `runs` on truth `key`; `choose(rows, rule)`, the iteration
    picked, in place of `recommend`'s (a variant of the rule, research.choice_invalid_drop)."""
    choose = choose or (lambda rows, r: recommend(rows, r)["iteration"])
    scores = [score(rows, choose(rows, rule), key) for _, rows in runs]
    gained = [s for s in scores if s["gained"]]
    within = sum(s["within"] for s in gained)
    return {"runs": len(scores), "gained": len(gained), "within": within,
            "recall": within / len(gained) if gained else float("nan"), "below": sum(s["below"] for s in scores),
            "below_runs": [name for (name, _), s in zip(runs, scores) if s["below"]],
            "missed": [name for (name, _), s in zip(runs, scores) if s["gained"] and not s["within"]]}


def grid() -> list[Rule]:
    return [Rule(a, s, p, v, c, r) for a, s, p, v, c, r in
            itertools.product(AGREEMENT_GAINS, SUPPORT_GAINS, PICKS, (True, False), (False, True), RESTATE_VETOES)]


def fit(runs: list[tuple[str, list[dict]]], max_below: int) -> tuple[Rule, dict]:
    """The first rule in the grid's order whose picks below it0 on the target (test-time accuracy) are at
    most `max_below` and whose recall there lies within one standard error of the best such rule's: the
    one-standard-error rule, so that one run more or less does not move the product's rule (a recall
    of 139 against 138 of 153 is noise). None within `max_below`: the fewest below, then the recall."""
    def recall(t: dict) -> float:
        return 0.0 if math.isnan(t["recall"]) else t["recall"]

    tallies = [(rule, tally(runs, rule, "ttt_accuracy")) for rule in grid()]
    allowed = [(rule, t) for rule, t in tallies if t["below"] <= max_below]
    if not allowed:
        return min(tallies, key=lambda rt: (rt[1]["below"], -recall(rt[1])))
    best = max(allowed, key=lambda rt: recall(rt[1]))[1]
    se = math.sqrt(recall(best) * (1 - recall(best)) / best["gained"]) if best["gained"] else 0.0
    return next((rule, t) for rule, t in allowed if recall(t) >= recall(best) - se)


def stop_replay(runs: list[tuple[str, list[dict]]], patience: int, while_rising: bool = True) -> dict:
    """The early stop (`stop.enabled`, `patience`, `while_rising`) replayed on kept runs: where it would
    have stopped (the metrics known before each iteration) and whether the run's best held-out iteration
    came after it, above every iteration before the stop by more than one s.e. of the best (a gain cut off)."""
    cfg = StopConfig(enabled=True, patience=patience, while_rising=while_rising)
    stopped, cut = [], []
    for name, rows in runs:
        at = next((n for n in range(1, len(rows)) if decide(rows[:n], cfg).stopped), None)
        if at is None:
            continue
        stopped.append(name)
        best = max(rows, key=lambda r: r["accuracy"])
        if best["accuracy"] - max(r["accuracy"] for r in rows[:at]) > best["accuracy_se"]:
            cut.append(name)  # the best came after the stop, beyond one s.e. of every iteration before it
    return {"patience": patience, "while_rising": while_rising, "runs": len(runs), "stopped": len(stopped),
            "cut": cut}


def replayed(path, kept: dict[str, list[dict]]) -> list[tuple[str, list[dict]]]:
    """The kept runs that `research.base_support` replayed with the base support (its JSON: `run`, the
    loop's directory name, which may carry a prefix such as `gpu-`, and `history`): each kept run's rows
    with the replayed label-free signals in place of the recorded ones. The kept run is the one of that
    name (prefix or not) whose iterations and held-out accuracies are the replay's; none, or more than
    one: an error naming the run."""
    try:
        replays = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"--replayed {path}: {err}") from None
    out = []
    for res in replays:
        run, new = res["run"], {r["iteration"]: r for r in res["history"]}
        same = [name for name, rows in kept.items()
                if (leaf := name.rsplit("/", 1)[-1]) and (run == leaf or run.endswith(f"-{leaf}"))
                and [r["iteration"] for r in rows] == list(new)
                and all(abs(r["accuracy"] - new[r["iteration"]]["accuracy"]) < 1e-9 for r in rows)]
        if len(same) != 1:
            raise SystemExit(f"{path}: replayed run {run!r} matches {len(same)} kept results by name and held-out "
                             f"accuracy ({', '.join(same) or 'none'}), not one")
        out.append((same[0], [{**{k: v for k, v in r.items() if not k.startswith("lf_")},
                               **{k: v for k, v in new[r["iteration"]].items() if k.startswith("lf_")}}
                              for r in kept[same[0]]]))
    return out


def shortcut_replayed(kept: dict[str, list[dict]], root: Path = ROOT) -> dict[str, list[dict]]:
    """Kept word-problem runs whose answers hold the base model's samples, with their label-free signals
    computed again from those answers with each test-time problem's ruled-out answers (the clean
    agreement and the shortcut share: what evaluate now records on word problems)."""
    out = {}
    for name, rows in kept.items():
        path = next((root / top / f"{name}.json" for top in KEPT if (root / top / f"{name}.json").exists()), None)
        answers = path.parent / path.stem / "answers.parquet" if path else None
        if answers is None or not answers.exists():
            continue
        result = json.loads(path.read_text())
        if result.get("params_set", {}).get("task.name") != "word_math":
            continue
        table = pd.read_parquet(answers)
        if not (table["set"] == "ttt_sample").any():
            continue
        try:
            clean = {r["iteration"]: r for r in shortcut_replay(result, table)[1]}
        except (ConfigError, SystemExit):  # a recipe whose sets today's draw cannot give again (V2)
            continue
        out[name] = [{**{k: v for k, v in row.items() if not k.startswith("lf_")},
                      **{k: v for k, v in clean[row["iteration"]].items() if k.startswith("lf_")}} for row in rows]
    return out


def moved(base: dict, row: dict, gain_lo: float | None) -> str:
    """How the picked iteration's label-free signals stand against it0's (empty at it0): `gain_lo`, the low
    end of the gain the rule read there, base support and agreement the base never samples it0 -> there,
    and distinct answers and the commonest answer's share as a factor of it0's."""
    if row is base or gain_lo is None:
        return ""
    out = [f"low end {gain_lo:+.3f}"]
    if base.get("lf_base_support") is not None and row.get("lf_base_support") is not None:
        out.append(f"support {base['lf_base_support']:.3f} -> {row['lf_base_support']:.3f}")
        if unsupported_agreement(base) is not None and unsupported_agreement(row) is not None:
            out.append(f"never sampled {unsupported_agreement(base):.3f} -> {unsupported_agreement(row):.3f}")
    for k, what in (("lf_distinct", "distinct"), ("lf_mode_share", "commonest")):
        if base.get(k) and row.get(k) is not None:
            out.append(f"{what} x{row[k] / base[k]:.2f}")
    return "; ".join(out)


def _rule_words(rule: Rule) -> str:
    sup = "none (it0)" if rule.min_support_gain is None else f"{rule.min_support_gain:+.2f}"
    return (f"minimum agreement gain {rule.min_agreement_gain:+.2f}, minimum base-support gain without rewrites "
            f"{sup}, pick {rule.pick}, invalid-share veto {'on' if rule.invalid_veto else 'off'}, clean agreement "
            f"{'on' if rule.shortcut else 'off'}, restatement veto {RESTATE_WORDS[rule.restate_veto]}")


RESTATE_WORDS = {"rise": "on any rise", "over_signal": "where it outpaced the signal"}


def restate_scope(runs: list[tuple[str, list[dict]]], fitted: Rule) -> list[str]:
    """The product's rule with each form of the restatement veto (`Rule.restate_veto`) on the target and on
    held-out, the form the fit (`fitted`) took, and the runs whose held-out verdict moves: markdown lines."""
    lines = ["", "## The restatement veto's scope", "",
             "A rise beyond noise in the answers that restate a number of the question vetoes an iteration "
             "(`Rule.restate_veto` rise). Right answers restate too where a step gives back an operand (8 - 4 = 4), "
             "so a skill gained raises them; a policy drifting onto restatements raises them faster than its "
             "agreement. The second form vetoes only a rise at least as large as the signal's own gain. Scored as "
             "above; the fit sees the target only and takes the first form within one s.e. of the best.", "",
             "| restatement veto | recall on the target | picks below it0 on the target | recall on held-out | "
             "picks below it0 on held-out |", "|---|---|---|---|---|"]
    forms = {form: replace(RULE, restate_veto=form) for form in RESTATE_VETOES}
    heldout = {}
    for form, rule in forms.items():
        t, h = tally(runs, rule, "ttt_accuracy"), tally(runs, rule, "accuracy")
        heldout[form] = h
        lines.append(f"| {RESTATE_WORDS[form]}{' (the product)' if rule == RULE else ''} | {t['within']}/{t['gained']} | "
                     f"{t['below']}/{t['runs']} | {h['within']}/{h['gained']} | {h['below']}/{h['runs']} |")
    lines += ["", f"The fit over the whole grid takes the form {RESTATE_WORDS[fitted.restate_veto]} (the product's: "
              f"{RESTATE_WORDS[RULE.restate_veto]})."]
    base = heldout[RULE.restate_veto]
    for form, h in heldout.items():
        if form == RULE.restate_veto:
            continue
        now = sorted(set(base["missed"]) - set(h["missed"]))
        lost = sorted(set(h["missed"]) - set(base["missed"]))
        below = sorted(set(h["below_runs"]) - set(base["below_runs"]))
        lines += ["", f"On held-out, {RESTATE_WORDS[form]} against the product's: now picked within one s.e.: "
                  f"{', '.join(now) or 'none'}; no longer: {', '.join(lost) or 'none'}; "
                  f"newly below it0 beyond noise: {', '.join(below) or 'none'}."]
    return lines


def _counts(t: dict) -> str:
    return (f"recall {t['within']}/{t['gained']} ({100 * t['recall']:.0f}%), {t['below']} of {t['runs']} picks below "
            f"it0 beyond noise")


def load_runs(replayed_json: str = REPLAYED) -> tuple[list[tuple[str, list[dict]]], set[str]]:
    """Every kept run with an it0 and both accuracies' s.e.: (name, per-iteration rows), the label-free
    signals replayed where `research.base_support` (`replayed_json`) or `research.shortcut_choice` computed
    them again; and the names read with `research.base_support`'s replay."""
    kept: dict[str, list[dict]] = {}
    for name, result in kept_runs():
        rows = history(result)
        if len(rows) < 2 or rows[0].get("iteration") != "it0":
            continue
        if _with_se(rows, "accuracy") and _with_se(rows, "ttt_accuracy"):
            kept[name] = rows
    again = dict(replayed(ROOT / replayed_json, kept))
    clean = shortcut_replayed(kept)
    return [(name, clean.get(name, again.get(name, rows))) for name, rows in kept.items()], set(again)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="research/results/choice_check.md")
    ap.add_argument("--replayed", default=REPLAYED,
                    help="research.base_support's JSON: real-model loops replayed with the base support")
    ap.add_argument("--max-below", type=int, default=0, help="picks below it0 the fit allows on its target")
    args = ap.parse_args(argv)
    runs, again = load_runs(args.replayed)
    recipes = sorted({recipe_of(n) for n, _ in runs})

    fitted, on_target = fit(runs, args.max_below)
    product = tally(runs, RULE, "accuracy")
    lines = ["# The label-free choice of iteration over every kept run", "",
             f"Generated by `python -m research.choice_check` from {len(runs)} kept runs ({', '.join(recipes)}).",
             "Truth: held-out accuracy, never read by the rule nor by its fit. Recall: of the runs whose best "
             "iteration gained over it0 beyond noise, the share picked within one s.e. of the best. Below: picks "
             "below it0 beyond noise, over all runs.", "",
             "| rule | fitted on | scored on | recall | picks below it0 |", "|---|---|---|---|---|"]
    rows_out = [("the product's (`choice.RULE`): " + _rule_words(RULE), "test-time accuracy, every run", "held-out",
                 product)]
    fitted_ho = tally(runs, fitted, "accuracy")
    rows_out.append(("fitted now: " + _rule_words(fitted), "test-time accuracy, every run", "held-out", fitted_ho))
    loro = {"runs": 0, "gained": 0, "within": 0, "below": 0, "below_runs": [], "missed": []}
    per_recipe = []
    for recipe in recipes:
        train = [(n, r) for n, r in runs if recipe_of(n) != recipe]
        test = [(n, r) for n, r in runs if recipe_of(n) == recipe]
        rule, _ = fit(train, args.max_below)
        t = tally(test, rule, "accuracy")
        per_recipe.append((recipe, rule, t))
        for k in ("runs", "gained", "within", "below"):
            loro[k] += t[k]
        loro["below_runs"] += t["below_runs"]
        loro["missed"] += t["missed"]
    loro["recall"] = loro["within"] / loro["gained"] if loro["gained"] else float("nan")
    rows_out.append(("refitted with each recipe left out (below)", "test-time accuracy, the other recipes",
                     "held-out, the recipe left out", loro))
    for words, on, scored, t in rows_out:
        lines.append(f"| {words} | {on} | {scored} | {t['within']}/{t['gained']} ({100 * t['recall']:.0f}%) | "
                     f"{t['below']}/{t['runs']} |")
    lines += ["", f"On its target the fitted rule has {_counts(on_target)}.", "",
              "## Each recipe left out", "", "| recipe left out | rule fitted on the others | runs | recall | picks below it0 |",
              "|---|---|---|---|---|"]
    for recipe, rule, t in per_recipe:
        rec = "n/a" if not t["gained"] else f"{t['within']}/{t['gained']} ({100 * t['recall']:.0f}%)"
        lines.append(f"| {recipe} | {_rule_words(rule)} | {t['runs']} | {rec} | {t['below']} |")
    support = sorted({recipe_of(n) for n, rows in runs if signal_of(rows[0], RULE.shortcut)[0] == "lf_base_support"})
    if len(support) == 1:
        lines += ["", f"Only the {support[0]} runs read base support (their task poses no rewrites, so no agreement): "
                  "with that recipe left out no run exercises `min_support_gain`, and the fit keeps the grid's first, "
                  "cautious value (none: such a run keeps it0)."]
        rest = [t for recipe, _, t in per_recipe if recipe != support[0]]
        within, gained = sum(t["within"] for t in rest), sum(t["gained"] for t in rest)
        if gained:
            lines[-1] += (f" Over the other recipes, each left out in turn, the refitted rule's recall is "
                          f"{within}/{gained} ({100 * within / gained:.0f}%), {sum(t['below'] for t in rest)} picks below it0.")
    kind = {name: kind_of(name, result) for name, result in kept_runs()}
    lines += ["", "## Where the misses fall", "",
              "The product's rule on held-out by what each run trained on: a user exports a label-free arm's pick; a "
              "control arm (random, format, validity_only, the plain vote) is run to be beaten, and gold labels to "
              "bound the loop. Not a fit: the rule and its grid are the same for every kind.", "",
              "| runs of | runs | recall | picks below it0 |", "|---|---|---|---|"]
    for k in KINDS:
        t = tally([(n, r) for n, r in runs if kind[n] == k], RULE, "accuracy")
        rec = "n/a" if not t["gained"] else f"{t['within']}/{t['gained']} ({100 * t['recall']:.0f}%)"
        lines.append(f"| {k} | {t['runs']} | {rec} | {t['below']} |")
    lines += restate_scope(runs, fitted)
    lines += ["", "## The early stop replayed", "",
              "Where `stop` (self_improve/stopping.py) would have stopped each kept run, reading the metrics known "
              "before each iteration, and the runs whose best held-out iteration came after the stop, above every "
              "iteration before it by more than one s.e. (a gain the stop would have cut off); with `stop.while_rising` "
              "(the default) and without it. Most kept runs have three iterations, where only stops before it2 or it3 "
              "show; patience 3 can stop only the six-iteration runs.", "",
              "| patience | goes on while rising | runs stopped early | best iteration cut off |", "|---|---|---|---|"]
    stops = [stop_replay(runs, p, w) for p in (1, 2, 3) for w in (True, False)]
    for st in stops:
        lines.append(f"| {st['patience']} | {'yes' if st['while_rising'] else 'no'} | {st['stopped']}/{st['runs']} | {len(st['cut'])}"
                     f"{': ' + ', '.join(st['cut']) if st['cut'] else ''} |")
    lines += ["", f"Below it0 with the product's rule: {', '.join(product['below_runs']) or 'none'}.",
              f"Gained but not picked within one s.e. with the product's rule: {', '.join(product['missed']) or 'none'}.",
              "", "## Each run with the product's rule", "",
              "| run | recipe | signal read | recommended | held-out there | best held-out | within 1 s.e. | "
              "below it0 beyond noise | signals there against it0 | why |", "|---|---|---|---|---|---|---|---|---|---|"]
    table = []
    for name, rows in runs:
        rec = recommend(rows, RULE)
        s = score(rows, rec["iteration"], "accuracy")
        chosen = next(r for r in rows if r["iteration"] == rec["iteration"])
        signal = ("supported agreement" if rows[0].get("lf_supported_agreement") is not None else "agreement"
                  if rows[0].get("lf_agreement") is not None else "base support"
                  if rows[0].get("lf_base_support") is not None else "none")
        lines.append(f"| {name}{' (replayed)' if name in again else ''} | {recipe_of(name)} | {signal} | {rec['iteration']} | "
                     f"{s['picked']:.3f} | {s['best']} ({s['best_value']:.3f}) | {'yes' if s['within'] else 'NO'} | "
                     f"{'YES' if s['below'] else 'no'} | "
                     f"{moved(rows[0], chosen, rec['rows'].get(rec['iteration'], {}).get('agreement_gain_lo'))} | "
                     f"{rec['reason']} |")
        table.append({"run": name, "recipe": recipe_of(name), "recommended": rec["iteration"], **s})
    text = "\n".join(lines) + "\n"
    (ROOT / args.out).write_text(text)
    summary = {"product": {"rule": asdict(RULE), **product}, "fitted": {"rule": asdict(fitted), "target": on_target,
                                                                        "heldout": fitted_ho},
               "leave_one_recipe_out": {"total": loro, "recipes": [{"recipe": r, "rule": asdict(rule), **t}
                                                                    for r, rule, t in per_recipe]},
               "stop": stops, "runs": table}
    (ROOT / args.out).with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n".join(lines[:16]))


if __name__ == "__main__":
    main()

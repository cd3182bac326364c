"""The seeds runner's inputs and its table, without running a loop."""

from __future__ import annotations

import pytest
import yaml

from runners.experiments import ROOT, load_variants
from runners.comparison import choices, mean_sd, table
from self_improve.config import ConfigError, parse_params


def _override(raw: dict, item: str) -> dict:
    key, _, value = item.partition("=")
    *path, last = key.split(".")
    node = raw
    for part in path:
        node = node[part]
    assert last in node, f"{item}: params.yaml has no {key}"
    node[last] = yaml.safe_load(value)
    return raw


def test_every_shipped_variant_sets_existing_params_to_valid_values():
    variants = load_variants(ROOT / "configs" / "variants.yaml")
    assert {"default", "judge-verifier", "algo-ipo", "algo-spin-nll0", "evolve-fixed"} <= set(variants)
    bstar = load_variants(ROOT / "configs" / "variants_bstar.yaml")  # compared in research/results/bstar/, not reports/seeds/
    assert set(bstar) == {"default", "sample-bstar", "sample-bstar-oracle"} and bstar["default"] == []
    assert not set(variants) & (set(bstar) - {"default"})
    variants |= bstar
    for name, overrides in variants.items():
        raw = yaml.safe_load((ROOT / "params.yaml").read_text())
        for item in overrides:
            raw = _override(raw, item)
        params = parse_params(raw, f"variant {name}")
        for item in overrides:  # the value took: the variant runs what its name says
            key, _, value = item.partition("=")
            got = params
            for part in key.split("."):
                got = getattr(got, part)
            assert getattr(got, "value", got) == yaml.safe_load(value), item
    with pytest.raises(ConfigError, match="train.dpo.beta"):
        parse_params(_override(yaml.safe_load((ROOT / "params.yaml").read_text()), "train.dpo.beta=0"))


def test_a_malformed_variants_file_is_refused_naming_the_variant(tmp_path):
    bad = tmp_path / "v.yaml"
    bad.write_text("ok: [seed=1]\nbroken: judge.method=verifier\n")
    with pytest.raises(SystemExit, match="variant 'broken'"):
        load_variants(bad)


def test_table_gives_mean_sd_and_per_seed_values():
    runs = [{"seed": s, "metrics": {"it0": {"accuracy": a0, "ttt_accuracy": a0},
                                    "it1": {"accuracy": a1, "ttt_accuracy": a1, "judge_auc": 0.7}}}
            for s, (a0, a1) in enumerate([(0.4, 0.5), (0.4, 0.7)])]
    text = table({"v": runs}, ["it0", "it1"])
    row = text.splitlines()[2]
    assert row.startswith("| v | 0, 1 | 0.400 +- 0.000") and "0.600 +- 0.141 (0.50, 0.70)" in row
    assert "0.200 +- 0.141 (0.10, 0.30)" in row  # the gain it0 -> it1
    assert "n/a (no s.e. recorded)" in row
    assert mean_sd([0.5]) == "0.500 (1 seed)"
    runs[0]["metrics"]["it1"].update(accuracy_gain_lo=-0.021, accuracy_gain_hi=0.2)
    runs[1]["metrics"]["it1"].update(accuracy_gain_lo=0.1, accuracy_gain_hi=0.5)
    assert "| [-0.021, +0.200]; [+0.100, +0.500] |" in table({"v": runs}, ["it0", "it1"]).splitlines()[2]


def test_choices_list_each_iterations_temperature_and_threshold_where_bstar_chose():
    fixed = {"seed": 0, "metrics": {"it0": {}, "it1": {"sample_temperature": 0.7, "sft_min_reward": 1.0}}}
    assert choices({"default": [fixed]}, ["it0", "it1"]) is None  # no sweep anywhere: no page
    chose = {"seed": 2, "metrics": {"it0": {}, "it1": {"sample_temperature": 1.1, "sft_min_reward": 0.5,
                                                       "bstar_balance": 0.4321, "bstar_seconds": 3.04}}}
    rows = choices({"default": [fixed], "bstar": [chose]}, ["it0", "it1"]).splitlines()
    assert "| default | 0 | 0.7 / 1 | – |" in rows
    assert "| bstar | 2 | 1.1 / 0.5 (0.432) | 3.0 |" in rows


def test_comparison_pairs_seeds_and_bolds_only_a_difference_beyond_noise():
    from runners.comparison import beyond_noise, comparison

    def run(seed: int, a0: float, a1: float) -> dict:
        return {"seed": seed, "overrides": ["train.algorithm=dpo"],
                "metrics": {"it0": {"accuracy": a0, "ttt_accuracy": a0}, "it1": {"accuracy": a1, "ttt_accuracy": a1}}}

    base = [run(s, a0, a1) for s, (a0, a1) in enumerate([(0.4, 0.5), (0.5, 0.6), (0.3, 0.4)])]
    steady = [run(s, a0, a1) for s, (a0, a1) in enumerate([(0.4, 0.60), (0.5, 0.71), (0.3, 0.49)])]
    noisy = [run(s, a0, a1) for s, (a0, a1) in enumerate([(0.4, 0.70), (0.5, 0.55), (0.3, 0.40)])]
    rows = comparison({"default": base, "steady": steady, "noisy": noisy}, ["it0", "it1"]).splitlines()
    # steady: +0.10, +0.11, +0.09 over the default at the same seed; noisy: +0.20, -0.05, 0.00
    assert "| **0.100 +- 0.010 (0.10, 0.11, 0.09)** |" in rows[3]
    assert "| 0.050 +- 0.132 (0.20, -0.05, 0.00) |" in rows[4]
    assert rows[3].startswith("| steady | `train.algorithm=dpo` | 3 | 0.400 -> 0.600 |")
    assert not beyond_noise([0.1, 0.1]) and beyond_noise([0.1, 0.11, 0.09]) and not beyond_noise([0.1, 0.2, -0.05])


def test_a_judge_table_without_a_default_is_set_against_the_oracle():
    from runners.comparison import baseline, comparison

    def run(seed: int, a1: float) -> dict:
        return {"seed": seed, "metrics": {"it0": {"accuracy": 0.2, "ttt_accuracy": 0.2},
                                          "it1": {"accuracy": a1, "ttt_accuracy": a1}}}

    groups = {"self_harmony": [run(0, 0.34), run(1, 0.51)], "verifier": [run(0, 0.48), run(1, 0.53)]}
    assert baseline(groups) == "verifier" and baseline({"default": [], "verifier": []}) == "default"
    assert baseline({"co_reward": []}) == "default"
    rows = comparison(groups, ["it0", "it1"], baseline(groups)).splitlines()
    assert "held-out it1 - verifier's, same seed" in rows[0]
    assert "| -0.080 +- 0.085 (-0.14, -0.02) |" in rows[2]
    assert rows[3].split(" | ")[6] == ""  # the oracle's own row


def test_a_tagged_run_of_a_judge_is_a_variant_of_its_own(tmp_path):
    import json

    from runners.comparison import load_results

    def keep(name: str, seed: int, **extra) -> None:
        (tmp_path / f"{name}.json").write_text(json.dumps(
            {"judge": "verifier", "seed": seed, "metrics": {"it0": {"accuracy": 0.2}}, **extra}))

    keep("verifier-s0", 0)
    keep("verifier-s1", 1)
    keep("nft-verifier-s0", 0, tag="nft")
    groups = load_results(tmp_path)
    assert sorted(groups) == ["nft-verifier", "verifier"]
    assert [r["seed"] for r in groups["verifier"]] == [0, 1] and len(groups["nft-verifier"]) == 1


def test_plain_runs_every_variant_and_seed_in_parallel_workspaces(tmp_path, monkeypatch):
    """--plain --jobs: each (variant, seed) goes to run_plain (tests/test_plain.py runs it for real)
    in its own workspace with the CPU threads split between the jobs; --jobs without --plain is refused."""
    from runners import experiments as seeds

    variants = tmp_path / "v.yaml"
    variants.write_text("default: []\ndpo: [train.algorithm=dpo]\n")
    calls = []
    monkeypatch.setattr(seeds, "run_plain", lambda name, args, dest, **kw: calls.append((name, args, dest, kw)))
    monkeypatch.setattr(seeds, "write_reports", lambda out: "")
    monkeypatch.setattr(seeds.plain, "usable_cpus", lambda: 16)
    seeds.main(["--variants", str(variants), "--seeds", "0", "1", "--plain", str(tmp_path / "w"), "--jobs", "4",
                "--out", str(tmp_path / "out")])
    assert sorted(c[0] for c in calls) == ["default-s0", "default-s1", "dpo-s0", "dpo-s1"]
    dpo1 = next(c for c in calls if c[0] == "dpo-s1")
    assert dpo1[1] == ["-S", "train.algorithm=dpo", "-S", "seed=1"] and dpo1[2] == tmp_path / "out" / "dpo" / "s1.json"
    assert dpo1[3]["threads"] == 4 and dpo1[3]["workdir"] == (tmp_path / "w").resolve()
    assert dpo1[3]["extra"] == {"variant": "dpo", "seed": 1, "overrides": ["train.algorithm=dpo"]}
    with pytest.raises(SystemExit):
        seeds.main(["--name", "x", "--jobs", "2"])


def test_variants_are_plotted_by_family_with_the_default_in_each():
    from runners.comparison import families

    assert families(["default", "judge-a", "judge-b", "algo-dpo"]) == {
        "judge": ["default", "judge-a", "judge-b"], "algo": ["default", "algo-dpo"]}
    assert families(["co_reward", "verifier"]) == {"": ["co_reward", "verifier"]}


def _tiny_dvc_project(root):
    """A DVC project of one stage that writes each iteration's metrics from params.yaml."""
    import subprocess

    root.mkdir()
    (root / "params.yaml").write_text("seed: 0\nloop:\n  it1: {prev: it0}\nx: 1\ny: 1\n")
    (root / "write.py").write_text(
        "import json, pathlib, yaml\n"
        "p = yaml.safe_load(open('params.yaml'))\n"
        "for it in ('it0', 'it1'):\n"
        "    d = pathlib.Path('reports/iterations') / it\n"
        "    d.mkdir(parents=True, exist_ok=True)\n"
        "    (d / 'metrics.json').write_text(json.dumps({'accuracy': p['x'] / 10, 'ttt_accuracy': p['y'] / 10}))\n")
    (root / "dvc.yaml").write_text(
        "stages:\n  write:\n    cmd: python write.py\n    deps: [write.py]\n    params: [x, y, seed]\n"
        "    outs: [reports/iterations]\n")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=root, check=True, env={**__import__("os").environ, **env})
    return root


def test_each_experiment_runs_on_heads_params_and_records_what_differed(tmp_path):
    """`dvc exp run` leaves an experiment's params in the workspace: the next variant must not
    inherit them (x=2 of the first run must not reach the second)."""
    import json
    import shutil

    from runners.experiments import run_experiment
    from runners.comparison import unexpected_params

    if shutil.which("dvc") is None:
        pytest.skip("needs dvc")
    root = _tiny_dvc_project(tmp_path / "proj")
    head = (root / "params.yaml").read_text()
    first = run_experiment("a-s0", ["-S", "x=2"], tmp_path / "a.json", root=root, extra={"overrides": ["x=2"]})
    assert (root / "params.yaml").read_text() == head
    second = run_experiment("b-s0", ["-S", "y=3"], tmp_path / "b.json", root=root, extra={"overrides": ["y=3"]})
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    assert a["params_diff"] == {"x": 2} and a["metrics"]["it1"]["accuracy"] == 0.2
    assert b["params_diff"] == {"y": 3} and b["metrics"]["it1"] == {"accuracy": 0.1, "ttt_accuracy": 0.3}
    assert b["params_set"] == {"y": 3} and unexpected_params(b) == {}
    assert unexpected_params({**b, "params_diff": {"x": 2, "y": 3}}) == {"x": 2}  # another's override
    assert unexpected_params({**b, "params_diff": {}, "params_set": {"y": 1}}) == {"y": 1}  # it did not take
    # a user's uncommitted change to params.yaml is refused, not folded into every variant
    (root / "params.yaml").write_text(head.replace("x: 1", "x: 5"))
    with pytest.raises(SystemExit, match="differs from HEAD"):
        run_experiment("c-s0", [], tmp_path / "c.json", root=root)
    assert "x: 5" in (root / "params.yaml").read_text()


def test_a_second_runner_in_the_same_workspace_is_refused(tmp_path):
    import fcntl

    from runners.experiments import hold_runner_lock

    (tmp_path / ".dvc" / "tmp").mkdir(parents=True)
    with (tmp_path / ".dvc" / "tmp" / "seeds.lock").open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what another runner's process holds
        with pytest.raises(SystemExit, match="one runner per workspace"):
            hold_runner_lock(tmp_path)
    assert hold_runner_lock(tmp_path) is hold_runner_lock(tmp_path)  # once free, held for the process


def test_a_kept_result_carries_every_signal_the_label_free_choice_reads(tmp_path):
    """The choice check reruns `recommend` on kept results, not on the workspace: a signal dropped
    when keeping (the restate share was, once) silently removes its veto from every check."""
    import json

    from runners.experiments import keep_result
    from self_improve.choice import recommend

    work = tmp_path / "work"
    (work / "reports" / "figures").mkdir(parents=True)
    (work / "reports" / "summary.md").write_text("summary\n")
    (work / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    base = {"iteration": "it0", "accuracy": 0.18, "lf_n": 128, "lf_agreement": 0.09, "lf_restate_share": 0.21,
            "lf_invalid_share": 0.53, "lf_distinct": 0.32}
    # agreement up beyond noise (a candidate) while the answers drift to restated numbers (vetoed)
    drifted = {"iteration": "it1", "accuracy": 0.07, "lf_n": 128, "lf_agreement": 0.35, "lf_agreement_gain_lo": 0.17,
               "lf_restate_share": 0.78, "lf_restate_share_gain": 0.57, "lf_restate_share_gain_lo": 0.48,
               "lf_restate_share_gain_hi": 0.66, "lf_restate_share_se": 0.04, "lf_invalid_share": 0.51,
               "lf_invalid_share_gain_lo": -0.13, "lf_distinct": 0.29}
    for it, m in (("it0", base), ("it1", drifted), ("it2", drifted | {"iteration": "it2"}),
                  ("it3", drifted | {"iteration": "it3"})):
        (work / "reports" / "iterations" / it).mkdir(parents=True)
        (work / "reports" / "iterations" / it / "metrics.json").write_text(json.dumps(m))
    text = (ROOT / "params.yaml").read_text()
    kept = json.loads(keep_result("w-s0", [], tmp_path / "w-s0.json", work, ran=text, base=text, wall=1.0).read_text())
    assert recommend([base, drifted])["iteration"] == "it0"
    rows = [{"iteration": it, **m} for it, m in kept["metrics"].items()]
    assert kept["metrics"]["it1"]["lf_restate_share_gain_lo"] == 0.48
    assert recommend(rows)["iteration"] == "it0"


def test_a_kept_result_without_a_report_keeps_its_answers_beside_it(tmp_path):
    """`make variants` keeps no report directory: the answers go beside s<seed>.json, so the
    label-free signals can be replayed on tiny runs too (research/paired_runs.py reads the file)."""
    import json

    from runners.experiments import keep_result
    from self_improve import artifacts as art

    work = tmp_path / "work"
    work.mkdir()
    (work / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    for it in ("it0", "it1", "it2", "it3"):
        (work / "reports" / "iterations" / it).mkdir(parents=True)
        (work / "reports" / "iterations" / it / "metrics.json").write_text(json.dumps({"iteration": it, "accuracy": 0.3}))
    rows = art.empty_table(art.EVAL)
    art.write_table(rows, work / "data" / "it0" / "eval.parquet", art.EVAL)
    text = (ROOT / "params.yaml").read_text()
    keep_result("v-s0", [], tmp_path / "out" / "s0.json", work, ran=text, base=text, wall=1.0)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s0.answers.parquet", "s0.json"]
    assert list(art.read_table(tmp_path / "out" / "s0.answers.parquet", art.KEPT_EVAL).columns) == art.KEPT_EVAL.names


def test_a_result_whose_answers_cannot_be_kept_is_not_kept(tmp_path):
    """The metrics are the mark of a finished result (a rerun skips it): they land only once the
    answers are kept, and a failure leaves neither them nor a temporary beside them."""
    import json

    import pytest

    from runners.experiments import keep_result

    work = tmp_path / "work"
    for it in ("it0", "it1", "it2", "it3"):
        (work / "reports" / "iterations" / it).mkdir(parents=True)
        (work / "reports" / "iterations" / it / "metrics.json").write_text(json.dumps({"iteration": it, "accuracy": 0.3}))
    (work / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    (work / "data" / "it0").mkdir(parents=True)
    (work / "data" / "it0" / "eval.parquet").write_text("not parquet")  # a half-written copy, say
    text = (ROOT / "params.yaml").read_text()
    with pytest.raises(Exception, match="eval.parquet"):
        keep_result("v-s0", [], tmp_path / "out" / "s0.json", work, ran=text, base=text, wall=1.0)
    assert [p.name for p in (tmp_path / "out").iterdir()] == []


def test_a_kept_result_carries_accuracy_per_category(tmp_path):
    """A mix of reasoning-gym datasets (or a task's levels) is read per dataset from kept results, with the
    shortcut floors and the training mix; the stage's own timings are not kept."""
    import json

    from runners.experiments import keep_result

    work = tmp_path / "work"
    (work / "reports" / "figures").mkdir(parents=True)
    (work / "reports" / "summary.md").write_text("summary\n")
    (work / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    for it in ("it0", "it1", "it2", "it3"):
        (work / "reports" / "iterations" / it).mkdir(parents=True)
        (work / "reports" / "iterations" / it / "metrics.json").write_text(json.dumps(
            {"iteration": it, "accuracy": 0.3, "accuracy/chain_sum-2x12": 0.2, "ttt_accuracy/chain_sum-2x12": 0.25,
             "accuracy_gain/chain_sum-2x12": 0.1, "accuracy_gain_lo/chain_sum-2x12": 0.05, "floor": 0.4,
             "floor/chain_sum-2x12": 0.5, "floor_gain": -0.1, "train_coverage": 1.0,
             "mix_chain_sum-2x12": 0.5, "train_seconds": 9.0}))
    text = (ROOT / "params.yaml").read_text()
    kept = json.loads(keep_result("g-s0", [], tmp_path / "g-s0.json", work, ran=text, base=text, wall=1.0).read_text())
    # per category: accuracy, the gain over it0 and over the floor, the floors, the training mix and its coverage
    assert kept["metrics"]["it1"] == {"accuracy": 0.3, "accuracy/chain_sum-2x12": 0.2,
                                      "ttt_accuracy/chain_sum-2x12": 0.25, "accuracy_gain/chain_sum-2x12": 0.1,
                                      "accuracy_gain_lo/chain_sum-2x12": 0.05, "floor": 0.4,
                                      "floor/chain_sum-2x12": 0.5, "floor_gain": -0.1, "train_coverage": 1.0,
                                      "mix_chain_sum-2x12": 0.5}


def test_a_kept_report_carries_each_iterations_training_metrics(tmp_path):
    """The train stage's own figures (samples trained, NFT's clipped share) are not evaluated
    metrics: the report directory keeps them per iteration, where the docs read them."""
    import json

    from runners.experiments import keep_report

    work = tmp_path / "work"
    (work / "reports" / "figures").mkdir(parents=True)
    (work / "reports" / "summary.md").write_text("summary\n")
    for it, n in (("it1", 688), ("it2", 1232)):
        (work / "data" / it).mkdir(parents=True)
        (work / "data" / it / "train_metrics.json").write_text(json.dumps({"train_examples": n}))
    (work / "data" / "it0").mkdir(parents=True)  # the base model is not trained
    (work / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    keep_report(work, tmp_path / "kept")
    assert sorted(p.name for p in (tmp_path / "kept").glob("train_metrics_*.json")) == [
        "train_metrics_it1.json", "train_metrics_it2.json"]
    assert json.loads((tmp_path / "kept" / "train_metrics_it2.json").read_text()) == {"train_examples": 1232}


def test_a_setup_and_a_rule_run_over_seeds_by_name(tmp_path, monkeypatch):
    """--recipe smollm2-gym scpo: every run gets the recipes' overrides, then its own, then its seed, and
    keeps them in its result; an unknown recipe is refused before anything runs."""
    from runners import experiments as seeds
    from self_improve import recipes

    calls = []
    monkeypatch.setattr(seeds, "run_experiment", lambda name, args, dest, **kw: calls.append((name, args, kw)))
    monkeypatch.setattr(seeds, "write_reports", lambda out: "")
    seeds.main(["--recipe", "smollm2-gym", "scpo", "--name", "scpo", "--seeds", "2", "--out", str(tmp_path),
                "-S", "pairs.max_pairs=53"])
    ((name, args, kw),) = calls
    want = recipes.set_args(recipes.load_all(["smollm2-gym", "scpo"], ROOT))
    assert name == "scpo-s2" and args == want + ["-S", "pairs.max_pairs=53", "-S", "seed=2"]
    assert kw["extra"]["overrides"][-1] == "pairs.max_pairs=53" and "judge.method=vote_share" in kw["extra"]["overrides"]
    with pytest.raises(SystemExit):
        seeds.main(["--recipe", "nope", "--name", "x", "--out", str(tmp_path)])

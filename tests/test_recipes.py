"""Recipes as files (configs/recipes/): one parser, one flattener, the same -S arguments everywhere."""

from __future__ import annotations

import shlex
import subprocess
import sys

import pytest
import yaml

from self_improve import recipes
from self_improve.config import ConfigError, parse_params

from .conftest import ROOT


@pytest.mark.parametrize("name", ["smollm2-v1", "smollm2-v2"])
def test_a_recipe_is_valid_params_and_its_set_args_read_back_as_its_values(name, monkeypatch):
    monkeypatch.chdir(ROOT)
    overrides = recipes.load(name)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = parse_params(recipes.apply(raw, overrides), name)
    assert params.model.base == "models/smollm2-135m-instruct" and params.task.name == "word_math"
    args = recipes.set_args(overrides)
    assert args[::2] == ["-S"] * len(overrides)
    assert dict(map(recipes.parse_assignment, args[1::2])) == overrides  # DVC reads back what the file says


@pytest.mark.parametrize("name", sorted(f.stem for f in (ROOT / "configs/recipes").glob("*.yaml")))
def test_every_key_a_recipe_sets_is_in_params_yaml(name):
    """`dvc exp run -S key=value` refuses a key params.yaml lacks ("Key 'datasets' is not in struct"),
    so every key a recipe sets must be there, with a value or null; iterations of `loop` excepted,
    which `set_args` passes as `++key=value` (test_a_longer_loop_is_a_recipe)."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    for key in recipes.load(name):
        if key.startswith(recipes.OPEN):  # an iteration params.yaml may lack: set_args writes `++key`
            continue
        node = raw
        for part in key.split("."):
            assert isinstance(node, dict) and part in node, f"{name}: {key} is not in params.yaml"
            node = node[part]


def test_real_loops_exits_non_zero_naming_the_runs_that_failed(monkeypatch, tmp_path):
    from research import real_loops

    monkeypatch.setattr(real_loops, "run_one", lambda judge, seed, *a, **k: None if seed == 1 else tmp_path)
    monkeypatch.setattr(real_loops, "write_reports", lambda out: "table")
    with pytest.raises(SystemExit) as err:
        real_loops.main(["--judges", "verifier", "--seeds", "0", "1", "--out", str(tmp_path)])
    assert "1 of 2 runs failed: verifier seed 1" in str(err.value.code)
    real_loops.main(["--judges", "verifier", "--seeds", "0", "--out", str(tmp_path)])  # all kept: returns


def test_the_v2_recipe_sizes(monkeypatch):
    monkeypatch.chdir(ROOT)
    v2 = recipes.load("smollm2-v2")
    assert (v2["task.heldout_size"], v2["task.ttt_size"], v2["sample.k"], v2["task.instruction"]) == \
        (512, 128, 8, "Answer with the final number only.")


def test_overrides_nest_and_bad_ones_are_named():
    raw = {"train": {"lr": 0.1}}
    out = recipes.apply(raw, ["train.lora.r=8", "task.datasets=[{name: chain_sum}]", "seed=3"])
    assert out == {"train": {"lr": 0.1, "lora": {"r": 8}}, "task": {"datasets": [{"name": "chain_sum"}]}, "seed": 3}
    assert raw == {"train": {"lr": 0.1}}  # a copy
    with pytest.raises(ConfigError, match="expected key=value"):
        recipes.parse_assignment("train.lr")
    with pytest.raises(ConfigError, match="train.lr.x: lr is a value"):
        recipes.apply(raw, ["train.lr.x=1"])
    with pytest.raises(ConfigError, match="recipe nope: .*not found .*smollm2-v2"):
        recipes.load("nope")


def test_render_gives_what_yaml_reads_back():
    for value in ["Answer with the final number only.", "yes", "0.3", "a: b", 0.0002, 8, True, None,
                  [{"name": "chain_sum", "config": {"min_terms": 2}}], {"a": [1, 2]}]:
        assert yaml.safe_load(recipes.render(value)) == value, value


def test_the_command_prints_the_recipe_with_overrides_on_top():
    out = subprocess.run([sys.executable, "-m", "self_improve.recipes", "smollm2-v2", "-S", "sample.backend=hf"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    args = shlex.split(out)
    got = dict(map(recipes.parse_assignment, args[1::2]))
    assert got["sample.backend"] == "hf" and got["task.instruction"] == "Answer with the final number only."


def test_the_flow_applies_a_recipe_then_its_own_overrides(monkeypatch):
    from flows.loop import apply_overrides

    monkeypatch.chdir(ROOT)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    out = apply_overrides(raw, {"temperature": 0.7}, "smollm2-v2")
    assert out["sample"]["temperature"] == 0.7 and out["sample"]["k"] == 8 and out["task"]["heldout_size"] == 512


def test_every_diagnosed_rule_runs_as_a_loop_with_the_configs_the_diagnosis_measured():
    """research/gap.py measures each label-free rule on it0's samples; research/real_loops.py loops it with
    `-S` overrides: both read the one table, so the loop runs the judge and pairs the diagnosis scored."""
    from research.gap import RULES, rule
    from research.real_loops import judge_overrides

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    base = parse_params(raw, "params.yaml")
    for name in [*RULES, "llm_judge:yes_logprob"]:
        args = judge_overrides(name)
        looped = parse_params(recipes.apply(raw, args[1::2]), name)
        judge, pairs = rule(name, base)
        assert (looped.judge, looped.pairs) == (judge, pairs), name
    assert rule("scpo+validity_any", base)[1].weight.value == "margin"
    assert rule("llm_judge:yes_logprob", base)[0].mode.value == "yes_logprob"


def test_the_diagnosis_takes_a_recipe_by_name_with_overrides_on_top(tmp_path, bpe_model_dir, monkeypatch):
    """`research.gap --recipe` applies the recipe before -S (a recipe's quoted values survive, which
    `$(python -m self_improve.recipes ...)` in a shell does not), and records what ran."""
    import json

    from research import gap

    recipe = tmp_path / "small.yaml"
    recipe.write_text(f"model: {{base: {bpe_model_dir}}}\n"
                      "task: {name: word_math, instruction: Answer with the final number only., heldout_size: 12,"
                      " ttt_size: 4, dev_size: 12}\nsample: {backend: hf}\nevaluate: {max_new_tokens: 8}\n")
    monkeypatch.chdir(ROOT)
    out = tmp_path / "gap.json"
    gap.main(["--recipe", str(recipe), "-S", "task.dev_size=6", "--greedy-only", "--out", str(out)])
    result = json.loads(out.read_text())
    assert result["greedy"]["n"] == 6 and result["set"] == "dev"  # the -S on top of the recipe's 12, on dev
    assert result["params"]["task.instruction"] == "Answer with the final number only."
    assert result["params"]["task.dev_size"] == "6" and result["params"]["sample.backend"] == "hf"
    assert out.with_suffix(".md").read_text().startswith("it0 greedy answers to 6 dev problems")
    # held-out is read only by evaluate: a diagnosis without a dev set says how to get one
    with pytest.raises(SystemExit, match="task.dev_size"):
        gap.main(["--recipe", str(recipe), "-S", "task.dev_size=0", "--greedy-only", "--out", str(out)])
    gap.main(["--recipe", str(recipe), "--on", "heldout", "--greedy-only", "--out", str(out)])
    assert json.loads(out.read_text())["greedy"]["n"] == 12


@pytest.mark.unit
def test_rules_are_recipes_that_compose_with_a_setup_left_to_right():
    """A rule of configs/rules/ is a recipe by name: `smollm2-gym scpo` is the gym setup judged by ScPO,
    the same `-S` arguments the kept runs' runner passes to `dvc exp run` (so a README row's command
    is `dvc exp run $(python -m self_improve.recipes smollm2-gym scpo -S seed=0)`)."""
    from research.gap import rule_overrides
    from research.real_loops import judge_overrides, recipe

    assert {"scpo", "scpo+validity_any", "random", "format", "validity_only", "verifier"} <= set(recipes.rules(ROOT))
    both = recipes.load_all(["smollm2-gym", "scpo"], ROOT)
    assert both["task.name"] == "reasoning_gym" and both["judge.method"] == "vote_share"
    assert both["pairs.weight"] == "margin" and both["judge.min_share"] == 0.5
    out = subprocess.run([sys.executable, "-m", "self_improve.recipes", "smollm2-gym", "scpo", "-S", "seed=0"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert shlex.split(out) == recipe("smollm2-gym") + judge_overrides("scpo") + ["-S", "seed=0"]
    # later wins; a bare judge.method[:mode] still names a judge with no rule file
    assert recipes.load_all(["scpo", "majority_vote"], ROOT)["judge.method"] == "majority_vote"
    assert rule_overrides("llm_judge:yes_logprob", ROOT) == {"judge.method": "llm_judge", "judge.mode": "yes_logprob"}
    # a sweep point of the diagnosis: a rule with one key set after `@`
    assert rule_overrides("scpo+category_gate@judge.category_gate=0.3", ROOT) == {
        "judge.method": "vote_share", "judge.min_share": 0.5, "judge.category_gate": 0.3, "pairs.weight": "margin"}
    with pytest.raises(SystemExit, match="section.key=value"):
        rule_overrides("scpo@category_gate", ROOT)
    bad = subprocess.run([sys.executable, "-m", "self_improve.recipes", "smollm2-gym", "nope"],
                         cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0 and "recipe nope" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.unit
def test_the_flow_takes_a_setup_and_a_rule(monkeypatch):
    from flows.loop import apply_overrides

    monkeypatch.chdir(ROOT)
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    out = apply_overrides(raw, {}, "smollm2-gym,scpo+validity_any", root=ROOT)
    assert out["task"]["name"] == "reasoning_gym" and out["judge"]["restates"] == "any"


def test_a_longer_loop_is_a_recipe(monkeypatch):
    """`long` adds it4-it6 and the stop: valid params on top of a setup, and DVC's arguments add the
    iterations params.yaml lacks (`++`, Hydra's add-or-override) and read back as the file's values."""
    monkeypatch.chdir(ROOT)
    overrides = recipes.load_all(["smollm2-v3", "long"])
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    params = parse_params(recipes.apply(raw, overrides), "smollm2-v3 long")
    assert list(params.loop) == ["it1", "it2", "it3", "it4", "it5", "it6"] and params.stop.enabled
    assert params.loop["it6"].prev == "it5" and params.loop["it6"].ref == "it4"
    args = recipes.set_args(overrides)
    assert "++loop.it4.prev=it3" in args and "stop.enabled=true" in args
    assert dict(map(recipes.parse_assignment, args[1::2])) == overrides


def test_exp_hands_dvc_each_value_as_one_argument_and_names_what_is_missing(tmp_path, monkeypatch, capsys):
    """`self-improve exp` runs `dvc exp run` without a shell: the instruction's spaces stay in one
    argument (the shell's `$(self-improve recipe ...)` splits it), and a missing SmolLM2 is named with
    the command that fetches it before DVC starts anything."""
    from runners import console as cli

    monkeypatch.chdir(ROOT)
    cli.main(["exp", "smollm2-gym", "scpo", "-S", "seed=1", "-n", "gym-s1", "--dry-run", "--", "--temp"])
    argv = shlex.split(capsys.readouterr().out)
    overrides = recipes.load_all(["smollm2-gym", "scpo"], ROOT) | {"seed": 1}
    assert argv == ["dvc", "exp", "run", "-n", "gym-s1", *recipes.set_args(overrides), "--temp"]
    assert "task.instruction=Answer with the final number only." in argv
    monkeypatch.chdir(tmp_path)  # a checkout without models/smollm2-135m-instruct
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    with pytest.raises(SystemExit, match=r"models/smollm2-135m-instruct \(model.base\) is missing: make smollm2"):
        cli.main(["exp", "smollm2-v3", "co_reward"])


@pytest.mark.unit
def test_the_1024_heldout_recipe_draws_its_sets_stratified():
    """smollm2-v3 heldout-1024: 1,024 held-out problems, a third per operation, beside the test-time
    and dev sets, none running out of distinct problems."""
    from self_improve.config import TaskConfig
    from self_improve.tasks import task_for

    raw = recipes.apply(yaml.safe_load((ROOT / "params.yaml").read_text()),
                        recipes.load_all(["smollm2-v3", "heldout-1024"], ROOT))
    sets = task_for(TaskConfig(**raw["task"])).sets(0, raw["prepare"]["train_size"])
    assert len(sets.heldout) == 1024 and len(sets.ttt) == 128
    assert sets.heldout["category"].value_counts().to_dict() == {"add": 342, "sub": 341, "mul": 341}

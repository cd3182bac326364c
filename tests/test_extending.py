"""docs/extending.md's worked examples, run as the page writes them: each adds to the loop with one module
of its own and its one entry, and no edit anywhere else."""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml

from self_improve import artifacts as art
from self_improve.config import ALGORITHMS, ENGINES, JUDGES, TASKS, ConfigError, parse_params

from .conftest import ROOT, deep_merge, run_all

PAGE = ROOT / "docs" / "extending.md"


def _blocks(section: str, lang: str) -> list[str]:
    """The `lang` code blocks of docs/extending.md's `## section`."""
    text = PAGE.read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", body, flags=re.S)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """load(section, module, table, name): the page's python block of `section` written as `module` and
    importable; afterwards `name` leaves `table` and the module leaves sys.modules."""
    added = []

    def load(section: str, module: str, table, name: str) -> str:
        (code,) = _blocks(section, "python")
        folder = tmp_path / module
        folder.mkdir()
        (folder / f"{module}.py").write_text(code)
        monkeypatch.syspath_prepend(str(folder))
        added.append((module, table, name))
        return module

    yield load
    for module, table, name in added:
        table.unregister(name)
        sys.modules.pop(module, None)


@pytest.fixture
def brevity_plugin(plugin):
    return plugin("A judge", "brevity_example", JUDGES, "brevity")


@pytest.fixture
def hinge_plugin(plugin):
    return plugin("A training algorithm", "hinge_example", ALGORITHMS, "hinge")


def test_a_judge_added_by_a_plugin_is_a_judge_method(brevity_plugin, tiny_raw):
    (snippet,) = _blocks("A judge", "yaml")
    over = yaml.safe_load(snippet)
    assert over["plugins"] == ["plugins.brevity"] and over["judge"] == {"method": "brevity"}
    params = parse_params(deep_merge(tiny_raw, {**over, "plugins": [brevity_plugin]}))
    assert params.judge.method == "brevity" and "brevity" in JUDGES and not params.judge.entry.verdict
    with pytest.raises(ConfigError, match="unknown judge 'brevit'.*brevity"):
        parse_params(deep_merge(tiny_raw, {"plugins": [brevity_plugin], "judge": {"method": "brevit"}}))
    with pytest.raises(ConfigError, match="plugins: cannot import no_such_plugin"):
        parse_params(deep_merge(tiny_raw, {"plugins": ["no_such_plugin"]}))


@pytest.mark.loop
def test_the_plugin_judge_runs_the_whole_loop(brevity_plugin, tmp_path, tiny_raw, monkeypatch):
    """Through the judge stage and the loop, in-process: the rewards are the page's formula, the pairs
    prefer the shorter answered response, and every iteration trains and is evaluated."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(deep_merge(tiny_raw, {"plugins": [brevity_plugin],
                                                           "judge": {"method": "brevity"}})))
    run_all(tmp_path, params, monkeypatch)
    judged = art.read_table(tmp_path / "data" / "it1" / "judgments.parquet", art.JUDGMENTS)
    answered = judged["pred"].notna()
    assert answered.any()
    want = [1.0 / (1.0 + len(r) / 100) for r in judged.loc[answered, "response"]]
    assert judged.loc[answered, "reward"].astype(float).tolist() == pytest.approx(want)
    assert judged.loc[~answered, "reward"].isna().all()
    pairs = art.read_table(tmp_path / "data" / "it1" / "pairs.parquet", art.PAIRS)
    assert len(pairs) and (pairs["chosen"].str.len() <= pairs["rejected"].str.len()).all()
    for it in ("it1", "it2", "it3"):
        metrics = json.loads((tmp_path / "reports" / "iterations" / it / "metrics.json").read_text())
        assert metrics["accuracy"] is not None and metrics["num_pairs"] > 0, it


def test_an_algorithm_added_by_a_plugin_trains_with_its_loss(hinge_plugin, tiny_raw):
    """The loss is SLiC's hinge on a known input, and the preference trainer runs it by name."""
    import importlib

    import torch

    from self_improve.training.loop import Schedule
    from self_improve.training.trainers import PreferenceTrainer, RunContext

    params = parse_params(deep_merge(tiny_raw, {"plugins": [hinge_plugin], "train": {"algorithm": "hinge"}}))
    assert params.train.entry.family == "preference" and params.train.entry.nll
    hinge_loss = importlib.import_module(hinge_plugin).hinge_loss
    pc, pr = torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0])
    rc, rr = torch.tensor([-1.5, -2.0]), torch.tensor([-1.5, -2.0])
    loss, stats = hinge_loss(pc, pr, rc, rr, beta=2.0)
    # margins 2 * ((0.5) - (-0.5)) = 2 and 2 * ((-1) - (1)) = -4: relu(1 - 2) = 0, relu(1 + 4) = 5
    assert float(loss) == pytest.approx(2.5) and stats["reward_accuracy"].tolist() == [1.0, 0.0]
    trainer = PreferenceTrainer(RunContext(None, Schedule(1e-3, 1), 4), "hinge", params.train.dpo)
    assert trainer.fn is hinge_loss
    with pytest.raises(ConfigError, match="unknown algorithm 'hing'.*hinge"):
        parse_params(deep_merge(tiny_raw, {"plugins": [hinge_plugin], "train": {"algorithm": "hing"}}))


@pytest.mark.loop
def test_the_plugin_algorithm_runs_the_whole_loop(hinge_plugin, tmp_path, tiny_raw, monkeypatch):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(deep_merge(tiny_raw, {"plugins": [hinge_plugin],
                                                           "train": {"algorithm": "hinge", "dpo": {"rpo_alpha": 0.0}}})))
    run_all(tmp_path, params, monkeypatch)
    for it in ("it1", "it2", "it3"):
        train = json.loads((tmp_path / "data" / it / "train_metrics.json").read_text())
        assert train["train_steps"] > 0, it
        # a fresh adapter starts at the reference: every margin 0, the hinge's loss 1 (DPO's would be log 2)
        assert train["train_loss_first"] == pytest.approx(1.0, abs=1e-5), it
        metrics = json.loads((tmp_path / "reports" / "iterations" / it / "metrics.json").read_text())
        assert metrics["accuracy"] is not None, it


@pytest.fixture
def three_sum_plugin(plugin):
    return plugin("A task", "three_sum_example", TASKS, "three_sum")


def test_a_task_added_by_a_plugin_draws_disjoint_sets_and_checks_answers(three_sum_plugin, tiny_raw):
    from self_improve.tasks import task_for

    params = parse_params(deep_merge(tiny_raw, {"plugins": [three_sum_plugin], "task": {"name": "three_sum"}}))
    task = task_for(params.task)
    sets = task.sets(0, 50)
    keys = [{task.parse(p).key for p in frame["prompt"]} for frame in (sets.heldout, sets.ttt, sets.seed)]
    assert [len(k) for k in keys] == [30, 30, 50] and not (keys[0] & keys[1] or keys[0] & keys[2] or keys[1] & keys[2])
    row = sets.heldout.iloc[0]
    a, b, c = map(int, row["prompt"].rstrip("=").split("+"))
    assert row["answer"] == str(a + b + c) and task.extract(f"{a + b + c} ").answer == row["answer"]
    assert task.verify(row["answer"], row["answer"]) == 1.0 and task.verify("0", row["answer"]) == 0.0
    with pytest.raises(ConfigError, match="unknown task 'three_sun'.*three_sum"):
        parse_params(deep_merge(tiny_raw, {"plugins": [three_sum_plugin], "task": {"name": "three_sun"}}))


@pytest.mark.loop
def test_the_plugin_task_runs_the_whole_loop(three_sum_plugin, tmp_path, tiny_raw, monkeypatch):
    """The tiny base warms up on the task's own problems; every iteration samples, judges (co_reward
    across the reorderings), trains and is evaluated per category."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(deep_merge(tiny_raw, {"plugins": [three_sum_plugin],
                                                           "task": {"name": "three_sum"}})))
    run_all(tmp_path, params, monkeypatch)
    held = art.read_table(tmp_path / "data" / "task" / "heldout.parquet", art.PROMPTS)
    assert held["prompt"].str.fullmatch(r"\d+\+\d+\+\d+=").all()
    prompts = art.read_table(tmp_path / "data" / "it1" / "prompts.parquet", art.PROMPTS)
    assert (prompts.groupby("group_id")["prompt"].nunique() > 1).any()  # rewrites to vote across
    for it in ("it1", "it2", "it3"):
        metrics = json.loads((tmp_path / "reports" / "iterations" / it / "metrics.json").read_text())
        assert metrics["accuracy"] is not None and "floor" not in metrics, it
        assert {"accuracy/up_to_200", "accuracy/over_200"} <= set(metrics), it


@pytest.fixture
def merged_plugin(plugin):
    return plugin("An engine", "merged_example", ENGINES, "hf_merged")


def test_an_engine_added_by_a_plugin_samples_as_hf_does(merged_plugin, tiny_raw, tok, trained, tmp_path):
    """Named by sample.backend (an unknown name refused with the table's), prepared once (the merged
    copy and its record) and opened on it: greedy answers equal hf's on the same model."""
    from self_improve.engines.engine import prepare, read_engine
    from self_improve.engines.hf import SamplingSpec
    from self_improve.engines.sampler import HFSampler, open_sampler
    from self_improve.models.loading import save_model

    (snippet,) = _blocks("An engine", "yaml")
    over = yaml.safe_load(snippet)
    assert over["plugins"] == ["plugins.merged"] and over["sample"] == {"backend": "hf_merged"}
    params = parse_params(deep_merge(tiny_raw, {**over, "plugins": [merged_plugin]}))
    assert params.sample.backend == "hf_merged" and ENGINES.of("hf_merged").auto is None
    with pytest.raises(ConfigError, match="sample.backend.*unknown engine 'hf_merge'.*auto.*hf_merged"):
        parse_params(deep_merge(tiny_raw, {"plugins": [merged_plugin], "sample": {"backend": "hf_merge"}}))
    model = tmp_path / "model"
    save_model(trained, tok, model, {"test": True})
    engine = tmp_path / "engine"
    engine.mkdir()
    assert prepare("hf_merged", model, None, engine) == read_engine(engine) == {"engine": "hf_merged", "model": "merged"}
    assert (engine / "merged" / "config.json").is_file()
    sampler = open_sampler(model, params.sample, engine=engine)
    assert sampler.backend == "hf_merged"
    prompts, spec = ["12+34=", "23+45=", "31+17="], SamplingSpec(n=1, greedy=True, max_new_tokens=4)
    assert sampler.generate(prompts, spec, 0, progress=False) == HFSampler(trained, tok).generate(
        prompts, spec, 0, progress=False)


@pytest.mark.loop
def test_the_plugin_engine_runs_the_whole_loop(merged_plugin, tmp_path, tiny_raw, monkeypatch):
    """Every iteration's engine stage merges its chain once; sample and evaluate run on the copy."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(deep_merge(tiny_raw, {"plugins": [merged_plugin],
                                                           "sample": {"backend": "hf_merged"}})))
    run_all(tmp_path, params, monkeypatch)
    for it in ("it0", "it1", "it2", "it3"):
        engine = tmp_path / "data" / it / "engine"
        assert json.loads((engine / "engine.json").read_text()) == {"engine": "hf_merged", "model": "merged"}, it
        assert (engine / "merged" / "config.json").is_file(), it
    for it in ("it1", "it2", "it3"):
        assert art.read_provenance(tmp_path / "data" / it / "samples.parquet")["backend"] == "hf_merged", it
        metrics = json.loads((tmp_path / "reports" / "iterations" / it / "metrics.json").read_text())
        assert metrics["accuracy"] is not None and metrics["num_pairs"] > 0, it

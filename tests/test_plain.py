"""The loop without DVC (scripts/plain.py, `--plain` of scripts.seeds / scripts.real_loops): the same
stages in the same order give the same figures as the in-process loop, kept as a result file."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from scripts import plain
from scripts.seeds import run_plain
from self_improve import artifacts as art
from self_improve import choice

from .conftest import ROOT, run_all, tiny_full


def fake_root(tmp_path, raw: dict):
    """A tree holding what a plain run reads from the repository: dvc.yaml, params.yaml, inputs, configs."""
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy2(ROOT / "dvc.yaml", root / "dvc.yaml")
    shutil.copytree(ROOT / "data" / "inputs", root / "data" / "inputs")
    shutil.copytree(ROOT / "configs", root / "configs")
    (root / "models").mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root


@pytest.mark.unit
def test_workspace_holds_the_pipeline_and_links_models(tmp_path):
    root = fake_root(tmp_path, {"seed": 3})
    (root / "models" / "base").mkdir()
    work = plain.prepare_workspace(tmp_path / "w" / "one", "seed: 4\n", root)
    assert (work / "dvc.yaml").read_text() == (ROOT / "dvc.yaml").read_text()
    assert (work / "params.yaml").read_text() == "seed: 4\n"
    assert (work / "data" / "inputs" / "gsm8k_sample.jsonl").is_file() and (work / "configs").is_dir()
    assert (work / "models").is_symlink() and (work / "models" / "base").is_dir()
    # made fresh: what an earlier run left there is gone
    (work / "data" / "it1").mkdir()
    plain.prepare_workspace(work, "seed: 5\n", root)
    assert not (work / "data" / "it1").exists()
    with pytest.raises(SystemExit, match="cannot be the repository itself"):
        plain.prepare_workspace(root, "seed: 5\n", root)


@pytest.mark.unit
def test_only_overrides_are_taken(tmp_path):
    root = fake_root(tmp_path, {"seed": 0})
    with pytest.raises(SystemExit, match="only -S KEY=VALUE"):
        run_plain("x", ["--force", "-S", "seed=1"], tmp_path / "x.json", workdir=tmp_path / "w", root=root)
    assert not (tmp_path / "x.json").exists()


@pytest.mark.loop
def test_plain_run_gives_the_in_process_figures(tmp_path, monkeypatch):
    raw = tiny_full()
    root = fake_root(tmp_path, raw)
    dest = tmp_path / "out" / "tiny-s1.json"
    assert run_plain("tiny-s1", ["-S", "seed=1"], dest, workdir=tmp_path / "w", root=root,
                     extra={"judge": "co_reward"}, report_dir=tmp_path / "out" / "tiny-s1", threads=1) == dest
    result = json.loads(dest.read_text())
    assert result["machine"]["runner"] == "plain" and result["judge"] == "co_reward"
    assert result["params_diff"] == {"seed": 1} and result["params_set"] == {"seed": 1}
    assert (tmp_path / "out" / "tiny-s1" / "summary.md").is_file()
    # the same params through every stage's main() in this process: the same figures
    (tmp_path / "inproc").mkdir()
    params = tmp_path / "inproc" / "params.yaml"
    params.write_text(yaml.safe_dump(raw | {"seed": 1}, sort_keys=False))
    run_all(tmp_path / "inproc", params, monkeypatch)
    for it, kept in result["metrics"].items():
        ran = json.loads((tmp_path / "inproc" / "reports" / "iterations" / it / "metrics.json").read_text())
        assert kept == {k: ran[k] for k in kept}, it
    assert set(result["metrics"]) == {"it0", "it1", "it2", "it3"}
    # the answers kept problem by problem give the kept figures back: accuracy, and the label-free signals
    answers = art.read_table(tmp_path / "out" / "tiny-s1" / "answers.parquet", art.KEPT_EVAL)
    it0 = answers[answers["iteration"] == "it0"]
    for it, kept in result["metrics"].items():
        rows = answers[answers["iteration"] == it]
        assert rows[rows["set"] == "heldout"]["correct"].mean() == pytest.approx(kept["accuracy"]), it
        if it != "it0":
            lf = choice.signals(rows, base=it0)
            assert lf["lf_supported_agreement"] == pytest.approx(kept["lf_supported_agreement"]), it
            assert lf["lf_agreement_gain_lo"] == pytest.approx(kept["lf_agreement_gain_lo"]), it
    # kept once: a second call does not run again
    assert run_plain("tiny-s1", ["-S", "seed=1"], dest, workdir=tmp_path / "w", root=root) == dest


@pytest.mark.loop
def test_failed_plain_run_keeps_nothing(tmp_path, capsys):
    root = fake_root(tmp_path, tiny_full())
    dest = tmp_path / "out" / "bad.json"
    assert run_plain("bad", ["-S", "task.heldout_size=-1"], dest, workdir=tmp_path / "w", root=root) is None
    assert not dest.exists()
    assert "task.heldout_size" in capsys.readouterr().err

"""The loop without DVC (runners/plain.py, `--plain` of runners.experiments / research.real_loops): the same
stages in the same order give the same figures as the in-process loop, kept as a result file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from runners import plain
from research import base_screen
from runners.experiments import run_plain
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


@pytest.mark.unit
def test_only_named_stages_are_run_and_an_unknown_name_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a run changes into its workspace: back where the test started afterwards
    root = fake_root(tmp_path, tiny_full())
    work = plain.prepare_workspace(tmp_path / "w", (root / "params.yaml").read_text(), root)
    with pytest.raises(SystemExit, match="no stage named nosuch, train@it9"):
        plain.main([str(work), "--only", "check_params,train@it9,nosuch"])
    assert not (work / "device.json").exists()  # refused before anything ran
    for bad in ([str(work), "--only", ""], [str(work), "--only"], [str(work), "x", "y"]):
        with pytest.raises(SystemExit, match="usage"):
            plain.main(bad)
    plain.main([str(work), "--only", "check_params"])
    assert (work / "data" / "params.ok").is_file() and not (work / "data" / "task").exists()


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
    # its base alone (research/base_screen.py: only it0's stages, nothing trained) is the loop's own it0
    base = base_screen.screen_one(1, [], tmp_path / "screen", root=root, threads=1)
    screened = tmp_path / "screen" / "s1"
    assert result["metrics"]["it0"] == {k: base[k] for k in result["metrics"]["it0"]}
    assert not (screened / "data" / "it1").exists() and {"lf_supported_agreement", "lf_distinct"} <= set(base)
    # screened already: read, not run (the log is not rewritten); other params: run again, not read
    # (here params the first stage refuses, naming the seed and the key)
    log = (screened / "run.log").stat().st_mtime_ns
    assert base_screen.screen_one(1, [], tmp_path / "screen", root=root, threads=1) == base
    assert (screened / "run.log").stat().st_mtime_ns == log
    with pytest.raises(RuntimeError, match=r"seed 1: the base stages failed(.|\n)*task.heldout_size"):
        base_screen.screen_one(1, ["task.heldout_size=-1"], tmp_path / "screen", root=root, threads=1)
    assert not (screened / base_screen.METRICS).exists()


@pytest.mark.loop
def test_failed_plain_run_keeps_nothing(tmp_path, capsys):
    root = fake_root(tmp_path, tiny_full())
    dest = tmp_path / "out" / "bad.json"
    assert run_plain("bad", ["-S", "task.heldout_size=-1"], dest, workdir=tmp_path / "w", root=root) is None
    assert not dest.exists()
    assert "task.heldout_size" in capsys.readouterr().err


@pytest.mark.unit
def test_run_cache_keys_what_a_stage_reads_and_restores_what_it_wrote(tmp_path, capsys):
    from runners.dag import Stage
    from runners.run_cache import RunCache

    def workspace(name: str, data: str) -> Path:
        work = tmp_path / name
        (work / "data" / "in").mkdir(parents=True)
        (work / "data" / "in" / "a.txt").write_text(data)
        return work

    stage = Stage("s@it1", ["python", "-m", "stages.x"], ("data/in", "stages/__init__.py"), ("seed", "judge.method"),
                  ("data/out/model", "data/out/m.json", "data/out/optional.json"))
    one, two = workspace("one", "x"), workspace("two", "x")
    c1, c2 = RunCache(tmp_path / "c", one, ROOT, {"env": {}}), RunCache(tmp_path / "c", two, ROOT, {"env": {}})
    params = {"seed": 1, "judge": {"method": "co_reward", "mode": "a"}}
    key = c1.key(stage, params)
    # the same command, deps' bytes (code read from the repository) and declared params: the same key
    assert c2.key(stage, params) == key and c2.key(stage, params | {"other": 3}) == key
    assert c2.key(stage, {"seed": 1, "judge": {"method": "co_reward", "mode": "b"}}) == key  # undeclared key
    assert c2.key(stage, params | {"seed": 2}) != key
    assert RunCache(tmp_path / "c", two, ROOT, {"env": {"OMP_NUM_THREADS": "2"}}).key(stage, params) != key
    assert c1.digest("stages/__init__.py") == c1._file(ROOT / "stages" / "__init__.py")
    assert not c2.restore(stage, key)  # nothing stored yet
    (one / "data" / "out" / "model").mkdir(parents=True)
    (one / "data" / "out" / "model" / "w.bin").write_bytes(b"\0\1")
    (one / "data" / "out" / "m.json").write_text("{}")
    c1.store(stage, key)
    c1.store(stage, key)  # stored once; a second store leaves it
    (two / "data" / "out").mkdir(parents=True)
    (two / "data" / "out" / "optional.json").write_text("stale")  # not written by the stored run: removed
    assert c2.restore(stage, key)
    assert (two / "data" / "out" / "model" / "w.bin").read_bytes() == b"\0\1"
    assert (two / "data" / "out" / "m.json").read_text() == "{}"
    assert not (two / "data" / "out" / "optional.json").exists()
    assert not list((tmp_path / "c").glob(".tmp-*"))
    (two / "data" / "in" / "a.txt").write_text("y")  # other bytes in a dep: another key
    assert c2.key(stage, params) != key
    # a store that cannot be written (here its folder is a file) is said, and the run goes on
    (tmp_path / "not-a-folder").write_text("")
    broken = RunCache(tmp_path / "not-a-folder", one, ROOT, {"env": {}})
    broken.store(stage, key)
    assert "run cache: s@it1 not stored in" in capsys.readouterr().err and not broken.restore(stage, key)


@pytest.mark.loop
def test_run_cache_restores_the_base_stages_of_a_second_loop(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    root = fake_root(tmp_path, tiny_full())
    base = "check_params,prepare,engine_base,evaluate_base"
    cache = tmp_path / "cache"
    works = [plain.prepare_workspace(tmp_path / name, (root / "params.yaml").read_text(), root) for name in ("a", "b")]
    for work in works:
        plain.main([str(work), "--only", base, "--cache", str(cache)])
    assert json.loads((works[0] / "run_cache.json").read_text())["restored"] == []
    assert json.loads((works[1] / "run_cache.json").read_text())["restored"] == base.split(",")
    for rel in ("data/it0/eval.parquet", "data/it0/history.json", "reports/iterations/it0/metrics.json"):
        assert (works[1] / rel).read_bytes() == (works[0] / rel).read_bytes(), rel
    # another evaluate setting: the base model and its engine come back, the evaluation runs again (and the
    # check of the whole params file, a dep of its own)
    raw = tiny_full()
    raw["evaluate"]["batch_size"] = 128
    third = plain.prepare_workspace(tmp_path / "c", yaml.safe_dump(raw, sort_keys=False), root)
    plain.main([str(third), "--only", base, "--cache", str(cache)])
    assert json.loads((third / "run_cache.json").read_text())["restored"] == ["prepare", "engine_base"]
    with pytest.raises(SystemExit, match="usage"):
        plain.main([str(third), "--cache", str(cache), "--cache", str(cache)])

"""The whole loop in-process on a tiny config: every stage's main() with the paths dvc.yaml gives."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from self_improve import artifacts as art
from self_improve.config import parse_params
from self_improve.engines.ct2 import ct2_unavailable
from stages import judge, prepare

from .conftest import run_all, stage_argv, stage_commands, stage_modules

MODULES = stage_modules()


@pytest.mark.loop
def test_whole_loop_in_process(tmp_path, tiny_params_file, monkeypatch, capsys):
    run_all(tmp_path, tiny_params_file, monkeypatch)
    m0_k = parse_params(yaml.safe_load(Path(tiny_params_file).read_text())).evaluate.support_k
    assert m0_k > 0
    for it in ("it0", "it1", "it2", "it3"):
        m = art.read_json(tmp_path / "reports" / "iterations" / it / "metrics.json")
        # each accuracy is a count of right answers over the set's problems, with its binomial s.e.
        for key, n in (("accuracy", "heldout_n"), ("ttt_accuracy", "ttt_n"), ("maj_accuracy", "heldout_n")):
            right = m[key] * m[n]
            assert abs(right - round(right)) < 1e-9 and m[n] == 30
            assert m[f"{key}_se"] == pytest.approx((m[key] * (1 - m[key]) / m[n]) ** 0.5)
        if it != "it0":
            assert {"reward_mean", "judge_accuracy", "num_pairs", "train_loss"} <= set(m)
            # the gain on the same problems as it0, with its paired interval around it
            m0 = art.read_json(tmp_path / "reports" / "iterations" / "it0" / "metrics.json")
            for key in ("accuracy", "ttt_accuracy"):
                assert m[f"{key}_gain"] == pytest.approx(m[key] - m0[key])
                assert m[f"{key}_gain_lo"] <= m[f"{key}_gain"] <= m[f"{key}_gain_hi"]
        answers = art.read_table(tmp_path / "data" / it / "eval.parquet", art.EVAL)
        views = answers[answers["set"] == "ttt_view"]
        drawn = answers[answers["set"] == "ttt_sample"]  # the base model's sampled answers: it0 only
        answers = answers[~answers["set"].isin(["ttt_view", "ttt_sample"])]
        assert len(drawn) == (0 if it != "it0" else m0_k * (30 + len(views)))
        if it == "it0":
            support = drawn.dropna(subset=["pred"]).groupby("prompt_id")["pred"].agg(set)
        posed_ttt = answers[answers["set"] == "ttt"]
        inside = [float(pd.notna(p) and p in support.get(i, set())) for i, p in zip(posed_ttt["prompt_id"], posed_ttt["pred"])]
        assert m["lf_base_support"] == pytest.approx(sum(inside) / len(inside))
        assert len(answers) == 60 and answers["correct"].mean() == pytest.approx((m["accuracy"] + m["ttt_accuracy"]) / 2)
        # the label-free signals: each test-time problem in a second wording, the validity check
        assert len(views) >= 24 and set(views["prompt_id"]) <= set(answers.loc[answers["set"] == "ttt", "prompt_id"])
        assert m["lf_n"] == 30
        # agreement, recomputed from the answers: a problem's two wordings got one and the same answer
        posed = answers[answers["set"] == "ttt"].set_index("prompt_id")["pred"]
        other = views.set_index("prompt_id")["pred"]
        same = [float(pd.notna(posed[i]) and pd.notna(other[i]) and posed[i] == other[i]) for i in other.index]
        assert m["lf_agreement"] == pytest.approx(sum(same) / len(same))
        # invalid: no answer, or the validity check said no
        ttt_rows = answers[answers["set"] == "ttt"]
        bad = ttt_rows["pred"].isna() | (ttt_rows["valid"].notna() & ~ttt_rows["valid"].fillna(True).astype(bool))
        assert m["lf_invalid_share"] == pytest.approx(bad.astype(float).mean())
        ttt = answers[(answers["set"] == "ttt") & answers["pred"].notna()]
        assert m["lf_restate_share"] == pytest.approx(ttt["restates"].astype(float).mean())
        assert (it == "it0") == ("lf_agreement_gain" not in m)
        # it0 holds the tiny model's weights; with LoRA each iteration holds adapters, not a copy
        model_file = "model.safetensors" if it == "it0" else "chain.json"
        assert (tmp_path / "data" / it / "model" / model_file).is_file()
    # the base support drawn again for a loop kept before it was recorded: the same samples, the same signal
    from research import base_support

    base_support.main([str(tmp_path), "--out", str(tmp_path / "support.md")])
    replayed = json.loads((tmp_path / "support.json").read_text())[0]
    for row in replayed["history"]:
        m = art.read_json(tmp_path / "reports" / "iterations" / row["iteration"] / "metrics.json")
        for key in ("lf_base_support", "lf_supported_agreement"):
            assert row[key] == pytest.approx(m[key]), (row["iteration"], key)
    prompts = art.read_table(tmp_path / "data/it2/prompts.parquet", art.PROMPTS)
    heldout = art.read_table(tmp_path / "data/task/heldout.parquet", art.PROMPTS)
    assert set(prompts["source"]) == {"ttt", "fresh", "evolved"}
    assert not set(prompts["prompt"]) & set(heldout["prompt"])
    samples = art.read_table(tmp_path / "data/it1/samples.parquet", art.SAMPLES)
    assert len(samples) == 2 * len(art.read_table(tmp_path / "data/it1/prompts.parquet", art.PROMPTS))
    prov = art.read_provenance(tmp_path / "data/it1/judgments.parquet")
    assert prov["stage"] == "judge" and prov["params"]["judge"]["method"] == "co_reward"
    summary = (tmp_path / "reports/summary.md").read_text()
    assert "| it3 |" in summary
    assert "## Choosing the iteration without labels" in summary and "**Recommended: it" in summary
    # the report's examples and category mix come from each evaluate stage's files
    judged = art.read_table(tmp_path / "data/it3/judgments.parquet", art.JUDGMENTS).dropna(subset=["reward"])
    ex = art.read_json(tmp_path / "reports/iterations/it3/examples.json")
    assert ex["judged"][0]["reward"] == judged["reward"].max() and ex["judged"][-1]["reward"] == judged["reward"].min()
    assert ex["judged"][0]["response"] in summary.split("### it3")[1]
    assert ex["datasets"]["prompts"]["rows"] == len(art.read_table(tmp_path / "data/it3/prompts.parquet", art.PROMPTS))
    m3 = art.read_json(tmp_path / "reports/iterations/it3/metrics.json")
    mix = {k: v for k, v in m3.items() if k.startswith("mix_")}
    assert sum(mix.values()) == pytest.approx(1.0) and len(mix) >= 2
    table = pd.read_csv(tmp_path / "reports/iterations.csv")
    assert table.loc[table["iteration"] == "it3", list(mix)].iloc[0].tolist() == pytest.approx(list(mix.values()))
    assert all((tmp_path / "reports/figures" / f).stat().st_size > 1000
               for f in ("accuracy.png", "judge.png", "reward.png"))


@pytest.mark.loop
@pytest.mark.skipif(bool(ct2_unavailable()), reason=f"{ct2_unavailable()}")
def test_whole_loop_on_ct2(tmp_path, tiny_raw, monkeypatch):
    """sample.backend ct2: each iteration's model converted once (engine stages), then sampled and
    evaluated through the conversion; a rerun converts to the same bytes and samples the same."""
    tiny_raw["sample"]["backend"] = "ct2"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_raw))
    run_all(tmp_path, params, monkeypatch)
    for it in ("it0", "it1", "it2", "it3"):
        assert art.read_json(tmp_path / f"data/{it}/engine/engine.json")["engine"] == "ct2"
        assert {"accuracy", "ttt_accuracy", "maj_accuracy"} <= set(art.read_json(f"reports/iterations/{it}/metrics.json"))
    assert art.read_provenance(tmp_path / "data/it2/samples.parquet")["backend"] == "ct2"
    outs = ["data/it1/engine/ct2/model.bin", "data/it2/samples.parquet"]
    before = {o: (tmp_path / o).read_bytes() for o in outs}
    for name in ("engine@it1", "sample@it2"):
        argv = stage_argv(name)
        MODULES[name.split("@")[0]].main(argv + ["--params", str(params)])
    assert {o: (tmp_path / o).read_bytes() for o in outs} == before


@pytest.mark.loop
def test_stage_rerun_is_byte_identical(tmp_path, tiny_params_file, monkeypatch):
    run_all(tmp_path, tiny_params_file, monkeypatch)
    outs = ["data/it2/prompts.parquet", "data/it2/samples.parquet", "data/it2/judgments.parquet",
            "data/it2/pairs.parquet", "data/it2/model/adapters/it2/adapter_model.safetensors",
            "data/it2/model/adapters/it1/adapter_model.safetensors", "data/it2/model/chain.json"]
    before = {p: (tmp_path / p).read_bytes() for p in outs}
    for cmd in stage_commands():
        if "--iteration" in cmd and cmd[cmd.index("--iteration") + 1] == "it2" and "evaluate" not in cmd[2]:
            MODULES[cmd[2].split(".")[1]].main(cmd[3:] + ["--params", str(tiny_params_file)])
    assert {p: (tmp_path / p).read_bytes() for p in outs} == before


def test_bad_params_stop_a_stage_before_it_writes(tmp_path, tiny_raw, monkeypatch, capsys):
    tiny_raw["judge"]["methd"] = "co_reward"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_raw))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        prepare.main(stage_argv("prepare") + ["--params", str(params)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"prepare: error: {params}: judge.methd: unknown key"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_missing_input_is_named(tmp_path, tiny_params_file, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        judge.main(["--iteration", "it1", "--samples", "nope.parquet", "--model", "m", "--ref-model", "m",
                    "--out", "j.parquet",
                    "--params", str(tiny_params_file)])
    assert "nope.parquet: file not found" in capsys.readouterr().err
    assert not (tmp_path / "j.parquet").exists()

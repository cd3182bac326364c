"""MLflow while a loop runs: each iteration's metrics reach the loop's parent run as its evaluation
ends (self_improve/tracking.py `log_as_it_ends`), and the report finishes that run instead of making
another."""

from __future__ import annotations

import json

import pytest
import yaml

from runners.dag import stage_commands

from .conftest import ROOT, stage_modules


def _runs(uri: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("live")
    runs = client.search_runs([exp.experiment_id]) if exp else []
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    return client, parents, children


@pytest.mark.loop
def test_an_iterations_metrics_are_in_mlflow_before_the_next_one_samples(tmp_path, tiny_raw, monkeypatch):
    tiny_raw["tracking"] = {"enabled": True, "experiment": "live"}
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_raw))
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("SELF_IMPROVE_TRACKING", raising=False)
    modules = stage_modules()
    monkeypatch.chdir(tmp_path)
    before_it2 = None
    for name, argv in stage_commands(ROOT):
        if name == "sample@it2":  # what a user comparing iterations in the MLflow UI sees now
            client, parents, children = _runs(uri)
            before_it2 = (
                [p.info.status for p in parents],
                sorted(c.data.tags["iteration"] for c in children),
                [(m.step, m.value) for m in client.get_metric_history(parents[0].info.run_id, "accuracy")],
            )
        modules[argv[2].split(".")[1]].main(argv[3:] + ["--params", str(params)])
    metrics = {it: json.loads((tmp_path / "reports" / "iterations" / it / "metrics.json").read_text())
               for it in ("it0", "it1", "it2", "it3")}
    statuses, iterations, accuracy = before_it2
    assert statuses == ["RUNNING"] and iterations == ["it0", "it1"]
    assert sorted(accuracy) == [(0, metrics["it0"]["accuracy"]), (1, metrics["it1"]["accuracy"])]
    # the report finished that run: still one parent, one child per iteration, no point logged twice
    client, parents, children = _runs(uri)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert sorted(c.data.tags["iteration"] for c in children) == ["it0", "it1", "it2", "it3"]
    assert all(c.info.status == "FINISHED" for c in children)
    history = client.get_metric_history(parents[0].info.run_id, "accuracy")
    assert sorted((m.step, m.value) for m in history) == [(i, metrics[f"it{i}"]["accuracy"]) for i in range(4)]
    assert parents[0].data.params["seed"] == str(tiny_raw["seed"])  # the report's part
    assert "reward_hacking_alarm" in parents[0].data.tags

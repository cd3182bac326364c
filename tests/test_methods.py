"""Every judge method and training algorithm through the whole loop in-process (tiny config)."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from stages.lib import artifacts as art

from .conftest import deep_merge
from .test_pipeline import run_all

VARIANTS = {
    "llm_judge": {"judge": {"method": "llm_judge", "max_prompts": 3, "judgments": 2, "max_new_tokens": 12}},
    "self_certainty": {"judge": {"method": "self_certainty"}},
    "implicit_reward": {"judge": {"method": "implicit_reward"}},
    "ipo": {"train": {"algorithm": "ipo"}},
    "spin": {"train": {"algorithm": "spin"}, "evolve": {"seed_prompts": 8}},
    "cream": {"train": {"algorithm": "cream"}},
    "grpo": {"train": {"algorithm": "grpo", "kl_beta": 0.05}},
    "dpo_full": {"train": {"algorithm": "dpo", "lora": {"enabled": False}}},
}


@pytest.fixture(params=sorted(VARIANTS))
def variant_run(request, tmp_path, tiny_raw, monkeypatch):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(deep_merge(tiny_raw, VARIANTS[request.param])))
    run_all(tmp_path, params, monkeypatch)
    return request.param, tmp_path


def _read(root, it, name, schema):
    return art.read_table(root / "data" / it / f"{name}.parquet", schema)


def test_every_method_runs_the_loop(variant_run):
    name, root = variant_run
    metrics = {it: art.read_json(root / "reports" / it / "metrics.json") for it in ("it1", "it2", "it3")}
    assert all("accuracy" in m and "judged_share" in m for m in metrics.values())
    j1 = _read(root, "it1", "judgments", art.JUDGMENTS)
    j2 = _read(root, "it2", "judgments", art.JUDGMENTS)
    if name == "llm_judge":
        judged = j1[j1["parse_rate"].notna()]
        assert 0 < judged["prompt_id"].nunique() <= 3  # max_prompts
        assert j1.loc[j1["parse_rate"].isna(), "reward"].isna().all()  # not judged: no verdict
        rewards = j1["reward"].dropna()
        assert ((rewards >= 0) & (rewards <= 1)).all()
        assert "parse_failure_rate" in metrics["it1"]
        # a sample whose judgments all failed to parse is dropped, never scored 0
        failed = j1[(j1["parse_rate"] == 0)]
        assert failed["reward"].isna().all()
    elif name == "self_certainty":
        assert j1["reward"].notna().all() and j1["reward"].nunique() > 1
    elif name == "implicit_reward":
        # it1: the base against itself before its warm-up; later: against the previous model
        assert j1["reward"].notna().all() and j1["reward"].nunique() > 1 and metrics["it1"]["num_pairs"] > 0
        assert j2["reward"].nunique() > 1
    elif name == "cream":
        cons = _read(root, "it2", "pairs", art.PAIRS)["consistency"]
        assert len(cons) and cons.notna().all() and ((cons >= 0) & (cons <= 1)).all()
        assert j2["consistency"].notna().any()
    elif name == "spin":
        pairs = _read(root, "it1", "pairs", art.PAIRS)
        prompts = _read(root, "it1", "prompts", art.PROMPTS)
        seed = prompts[prompts["source"] == "seed"].set_index("prompt")["answer"]
        assert len(seed) == 8 and len(pairs) > 0
        assert set(pairs["prompt"]) <= set(seed.index)
        assert (pairs["chosen"] == pairs["prompt"].map(seed)).all()
        assert (pairs["chosen"] != pairs["rejected"]).all()
    elif name == "grpo":
        groups = _read(root, "it1", "groups", art.GROUPS)
        assert len(groups) > 0
        per = groups.groupby("prompt_id")["advantage"]
        assert (per.mean().abs() < 1e-9).all() and (per.std() > 0).all()
        assert {"clip_fraction", "kl"} <= set(art.read_json(root / "data/it1/train_metrics.json"))
    elif name == "dpo_full":
        from safetensors.torch import load_file

        before = load_file(root / "data/it1/model/model.safetensors")
        after = load_file(root / "data/it2/model/model.safetensors")
        changed = [k for k in before if not (before[k] == after[k]).all()]
        assert "lm_head.weight" in changed and any("embed" in k for k in changed)  # not an adapter
    assert isinstance(j1, pd.DataFrame)

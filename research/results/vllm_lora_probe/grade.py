"""Held-out accuracy of answer files against the workspace's gold, with the answer stop applied as the loop does."""
import json, sys
from pathlib import Path
import pandas as pd
from self_improve.config import load_params
from self_improve.engines.hf import finish
from self_improve.tasks import answer_stop, task_for

ws = Path(sys.argv[1])
params = load_params(ws / "params.yaml")
task = task_for(params.task)
stop = answer_stop(task, True)
held = pd.read_parquet(ws / "data/task/heldout.parquet")
ev = pd.read_parquet(ws / f"data/{sys.argv[2]}/eval.parquet")
ev = ev[ev.set == "heldout"].set_index("prompt_id").loc[held.prompt_id]
print("loop's own eval:", round(ev.correct.mean(), 4))
for f in sys.argv[3:]:
    d = json.load(open(f))
    texts = [finish(t, stop)[0] for t in d["texts"]]
    ok = [bool(task.verify(task.extract(t).answer, g, c)) for t, g, c in zip(texts, held.answer, held.category)]
    same = sum(a == b for a, b in zip(texts, ev.response))
    print(f, d["mode"], "acc", round(sum(ok) / len(ok), 4), "rate", round(d["rate"], 1), "s", round(d["seconds"], 1),
          "same text as loop's eval", same)

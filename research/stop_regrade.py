"""The answer stop (`sample.stop_at_answer`) replayed on kept answers: every kept response cut where the
task's `answer_end` says its first complete answer ends, then graded again.

    python -m research.stop_regrade research/results/smollm2_v3_arms research/results/smollm2_gym_arms
        # writes research/results/stop_regrade.md

Per folder: responses, the share the stop would cut, the characters it would save, and the responses
whose extracted answer or grade changes (right -> wrong and wrong -> right counted apart), so the
stop's cost in graded answers is read off the answers the loops actually wrote, not assumed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from self_improve.config import TaskConfig
from self_improve.tasks import task_for


def task_of(result: dict):
    params = result["params_set"]
    return task_for(TaskConfig(**{k.split(".", 1)[1]: v for k, v in params.items() if k.startswith("task.")}))


def regrade(answers: pd.DataFrame, task) -> dict:
    out = {"responses": 0, "cut": 0, "chars": 0, "chars_saved": 0, "answer_changed": 0, "right_to_wrong": 0,
           "wrong_to_right": 0}
    for response, gold, category, correct in zip(answers["response"], answers["answer"], answers["category"],
                                                 answers["correct"]):
        text = response if isinstance(response, str) else ""
        out["responses"] += 1
        out["chars"] += len(text)
        end = task.answer_end(text)
        if end is None or end >= len(text):
            continue
        out["cut"] += 1
        out["chars_saved"] += len(text) - end
        cut = text[:end]
        before, after = task.extract(text).answer, task.extract(cut).answer
        if before == after:
            continue
        out["answer_changed"] += 1
        cat = category if isinstance(category, str) else None
        now = task.verify(after, gold, cat) if isinstance(gold, str) else None
        was = float(correct) if correct is not None and not pd.isna(correct) else None
        if was is not None and now is not None and now != was:
            out["right_to_wrong" if was > now else "wrong_to_right"] += 1
    return out


def folder_rows(folder: Path) -> dict:
    total: dict = {}
    for result_file in sorted(folder.glob("*.json")):
        kept = folder / result_file.stem / "answers.parquet"
        if not kept.is_file():
            continue
        result = json.loads(result_file.read_text())
        got = regrade(pd.read_parquet(kept), task_of(result))
        for k, v in got.items():
            total[k] = total.get(k, 0) + v
        total["runs"] = total.get("runs", 0) + 1
    return total


def table(rows: dict[str, dict]) -> str:
    head = ("| kept runs | runs | responses | cut by the stop | characters saved | answer changed | right -> wrong "
            "| wrong -> right |\n|---|---|---|---|---|---|---|---|\n")
    body = ""
    for name, r in rows.items():
        n = max(1, r["responses"])
        body += (f"| {name} | {r['runs']} | {r['responses']} | {r['cut']} ({r['cut'] / n:.3f}) | "
                 f"{r['chars_saved'] / max(1, r['chars']):.3f} | {r['answer_changed']} ({r['answer_changed'] / n:.4f}) | "
                 f"{r['right_to_wrong']} ({r['right_to_wrong'] / n:.4f}) | {r['wrong_to_right']} ({r['wrong_to_right'] / n:.4f}) |\n")
    return head + body


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=Path("research/results/stop_regrade.md"))
    args = ap.parse_args(argv)
    rows = {str(f): folder_rows(f) for f in args.folders}
    text = ("# The answer stop replayed on kept answers\n\n`python -m research.stop_regrade "
            + " ".join(str(f) for f in args.folders) + "`: every kept response (held-out, test-time and base "
            "samples) cut where its first complete answer ends (tasks/answers.py `answer_end`), then graded "
            "again. Shares are of all responses; characters saved of all characters.\n\n" + table(rows))
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()

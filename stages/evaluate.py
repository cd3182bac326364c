"""Stage `evaluate`: how good the iteration's model is, and how good its self-judge was.

The logic: self_improve/evaluation.py."""

from __future__ import annotations

import argparse
import time

import pandas as pd

from self_improve import artifacts as art
from self_improve import choice
from self_improve.config import (
    ConfigError,
    FrozenJudge,
    Params,
)
from self_improve.engines.sampler import HFSampler, close_sampler, open_sampler
from self_improve.evaluation import (
    category_mix,
    dataset_record,
    Replay,
    frozen_yes,
    gains,
    head_to_head,
    iteration_metrics,
    judged_examples,
    model_metrics,
    pair_examples,
    recorded_answers,
    records,
    train_coverage,
)
from self_improve.floors import floor_metrics, floor_table
from self_improve.judges import (
    ModelHandle,
    template_path,
)
from self_improve.judges.rubric import load_template
from self_improve.models.loading import load_model, set_threads
from self_improve.stage import (
    BASE,
    ENGINE,
    ITERATION,
    Arg,
    Declaration,
    Run,
    derive_seed,
    note_timing,
    run_stage,
    stage_provenance,
)
from self_improve.stopping import STOPPED
from self_improve.tasks import answer_stop, task_for
from self_improve.tracking import log_as_it_ends

# the params keys this stage reads (it0, as evaluate_base, without the iteration's judge): dvc.yaml's
# params for it, and its provenance
BASE_PARAMS = (
    "seed", "model", "task", "evaluate", "judge.frozen", "judge.correct_template", "sample.batch_size",
    "sample.score_tokens", "sample.backend", "sample.gpu_memory_utilization", "sample.vllm",
    "sample.ct2", "sample.stop_at_answer", "security",
)
PARAMS = (
    "seed", "model", "evaluate", "judge", "task", "sample.batch_size", "sample.score_tokens",
    "sample.backend", "sample.gpu_memory_utilization", "sample.vllm", "sample.ct2", "sample.stop_at_answer",
    "security",
)
MAJ = ("maj_accuracy", "maj_accuracy_se")  # model_metrics' sampled metrics (evaluate.k)


JUDGE_TEMPLATES = ("${judge.template}  # the rubric the params name",
                   "${judge.correct_template}  # judge.frozen: the base model's P(Yes) for each answer")
DECLARATION = Declaration(
    args=(
        ITERATION,
        Arg("--model", "in", "the model to evaluate", required=True),
        BASE,
        ENGINE,
        Arg("--heldout", "in", "held-out problems", required=True),
        Arg("--ttt", "in", "test-time problems", required=True),
        Arg("--train-metrics", "in", "training metrics of this model", required=True),
        Arg("--judgments", "in", "the iteration's judgments (not for it0)"),
        Arg("--pairs", "in", "the iteration's pairs (not for it0)"),
        Arg("--sft", "in", "the iteration's best samples (not for it0)"),
        Arg("--prev-model", "in", "the previous model (prompt files: win rate against it)"),
        Arg("--prompts", "in", "the iteration's prompts (not for it0)"),
        Arg("--eval-out", "out", "each problem's greedy answer (parquet)",
            note="each problem's greedy answer: later iterations compare with it"),
        Arg("--bstar", "in", "the bstar stage's choice, reported beside the iteration's metrics"),
        Arg("--base-eval", "in", "it0's answers to the same problems: gains with paired intervals"),
        Arg("--stop", "in", "whether the loop stopped before this iteration (evolve's stop.json)"),
        Arg("--prev-eval", "in", "the previous iteration's answers (eval.parquet): a stopped iteration's model "
            "is that one, so its greedy answers are given again",
            note="a stopped iteration's answers are its predecessor's"),
        Arg("--prev-history", "in", "the metrics of it0 .. the previous iteration (history.json)"),
        Arg("--history", "out", "those and this iteration's metrics (history.json: the next iteration's evolve "
            "reads it to decide whether the loop stops)", note="the metrics so far: what the next evolve reads for the stop"),
        Arg("--out", "metric", "metrics.json", required=True, cache=False),
        Arg("--examples", "out", "examples.json, what the report shows of the iteration (not for it0)", cache=False),
    ),
    params=PARAMS,
    runs=(
        Run("evaluate_base", {
            "--iteration": "it0", "--model": "data/it0/model", "--engine": "data/it0/engine",
            "--heldout": "data/task/heldout.parquet", "--ttt": "data/task/ttt.parquet",
            "--train-metrics": "data/it0/train_metrics.json", "--eval-out": "data/it0/eval.parquet",
            "--history": "data/it0/history.json", "--out": "reports/iterations/it0/metrics.json"},
            deps=JUDGE_TEMPLATES[1:], params=BASE_PARAMS),
        Run("evaluate", {
            "--iteration": "${key}", "--model": "data/${key}/model", "--base": "data/it0/model",
            "--engine": "data/${key}/engine", "--heldout": "data/task/heldout.parquet",
            "--ttt": "data/task/ttt.parquet", "--train-metrics": "data/${key}/train_metrics.json",
            "--judgments": "data/${key}/judgments.parquet", "--pairs": "data/${key}/pairs.parquet",
            "--sft": "data/${key}/sft.parquet", "--prev-model": "data/${item.prev}/model",
            "--prompts": "data/${key}/prompts.parquet", "--base-eval": "data/it0/eval.parquet",
            "--bstar": "data/${key}/bstar.json", "--eval-out": "data/${key}/eval.parquet",
            "--stop": "data/${key}/stop.json", "--prev-eval": "data/${item.prev}/eval.parquet",
            "--prev-history": "data/${item.prev}/history.json", "--history": "data/${key}/history.json",
            "--out": "reports/iterations/${key}/metrics.json",
            "--examples": "reports/iterations/${key}/examples.json"},
            foreach="${loop}", deps=JUDGE_TEMPLATES),
    ),
)


def _answer(args: argparse.Namespace, params: Params, heldout, ttt, task) -> tuple[object, dict, pd.DataFrame]:
    """The model's answers to held-out and test-time problems (a stopped iteration replays its
    predecessor's), their metrics, and the answers table with the frozen judge's P(Yes) where it is on."""
    def engine():
        return open_sampler(args.model, params.sample, params.security, args.base, params.model, args.engine)

    cfg, again = params.evaluate, {}
    if args.prev_eval and args.prev_history and args.stop and art.read_json(args.stop).get("stopped"):
        # the predecessor's model, seed and problems: its greedy answers and its maj@k (same samples)
        sampler = Replay(recorded_answers(art.read_table(args.prev_eval, art.EVAL), heldout, ttt,
                                          derive_seed(params.seed, "evaluate"), task), engine)
        before = art.read_json(args.prev_history)[-1]
        cfg, again = cfg.model_copy(update={"k": 0}), {k: before[k] for k in MAJ if k in before}
    else:
        sampler = engine()
    answers: list[dict] = []
    metrics = model_metrics(sampler, heldout, ttt, cfg, derive_seed(params.seed, "evaluate"), task, answers=answers,
                            base_samples=not args.base_eval,
                            stop_at=answer_stop(task, params.sample.stop_at_answer)) | again
    answers_df = pd.DataFrame(answers, columns=[f.name for f in art.EVAL if f.name != "iteration"])
    answers_df.insert(0, "iteration", args.iteration)
    if params.judge.frozen != FrozenJudge.none and not ttt.empty:
        answers_df = frozen_yes(answers_df, ttt, params, args.base or args.model)
    return sampler, metrics, answers_df


def _against_previous(args: argparse.Namespace, params: Params, sampler, heldout) -> dict:
    """Open prompts: the new model's win rate against the previous one, judged by the rubric."""
    load = dict(security=params.security, base=args.base, model_cfg=params.model)
    new = ModelHandle(sampler.model, sampler.tokenizer) if isinstance(sampler, HFSampler) else \
        ModelHandle(*load_model(args.model, **load))
    old = ModelHandle(*load_model(args.prev_model, **load))
    return head_to_head(new, old, heldout, params.judge, load_template(template_path(params, "template")),
                        params.evaluate.max_new_tokens, params.evaluate.batch_size,
                        derive_seed(params.seed, "win-rate", args.iteration), params.model.max_length)


def _iteration(args: argparse.Namespace, params: Params, task, heldout) -> tuple[dict, dict | None]:
    """What the iteration trained on: judge, pairs and prompt metrics and the report's examples (it0: the
    base model's training metrics), and the bstar stage's choice."""
    metrics: dict = {}
    train = art.read_json(args.train_metrics)
    examples = None
    if args.judgments:
        judgments = art.read_table(args.judgments, art.JUDGMENTS)
        pairs = art.read_table(args.pairs, art.PAIRS)
        metrics.update(iteration_metrics(judgments, pairs, art.read_table(args.sft, art.SFT), train,
                                         params.judge.entry.verdict, task))
        examples = {"judged": records(judged_examples(judgments)), "pairs": records(pair_examples(pairs)),
                    "datasets": {"pairs": dataset_record(args.pairs, pairs)}}
        if args.prompts:
            prompts = art.read_table(args.prompts, art.PROMPTS)
            metrics.update(category_mix(prompts))
            metrics.update(train_coverage(prompts, heldout))
            examples["datasets"]["prompts"] = dataset_record(args.prompts, prompts)
    else:
        metrics.update({k: v for k, v in train.items() if isinstance(v, (int, float))})
    if args.bstar:
        picked = art.read_json(args.bstar)
        metrics.update({"sample_temperature": picked["temperature"], "sft_min_reward": picked["threshold"]})
        if picked.get("enabled"):
            metrics.update({"bstar_balance": picked["balance"], "bstar_seconds": picked["seconds"]})
    return metrics, examples


def _ruled_out(task, ttt: pd.DataFrame) -> dict[str, frozenset] | None:
    """Each test-time problem's answers the task rules out (judge.shortcut's), for the shortcut signals of
    the label-free choice; None for a task that names none."""
    if not hasattr(task, "ruled_out"):
        return None
    return {pid: task.ruled_out(prompt) for pid, prompt in zip(ttt["prompt_id"], ttt["prompt"])}


def _stopped(args: argparse.Namespace) -> dict:
    """Whether the loop had stopped before this iteration, and where and why (evolve's stop.json); the
    reason too where the stop was due but the loop went on (stop.while_rising)."""
    if not args.stop:
        return {}
    stop = art.read_json(args.stop)
    out = {STOPPED: float(bool(stop.get("stopped")))}
    if stop.get("stopped"):
        out.update({"stop_at": stop.get("at"), "stop_reason": stop.get("reason")})
    elif stop.get("reason"):
        out["stop_reason"] = stop["reason"]
    return out


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        step = params.iteration_index(args.iteration)
        set_threads()
        heldout = art.read_table(args.heldout, art.PROMPTS)
        ttt = art.read_table(args.ttt, art.PROMPTS)
        task = task_for(params.task)
        metrics = {"iteration": args.iteration, "step": step}
        sampler, answered, answers_df = _answer(args, params, heldout, ttt, task)
        try:
            metrics.update(answered)
            base_eval = art.read_table(args.base_eval, art.EVAL) if args.base_eval else None
            if base_eval is not None:
                metrics.update(gains(base_eval, answers_df))
            metrics.update(floor_metrics(floor_table(task, heldout, ttt), answers_df))  # the shortcut floors
            metrics.update(choice.signals(answers_df, base_eval, _ruled_out(task, ttt)))
            if args.prev_model and task.open_ended:  # open prompts: the new model against the old
                metrics.update(_against_previous(args, params, sampler, heldout))
        finally:
            close_sampler(sampler)
        trained, examples = _iteration(args, params, task, heldout)
        metrics.update(trained)
        if args.examples:
            if examples is None:
                raise ConfigError("evaluate: --examples needs the iteration's --judgments and --pairs")
            art.write_json(examples, args.examples)
        if args.eval_out:
            art.write_table(answers_df, args.eval_out, art.EVAL,
                            stage_provenance("evaluate", args.iteration, params, None, [args.eval_out]))
        metrics.update(_stopped(args))
        metrics = {k: v for k, v in metrics.items() if v is not None}
        if args.history:
            art.write_json((art.read_json(args.prev_history) if args.prev_history else []) + [metrics], args.history,
                           sort_keys=False)
        art.write_json(metrics, args.out)
        started = time.perf_counter()
        log_as_it_ends(args.params, args.iteration, step, metrics)
        note_timing("tracking_seconds", time.perf_counter() - started)

    run_stage("evaluate", DECLARATION.add_args, body, argv,
              reads=lambda args: BASE_PARAMS if args.iteration == "it0" else PARAMS)


if __name__ == "__main__":
    main()

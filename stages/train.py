"""Stage `train`: one iteration of self-training, LoRA (default) or full fine-tuning.

`train.algorithm`: `raft` fine-tunes on the best-judged samples (RAFT / ReST / STaR); `dpo`,
`ipo`, `spin` and `cream` train on the pairs (the reference being the iteration's starting
model); `grpo` on the stored groups of samples with their advantages; `nft` on the same samples
with 1/0 labels (negative-aware fine-tuning: wrong samples trained through the implicit negative
policy, not dropped). With LoRA the iteration's
output is its adapter (beside the earlier iterations' adapters and `chain.json`): the next
iteration loads the base with every adapter merged in order and trains a fresh one on top. Full
fine-tuning writes full safetensors weights. Memory is bounded by `train.micro_batch_size`
(gradient accumulation up to `train.batch_size`), optionally with gradient checkpointing.

Resumable: every `train.checkpoint_every` steps the state goes to `--checkpoints` (a DVC
`persist` output), and a run killed part way continues from there when restarted on the same
inputs and params. Scale-out: `accelerate launch -m stages.train ...` runs it unchanged on
several processes (DDP, or FSDP2 with configs/accelerate/fsdp.yaml); only the main process writes.
`SELF_IMPROVE_ACCELERATE_CONFIG=configs/accelerate/fsdp.yaml` picks that launcher for dvc.yaml's
command as it is (stages/lib/distributed.py).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from pathlib import Path

import pandas as pd
import torch

from .lib import artifacts as art
from .lib.cli import derive_seed, run_stage, stage_provenance
from .lib.config import PREFERENCE, Algorithm, Params, TrainConfig
from .lib.distributed import is_fsdp, make_accelerator, relaunch
from .lib.generation import chat_format
from .lib.models import attach_lora, load_model, model_identity, save_adapter_chain, save_model, set_threads
from .lib.training import Checkpoints, Schedule, steps_for, train_grpo, train_nft, train_preference, train_sft

log = logging.getLogger(__name__)


def nft_data(groups: pd.DataFrame, threshold: float) -> pd.DataFrame:
    """NFT's samples: each scored sample's label (1: reward >= threshold and neither truncated nor
    invalid; else 0) and `rate`, the mean label of its prompt's samples; prompts whose samples all
    share one label are dropped (they carry no signal, as in the official code's filter), except
    prompts judge.low_consensus penalise marked: all wrong, trained down (RESTRAIN)."""
    if groups.empty:
        return groups.assign(label=pd.Series(dtype=float), rate=pd.Series(dtype=float))
    right = (groups["reward"].astype(float) >= threshold) & ~groups["truncated"].fillna(False).astype(bool)
    right &= groups["valid"].fillna(True).astype(bool)
    penalised = (groups["penalised"].fillna(False).astype(bool) if "penalised" in groups
                 else pd.Series(False, index=groups.index))
    out = groups.assign(label=(right & ~penalised).astype(float))
    out["rate"] = out.groupby("prompt_id")["label"].transform("mean")
    return out[((out["rate"] > 0) & (out["rate"] < 1)) | penalised].reset_index(drop=True)


def training_size(cfg: TrainConfig, pairs: pd.DataFrame, sft: pd.DataFrame, groups: pd.DataFrame) -> int:
    if cfg.algorithm == Algorithm.raft:
        return len(sft)
    if cfg.algorithm == Algorithm.grpo:
        return len(groups)
    if cfg.algorithm == Algorithm.nft:
        return len(nft_data(groups, cfg.nft.threshold))
    return len(pairs)


def train(model, tokenizer, pairs: pd.DataFrame, sft: pd.DataFrame, groups: pd.DataFrame, cfg: TrainConfig,
          seed: int, accelerator=None, checkpoints: Checkpoints | None = None, max_length: int | None = None):
    """Train `model`; returns the trained model (a peft model with LoRA), the log, the number of examples
    and, under FSDP, the gathered full state dict (None otherwise: the model's own weights are whole)."""
    chat = chat_format(model, tokenizer)  # before LoRA wraps it: the base's generation config
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.lora.enabled:
        torch.manual_seed(seed)  # the adapter's initial weights
        model = attach_lora(model, cfg.lora)
    n = training_size(cfg, pairs, sft, groups)
    sched = Schedule(cfg.lr, steps_for(n, cfg.batch_size, cfg.epochs), warmup_steps=min(10, n))
    common = dict(accelerator=accelerator, checkpoints=checkpoints, micro_batch_size=cfg.micro,
                  chat=chat, max_length=max_length)
    if cfg.algorithm == Algorithm.raft:
        out = train_sft(model, tokenizer, list(sft["prompt"]), list(sft["response"]), sched,
                        cfg.batch_size, seed, cfg.max_grad_norm, desc="raft", **common)
    elif cfg.algorithm in PREFERENCE:
        cons = [0.5 if pd.isna(c) else float(c) for c in pairs["consistency"]]
        weights = None
        if pairs["weight"].notna().any():
            weights = [1.0 if pd.isna(w) else float(w) for w in pairs["weight"]]
        out = train_preference(model, tokenizer, cfg.algorithm, list(pairs["prompt"]), list(pairs["chosen"]),
                               list(pairs["rejected"]), sched, cfg.batch_size, seed, cfg.beta,
                               cfg.nll_weight, cons, cfg.max_grad_norm, weights=weights, **common)
    elif cfg.algorithm == Algorithm.nft:
        data = nft_data(groups, cfg.nft.threshold)
        out = train_nft(model, tokenizer, list(data["prompt"]), list(data["response"]), list(data["label"]),
                        list(data["rate"]), sched, cfg.batch_size, seed, cfg.nft.eps, cfg.nft.neg_weight,
                        cfg.nft.omega.value, cfg.max_grad_norm, **common)
    else:
        out = train_grpo(model, tokenizer, list(groups["prompt"]), list(groups["response"]),
                         [float(a) for a in groups["advantage"]], sched, cfg.batch_size, seed,
                         cfg.clip_eps, cfg.kl_beta, cfg.max_grad_norm, **common)
    if n == 0:
        log.warning("no training data this iteration: the model is passed on unchanged")
    full_state = None
    if is_fsdp(accelerator):  # every process takes part in gathering the shards; the main one gets them
        full_state = accelerator.get_state_dict(model)
    if accelerator is not None:
        model = accelerator.unwrap_model(model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_disable()
        model.config.use_cache = True
    return model, out, n, full_state


def fingerprint(params: Params, iteration: str, model_dir: str | Path, base: str | Path | None,
                *tables: pd.DataFrame) -> str:
    """What a checkpoint belongs to: the train and model params, the data and the starting model.

    The starting model is identified without re-reading a pretrained base's weights: by the base
    record's content hash (taken once by prepare) and the adapters' bytes (stages/lib/models.py).
    """
    h = hashlib.sha256()
    head = [params.seed, iteration, params.train.model_dump(mode="json"), params.model.model_dump(mode="json")]
    h.update(json.dumps(head, sort_keys=True).encode())
    for t in tables:
        h.update(pd.util.hash_pandas_object(t, index=False).to_numpy().tobytes())
    h.update(model_identity(model_dir).encode())
    if base is not None and Path(base).resolve() != Path(model_dir).resolve():
        h.update(model_identity(base).encode())
    return h.hexdigest()


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--iteration", required=True)
    p.add_argument("--model", required=True, help="in: the iteration's starting model")
    p.add_argument("--base", help="in: the base model (it0) that adapter chains apply to")
    p.add_argument("--pairs", required=True, help="in: preference pairs")
    p.add_argument("--sft", required=True, help="in: best-judged samples")
    p.add_argument("--groups", required=True, help="in: GRPO groups")
    p.add_argument("--out", required=True, help="out: the next model directory")
    p.add_argument("--metrics", required=True, help="out: training metrics (json)")
    p.add_argument("--checkpoints", help="resumable state (kept between runs); none if not given")


def main(argv: list[str] | None = None) -> None:
    def body(args: argparse.Namespace, params: Params) -> None:
        params.iteration_index(args.iteration)
        if argv is None:  # run as a program (dvc.yaml): SELF_IMPROVE_ACCELERATE_CONFIG may pick a launcher
            relaunch("stages.train", sys.argv[1:])
        set_threads()
        accelerator = make_accelerator()  # no GPU: processes over gloo; FSDP2 if the config asks
        pairs = art.read_table(args.pairs, art.PAIRS)
        sft = art.read_table(args.sft, art.SFT)
        groups = art.read_table(args.groups, art.GROUPS)
        model, tokenizer = load_model(args.model, device="cpu", security=params.security, base=args.base,
                                      model_cfg=params.model)
        ckpt = None
        if args.checkpoints:
            key = fingerprint(params, args.iteration, args.model, args.base, pairs, sft, groups)
            ckpt = Checkpoints(args.checkpoints, key, params.train.checkpoint_every, accelerator.is_main_process)
        if accelerator.num_processes > 1:
            log.info("training on %d processes (%s)", accelerator.num_processes, accelerator.distributed_type)
        seed = derive_seed(params.seed, "train", args.iteration)
        trained, train_log, n, full_state = train(model.to(accelerator.device), tokenizer, pairs, sft, groups, params.train,
                                      seed, accelerator, ckpt, params.model.max_length)
        if not accelerator.is_main_process:
            return
        metrics = {"train_examples": n, "train_processes": accelerator.num_processes,
                   "train_resumed_from": train_log.resumed_from, **train_log.summary()}
        prov = stage_provenance("train", args.iteration, params, ("seed", "model", "train", "security"), [args.out])
        if params.train.lora.enabled:
            save_adapter_chain(trained, args.model, args.base or args.model, args.iteration,
                               args.out, prov, state_dict=full_state)
        else:
            save_model(trained, tokenizer, args.out, prov, state_dict=full_state)
        art.write_json(metrics, args.metrics)

    run_stage("train", _args, body, argv)


if __name__ == "__main__":
    main()

"""The algorithm table: every `train.algorithm`, once, with everything the loop needs to know of it.

An entry names its family, which decides the table it trains on and its trainer (sft: the best
samples, RAFT / ReST / STaR; preference: the pairs; grpo and nft: every scored sample of a prompt,
the groups), and declares what the other stages give it: `consistency` (the judge stage stores
CREAM's per-prompt consistency beside the rewards), `reference_pairs` (the pairs stage pairs the
seed data's reference answer over the model's own sample, SPIN) and `seed_prompts` (seed-data
prompts each iteration by default). No stage asks which algorithm it runs: each reads these.

A preference algorithm's `loss` is `"module:function"` (imported when training starts) or the
function, called as `fn(pi_chosen, pi_rejected, ref_chosen, ref_rejected, beta=, weight=,
[consistency=])` on (B,) sequence log-probs and returning (the weighted mean loss, stats holding
(B,) `reward_margin` and `reward_accuracy`), as self_improve/training/losses.py's dpo_loss does;
`mean_logps` takes token-mean log-probs (IPO), `nll` adds the RPO NLL term on the chosen answer
(train.dpo.rpo_alpha). Adding a loss variant is one module and one `register_algorithm` call
(docs/extending.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

from self_improve.config.tables import Table, resolve

FAMILIES = ("sft", "preference", "grpo", "nft")


@dataclass(frozen=True)
class Algorithm:
    family: str  # sft | preference | grpo | nft: the table it trains on and its trainer
    about: str = ""
    loss: Optional[Union[str, Callable[..., Any]]] = None  # preference: "module:function" or the function
    mean_logps: bool = False  # preference: token-mean log-probs (IPO) rather than sums
    nll: bool = True  # preference: the RPO NLL term on the chosen answer applies
    consistency: bool = False  # the judge stores CREAM's consistency; the loss takes it
    reference_pairs: bool = False  # pairs: the seed data's reference answer over the model's sample (SPIN)
    seed_prompts: int = 0  # seed-data prompts per iteration when evolve.seed_prompts is not set

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r}: one of {', '.join(FAMILIES)}")
        if (self.family == "preference") != (self.loss is not None):
            raise ValueError("a preference algorithm has a loss, and only it")

    def loss_function(self) -> Callable[..., Any]:
        return resolve(self.loss)


LOSSES = "self_improve.training.losses"
ALGORITHMS: Table[Algorithm] = Table("algorithm", {
    "raft": Algorithm("sft", "fine-tune on the best-judged samples (RAFT / ReST / STaR)"),
    "dpo": Algorithm("preference", "sigmoid DPO, optional NLL on the chosen answer (iterative RPO)",
                     loss=f"{LOSSES}:dpo_loss"),
    "ipo": Algorithm("preference", "squared loss towards a margin of 1/(2 beta)", loss=f"{LOSSES}:ipo_loss",
                     mean_logps=True, nll=False),  # its squared loss has its own target
    "spin": Algorithm("preference", "DPO form: the seed data's reference answer over the model's own sample",
                      loss=f"{LOSSES}:spin_loss", reference_pairs=True, seed_prompts=300),
    "cream": Algorithm("preference", "DPO regularised by the judge's consistency across iterations",
                       loss=f"{LOSSES}:cream_loss", consistency=True),
    "grpo": Algorithm("grpo", "group-relative advantages with a clipped ratio"),
    "nft": Algorithm("nft", "negative-aware fine-tuning: right samples' likelihood up, wrong ones' via the "
                            "implicit negative policy"),
})


register_algorithm = ALGORITHMS.register  # a new train.algorithm: register_algorithm("name", Algorithm(...))
unregister_algorithm = ALGORITHMS.unregister
algorithm_of = ALGORITHMS.of  # the entry of a train.algorithm; an unknown one refused with the table's names

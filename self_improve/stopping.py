"""When a loop stops early: the label-free choice rule read after every iteration.

The evolve stage of iteration N reads the metrics of it0 .. it(N-1) (the history evaluate keeps,
`data/itK/history.json`) and decides (`decide`) whether the loop has stopped. It stops once the
iteration the choice rule recommends (`choice.recommend` with `choice.RULE`: the latest candidate,
its signal risen beyond noise) is `stop.patience` iterations behind the latest one: no iteration
since has passed the rule. With `stop.on_alarm`, it also stops when the reward-hacking alarm fires
(`quality.reward_hacking_alarm`; it reads held-out and verifier accuracy where the task has gold
answers, so this part is not label-free). Once stopped, the loop stays stopped: an iteration whose
predecessor stopped poses no prompts, so it samples, judges and trains nothing and passes its
starting model on; its evaluation gives its predecessor's greedy answers again (evaluation.Replay).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from self_improve.choice import recommend
from self_improve.config import StopConfig
from self_improve.quality import reward_hacking_alarm

STOPPED = "stopped"  # the metrics key evaluate records (1.0: this iteration trained nothing)


@dataclass(frozen=True)
class Decision:
    stopped: bool
    at: str | None  # the last iteration that trained (the one the stop came after)
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def decide(history: list[dict], cfg: StopConfig) -> Decision:
    """Whether the iteration after `history` (it0's metrics first, then each iteration's, in order)
    runs, by `cfg`; off, it always does."""
    if not cfg.enabled or not history:
        return Decision(False, None, "")
    last = history[-1]
    if last.get(STOPPED):  # stopped before: stays stopped
        return Decision(True, last.get("stop_at"), last.get("stop_reason") or "stopped earlier")
    latest = str(last.get("iteration", "it0"))
    if cfg.on_alarm and len(history) > 1:
        alarms = reward_hacking_alarm(history)
        if alarms:
            return Decision(True, latest, f"the reward-hacking alarm fired: {alarms[0]}")
    if len(history) <= cfg.patience:  # too few iterations to tell
        return Decision(False, None, "")
    rec = recommend(history)
    behind = len(history) - 1 - [r.get("iteration") for r in history].index(rec["iteration"])
    if behind >= cfg.patience:
        return Decision(True, latest, f"the recommended iteration ({rec['iteration']}) is {behind} behind the latest "
                                      f"({latest}): {rec['reason']}")
    return Decision(False, None, "")

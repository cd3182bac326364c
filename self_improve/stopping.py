"""When a loop stops early: the label-free choice rule read after every iteration.

The evolve stage of iteration N reads the metrics of it0 .. it(N-1) (the history evaluate keeps,
`data/itK/history.json`) and decides (`decide`) whether the loop has stopped. It stops once the
iteration the choice rule recommends (`choice.recommend` with `choice.RULE`: the latest candidate,
its signal risen beyond noise) is `stop.patience` iterations behind the latest one: no iteration
since has passed the rule; unless the rule's agreement signal is still rising (`rising`, on with
`stop.while_rising`): one of those iterations set a new high, above every earlier iteration's by
more than the rule's minimum gain, and no veto of the choice held it back (a vote that drifts onto
restating the question raises its agreement too). A rise too small for the rule's 95% interval is
not a plateau: on 128 test-time problems the interval is wide, and a V3 loop whose held-out accuracy
rose 0.172 -> 0.307 from it0 to it3 (its agreement 0.133 -> 0.180, low end -0.047) stopped there
before this exception. With `stop.on_alarm`, it also stops when the reward-hacking alarm fires
(`quality.reward_hacking_alarm`; it reads held-out and verifier accuracy where the task has gold
answers, so this part is not label-free). Once stopped, the loop stays stopped: an iteration whose
predecessor stopped poses no prompts, so it samples, judges and trains nothing and passes its
starting model on; its evaluation gives its predecessor's greedy answers again (evaluation.Replay).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from self_improve.choice import RULE, Rule, recommend, signal_of, vetoes
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


def rising(history: list[dict], patience: int, rule: Rule = RULE) -> str | None:
    """Words saying the rule's agreement signal set a new high in the last `patience` iterations, above
    every earlier iteration's (it0's included) by more than `rule.min_agreement_gain` (point estimates),
    at an iteration no veto of the choice holds back (`choice.vetoes`: an agreement that rose with the
    answers restating the question, say, is a drift, not a gain); None when it did not, when a value is
    missing, or when the rule reads the base support (a guard that held, not a signal that rises) or
    nothing."""
    key, what = signal_of(history[0], rule.shortcut) if history else (None, "")
    if key in (None, "lf_base_support") or len(history) <= patience:
        return None
    values = [r.get(key) for r in history]
    if any(v is None for v in values):
        return None
    before = values[:-patience]
    window = [(v, r) for v, r in zip(values[-patience:], history[-patience:])
              if not vetoes(r, history[0], rule.invalid_veto, rule.restate_veto, key)]
    if not window:  # every new value came with a veto (a drift the choice would not keep): no rise
        return None
    top, row = max(window, key=lambda vr: vr[0])
    if top > max(before) + rule.min_agreement_gain:
        return (f"its {what} is still rising: {top:.3f} at {row.get('iteration')}, above every earlier iteration's "
                f"(at most {max(before):.3f}) by more than {rule.min_agreement_gain:+.2f}")
    return None


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
    if behind < cfg.patience:
        return Decision(False, None, "")
    why = f"the recommended iteration ({rec['iteration']}) is {behind} behind the latest ({latest})"
    still = rising(history, cfg.patience) if cfg.while_rising else None
    if still:  # goes on, and says why it did not stop
        return Decision(False, None, f"{why}, but {still}")
    return Decision(True, latest, f"{why}: {rec['reason']}")

"""The one path from a user turn to the model's tokens, for inference and training alike.

A model with a chat template (any instruct model) sees a user turn through
`tokenizer.apply_chat_template(..., add_generation_prompt=True)`, tokenised without adding special
tokens again (the template already holds them, as TRL does). A model without one (the embedded
tiny model) sees the plain text with the tokenizer's own special tokens (its <bos>). A training
row is the prompt's tokens exactly as inference builds them, then the response's tokens, then the
template's end-of-turn tokens (or <eos>): loss falls on the response and the end-of-turn only.

Generation stops on every end-of-sequence id the model's generation config lists, the
tokenizer's eos and the template's end-of-turn token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from jinja2 import TemplateError

Turn = Union[str, list[dict]]  # a user turn, or a message list ending with a user turn

_SENTINEL = "\u2063SELF-IMPROVE-RESPONSE\u2063"


def _as_list(x) -> list[int]:
    if x is None:
        return []
    return [int(i) for i in x] if isinstance(x, (list, tuple)) else [int(x)]


@dataclass
class ChatFormat:
    tokenizer: object
    templated: bool
    end_of_turn: list[int]  # appended to every training response
    stop_ids: list[int] = field(default_factory=list)  # generation ends on any of these

    @classmethod
    def of(cls, tokenizer, generation_config=None) -> "ChatFormat":
        templated = bool(getattr(tokenizer, "chat_template", None))
        eos = tokenizer.eos_token_id
        end = [eos] if eos is not None else []
        if templated:
            end = _template_end_of_turn(tokenizer) or end
        stops = _as_list(getattr(generation_config, "eos_token_id", None)) + _as_list(eos) + end[:1]
        return cls(tokenizer, templated, end, sorted(set(stops)))

    @classmethod
    def from_dir(cls, path, trust_remote_code: bool = False) -> "ChatFormat":
        """The chat format of a model directory's tokenizer and generation config (an engine that
        runs the model itself, CTranslate2 or vLLM, needs only these from transformers)."""
        from transformers import AutoTokenizer, GenerationConfig

        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        try:
            gen_cfg = GenerationConfig.from_pretrained(path)
        except OSError:
            gen_cfg = None  # stop ids from the tokenizer and the template
        return cls.of(tokenizer, gen_cfg)

    def messages(self, turn: Turn) -> list[dict]:
        return [{"role": "user", "content": turn}] if isinstance(turn, str) else list(turn)

    def prompt_text(self, turn: Turn) -> str:
        if not self.templated:
            if not isinstance(turn, str):
                raise ValueError("a model without a chat template takes a plain-text prompt, not messages")
            return turn
        return self.tokenizer.apply_chat_template(self.messages(turn), tokenize=False, add_generation_prompt=True)

    def prompt_ids(self, turn: Turn) -> list[int]:
        """The tokens a model is prompted with; training rows start with exactly these."""
        text = self.prompt_text(turn)
        return list(self.tokenizer(text, add_special_tokens=not self.templated)["input_ids"])

    def response_ids(self, response: str) -> list[int]:
        """The response's tokens followed by the end-of-turn tokens (the training target)."""
        return list(self.tokenizer(response, add_special_tokens=False)["input_ids"]) + self.end_of_turn

    def cut_at_stop(self, ids: list[int]) -> tuple[list[int], bool]:
        """The generated ids up to the first stop id, and whether one was found (else: truncated)."""
        stops = set(self.stop_ids)
        for i, t in enumerate(ids):
            if t in stops:
                return ids[:i], True
        return ids, False


def _template_end_of_turn(tokenizer) -> list[int]:
    """The tokens the template puts after an assistant message's content, trailing whitespace aside
    (e.g. `<|im_end|>`): what a response must end with for the model to stop where inference stops."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}], tokenize=False
        )
    except (TemplateError, ValueError, TypeError, KeyError):  # a template that refuses this shape
        return []  # (e.g. it needs a system turn): fall back to eos
    if _SENTINEL not in text:
        return []
    suffix = text.split(_SENTINEL, 1)[1].rstrip()
    if not suffix:
        return []
    return list(tokenizer(suffix, add_special_tokens=False)["input_ids"])

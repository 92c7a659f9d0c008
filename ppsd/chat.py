"""Prompt text to token ids: raw completion, or one user turn through the tokenizer's chat template.

One rule for every entry point (CLI, page, benchmarks, head training): an instruct model's
prompt is wrapped as a user message with the generation prompt appended, so the model answers
instead of continuing the question. Token ids in `ppsd.generate` never know which was used.
"""

from __future__ import annotations


def check_text(text: str) -> str:
    """`text`, or ValueError when it holds nothing to decode or is no valid Unicode (every entry
    point says it alike)."""
    if not str(text).strip():
        raise ValueError("prompt is empty: give some text to continue")
    try:
        str(text).encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate ("\ud800" over raw JSON): the tokenizer's TypeError
        raise ValueError(f"prompt is not valid Unicode text: character {error.start} is a lone surrogate "
                         f"(U+{ord(str(text)[error.start]):04X})") from None
    return text


def has_chat_template(tokenizer) -> bool:
    """True when the tokenizer carries a chat template (instruct models do)."""
    return bool(getattr(tokenizer, "chat_template", None))


def use_chat(tokenizer, asked: bool | None) -> bool:
    """What `--chat/--no-chat` means: as asked, or (not asked) whenever the model has a template."""
    return has_chat_template(tokenizer) if asked is None else asked


def encode_prompt(tokenizer, text: str, *, chat: bool) -> list[int]:
    """Token ids of `text`: as a chat user turn when `chat` (ValueError if the tokenizer has no
    template), else the raw text with no special tokens added."""
    if chat:
        if not has_chat_template(tokenizer):
            raise ValueError("this model's tokenizer has no chat template: use raw completion (--no-chat)")
        text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])

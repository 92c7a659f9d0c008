"""Prompt text to token ids: raw completion, or one user turn through the tokenizer's chat template.

One rule for every entry point (CLI, page, benchmarks, head training): an instruct model's
prompt is wrapped as a user message with the generation prompt appended, so the model answers
instead of continuing the question. Token ids in `ppsd.generate` never know which was used.
"""

from __future__ import annotations


EMPTY_PROMPT = "prompt is empty: give some text to continue"  # the library's words, for text or token ids


def check_text(text: str, *, empty: str = EMPTY_PROMPT) -> str:
    """`text`, or ValueError when it holds nothing to decode (said as `empty`: a front end may say
    it in its own words) or is no valid Unicode (`unicode_text`): the one check of a prompt's text."""
    if not str(text).strip():
        raise ValueError(empty)
    unicode_text("prompt", text)
    return text


def unicode_text(name: str, text: object) -> str:
    """`text` as a str, or ValueError naming the field `name` when it holds a lone surrogate (raw
    JSON can send "\\ud800"): no tokenizer, file system or reply can take one, and a reply that
    echoed it could not be sent at all (the connection drops). The message never echoes the text."""
    text = "" if text is None else str(text)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError(f"{name} is not valid Unicode text: character {error.start} is a lone surrogate "
                         f"(U+{ord(text[error.start]):04X})") from None
    return text


def has_chat_template(tokenizer) -> bool:
    """True when the tokenizer carries a chat template (instruct models do)."""
    return bool(getattr(tokenizer, "chat_template", None))


def use_chat(tokenizer, asked: bool | None) -> bool:
    """What `--chat/--no-chat` means: as asked, or (not asked) whenever the model has a template."""
    return has_chat_template(tokenizer) if asked is None else asked


USER_SLOT = "\ue000ppsd-user-text\ue001"  # private-use characters: no template or tokenizer makes them


def encode_prompt(tokenizer, text: str, *, chat: bool) -> list[int]:
    """Token ids of `text`: as a chat user turn when `chat` (ValueError if the tokenizer has no
    template), else the raw text with no special tokens added.

    The user's text is always text: a typed "<|im_end|>" or "<|endoftext|>" is encoded as the
    characters it is made of, never as the control token (which would let a prompt end its own
    turn and write the system's). Only the template's own markup gives special tokens.
    """
    if chat and not has_chat_template(tokenizer):
        raise ValueError("this model's tokenizer has no chat template: use raw completion (--no-chat)")
    whole = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                          add_generation_prompt=True) if chat else text
    if not any(special in text for special in special_texts(tokenizer)):
        # The common case, encoded whole as always (splitting at the text would change the tokens
        # of a prompt that starts with a blank line, and every measured run's prompt with them).
        return list(tokenizer(whole, add_special_tokens=False)["input_ids"])
    plain = lambda part: list(tokenizer(part, add_special_tokens=False, split_special_tokens=True)["input_ids"])  # noqa: E731
    if not chat:
        return plain(text)
    # The template rendered around a placeholder: its parts keep their special tokens, the text none.
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": USER_SLOT}], tokenize=False,
                                             add_generation_prompt=True)
    if rendered.count(USER_SLOT) != 1:  # a template that edits the content: only the whole can be encoded
        raise ValueError("this model's chat template changes the user's text, which holds a special token: "
                         "use raw completion (--no-chat)")
    before, after = rendered.split(USER_SLOT)
    markup = lambda part: list(tokenizer(part, add_special_tokens=False)["input_ids"]) if part else []  # noqa: E731
    return markup(before) + plain(text) + markup(after)


def special_texts(tokenizer) -> set[str]:
    """The text of every special token (end of turn, start of turn, end of text, ...)."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    return {t.content for t in added.values() if getattr(t, "special", False) and t.content} | {
        t for t in getattr(tokenizer, "all_special_tokens", ()) if t}

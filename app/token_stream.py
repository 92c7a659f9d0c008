"""The token stream: committed tokens as coloured spans (accepted, corrected with its draft, no
draft), drafts still in flight, and the key to the colours. HTML strings only; the method columns,
the race and the step-through all draw their text here, so a token looks the same in each.

Token text arrives through a `piece(token_id) -> str` callable, so the tokenizer stays with the
runner; every text is escaped.
"""

from __future__ import annotations

import html
from typing import Callable, Mapping, Sequence

from ppsd import Draft, Event, Token

Piece = Callable[[int], str]


def deciding_events(events: Sequence[Event], num_stages: int) -> dict[int, Event]:
    """position of a committed token -> the final-stage work that produced it.

    The token at position p comes from the final stage's output on position p - 1, so the
    decider is the kept (never flushed) final-stage event whose kept range covers p - 1.
    """
    found: dict[int, Event] = {}
    for event in events:
        if event.stage != num_stages or event.kind == "flushed":
            continue
        for p in range(event.position, event.position + event.kept_width):
            found[p + 1] = event
    return found


def render_tokens(
    tokens: Sequence[Token],
    piece: Piece,
    *,
    prompt: str = "",
    pending: Sequence[Draft] = (),
    deciders: Mapping[int, Event] | None = None,
    placeholder: str = "",
    cut: int | None = None,
    label: str = "the answer",
) -> str:
    """Committed tokens as marked spans (accepted: underlined / corrected: boxed, after its
    struck-through draft / plain), then in-flight drafts as dashed spans, then, for an answer the
    max-tokens limit ended (`cut`, that limit), a note saying so. All text is escaped; CSS keeps
    whitespace. The box is a named region in the Tab order (`label`): it may scroll, and a keyboard
    must reach what it hides."""
    deciders = deciders or {}
    parts = [f'<span class="tok-prompt" title="prompt">{_text(prompt)}</span>'] if prompt else []
    for token in tokens:
        parts.append(_token_span(token, piece, deciders.get(token.position)))
    committed = tokens[-1].position if tokens else -1
    for draft in sorted(pending, key=lambda d: d.position):
        if draft.position > committed:
            tip = f"position {draft.position} · draft {piece(draft.id)!r} · pending: still in the pipeline"
            parts.append(f'<span class="tok tok-pending" title="{html.escape(tip)}">'
                         f'{_token_text(piece(draft.id))}</span>')
    if not tokens and not pending and placeholder:
        parts.append(f'<span class="tok-placeholder">{html.escape(placeholder)}</span>')
    if cut is not None:
        parts.append(f'<span class="tok-cut">✂ cut at {cut} tokens (Max new tokens): the model had not ended its '
                     'answer</span>')
    return (f'<div class="ppsd-stream" role="region" tabindex="0" aria-label="{html.escape(label)}">'
            f'{"".join(parts)}</div>')


def _token_span(token: Token, piece: Piece, decider: Event | None) -> str:
    final = piece(token.id)
    where = "" if decider is None else f" · stage {decider.stage}" + (
        f" · slot {decider.slot}" if decider.slot is not None else "")
    if token.draft is None:
        tip = f"position {token.position} · no draft · final {final!r}{where}"
        return f'<span class="tok tok-verified" title="{html.escape(tip)}">{_token_text(final)}</span>'
    drafted = piece(token.draft)
    tip = f"position {token.position} · draft {drafted!r} · final {final!r} · {token.status}{where}"
    if token.status == "accepted":
        return f'<span class="tok tok-accepted" title="{html.escape(tip)}">{_token_text(final)}</span>'
    return (f'<span class="tok-pair" title="{html.escape(tip)}"><span class="tok tok-rejected">{_token_text(drafted)}'
            f'</span><span class="tok tok-corrected">{_token_text(final)}</span></span>')


def _text(text: str) -> str:
    return html.escape(text, quote=False)


def _token_text(text: str) -> str:
    """Escaped token text that stays visible: a newline gets a faint ↵ before the line break
    (a coloured span holding only a line break has no width), an empty piece shows ∅."""
    if not text:
        return '<span class="ws">∅</span>'
    return _text(text).replace("\n", '<span class="ws">↵</span>\n')


def render_legend() -> str:
    """The key of the token stream, shown above it at all times."""
    # Each mark named by its shape as well as its colour: a student who cannot tell green from
    # orange reads "underlined" and "boxed" (assets/styles/app.css draws them).
    items = [("tok-accepted", "accepted", "underlined: the exit head's draft, confirmed by the full model"),
             ("tok-corrected", "corrected", "dark box: the full model replaced the draft"),
             ("tok-rejected", "rejected draft", "struck through: its work was flushed (shown with “Show the "
                                                "drafts”, and in Present)"),
             ("tok-verified", "no draft", "plain: AR, or the first token after the prompt"),
             ("tok-pending", "pending", "dashed box: drafted, still in the pipeline (live only)")]
    spans = "".join(f'<span class="legend-item" title="{html.escape(tip)}"><span class="tok {cls}">{label}</span>'
                    f'<span class="legend-tip">{html.escape(tip)}</span></span>' for cls, label, tip in items)
    marks = [(_token_text(""), "the model's end token: its answer is complete"),
             (_token_text("\n"), "a line break")]  # drawn by `_token_text`, so the key matches the stream
    spans += "".join(f'<span class="legend-item"><span class="tok tok-mark">{mark.strip()}</span>'
                     f'<span class="legend-tip">{html.escape(tip)}</span></span>' for mark, tip in marks)
    return f'<div class="ppsd-legend">{spans}</div>'

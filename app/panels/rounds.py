"""The timed rounds' cost, said under their slider before Run: how much longer the extra rounds
make a run, estimated from the last run's round on this page (or said to be a guess before one).
"""

from __future__ import annotations

import html

import gradio as gr

from ..words import duration_text
from . import QUIET, Page


def create(repeats: int) -> gr.HTML:
    return gr.HTML(render_cost(repeats, None), elem_id="rounds-cost")


def wire(made: gr.HTML, page: Page) -> None:
    """Said again as the slider moves and after each run (whose round times the estimate, from the
    race's state)."""
    repeats, race = page.controls["repeats"], page.made["race"].state
    repeats.change(on_cost, [repeats, race], made, **QUIET)
    page.run.success(on_cost, [repeats, race], made, **QUIET)


def on_cost(repeats: float, race: dict | None) -> str:
    return render_cost(repeats, (race or {}).get("round_seconds"))


def render_cost(repeats: float, round_seconds: float | None) -> str:
    """"3 timed rounds: about N s more" from `round_seconds` (one round's decoding, the last run's
    methods' measured walls), or, with none yet, how many rounds more, said to be an estimate."""
    try:
        rounds = int(repeats)
    except (TypeError, ValueError):
        return ""
    extra = rounds - 1
    if extra < 1:
        text = "1 timed round: the answer and its first result, nothing more (the headline says \"one round\")."
    elif round_seconds:
        text = (f"{rounds} timed rounds: about {duration_text(extra * round_seconds)} more after the answer "
                f"(estimated from the last run here: {duration_text(round_seconds)} of decoding a round).")
    else:
        text = (f"{rounds} timed rounds: {extra} more after the answer, each about as long as the first; an "
                "estimate (no run here yet to time one from).")
    return f'<div class="rounds-cost">{html.escape(text)}</div>'

"""The line under Run on what compiles in the background since start-up ("compiling the captured
steps: 40 s so far", then "the captured steps ready (compiled in 52 s)"), refreshed by a timer
every few seconds; empty where nothing compiles (a GPU, a machine whose kinds need no compile).
Runs never wait for it: they say, at their end, which kind ran and why (`app.runner`).
"""

from __future__ import annotations

from typing import Callable

import gradio as gr

from ..runner import READY
from . import Page, Single
from .run_message import render as render_message

NAME = "compile_status"  # not a run output: its timer alone refreshes it
REFRESH_SECONDS = 5.0


def create() -> Single:
    """The line as it stands now (a compile may have started before the page was built)."""
    return Single(NAME, gr.HTML(render(READY.words()), elem_id="compile-status"))


def render(words: str) -> str:
    """`words` as one quiet status line, or an empty box."""
    return render_message(words[:1].upper() + words[1:], "status", title=False)


def wire(made: Single, page: Page) -> None:
    """Refreshed from what compiles in the background (`app.runner.READY`)."""
    refresh(made, READY.words)


def refresh(panel: Single, words: Callable[[], str]) -> gr.Timer:
    """Refresh `panel` from `words()` every REFRESH_SECONDS while the page is open."""
    timer = gr.Timer(REFRESH_SECONDS)
    timer.tick(lambda: render(words()), outputs=[panel.component], queue=False, show_progress="hidden",
               api_visibility="private")  # the page's own refresh, kept out of the API
    return timer

"""The message box beside Run, where a visitor looks when they press it: empty, a refusal in
words, the run's status while it runs, or at the end what the run did otherwise than asked (a
pipeline that could not run where it ran). The stages warning and the GPU lease note use its look.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from ..reading import RunView
from . import Page, Single

OUTPUTS = ("message",)


def create() -> Single:
    return Single(OUTPUTS[0], gr.HTML(render(), elem_id="run-message"))


def render(text: str = "", kind: str = "error", *, title: bool = True) -> str:
    """Empty, or one error (or notice, status, warning) in words; `title` says it again on hover,
    for Present, which cuts the box beside Run to one line."""
    if not text:
        return '<div class="run-message run-message-empty"></div>'
    hover = f' title="{html.escape(text)}"' if title else ""
    return f'<div class="run-message run-message-{kind}" role="status"{hover}>{html.escape(text)}</div>'


def wire(made: Single, page: Page) -> None:
    """No events of its own: a Run fills it."""


def idle() -> dict[str, Any]:
    return {"message": render()}


def show(view: RunView) -> dict[str, Any]:
    snap = view.snap
    if not view.ended:
        return {"message": render(view.status, "status")}
    # A recording's note ("Recorded on …; not run now") is the headline's last line too: Present keeps that one.
    return {"message": render(snap.note, "recorded" if view.recorded else "notice")}

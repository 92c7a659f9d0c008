"""The GPU-lease panel, under the controls on ZeroGPU only: before Run and as the form changes,
how many GPU seconds the Run will ask for and what that costs of a visitor's daily quota. The
size and the words are `app.lease`'s; this module holds the component and its wiring.
"""

from __future__ import annotations

import gradio as gr

from .. import lease, zerogpu
from ..request import FORM
from . import QUIET, Page
from .run_message import render

# The fields that change what a Run asks for.
CHANGES = ("prompt", "model", "num_stages", "draft_len", "max_new_tokens", "repeats", "eesd", "workers", "pipeline")


def create() -> gr.HTML:
    return gr.HTML(render(), visible=False, elem_id="gpu-lease")


def wire(made: gr.HTML, page: Page) -> None:
    """On ZeroGPU only (elsewhere it stays hidden): say `page.lease(0, request)` of the form's
    request on load and whenever a field in `CHANGES` changes."""
    if not zerogpu.active():
        return
    say = lambda *form: gr.update(value=render(lease.note(page.lease(0, lease.of_form(*form))), "status"),  # noqa: E731
                                  visible=True)
    gr.on([page.demo.load, *(page.controls[name].change for name in CHANGES)], say,
          [page.controls[name] for name in FORM], made, trigger_mode="always_last", **QUIET)

"""The GPU-lease panel, under the controls on ZeroGPU only: before Run and as the form changes,
how many GPU seconds the Run will ask for and what that costs of a visitor's daily quota. The
size and the words are `app.lease`'s; this module holds the component and its wiring.
"""

from __future__ import annotations

from typing import Any, Callable

import gradio as gr

from .. import lease
from ..request import FORM
from .run_message import render

# The fields that change what a Run asks for.
CHANGES = ("prompt", "model", "num_stages", "draft_len", "max_new_tokens", "repeats", "eesd", "workers", "pipeline")


def create() -> gr.HTML:
    return gr.HTML(render(), visible=False, elem_id="gpu-lease")


def wire(shown: gr.HTML, demo: gr.Blocks, c: dict[str, Any], duration: Callable[..., int], quiet: dict) -> None:
    """Say `duration(0, request)` of the form's request in `shown` on load and whenever a field in
    `CHANGES` changes."""
    say = lambda *form: gr.update(value=render(lease.note(duration(0, lease.of_form(*form))), "status"),  # noqa: E731
                                  visible=True)
    form = [c[name] for name in FORM]
    demo.load(say, form, shown, **quiet)
    for name in CHANGES:
        c[name].change(say, form, shown, trigger_mode="always_last", **quiet)

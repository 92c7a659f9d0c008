"""The exit-head panel, beside the E slider: before any Run, which head will draft at this E, and
when it is no trained one, a warning (the shared head drafts poorly, so PPSD will lose) with a
button that moves E to the shipped head's. Its rule (`head_note`) is plain words from the
shipped heads' configs (`ppsd.heads.shipped_exit_layers`); no weights are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

import ppsd
from ppsd.config import fit_stages
from ppsd.heads.shipped import AUTO_HEAD, shipped_exit_layers

from . import QUIET, Page
from .run_message import render as render_message


@dataclass(frozen=True)
class Note:
    """What the panel says at one E: `text` ("" when a trained head drafts), the shipped E to
    offer (None: none to offer)."""

    text: str
    offer: int | None = None


def head_note(model: str, exit_layer: Any, exit_head: str = "") -> Note:
    """Which head drafts a run of `model` at E = `exit_layer` with the exit-head box at `exit_head`."""
    if (exit_head or "").strip() not in ("", AUTO_HEAD):
        return Note("")  # a head chosen by name: Run says whether it fits
    try:
        e = int(exit_layer)
    except (TypeError, ValueError):
        return Note("")
    trained = sorted(set(shipped_exit_layers((model or "").strip() or ppsd.DEFAULT_MODEL).values()))
    if e in trained:
        return Note("")
    shared = (f"No trained exit head at E = {e}: the shared head (the model's own final norm and LM head, read "
              f"at layer {e}) will draft. How often its drafts are accepted is measured by the Run (the "
              "acceptance on PPSD's card): on a real model with no trained head it is usually low, and PPSD "
              "then loses to AR.")  # a small model may agree with itself: the shipped tiny one measured 0.87 (issue 58)
    if not trained:
        return Note(shared + " This model ships no trained head; `python -m ppsd train-head` makes one.")
    return Note(shared + f" The shipped trained head is at E = {trained[0]}.", trained[0])


@dataclass(frozen=True)
class ExitHeadPanel:
    note: gr.HTML
    use: gr.Button


def create() -> ExitHeadPanel:
    """The note and its button, hidden until a note is due."""
    with gr.Row(elem_id="exit-head-note-row"):
        note = gr.HTML(render(Note("")), elem_id="exit-head-note")
        use = gr.Button("Use the shipped head's E", size="sm", visible=False, elem_id="use-shipped-e", scale=0,
                        min_width=200)
    return ExitHeadPanel(note, use)


def render(note: Note) -> str:
    return render_message(note.text and f"⚠ {note.text}", "warning", title=False)


def on_change(model: str, exit_layer: Any, exit_head: str) -> tuple[str, Any]:
    note = head_note(model, exit_layer, exit_head)
    label = f"Use E = {note.offer} (the shipped trained head)" if note.offer is not None else ""
    return render(note), gr.update(visible=note.offer is not None, value=label or "Use the shipped head's E")


def on_use(model: str, exit_layer: Any, num_stages: Any, layers: Any, exit_head: str) -> tuple[Any, Any]:
    """E moved to the shipped head's; K lowered only if the layers after it cannot hold K - 1 stages."""
    offer = head_note(model, exit_layer, exit_head).offer
    if offer is None:
        return gr.skip(), gr.skip()
    e, k = fit_stages(int(layers), offer, int(num_stages), moved="exit_layer")
    return gr.update(value=e), gr.update(value=k)


def wire(made: ExitHeadPanel, page: Page) -> None:
    """Said as the model, E, K or the head box change (before any Run); the button moves E."""
    c = page.controls
    inputs = [c["model"], c["exit_layer"], c["exit_head"]]
    gr.on([i.change for i in inputs], on_change, inputs, [made.note, made.use], **QUIET)
    made.use.click(on_use, [c["model"], c["exit_layer"], c["num_stages"], c["layers"], c["exit_head"]],
                   [c["exit_layer"], c["num_stages"]], **QUIET)

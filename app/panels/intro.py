"""The intro panel, in the side column: what PPSD is, in words, and the pipeline picture for the
sliders' E and K (`app.teach.pipeline_diagram`), redrawn as they move.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

import ppsd
from ppsd.config import DEFAULTS
from ppsd.heads import default_exit_layer

from .. import teach
from ..page_text import INTRO
from . import QUIET, Page


@dataclass(frozen=True)
class IntroPanel:
    diagram: gr.HTML


def create(num_layers: int) -> IntroPanel:
    """Open at first: the words, then the picture of the default model's default E and K."""
    with gr.Accordion("What PPSD is: the picture, the trick, why it is safe", open=True, elem_id="intro-fold"):
        gr.Markdown(INTRO, elem_id="intro")
        k = DEFAULTS.num_stages
        e = default_exit_layer(ppsd.DEFAULT_MODEL, num_layers, k)
        return IntroPanel(gr.HTML(diagram(e, k, num_layers), elem_id="diagram"))


def wire(made: IntroPanel, page: Page) -> None:
    """Redrawn as E, K or the model's layer count change."""
    inputs = [page.controls[name] for name in ("exit_layer", "num_stages", "layers")]
    gr.on([i.change for i in inputs], diagram, inputs, made.diagram, **QUIET)


def diagram(exit_layer: float, num_stages: float, num_layers: int) -> str:
    """The pipeline picture for the sliders' E and K ("" while they do not fit the model)."""
    try:
        return teach.pipeline_diagram(int(num_layers), int(exit_layer), int(num_stages))
    except ValueError:
        return ""

"""Gradio components as the page makes them: a refusal of a bad value sent through the API is one
line in the log and words to the caller, not Gradio's traceback; an upload button leaves no stray
file. Used by the layout and the panels.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import gradio as gr


def Slider(*args: Any, **kwargs: Any) -> gr.Slider:  # noqa: N802 - stands where gr.Slider would
    """A gr.Slider that refuses a bad value quietly (`refusing_quietly`)."""
    return refusing_quietly(gr.Slider(*args, **kwargs))


def refusing_quietly(component: Any) -> Any:
    """`component`, whose refusal of a value sent through the API (out of range, not a number, not
    a choice) logs one line, not Gradio's traceback: a visitor's bad value is no fault of the
    server's. (Patched on the instance: a subclass of a Gradio component makes Gradio write a .pyi
    beside this module.)"""
    checked = component.preprocess

    def preprocess(payload: Any) -> Any:
        try:
            return checked(payload)
        except gr.Error as error:
            message = error.message
        except (TypeError, ValueError):  # "abc" or null for a slider: Gradio compares it with its range
            text = repr(payload)
            message = f"Value {text if len(text) <= 40 else text[:40] + '…'} is not a number"
        print(f"refused {component.label!r}: {message[:300]}", file=sys.stderr, flush=True)
        raise gr.Error(message, print_exception=False) from None

    component.preprocess = preprocess
    return component


# Plotly's mode bar: 8 buttons a plot, each a Tab stop before the results' text (issue 58), and no
# use to a room; hover still shows every bar's detail.
PLOT_CONFIG = {"displayModeBar": False}


def Plot(*args: Any, **kwargs: Any) -> gr.Plot:  # noqa: N802 - stands where gr.Plot would
    """A gr.Plot whose Plotly figures are drawn with `PLOT_CONFIG` (Gradio sends a figure's data and
    layout, and Plotly reads its config beside them). Patched on the instance, as `refusing_quietly`."""
    plot = gr.Plot(*args, **kwargs)
    drawn = plot.postprocess

    def postprocess(value: Any) -> Any:
        data = drawn(value)
        if data is not None and data.type == "plotly":
            figure = json.loads(data.plot)
            figure["config"] = {**figure.get("config", {}), **PLOT_CONFIG}
            data = type(data)(type=data.type, plot=json.dumps(figure))
        return data

    plot.postprocess = postprocess
    return plot


def UploadButton(*args: Any, **kwargs: Any) -> gr.UploadButton:  # noqa: N802 - stands where gr.UploadButton would
    """A gr.UploadButton (type "filepath") that leaves no empty file behind: Gradio's makes a
    temporary file in its cache for every file it hands over, then renames the object, so the
    file is never deleted (one 0-byte file an open, for ever). Its own check of the file's type
    is kept. (Patched on the instance, as `refusing_quietly`.)"""
    from gradio.data_classes import FileData
    from gradio_client import utils as client_utils
    from gradio.utils import NamedString

    button = gr.UploadButton(*args, **kwargs)
    if button.type != "filepath":
        return button

    def handed_over(f: FileData) -> NamedString:
        if button.file_types and not client_utils.is_valid_file(f.path, button.file_types):
            raise gr.Error(f"Invalid file type. Please upload a file that is one of these formats: {button.file_types}")
        return NamedString(f.path)

    button._process_single_file = handed_over
    return button

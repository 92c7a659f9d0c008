"""The PPSD web demo: `render` (pure HTML/Plotly), `runner` (model cache and timed runs), `ui`
(the Gradio page). `app.py` at the repository root launches it."""

from .ui import create_demo, launch_kwargs

__all__ = ["create_demo", "launch_kwargs"]

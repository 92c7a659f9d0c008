"""The PPSD web demo, in layers (each imports only those listed before it):

- `render`, `numbers`, `tables`, `teach`: pure functions, records in, HTML and Plotly figures out;
- `models`: the loaded models a server shares; `line`: the device line, background waits, Stops;
- `request`: what a visitor asks for (the form, checked); `lease`: the GPU lease it needs on ZeroGPU;
- `zerogpu`: the device's part of a run as a ZeroGPU call, what crosses its fork, what a reused
  worker keeps, and the thread that imported `spaces`;
- `limits`: what a request may send (bytes, files, an address's uploads an hour); `sessions`: what
  the server keeps of each session, and who listens for results;
- `state`: what one server shares (models, device line, Stops), built by the entry point;
- `bodies`: a request's body counted as it streams; `guard`: the ASGI middleware that holds every
  request to `limits` before Gradio reads it;
- `runner`: one comparison (AR, PPSD, EESD, timed again), as snapshots;
- `view`: snapshot -> every output of the page, by name; `page_text`: the page's words;
- `handlers`: thin event handlers; `ui`: the Gradio page's panels and their wiring.

`app.py` at the repository root launches it: it builds the `AppState` and hands it to
`create_demo`. Importing the package builds nothing and reads no environment.
"""

from .state import AppState
from .ui import create_demo, launch_kwargs

__all__ = ["AppState", "create_demo", "launch_kwargs"]

"""The PPSD web demo, over the library `ppsd` (imports point that way only).

- `runner`: one comparison as the page runs it (the model, the kind `ppsd.choice` takes through
  the page's one `READY`, the time limit), as snapshots; `reading` reads a snapshot once into the
  one view every panel draws from (`analysis`: its sentences; `kind_words`: the page's words on
  each executor kind);
- `panels/`: one module a panel; `view` gathers the results panels, `ui` lays the page out and
  wires it, `handlers` are its events; `replay` and `record`: recorded runs;
- `models`, `request`, `lease`, `zerogpu`, `state`: the loaded models, a visitor's checked
  request, the ZeroGPU lease (its duration; a run's cost on a GPU is `ppsd.choice`'s) and call,
  what one server shares;
- `server/`: the defences under the page (request limits, the ASGI guard, uploads, visitors,
  the device line, sessions), with the Gradio internals they rely on.

The full map, and how a headline's number travels from the stopwatch to the HTML, is in
`docs/app.md` ("How the page is built"). `app.py` at the repository root launches it: it builds
the `AppState` and hands it to `create_demo`. Importing the package builds nothing and reads no
environment.
"""

from .state import AppState
from .ui import create_demo, launch_kwargs

__all__ = ["AppState", "create_demo", "launch_kwargs"]

"""The page's panels, one module each, of two sorts; `app.ui` lays them out, `app.view` gathers
what a run shows in them.

Results panels show a run, and are the run's outputs: `app.view.PANELS` lists them, once, in the
order of those outputs (the `run` API's, by position). Each has the same shape:

- `OUTPUTS`: its output names;
- `create()`: its components, a small frozen dataclass made where the layout calls it, whose
  `outputs()` maps `OUTPUTS` to them;
- `idle()`: its values before any run, under `OUTPUTS`;
- `show(view)`: its values for one snapshot, read once (`app.reading.RunView`), under `OUTPUTS`;
- `wire(made, page)`: its own events (a `Page`); most have none.

Setting panels (`intro`, `exit_head`, `rounds`, `gpu_lease`, `compile_status`, `steps`) are not
among the run's outputs: they speak before a Run, of the form (the pipeline picture, the exit
head, the rounds' cost, ZeroGPU's lease, a background compile), or after one, from the race's
state (the step-through). Each has `create(...)` and the same `wire(made, page)`; none has
`OUTPUTS`, `idle` or `show`.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

# The page's own events, kept out of the API and quiet on the page.
QUIET = dict(api_visibility="private", show_progress="hidden")


def div(cls: str, text: str) -> str:
    """`text`, escaped, in a `<div>` of class `cls`; "" for no text. The shown round's label
    (`app.reading.RunView.round_label`) is `div("shown-run", ...)` under the cards, over the
    metrics table and in the step-through; a what-if's words are `div("forced-note", ...)`."""
    return f'<div class="{cls}">{html.escape(text)}</div>' if text else ""


@dataclass(frozen=True)
class Single:
    """A panel shown in one component, under its one output name."""

    name: str
    component: Any  # a Gradio component

    def outputs(self) -> dict[str, Any]:
        return {self.name: self.component}


@dataclass(frozen=True)
class Shows:
    """How the page shows a snapshot, and nothing, as the run's outputs (`app.view`'s values in
    `app.view.OUTPUTS` order): what an opened recording fills them with."""

    snapshot: Callable[[Any], tuple]  # app.runner.Snapshot -> the run's outputs
    idle: Callable[[], tuple]


@dataclass(frozen=True)
class Page:
    """What a panel's `wire` may attach its events to: the `demo`, the form's `controls` by name
    (with Run and Stop), the Run event (`run`: `.success` follows a finished run), the run's
    output components (`outputs`, in `app.view.OUTPUTS` order), every panel's components by
    module name (`made`: "race" -> its `RacePanel`), how a snapshot and nothing are shown in
    those outputs (`shows`), the GPU lease's size (`lease`, on ZeroGPU), and `cancels`: the
    events Stop cancels, which a panel adds to."""

    demo: Any  # gr.Blocks
    controls: Mapping[str, Any]
    run: Any
    outputs: Sequence[Any]
    made: Mapping[str, Any]
    shows: Shows
    lease: Callable[..., int]
    cancels: list = field(default_factory=list)

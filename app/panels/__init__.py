"""The page's panels, one module each: its components (a small frozen dataclass, made where the
layout calls `create()`), what it shows before a run (`idle()`) and for a snapshot
(`show(view)`, values under its `OUTPUTS` names), and its own events (`wire`). `app.ui` lays
them out and wires the Run event; `app.view` gathers their values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Single:
    """A panel shown in one component, under its one output name."""

    name: str
    component: Any  # a Gradio component

    def outputs(self) -> dict[str, Any]:
        return {self.name: self.component}

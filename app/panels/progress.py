"""The progress panel: a run's phases as steps (done, now, to come), shown in the headline box
while a run is in flight."""

from __future__ import annotations

import html
from typing import Sequence

PHASE_NAMES = {"model": "load the model", "workers": "start the pipeline", "ar": "AR", "ppsd": "PPSD",
               "eesd": "EESD", "plain": "plain AR, one process", "repeats": "time again"}


def render_progress(phases: Sequence[str], current: str | None) -> str:
    """The run's phases as steps: done, now (the one `current` names), still to come."""
    if current not in phases:
        return ""
    now = phases.index(current)
    steps = [f'<span class="phase phase-{"done" if i < now else "now" if i == now else "todo"}">'
             f'{"✓ " if i < now else ""}{html.escape(PHASE_NAMES.get(p, p))}</span>' for i, p in enumerate(phases)]
    return f'<div class="phases">{"<span class=phase-arrow>›</span>".join(steps)}</div>'

"""Snapshot -> page: what every output of a run shows, as plain values keyed by output name. Each
results panel gives its own part (`idle`, `show`) from one `RunView` of the snapshot, read once.

`PANELS` is the one list of the results panels (`app.panels`), in the order of the run's outputs;
`OUTPUTS`, the `run` API's order by position, is theirs in turn (`app.ui` takes both from here).
A view leaves any output it does not name as it is. Pure: no Gradio events, no decoding.
"""

from __future__ import annotations

from typing import Any

from .panels import columns, headline, metrics, race, recording, run_message, summary, theory, timeline
from .request import RunRequest
from .reading import RunView
from .runner import Snapshot

PANELS = (headline, columns, timeline, theory, metrics, run_message, recording, summary, race)  # the summary stays the API's last
OUTPUTS = tuple(name for panel in PANELS for name in panel.OUTPUTS)
FIGURES = (timeline, theory)  # redrawn at most once a second while a run is live (`app.handlers`)
STOPPED_BEFORE = "Stopped before decoding began. Press Run to start again."


def idle() -> dict[str, Any]:
    """The page before any run (also after a failed one: no stale numbers stay up)."""
    return {name: value for panel in PANELS for name, value in panel.idle().items()}


def failed(text: str) -> dict[str, Any]:
    """A run that could not start or failed: the reason beside Run, the results cleared. The
    API's last output carries it too, as {"error": text}."""
    return {**idle(), "message": run_message.render(text), "summary": {"error": text}}


def stopped_before() -> dict[str, Any]:
    """Stop while the model loaded or the run waited for the device: the words, and the API's last
    output saying so as every stopped run's does (`app.panels.summary.stopped`)."""
    return {**status(STOPPED_BEFORE), "summary": {"stopped": STOPPED_BEFORE, "finished": {}}}


def status(text: str, request: RunRequest | None = None, phase: str | None = None) -> dict[str, Any]:
    """Only the status changes (loading a model, waiting for the device): the headline's status
    line, with the run's phases as steps when `request` and its current `phase` are given, and the
    same words beside Run, where the visitor is looking when they press it."""
    progress = headline.render_progress(request.phases(), phase) if request is not None else ""
    return {"headline": headline.render_headline(None, status=text, progress=progress),
            "message": run_message.render(text, "status")}


def snapshot(snap: Snapshot, *, figures: bool = True) -> dict[str, Any]:
    """Every output for one snapshot (live, stopped or final); without `figures` the two plots
    are left as they are."""
    view = RunView.of(snap)
    if not view.runs:  # the worker processes are starting: only the status changes
        stopped = {"summary": summary.stopped(view)} if snap.stopped else {}  # the API's last output says so
        return {**headline.show(view), **run_message.show(view), **stopped}
    values: dict[str, Any] = {}
    for panel in PANELS:
        if figures or panel not in FIGURES:
            values.update(panel.show(view))
    return values

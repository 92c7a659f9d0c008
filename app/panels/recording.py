"""The recordings panel, under Run: Save (a finished live run as one file, `ppsd.recording`) and
Open (a shipped recording from assets/runs/, or an uploaded one). An opened recording is
checked through before anything is shown, then drives every panel as the live run's last
snapshot did (`app.replay`), with no model loaded; the race then replays its streams at their
recorded pace. A bad file gets one message here, and the page goes on.

An upload is read from Gradio's temporary folder, at most `ppsd.recording.MAX_BYTES` of it, and
never handed to an output (no visitor is served another's file); a saved run is written to a
temporary folder of its own and offered to the visitor who ran it.
"""

from __future__ import annotations

import html
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import gradio as gr

from ppsd.recording import MAX_BYTES, BadRecording, dumps

from .. import replay
from ..components import UploadButton
from ..request import FORM
from ..words import OPEN_RECORDED
from ..reading import RunView
from . import QUIET, Page, Shows
from . import race, steps

OUTPUTS = ("recording",)
SAVES = Path(tempfile.gettempdir()) / "ppsd-saved-runs"  # a saved run's file, until Gradio has copied it
SAVE_SECONDS = 3600.0  # a saved file older than this is removed (by the next Save, and by `keep_pruned`)
PRUNE_SECONDS = 900.0  # how often the server removes saved files past SAVE_SECONDS, Saves or not
CHOOSE = "Choose a recorded run…"
# Opens at once, of uploads and of shipped recordings each (Gradio's default is one an event, so
# one slow file held every other visitor's open). A hostile file costs at most about 0.5 s and
# 50 MB before it is refused (tools/research/hostile_recordings.py), so eight at once stay small.
OPENS_AT_ONCE = 8


@dataclass(frozen=True)
class RecordingPanel:
    shipped: gr.Dropdown
    upload: gr.UploadButton
    save: gr.DownloadButton
    said: gr.HTML  # what was opened, or why it could not be
    state: gr.State  # the finished live run's recording, (file name, bytes); None otherwise

    def outputs(self) -> dict[str, Any]:
        return {"recording": self.state}


def create() -> RecordingPanel:
    with gr.Accordion("Recorded runs: save this run, or open one recorded before (no model needed)", open=True,
                      elem_id="recordings"):
        with gr.Row(equal_height=True):
            shipped = gr.Dropdown([CHOOSE, *replay.shipped()], value=CHOOSE, label=OPEN_RECORDED,
                                  elem_id="shipped-runs", scale=3)
            upload = UploadButton("Open a file…", file_types=[".json"], file_count="single", type="filepath",
                                     elem_id="open-recording", size="sm", scale=1)
            save = gr.DownloadButton("Save this run", visible=False, elem_id="save-recording", size="sm", scale=1)
        said = gr.HTML("", elem_id="recording-said")
    return RecordingPanel(shipped, upload, save, said, gr.State(None))


def idle() -> dict[str, Any]:
    return {"recording": None}


def show(view: RunView) -> dict[str, Any]:
    """A finished live run's recording, for Save; None while it runs, and for a replay."""
    snap = view.snap
    if not snap.done or view.recorded:
        return {"recording": None}
    try:
        rec = replay.record(snap)
    except ValueError as error:  # a run with no whole round to keep: shown as it is, not offered for saving
        print(f"the run could not be recorded: {error}", file=sys.stderr, flush=True)
        return {"recording": None}
    return {"recording": (replay.file_name(rec), dumps(rec))}


def wire(made: RecordingPanel, page: Page) -> None:
    """Open (the list, an upload) fills every run output and this panel's message, then the race
    replays and the step-through spans the run; Save appears once a live run is done."""
    # The form too: after Open, Run runs the prompt and the settings the page shows (issue 58).
    filled = [*page.outputs, made.said, *(page.controls[name] for name in FORM)]
    race_panel: race.RacePanel = page.made["race"]
    steps_panel: steps.StepsPanel = page.made["steps"]
    for event in (made.shipped.input(lambda name: on_shipped(name, page.shows), made.shipped, filled,
                                     concurrency_limit=OPENS_AT_ONCE, concurrency_id="open-shipped", **QUIET),
                  made.upload.upload(lambda path: on_upload(path, page.shows), made.upload, filled,
                                     concurrency_limit=OPENS_AT_ONCE, concurrency_id="open-upload", **QUIET)):
        event.success(race.on_replay, race_panel.state, race_panel.lanes, **QUIET, **race.REPLAY_EVENT)
        event.success(steps.on_steps_ready, race_panel.state, steps_panel.ready_outputs(),
                      **QUIET)  # as after a Run: a play of the last run stops
    made.state.change(on_recorded, made.state, [made.save, made.said], **QUIET)
    keep_pruned()


_tick = threading.Event()  # wakes the pruner early: a new PRUNE_SECONDS is read at once
_pruner: list[threading.Thread] = []  # the one pruning thread of this process, once started


def keep_pruned() -> None:
    """Remove saved files past SAVE_SECONDS every PRUNE_SECONDS, on a daemon thread of this
    process (started once): a file used to stay until someone saved again, however long."""
    if _pruner and _pruner[0].is_alive():
        _tick.set()
        return

    def prune() -> None:
        while True:
            _tick.wait(PRUNE_SECONDS)
            _tick.clear()
            _prune()

    _pruner[:] = [threading.Thread(target=prune, name="saved-runs-pruner", daemon=True)]
    _pruner[0].start()


def on_shipped(name: str | None, shows: Shows) -> tuple:
    """Open the shipped recording `name` (only a name the list offers: never a path a client sends)."""
    runs = replay.shipped()
    if name not in runs:
        return _refused("choose one of the shipped recordings" if name == CHOOSE else
                        "it is not one of the shipped ones", shows)
    return _opened(lambda: runs[name].read_bytes()[:MAX_BYTES + 1], shows)


def on_upload(path: str | None, shows: Shows) -> tuple:
    """Open an uploaded recording, read from Gradio's temporary folder where it arrived."""
    if not path:
        return _refused("no file arrived", shows)
    return _opened(lambda: replay.read_upload(path), shows)


def _opened(read: Callable[[], bytes], shows: Shows) -> tuple:
    started = time.perf_counter()
    try:
        snap = replay.open_bytes(read())
        values = shows.snapshot(snap)
    except BadRecording as error:
        return _refused(str(error), shows)
    except Exception as error:  # noqa: BLE001 - a file no check foresaw: one message, the server goes on
        print(f"opening a recording failed: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return _refused("it could not be read as a recording", shows)
    took = time.perf_counter() - started
    note = (f'<div class="recording-said recording-ok">{html.escape(snap.recorded)}. Opened in {took:.1f} s; '
            f"the host's load average then {' / '.join(f'{x:.1f}' for x in snap.load_average)} (1/5/15 min). The "
            "race replays its streams at their recorded pace.</div>")
    return values + (note,) + form_values(snap)


def form_values(snap: replay.Replayed) -> tuple:
    """The form set to the recording's own settings, in `FORM`'s order; E as its runs had it
    (a recording that left E to the model's default names the layer that default was).
    Opening a recording used to leave the prompt and the settings as they were, so the next Run
    ran another prompt than the one on screen (issue 58)."""
    settings = {name: getattr(snap.request, name) for name in FORM}
    if settings["exit_layer"] is None:
        settings["exit_layer"] = snap.state.rounds[0]["ppsd"].config.exit_layer
    if settings["forced_acceptance"] is None:
        settings["forced_acceptance"] = "off"  # the list's own "off" choice
    layers = snap.loaded.model.info.num_layers  # the sliders' ranges as for the recorded model, as Load sets them
    ranges = {"exit_layer": {"maximum": layers - 1}, "num_stages": {"maximum": layers}}
    return tuple(gr.skip() if value is None else gr.update(value=value, **ranges.get(name, {}))
                 for name, value in settings.items())


def _refused(reason: str, shows: Shows) -> tuple:
    text = f"This recording cannot be opened: {reason}."
    return shows.idle() + (f'<div class="recording-said recording-bad">{html.escape(text)}</div>',) + \
        (gr.skip(),) * len(FORM)


def on_recorded(saved: tuple[str, bytes] | None) -> tuple:
    """Save: a finished live run's recording as a file of its own, offered for download (hidden
    while there is none), and what was said of an opened recording cleared (a live run is shown)."""
    if not saved:
        return gr.update(visible=False, value=None), gr.skip()
    name, data = saved
    _prune()
    folder = SAVES / uuid.uuid4().hex
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / Path(name).name
    target.write_bytes(data)
    return gr.update(visible=True, value=str(target)), ""


def _prune() -> None:
    """Remove saved files older than SAVE_SECONDS (Gradio serves its own copy)."""
    if not SAVES.is_dir():
        return
    for folder in SAVES.iterdir():
        try:
            if time.time() - folder.stat().st_mtime > SAVE_SECONDS:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            pass

"""The summary panel, folded at the bottom: the run as JSON, which is also the last output of the
`run` API (a script's result): every setting, each method's text, token ids and metrics on both
clocks, and the timed rounds' walls with their medians' ratios; or, for a run that ended early,
why and what had finished.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from ppsd.executors.kinds import KINDS

from .. import kind_words
from ..reading import RunView
from ..words import forced_words
from . import Page, Single

OUTPUTS = ("summary",)


def create() -> Single:
    with gr.Accordion("Raw numbers (JSON; also the last output of the `run` API)", open=False):
        return Single(OUTPUTS[0], gr.JSON(show_label=False, elem_id="summary"))


def wire(made: Single, page: Page) -> None:
    """No events of its own: a Run fills it."""


def idle() -> dict[str, Any]:
    return {"summary": None}


def show(view: RunView) -> dict[str, Any]:
    return {"summary": summary(view) if view.snap.done else stopped(view)}


def summary(view: RunView) -> dict:
    """The machine-readable result of a run (also the API's last output)."""
    snap, finished = view.snap, view.finished
    info = snap.loaded.model.info
    config = next(iter(view.runs.values())).config
    out: dict[str, Any] = {
        "model": info.name, "device": info.device, "dtype": info.dtype, "num_layers": info.num_layers,
        "exit_layer": config.exit_layer, "stages": config.num_stages, "draft_len": config.draft_len,
        "max_new_tokens": config.max_new_tokens, "temperature": config.temperature, "top_p": config.top_p,
        "seed": config.seed, "prompt": snap.request.prompt, "chat": snap.request.chat and snap.loaded.chat,
        "exit_head": snap.head,
        "executor": KINDS[snap.pipeline].label,
        "timing": (f"decoder only, UI rendering paused; measured = {kind_words.of(snap.pipeline).where}; "
                   "projected = measured per-stage costs replayed on K workers"),
    }
    for method, run in view.runs.items():
        clocks = finished[method]
        out[method] = {"text": snap.loaded.decode(run.result.token_ids), "token_ids": run.result.token_ids,
                       "measured": clocks.measured.to_dict(), "projected": clocks.projected.to_dict()}
    stats = view.stats
    # Every ratio is of the medians of the rounds' walls, as on the page.
    for clock in ("projected", "measured"):
        out[f"speedup_{clock}"] = stats.ratio("ar", "ppsd", clock=clock)
    index = view.shown
    out["timed_runs"] = {"clock": snap.state.clock, "statistic": "each method's median wall; ratios of medians",
                         "rounds": len(stats.runs("ppsd")), "shown_round": None if index is None else index + 1,
                         "speedup": stats.ratio("ar", "ppsd"), "speedup_vs_fastest_ar": stats.against_fastest(),
                         "fastest_ar": (stats.fastest_ar() or (None,))[0],
                         **{f"{m}_wall_seconds": list(stats.runs(m)) for m in stats.walls}}
    if snap.request.forced is not None:  # a what-if: the API's result says so too
        out["forced_acceptance"] = snap.request.forced
        out["forced_note"] = forced_words(snap.request.forced)
    if snap.note:
        out["note"] = snap.note
    if snap.plain is not None:  # plain AR is on the measured clock, whatever the page's
        out["timed_runs"]["plain"] = f"AR {snap.plain.words}, measured"
        # each way plain AR was first timed, when there was a choice: the faster was kept
        out["timed_runs"]["plain_first_timings"] = [{"threads": t, "wall_seconds": w, "finished": done}
                                                    for t, w, done in snap.plain.trials]
    if len(stats.runs("ppsd")) < snap.request.rounds:  # Stop or the time limit cut the timing again short
        out["stopped"] = view.status
    return out


def stopped(view: RunView) -> dict | None:
    """The API's last output for a run that ended before its results: why, and where."""
    snap = view.snap
    if not snap.stopped:
        return None
    return {"stopped": view.status, **({"note": snap.note} if snap.note else {}),
            "finished": {m: {"token_ids": r.result.token_ids} for m, r in view.runs.items() if r.done}}

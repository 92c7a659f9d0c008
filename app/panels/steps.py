"""The step-through panel, under the analysis: the finished PPSD run one pipeline slot at a time,
what every stage computed, the draft accepted or corrected, the work flushed, and the text
committed so far (`app.teach`). It reads the race's state (`app.panels.race`), set by each Run.
Play moves it on by itself, one slot per tick of a `gr.Timer` at the pace chosen, until the last
slot or Pause.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import gradio as gr

from .. import teach
from ..components import Slider
from . import QUIET, Page, div

WAITING = '<div class="race-note">Run a comparison; then step through its PPSD run slot by slot here.</div>'
PACE_SECONDS = 1.5  # the default time per slot when playing: long enough to read a slot aloud


@dataclass(frozen=True)
class StepsPanel:
    previous: gr.Button
    slot: gr.Slider  # 1-based
    next: gr.Button
    view: gr.HTML
    play: gr.Button
    pause: gr.Button
    pace: gr.Slider  # seconds per slot while playing
    timer: gr.Timer  # ticks once per slot while playing; inactive otherwise


def create() -> StepsPanel:
    with gr.Accordion("Step through PPSD, slot by slot", open=True, elem_id="steps"):
        with gr.Row():
            previous = gr.Button("◀ Previous", size="sm", scale=1, elem_id="step-previous")
            slot = Slider(1, 2, value=1, step=1, label="Slot", scale=6, elem_id="step-slot")
            next_ = gr.Button("Next ▶", size="sm", scale=1, elem_id="step-next")
        with gr.Row():
            play = gr.Button("▶ Play", size="sm", scale=1, elem_id="step-play")
            pause = gr.Button("❚❚ Pause", size="sm", scale=1, elem_id="step-pause")
            pace = Slider(0.3, 5.0, value=PACE_SECONDS, step=0.1, label="Pace: seconds per slot", scale=6,
                          elem_id="step-pace")
        view = gr.HTML(step(None, 0), elem_id="step-view")
        timer = gr.Timer(PACE_SECONDS, active=False)
    return StepsPanel(previous, slot, next_, view, play, pause, pace, timer)


def wire(made: StepsPanel, page: Page) -> None:
    """After each successful Run the slider spans its slots; the buttons and the slider move.
    It reads the race's state (`app.panels.race.RacePanel`)."""
    panel, race, quiet = made, page.made["race"].state, QUIET
    step_outputs = [panel.slot, panel.view]
    page.run.success(on_steps_ready, race, [*step_outputs, panel.timer], **quiet)
    panel.previous.click(partial(on_step, move=-1), [race, panel.slot], step_outputs, **quiet)
    panel.next.click(partial(on_step, move=+1), [race, panel.slot], step_outputs, **quiet)
    panel.slot.input(on_step, [race, panel.slot], step_outputs, **quiet)
    panel.play.click(on_play, [race, panel.slot, panel.pace], [*step_outputs, panel.timer], **quiet)
    panel.pause.click(lambda: gr.Timer(active=False), None, panel.timer, **quiet)
    panel.pace.change(lambda pace: gr.Timer(value=float(pace)), panel.pace, panel.timer, **quiet)
    panel.timer.tick(on_tick, [race, panel.slot], [*step_outputs, panel.timer], **quiet)


def step(race: dict | None, index: int) -> str:
    """Slot `index` (0-based) of the finished PPSD run in `race` (`app.panels.race.race_state`),
    under the label of the round it is (the one closest to the medians, when there were several)."""
    if not race or not race.get("steps"):
        return WAITING
    steps = race["steps"]
    index = max(0, min(int(index), len(steps) - 1))
    piece = lambda token_id: race["pieces"].get(token_id, "?")  # noqa: E731
    slot = teach.render_slot(steps, index, race["ppsd_tokens"], piece)  # its caption says which slot, once
    forced = race.get("forced", "")  # a what-if's tokens are not the model's: said over every slot
    return div("forced-note", forced) + div("shown-run", race.get("round_label", "")) + slot


def on_step(race: dict | None, slot: float, move: int = 0) -> tuple:
    """Show slot `slot` + `move` (1-based on the slider), kept inside the run's slots."""
    count = len(race["steps"]) if race and race.get("steps") else 1
    slot = max(1, min(int(slot) + move, count))
    return gr.update(value=slot), step(race, slot - 1)


def on_steps_ready(race: dict | None) -> tuple:
    """After a run: the slider spans its slots, and shows the first; a play of the last run stops."""
    count = len(race["steps"]) if race and race.get("steps") else 1
    return gr.update(maximum=max(count, 2), value=1), step(race, 0), gr.Timer(active=False)


def _count(race: dict | None) -> int:
    return len(race["steps"]) if race and race.get("steps") else 0


def on_play(race: dict | None, slot: float, pace: float) -> tuple:
    """Play from the slot shown (from the first when it is the last), one slot per `pace` seconds."""
    count = _count(race)
    if count < 2:
        return gr.update(), step(race, 0), gr.Timer(active=False)
    slot = 1 if int(slot) >= count else max(1, int(slot))
    return gr.update(value=slot), step(race, slot - 1), gr.Timer(value=float(pace), active=True)


def on_tick(race: dict | None, slot: float) -> tuple:
    """One tick while playing: the next slot; the timer stops at the last."""
    count = _count(race)
    slot = min(int(slot) + 1, max(count, 1))
    return gr.update(value=slot), step(race, slot - 1), gr.Timer(active=slot < count)

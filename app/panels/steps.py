"""The step-through panel, under the analysis: the finished PPSD run one pipeline slot at a time,
what every stage computed, the draft accepted or corrected, the work flushed, and the text
committed so far (`app.teach`). It reads the race's state (`app.panels.race`), set by each Run.
Play moves it on by itself, one slot per tick of a `gr.Timer` at the pace chosen, until the last
slot or Pause. Pause is the word of the session's `playing` state, which every tick reads when it
runs: a tick queued before Pause (a busy machine) moves nothing, and no tick turns the timer back on.
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
    playing: gr.State  # True from Play until Pause, a Run or an Open: the ticks' authority

    def ready_outputs(self) -> list:
        """What `on_steps_ready` sets, after a Run or an Open."""
        return [self.slot, self.view, self.timer, self.playing]


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
    return StepsPanel(previous, slot, next_, view, play, pause, pace, timer, gr.State(False))


def wire(made: StepsPanel, page: Page) -> None:
    """After each successful Run the slider spans its slots; the buttons and the slider move.
    It reads the race's state (`app.panels.race.RacePanel`)."""
    panel, race, quiet = made, page.made["race"].state, QUIET
    shown = [panel.slot, panel.view]
    page.run.success(on_steps_ready, race, panel.ready_outputs(), **quiet)
    panel.previous.click(partial(on_step, move=-1), [race, panel.slot], shown, **quiet)
    panel.next.click(partial(on_step, move=+1), [race, panel.slot], shown, **quiet)
    panel.slot.input(on_step, [race, panel.slot], shown, **quiet)
    panel.play.click(on_play, [race, panel.slot, panel.pace], [*shown, panel.timer, panel.playing], **quiet)
    # Pause runs in its own group beside a slow tick, so it answers at once; the tick then obeys it.
    panel.pause.click(on_pause, None, [panel.timer, panel.playing], concurrency_limit=None, **quiet)
    panel.pace.change(lambda pace: gr.Timer(value=float(pace)), panel.pace, panel.timer, **quiet)
    panel.timer.tick(on_tick, [race, panel.slot, panel.playing], [*shown, panel.timer], **quiet)


def step(race: dict | None, index: int) -> str:
    """Slot `index` (0-based) of the finished PPSD run in `race` (`app.panels.race.race_state`),
    under the label of the round it is (the one closest to the medians, when there were several)."""
    if not _count(race):
        return WAITING
    steps = race["steps"]
    index = max(0, min(int(index), len(steps) - 1))
    piece = lambda token_id: race["pieces"].get(token_id, "?")  # noqa: E731
    slot = teach.render_slot(steps, index, race["ppsd_tokens"], piece)  # its caption says which slot, once
    forced = race.get("forced", "")  # a what-if's tokens are not the model's: said over every slot
    return div("forced-note", forced) + div("shown-run", race.get("round_label", "")) + slot


def _count(race: dict | None) -> int:
    return len(race["steps"]) if race and race.get("steps") else 0


def on_step(race: dict | None, slot: float, move: int = 0) -> tuple:
    """Show slot `slot` + `move` (1-based on the slider), kept inside the run's slots."""
    slot = max(1, min(int(slot) + move, _count(race)))
    return gr.update(value=slot), step(race, slot - 1)


def on_steps_ready(race: dict | None) -> tuple:
    """After a run: the slider spans its slots, and shows the first; a play of the last run stops."""
    return gr.update(maximum=max(_count(race), 2), value=1), step(race, 0), gr.Timer(active=False), False


def on_play(race: dict | None, slot: float, pace: float) -> tuple:
    """Play from the slot shown (from the first when it is the last), one slot per `pace` seconds."""
    count = _count(race)
    if count < 2:
        return gr.update(), step(race, 0), gr.Timer(active=False), False
    slot = 1 if int(slot) >= count else max(1, int(slot))
    return gr.update(value=slot), step(race, slot - 1), gr.Timer(value=float(pace), active=True), True


def on_pause() -> tuple:
    """Pause: the timer off, and the word every later tick reads."""
    return gr.Timer(active=False), False


def on_tick(race: dict | None, slot: float, playing: bool) -> tuple:
    """One tick while playing: the next slot; the timer stops at the last. After Pause (`playing`
    False) nothing moves. A tick never turns the timer on: one that started before Pause and ends
    after it used to, and play went on (5 more slots at load 8.4, issue 58)."""
    count = _count(race)
    if not playing:
        return gr.skip(), gr.skip(), gr.Timer(active=False)
    slot = min(int(slot) + 1, max(count, 1))
    return gr.update(value=slot), step(race, slot - 1), gr.skip() if slot < count else gr.Timer(active=False)

"""The race panel, under the columns: once a run is done, its methods' streams replayed side by
side, each committing its tokens at the times it recorded (never faster: a race shorter than
`REPLAY_SECONDS` is slowed down, and says so), ending with the finishing order. Its state, the
finished run as plain data, also feeds the step-through (`app.panels.steps`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import gradio as gr

from ppsd import Token, Trace
from ppsd.compare import PLAIN

from .. import teach
from ..reading import RunView
from ..token_stream import Piece, deciding_events, render_tokens
from ..words import METHOD_NAMES, PROJECTED_LANE, duration_text, forced_words
from . import QUIET, Page, div

OUTPUTS = ("race",)
REPLAY_SECONDS = 3.0  # least screen time of the slowest lane: a faster race is slowed down to it
REPLAY_MOST_SECONDS = 30.0  # most screen time: a longer race (a recording may say a week) is sped up to it
REPLAY_FPS = 12
REPLAY_BYTES = 16 * 2**20  # the most one replay streams: past it, frames come further apart
DRAWN_TOKENS = 400  # a lane draws at most its latest this many tokens (a frame's size stays bounded)
DRAWN_CHARS = 40  # and each token's text at most this many characters
REPLAYS_AT_ONCE = 16  # replays streaming at once, for every visitor together (each holds a thread)
# Every replay event, whatever started it, shares one group of REPLAYS_AT_ONCE (Gradio gives each
# event a group of one by default: five visitors' replays ran one after another).
REPLAY_EVENT = dict(concurrency_id="race-replay", concurrency_limit=REPLAYS_AT_ONCE)
WAITING = '<div class="race-note">Run a comparison; its race replays here.</div>'


@dataclass(frozen=True)
class RacePanel:
    lanes: gr.HTML
    replay: gr.Button
    state: gr.State  # the finished run (`race_state`), None before one

    def outputs(self) -> dict[str, Any]:
        return {"race": self.state}


def create() -> RacePanel:
    with gr.Accordion("Race replay: the finished streams side by side at their recorded pace", open=True,
                      elem_id="race-fold"):
        lanes = gr.HTML(WAITING, elem_id="race")
        replay = gr.Button("↻ Replay the race", size="sm")
    return RacePanel(lanes, replay, gr.State(None))


def wire(made: RacePanel, page: Page) -> None:
    """The race replays after each successful Run and on its button; Stop cancels both replays."""
    after_run = page.run.success(on_replay, made.state, made.lanes, **QUIET, **REPLAY_EVENT)
    again = made.replay.click(on_replay, made.state, made.lanes, api_name="replay", show_progress="hidden",
                              **REPLAY_EVENT)
    page.cancels.extend((after_run, again))


def idle() -> dict[str, Any]:
    return {"race": None}


def show(view: RunView) -> dict[str, Any]:
    return {"race": race_state(view) if view.snap.done else None}


def race_state(view: RunView) -> dict:
    """What the race replay needs, as plain data: lanes on the page's clock and token text."""
    snap = view.snap
    lanes = []
    pieces: dict[int, str] = {}
    plain = [(PLAIN, view.plain_run)] if view.plain_run is not None else []
    for method, run in [*view.runs.items(), *plain]:
        trace = view.traces[method]
        tokens = run.result.tokens
        # A lane ends at its run's wall on the page's clock, the value the stats card and the
        # metrics table show (the last event ends a little before the stopwatch stops).
        lanes.append(Lane(method, tokens, commit_times(tokens, trace), run.wall()))
        pieces.update({i: snap.loaded.piece(i) for token in tokens for i in (token.id, token.draft) if i is not None})
    ppsd_run = view.runs["ppsd"]
    if snap.concurrent:  # the paper's setup, a lane of its own: the same tokens at their projected times
        projected = ppsd_run.trace().project()
        lanes.append(Lane(PROJECTED_LANE, ppsd_run.result.tokens, commit_times(ppsd_run.result.tokens, projected),
                          ppsd_run.wall("projected"), ar_total=view.runs["ar"].wall("projected")))
    steps = teach.slots(ppsd_run.result.trace)  # the same trace the timeline draws
    forced = snap.request.forced
    return {"lanes": lanes, "pieces": pieces, "clock": "measured" if snap.concurrent else "projected",
            "round_label": view.round_label, "steps": steps, "ppsd_tokens": ppsd_run.result.tokens,
            "forced": "" if forced is None else forced_words(forced), "round_seconds": round_seconds(view)}


def round_seconds(view: RunView) -> float:
    """What one timed round took here: every method's measured wall in the round shown (the
    estimate of what each extra round costs, said before the next Run)."""
    runs = {**view.runs, **({PLAIN: view.plain_run} if view.plain_run is not None else {})}
    return sum(run.wall("measured") for run in runs.values() if run.done)


_latest: dict[str, object] = {}  # each session's replay in progress: a newer one ends the older


def on_replay(race: dict | None, request: gr.Request | None = None) -> Iterator[str]:
    """Replay the finished run: every lane commits its tokens at its recorded times, on the page's
    clock, at their pace, within REPLAY_SECONDS and REPLAY_MOST_SECONDS of screen time (slowed
    down or sped up to fit, and says so), and within REPLAY_BYTES streamed. One replay a
    session: a newer one of the same session ends this one."""
    if not race:
        yield '<div class="race-note">Run a comparison first; its race replays here.</div>'
        return
    session, mine = getattr(request, "session_hash", None) or "", object()
    _latest[session] = mine
    try:
        yield from _frames(race, lambda: _latest.get(session) is mine)
    finally:
        if _latest.get(session) is mine:
            del _latest[session]


def _frames(race: dict, current: Callable[[], bool]) -> Iterator[str]:
    """The race's frames while `current()`, the last one at its end."""
    lanes, pieces = race["lanes"], race["pieces"]
    piece = lambda token_id: _drawn(pieces.get(token_id, "?"))  # noqa: E731
    longest = max(lane.total for lane in lanes) or 1e-3
    stretch = min(max(1.0, REPLAY_SECONDS / longest), REPLAY_MOST_SECONDS / longest)
    screen = longest * stretch
    started = time.perf_counter()
    while current():
        at = (time.perf_counter() - started) / stretch
        frame = render_race(lanes, piece, at=min(at, longest), clock=race["clock"], stretch=stretch,
                            round_label=race.get("round_label", ""), forced=race.get("forced", ""))
        yield frame
        if at >= longest:
            return
        # as many frames as REPLAY_BYTES holds over the screen time, at most REPLAY_FPS a second,
        # and the last one on time
        gap = max(1 / REPLAY_FPS, screen * len(frame) / REPLAY_BYTES)
        time.sleep(max(0.0, min(gap, (longest - at) * stretch)))


def _drawn(text: str) -> str:
    """A token's text as the race draws it: at most DRAWN_CHARS characters."""
    return text if len(text) <= DRAWN_CHARS else text[:DRAWN_CHARS - 1] + "…"


@dataclass(frozen=True)
class Lane:
    """One method in the race: its committed tokens and the time (s) each became final."""

    method: str
    tokens: tuple[Token, ...]
    times: tuple[float, ...]
    total: float
    ar_total: float | None = None  # the projected lane: AR's wall on the same projected clock


def commit_times(tokens: Sequence[Token], trace: Trace) -> tuple[float, ...]:
    """When each token was decided on `trace`'s clock: the end of its final-stage work."""
    deciders = deciding_events(trace.events, trace.num_stages)
    times, last = [], 0.0
    for token in tokens:
        event = deciders.get(token.position)
        last = max(last, event.end) if event is not None else last
        times.append(last)
    return tuple(times)


def render_race(lanes: Sequence[Lane], piece: Piece, *, at: float, clock: str, stretch: float,
                round_label: str = "", forced: str = "") -> str:
    """The race at time `at` (seconds on the recorded clock): each lane shows what it had
    committed by then, with a progress bar and its own finishing time; `round_label`: the shown
    round it replays, in the panels' words."""
    longest = max((lane.total for lane in lanes), default=0.0) or 1.0
    rows = []
    for lane in lanes:
        done = sum(t <= at for t in lane.times)
        finished = at >= lane.total
        earlier = max(0, done - DRAWN_TOKENS)
        committed = render_tokens(lane.tokens[earlier:done], piece,
                                  label=f"{METHOD_NAMES.get(lane.method, lane.method)}: its answer so far in the race")
        if earlier:
            committed = f'<div class="race-earlier">… {earlier} earlier tokens not drawn</div>{committed}'
        clock_text = f"{duration_text(min(at, lane.total))}" + (" ✓ finished" if finished else "")
        if lane.ar_total is not None:
            clock_text += f" · AR on this clock: {duration_text(lane.ar_total)}"
        rows.append(
            f'<div class="race-lane"><div class="race-head"><span class="race-name">'
            f'{METHOD_NAMES.get(lane.method, lane.method)}</span><span class="race-clock">{clock_text} · '
            f'{done}/{len(lane.tokens)} tokens</span></div><div class="race-track"><div class="race-bar '
            f'race-{lane.method}" style="width:{100 * min(at, lane.total) / longest:.1f}%"></div></div>'
            f'{committed}</div>')
    which = f"{round_label[0].lower()}{round_label[1:].split(';')[0]}" if round_label else "this run"  # the round, as the panels say
    note = (f"Replay of {which}, slowed {stretch:.0f}× from its recorded pace ({clock} clock) so the "
            "eye can follow." if stretch >= 1.5 else
            f"Replay of {which}, sped up {1 / stretch:,.0f}× from its recorded pace ({clock} clock) to fit "
            f"{REPLAY_MOST_SECONDS:g} s." if stretch < 1 else
            f"Replay of {which} at its recorded pace ({clock} clock).")
    if any(lane.method == PROJECTED_LANE for lane in lanes):
        note += (" The lane of PPSD on one device per stage is projected from this run's stage costs (not run so): "
                 "compare it with AR's time on the same projected clock, beside it.")
    ended = at >= longest
    verdict = race_verdict([lane for lane in lanes if lane.method != PROJECTED_LANE]) if ended else ""
    return (f'<div class="race">{div("race-forced", forced)}{div("race-note", note)}{div("race-verdict", verdict)}'
            f'{"".join(rows)}</div>')


def race_verdict(lanes: Sequence[Lane]) -> str:
    """Every lane in the order it finished, with its time and how far behind the first it was
    (the replay's last frame)."""
    if len(lanes) < 2:
        return ""
    first, *rest = sorted(lanes, key=lambda lane: lane.total)
    name = lambda lane: METHOD_NAMES.get(lane.method, lane.method)  # noqa: E731
    behind = "; ".join(f"{name(lane)} {duration_text(lane.total)}, {duration_text(lane.total - first.total)} behind"
                       for lane in rest)
    return f"{name(first)} finished first, in {duration_text(first.total)}; then {behind}."

"""One snapshot of a run, read once for every panel (`RunView`): the round shown and the rounds'
statistic (`ppsd.compare_stats.Stats`, computed once here: the library's state computes it anew
on every call), its finished methods on both clocks, the page's reading of the comparison
(`app.reading.Reading`), which round the panels show, and the run's status in words. Every
panel's `show` reads this one value, so no two panels compute a number two ways. Pure: no
Gradio; HTML only for the shown round's label.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Mapping

from ppsd.compare import PLAIN, MethodRun
from ppsd.compare_stats import Stats
from ppsd.executors.kinds import KINDS

from .reading import MIN_TIMED_TOKENS, Clocks, Reading, reading
from .replay import Replayed
from .runner import Snapshot
from .words import METHOD_NAMES


@dataclass(frozen=True)
class Round:
    """The snapshot's statistic and the round the panels show, read off the library's state once:
    `runs` (the pipeline's methods), `plain` (plain AR's run, for the race), `index` (0-based,
    once done: the round closest to the medians; None while round 1 decodes live)."""

    stats: Stats
    runs: Mapping[str, MethodRun]
    plain: MethodRun | None
    index: int | None

    @classmethod
    def of(cls, snap: Snapshot) -> "Round":
        """`ppsd.compare.State.shown` and `shown_index`, over one `Snapshot.stats()`."""
        stats, rounds = snap.stats(), snap.state.rounds
        index = stats.shown() if snap.done and rounds else None
        shown = rounds[0 if index is None else index] if rounds else {}
        return cls(stats, {m: r for m, r in shown.items() if m != PLAIN}, shown.get(PLAIN), index)


@dataclass(frozen=True)
class RunView:
    """`snap` as the panels read it: `round` (the round shown and the statistic), `finished`
    (method -> its clocks, once done), `reading` (once AR and PPSD are done), `shown` (which
    round the panels show, in words; "" with one) and `status` (the run's status line). A
    recorded run (`app.replay.Replayed`) is `recorded` ("Recorded on <device>, <date>; not run
    now"), which leads `shown` and the status, so every panel that says which round it shows,
    and the headline, says so too."""

    snap: Snapshot
    round: Round
    finished: Mapping[str, Clocks]
    reading: Reading | None
    shown: str
    status: str
    recorded: str = ""

    @classmethod
    def of(cls, snap: Snapshot) -> "RunView":
        shown = Round.of(snap)
        finished = {m: Clocks(r.result.metrics("measured"), r.result.metrics("projected"), snap.concurrent)
                    for m, r in shown.runs.items() if r.done}
        recorded = snap.recorded if isinstance(snap, Replayed) else ""
        return cls(snap, shown, finished, reading(snap, shown.runs, finished, shown.stats, shown.index),
                   _joined(recorded, shown_run(snap, shown)), _joined(recorded, status_line(snap, shown)), recorded)

    @property
    def runs(self) -> Mapping[str, MethodRun]:
        """The pipeline's runs of the round shown (the live round, then the one closest to the medians)."""
        return self.round.runs

    @property
    def stats(self) -> Stats:
        return self.round.stats

    @property
    def teaches(self) -> bool:
        """AR and PPSD are done and the answer is long enough to time (`MIN_TIMED_TOKENS`)."""
        return self.reading is not None and self.reading.ar.tokens >= MIN_TIMED_TOKENS

    @property
    def ended(self) -> bool:
        return self.snap.done or self.snap.stopped


def _joined(recorded: str, text: str) -> str:
    return " · ".join(t for t in (recorded, text) if t)


def shown_note(shown: str) -> str:
    """The shown round's label, the same under the cards and over the metrics table."""
    return f'<div class="shown-run">{html.escape(shown)}</div>' if shown else ""


def shown_run(snap: Snapshot, shown: Round) -> str:
    """Which round the panels show, when there are several: the first while it decodes live,
    then the one closest to the medians, whose times the headline gives."""
    rounds, index = snap.request.rounds, shown.index
    if rounds == 1:
        return ""
    if index is None:
        return f"Round 1 of {rounds}, decoded live; the headline will give each method's median of the {rounds} rounds"
    return (f"Round {index + 1} of {len(snap.state.rounds)}, the one closest to the medians; the headline gives each "
            "method's median")


def status_line(snap: Snapshot, shown: Round) -> str:
    """The run's status in words: what it is doing, or why it ended early."""
    ended = "Stopped" if snap.limit is None else f"Ended by {snap.limit.words}"
    if snap.stopped:
        run = shown.runs.get(snap.active or "")
        where = (f" during {METHOD_NAMES[snap.active]}, after {len(run.recorder.tokens)} tokens"
                 if run is not None else " before decoding began")
        return f"{ended}{where}. " + ("Press Run to start again." if snap.limit is None else
                                      "Ask for fewer new tokens or fewer timed runs.")
    timed, rounds = len(shown.stats.runs("ppsd")), snap.request.rounds
    if snap.done and timed < rounds:
        return f"{ended} while timing again: the medians are over {timed} round{'s' * (timed != 1)}."
    if snap.active == "workers":
        return snap.status or f"Starting the {KINDS[snap.pipeline].choice}…"
    if snap.phase == "repeats":
        return f"Timing again for the medians: {snap.status}"
    if snap.active in shown.runs and not snap.done:
        run = shown.runs[snap.active]
        return (f"Running {METHOD_NAMES[snap.active]}… {len(run.recorder.tokens)}/"
                f"{run.config.max_new_tokens} tokens")
    return snap.status

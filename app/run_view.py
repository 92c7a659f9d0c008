"""One snapshot of a run, read once for every panel (`RunView`): its finished methods on both
clocks, the comparison the headline reports (`app.analysis.Comparison`), which round the panels
show, and the run's status in words. Every panel's `show` reads this one value, so no two panels
compute a number two ways. Pure: no Gradio; HTML only for the shown round's label.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Mapping

from ppsd.executors.kinds import KINDS
from ppsd.metrics import decode_costs, stalls

from . import analysis
from .analysis import MIN_TIMED_TOKENS, Clocks
from .replay import Replayed
from .runner import Snapshot
from .words import METHOD_NAMES


@dataclass(frozen=True)
class RunView:
    """`snap` as the panels read it: `finished` (method -> its clocks, once done), `comparison`
    (once AR and PPSD are done), `shown` (which round the panels show, in words; "" with one)
    and `status` (the run's status line). A recorded run (`app.replay.Replayed`) is `recorded`
    ("Recorded on <device>, <date>; not run now"), which leads `shown` and the status, so every
    panel that says which round it shows, and the headline, says so too."""

    snap: Snapshot
    finished: Mapping[str, Clocks]
    comparison: analysis.Comparison | None
    shown: str
    status: str
    recorded: str = ""

    @classmethod
    def of(cls, snap: Snapshot) -> "RunView":
        finished = {m: Clocks(r.result.metrics("measured"), r.result.metrics("projected"), snap.concurrent)
                    for m, r in snap.runs.items() if r.done}
        recorded = snap.recorded if isinstance(snap, Replayed) else ""
        return cls(snap, finished, _comparison(snap, finished), _joined(recorded, shown_run(snap)),
                   _joined(recorded, status_line(snap)), recorded)

    @property
    def teaches(self) -> bool:
        """AR and PPSD are done and the answer is long enough to time (`MIN_TIMED_TOKENS`)."""
        return self.comparison is not None and self.comparison.ar.tokens >= MIN_TIMED_TOKENS

    @property
    def ended(self) -> bool:
        return self.snap.done or self.snap.stopped


def _joined(recorded: str, text: str) -> str:
    return " · ".join(t for t in (recorded, text) if t)


def shown_note(shown: str) -> str:
    """The shown round's label, the same under the cards and over the metrics table."""
    return f'<div class="shown-run">{html.escape(shown)}</div>' if shown else ""


def shown_run(snap: Snapshot) -> str:
    """Which round the panels show, when there are several: the first while it decodes live,
    then the one closest to the medians, whose times the headline gives."""
    rounds, index = snap.request.rounds, snap.state.shown_index()
    if rounds == 1:
        return ""
    if index is None:
        return f"Round 1 of {rounds}, decoded live; the headline will give each method's median of the {rounds} rounds"
    return (f"Round {index + 1} of {len(snap.state.rounds)}, the one closest to the medians; the headline gives each "
            "method's median")


def status_line(snap: Snapshot) -> str:
    """The run's status in words: what it is doing, or why it ended early."""
    ended = "Stopped" if snap.limit is None else f"Ended by {snap.limit.words}"
    if snap.stopped:
        run = snap.runs.get(snap.active or "")
        where = (f" during {METHOD_NAMES[snap.active]}, after {len(run.recorder.tokens)} tokens"
                 if run is not None else " before decoding began")
        return f"{ended}{where}. " + ("Press Run to start again." if snap.limit is None else
                                      "Ask for fewer new tokens or fewer timed runs.")
    timed, rounds = len(snap.stats().runs("ppsd")), snap.request.rounds
    if snap.done and timed < rounds:
        return f"{ended} while timing again: the medians are over {timed} round{'s' * (timed != 1)}."
    if snap.active == "workers":
        return snap.status or f"Starting the {KINDS[snap.pipeline].choice}…"
    if snap.phase == "repeats":
        return f"Timing again for the medians: {snap.status}"
    if snap.active in snap.runs and not snap.done:
        run = snap.runs[snap.active]
        return (f"Running {METHOD_NAMES[snap.active]}… {len(run.recorder.tokens)}/"
                f"{run.config.max_new_tokens} tokens")
    return snap.status


def _comparison(snap: Snapshot, finished: Mapping[str, Clocks]) -> analysis.Comparison | None:
    """What the headline reports, once AR and PPSD have finished; None before."""
    if "ar" not in finished or "ppsd" not in finished:
        return None
    ar, ppsd_ = finished["ar"], finished["ppsd"]
    shown = snap.runs["ppsd"].shown()  # the trace the timeline draws on top: its rows' "util" are these
    stages = analysis.Stages(layers=tuple(len(r) for r in shown.partition), utilization=tuple(shown.utilization()),
                             costs=tuple(decode_costs(snap.runs["ar"].shown())))
    return analysis.Comparison(
        ar=ar.lead, ppsd=ppsd_.lead, ar_other=ar.other, ppsd_other=ppsd_.other, num_stages=snap.num_stages,
        device=snap.device, workers=snap.concurrent, stats=snap.stats(),
        eesd=finished["eesd"].measured if "eesd" in finished else None, plain=snap.plain,
        pipeline=snap.pipeline, stalls={m: stalls(snap.runs[m].trace()) for m in ("ar", "ppsd")}, stages=stages,
        shown=snap.state.shown_index(), rounds_asked=snap.request.rounds,
        final=snap.done or snap.stopped or len(snap.stats().runs("ppsd")) >= snap.request.rounds,
        round_busy=round_busy(snap), forced=snap.request.forced)


def round_busy(snap: Snapshot) -> tuple[float, ...]:
    """Each finished round's largest share of AR's or PPSD's measured time that stalls added (the
    machine's doing: `ppsd.metrics.stalls`), so a stall in any round, not only the one shown,
    keeps its numbers out of the headline."""
    shares = []
    for runs in snap.state.rounds:
        done = [runs[m] for m in ("ar", "ppsd") if m in runs and runs[m].done]
        if len(done) < 2:
            continue
        shares.append(max((found.excess_seconds / wall if found.count and wall > 0 else 0.0)
                          for run in done for found, wall in [(stalls(run.trace()), run.wall("measured"))]))
    return tuple(shares)

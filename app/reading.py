"""The page's one read model of a run: `RunView.of(snap)` reads a `Snapshot` once, and every
panel's `show` draws from that one frozen value, so no two panels compute a number two ways and
the library's `State.stats()` (which recomputes every run's walls on each call) is asked once a
snapshot. Pure: no Gradio, no HTML (its sentences are `app.analysis`'s, its HTML the panels').

"Shown" has one meaning on the page: the shown round, the round every panel draws. It is round 1
while that decodes live, then, once the run is done, the round closest to the medians
(`ppsd.compare_stats.Stats.shown`). `RunView.shown` and `Reading.shown` are its 0-based index
(None while live), `RunView.round_label` says it in words, and `RunView.traces` are its runs'
traces as the panels draw them.

Once AR and PPSD are done, the comparison's numbers are `Reading`: the metrics of the shown
round on both clocks (`Clocks`), the stages (`Stages`), the rounds' statistic (every ratio on
the page is read off it) and what the run ran on. It is built from plain values, so a test can
make one by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping

from ppsd import Metrics, Trace
from ppsd.compare import PLAIN, MethodRun, PlainWay
from ppsd.compare_stats import Stats
from ppsd.executors.kinds import KINDS, ExecutorKind, concurrent_kinds
from ppsd.metrics import Stalls, cost_slot_fraction, decode_costs, ideal_ppsd_speedup_slowest_stage, stalls

from . import kind_words
from .replay import Replayed
from .runner import Snapshot
from .words import METHOD_NAMES

MIN_TIMED_TOKENS = 8  # an answer shorter than this is over before the pipeline fills: no speedup is told


@dataclass(frozen=True)
class Clocks:
    """One finished run's metrics on both clocks, and the one the page leads with (`lead`):
    measured when the stages ran on K worker processes at once (`workers`), else projected, as on
    one device the measured clock runs the stages in turn and cannot show their overlap."""

    measured: Metrics
    projected: Metrics
    workers: bool = False

    @property
    def lead(self) -> Metrics:
        return self.measured if self.workers else self.projected

    @property
    def other(self) -> Metrics:
        return self.projected if self.workers else self.measured

    def on(self, clock: str) -> Metrics:
        return self.projected if clock == "projected" else self.measured


@dataclass(frozen=True)
class Stages:
    """The run's K stages two ways: by layers, the ideal model's view (the largest stage sets its
    slot), and by time on the page's clock: `utilization` of PPSD's run, what the timeline's rows
    say, and `costs`, each stage's seconds of decode work in AR's run, whose shares are a token's
    cost (`ppsd.metrics.decode_costs`)."""

    layers: tuple[int, ...]
    utilization: tuple[float, ...]
    costs: tuple[float, ...] = ()

    @property
    def largest(self) -> int:
        """The stage with the most layers (1-based; the first of equals)."""
        return 1 + self.layers.index(max(self.layers))

    @property
    def busiest(self) -> int:
        """The stage the timeline shows busiest (1-based): the slowest stage of this run."""
        return 1 + self.utilization.index(max(self.utilization))

    @property
    def cost_slot(self) -> float | None:
        return cost_slot_fraction(self.costs) if self.costs else None


@dataclass(frozen=True)
class Reading:
    """The page's reading of a comparison once AR and PPSD are done: what the headline reports.
    `stats`: every round's walls (`ppsd.compare_stats.Stats`, computed once per snapshot), the
    source of every ratio (medians over medians); `ar`, `ppsd` (on the page's clock) and
    `eesd` (measured): the metrics of the shown round (`shown`, 0-based, as in the module's docstring);
    `kind`: the executor kind the stages ran on (with `workers`, at once)."""

    ar: Metrics
    ppsd: Metrics
    num_stages: int
    device: str
    workers: bool
    stats: Stats
    eesd: Metrics | None = None
    plain: PlainWay | None = None  # how plain AR ran, when it was timed (with the stages at once)
    kind: ExecutorKind = field(default_factory=lambda: concurrent_kinds()[0])  # built by hand: the first concurrent kind
    stalls: Mapping[str, Stalls] = field(default_factory=dict)  # method -> its stalls in the shown round
    stages: Stages | None = None
    shown: int | None = None  # the shown round (0-based; None while round 1 is live)
    rounds_asked: int = 0  # R, the timed rounds asked for (0: as many as were timed)
    final: bool = True  # every round that will be timed is in `stats` (False while rounds 2..R run)
    round_busy: tuple[float, ...] = ()  # each finished round's largest share of a method's time added by stalls
    forced: float | None = None  # the forced acceptance (`ppsd.bench.forced`) the run was timed at, if any
    compiled: tuple[int, ...] = ()  # rounds (0-based) during which something compiled in the process: not clean
    others: tuple[float, ...] = ()  # each round's cores used by other programs meanwhile (`ppsd.quiet.others_cpu`)

    @property
    def speedup(self) -> float:
        """PPSD against AR on the same pipeline, on the page's clock: median AR wall over median
        PPSD wall (the headline's second line, the theory star, the cards, the API's summary)."""
        return self.stats.ratio("ar", "ppsd") or 0.0

    @property
    def acceptance(self) -> float | None:
        """The a the ideal is taken at: in a what-if the forced a (the work the run was asked to
        do), else PPSD's measured acceptance (None when no draft was judged)."""
        return self.forced if self.forced is not None else self.ppsd.acceptance_rate

    @property
    def ideal(self) -> float:
        """The ideal S_PPSD at `acceptance` and the run's slot (the measured run's own ideal
        unless a what-if forced another a)."""
        slot = self.ppsd.slot_fraction
        if self.forced is None or slot is None:
            return self.ppsd.ideal_speedup
        return ideal_ppsd_speedup_slowest_stage(self.forced, slot)

    @property
    def rounds(self) -> int:
        return len(self.stats.runs("ppsd"))

    @property
    def other_speedup(self) -> float:
        """The same medians' ratio on the other clock."""
        return self.stats.ratio("ar", "ppsd", clock="projected" if self.workers else "measured") or 0.0

    @property
    def fastest(self) -> tuple[str, float]:
        """The fastest AR measured here: ("plain" or "ar", its median measured wall)."""
        return self.stats.fastest_ar() or ("ar", self.stats.median("ar", clock="measured") or 0.0)

    @property
    def eesd_speedup(self) -> float:
        """EESD against AR, both measured (EESD has no pipeline to project onto)."""
        return self.stats.ratio("ar", "eesd", clock="measured") or 0.0

    @property
    def projected_speedup(self) -> float:
        """The medians' ratio on the projected clock: as on K devices, one per stage."""
        return self.stats.ratio("ar", "ppsd", clock="projected") or 0.0

    def spread(self, method: str) -> float:
        """`method`'s slowest round over its fastest (1: one round, or all alike)."""
        runs = self.stats.runs(method)
        return max(runs) / min(runs) if runs and min(runs) > 0 else 1.0


def reading(snap: Snapshot, runs: Mapping[str, MethodRun], traces: Mapping[str, Trace],
            finished: Mapping[str, Clocks], stats: Stats, shown: int | None) -> Reading | None:
    """What the headline reports, once AR and PPSD have finished (None before), from the shown
    round's `runs`, `traces` and `finished` clocks and the snapshot's `stats` (`RunView.of`)."""
    if "ar" not in finished or "ppsd" not in finished:
        return None
    ar, ppsd_ = finished["ar"], finished["ppsd"]
    top = traces["ppsd"]  # the trace the timeline draws on top: its rows' "util" are these
    stages = Stages(layers=tuple(len(r) for r in top.partition), utilization=tuple(top.utilization()),
                    costs=tuple(decode_costs(traces["ar"])))
    rounds = snap.request.rounds
    return Reading(
        ar=ar.lead, ppsd=ppsd_.lead, num_stages=snap.num_stages,
        device=snap.device, workers=snap.concurrent, stats=stats,
        eesd=finished["eesd"].measured if "eesd" in finished else None, plain=snap.plain,
        kind=KINDS[snap.pipeline], stalls={m: stalls(runs[m].trace()) for m in ("ar", "ppsd")}, stages=stages,
        shown=shown, rounds_asked=rounds,
        final=snap.done or snap.stopped or len(stats.runs("ppsd")) >= rounds,
        round_busy=round_busy(snap), forced=snap.request.forced, compiled=snap.state.compiled,
        others=snap.state.others)


def round_busy(snap: Snapshot) -> tuple[float, ...]:
    """Each finished round's largest share of AR's or PPSD's measured time that stalls added (the
    machine's doing: `ppsd.metrics.stalls`), so a stall in any round, not only the shown one,
    keeps its numbers out of the headline."""
    shares = []
    for runs in snap.state.rounds:
        done = [runs[m] for m in ("ar", "ppsd") if m in runs and runs[m].done]
        if len(done) < 2:
            continue
        shares.append(max((found.excess_seconds / wall if found.count and wall > 0 else 0.0)
                          for run in done for found, wall in [(stalls(run.trace()), run.wall("measured"))]))
    return tuple(shares)


@dataclass(frozen=True)
class RunView:
    """`snap` read once, as every panel draws it: the snapshot's `stats`; the shown round
    (`shown`, its index; `runs`, the pipeline's runs in it; `plain_run`, plain AR's, for the race;
    `traces`, each of those runs' trace on its own clock, as the timeline and the race draw it);
    `finished` (method -> its clocks, once done); `reading` (once AR and PPSD are done);
    `round_label` (the shown round in words; "" with one round) and `status` (the run's status
    line). A recorded run (`app.replay.Replayed`) is `recorded` ("Recorded on <device>, <date>;
    not run now"), which leads `round_label` and the status, so every panel that names the shown
    round, and the headline, says so too."""

    snap: Snapshot
    stats: Stats
    shown: int | None
    runs: Mapping[str, MethodRun]
    plain_run: MethodRun | None
    finished: Mapping[str, Clocks]
    round_label: str
    status: str
    recorded: str = ""

    @classmethod
    def of(cls, snap: Snapshot) -> "RunView":
        rounds = snap.state.rounds
        stats = snap.state.stats()  # the one call a snapshot makes
        shown = stats.shown() if snap.done and rounds else None
        drawn = rounds[0 if shown is None else shown] if rounds else {}
        runs = {m: r for m, r in drawn.items() if m != PLAIN}
        finished = {m: Clocks(r.result.metrics("measured"), r.result.metrics("projected"), snap.concurrent)
                    for m, r in runs.items() if r.done}
        recorded = snap.recorded if isinstance(snap, Replayed) else ""
        said = lambda text: " · ".join(t for t in (recorded, text) if t)  # noqa: E731
        return cls(snap, stats, shown, runs, drawn.get(PLAIN), finished, said(round_label(snap, shown)),
                   said(status_line(snap, runs, stats)), recorded)

    # Read when first asked and kept (a live snapshot whose figures are not redrawn projects no trace).
    @cached_property
    def traces(self) -> Mapping[str, Trace]:
        """Each run of the shown round that has done work, plain AR's too, on its own clock."""
        runs = {**self.runs, **({PLAIN: self.plain_run} if self.plain_run is not None else {})}
        return {m: r.shown() for m, r in runs.items() if r.recorder.events or r.done}

    @cached_property
    def reading(self) -> Reading | None:
        """The comparison's numbers, once AR and PPSD are done (None before)."""
        return reading(self.snap, self.runs, self.traces, self.finished, self.stats, self.shown)

    @property
    def teaches(self) -> bool:
        """AR and PPSD are done and the answer is long enough to time (`MIN_TIMED_TOKENS`)."""
        return self.reading is not None and self.reading.ar.tokens >= MIN_TIMED_TOKENS

    @property
    def ended(self) -> bool:
        return self.snap.done or self.snap.stopped


def round_label(snap: Snapshot, shown: int | None) -> str:
    """The shown round in words, when there are several: the first while it decodes live, then
    the one closest to the medians, whose times the headline gives."""
    rounds = snap.request.rounds
    if rounds == 1:
        return ""
    if shown is None:
        return f"Round 1 of {rounds}, decoded live; the headline will give each method's median of the {rounds} rounds"
    return (f"Round {shown + 1} of {len(snap.state.rounds)}, the one closest to the medians; the headline gives each "
            "method's median")


def status_line(snap: Snapshot, runs: Mapping[str, MethodRun], stats: Stats) -> str:
    """The run's status in words: what it is doing, or why it ended early (`runs`: the shown round's)."""
    ended = "Stopped" if snap.limit is None else f"Ended by {snap.limit.words}"
    if snap.stopped:
        run = runs.get(snap.active or "")
        where = (f" during {METHOD_NAMES[snap.active]}, after {len(run.recorder.tokens)} tokens"
                 if run is not None else " before decoding began")
        return f"{ended}{where}. " + ("Press Run to start again." if snap.limit is None else
                                      "Ask for fewer new tokens or fewer timed runs.")
    timed, rounds = len(stats.runs("ppsd")), snap.request.rounds
    if snap.done and timed < rounds:
        return f"{ended} while timing again: the medians are over {timed} round{'s' * (timed != 1)}."
    if snap.active == "workers":
        return snap.status or f"Starting the {kind_words.of(snap.pipeline).choice}…"
    if snap.phase == "repeats":
        return f"Timing again for the medians: {snap.status}"
    if snap.active in runs and not snap.done:
        run = runs[snap.active]
        return (f"Running {METHOD_NAMES[snap.active]}… {len(run.recorder.tokens)}/"
                f"{run.config.max_new_tokens} tokens")
    return snap.status

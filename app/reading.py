"""The page's reading of a finished comparison (`Reading`), built once per snapshot from the
library's state (`Reading.of`): the metrics of the round shown on both clocks (`Clocks`), the
stages (`Stages`), the rounds' one statistic (`ppsd.compare_stats.Stats`, computed once and
carried as it is: every ratio on the page is read off it) and what the run ran on. Numbers only:
its sentences are `app.analysis`'s, its HTML the panels'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ppsd import Metrics
from ppsd.compare import MethodRun, PlainWay
from ppsd.compare_stats import Stats
from ppsd.executors.kinds import KINDS, ExecutorKind, concurrent_kinds
from ppsd.metrics import Stalls, cost_slot_fraction, decode_costs, ideal_ppsd_speedup_slowest_stage, stalls

from .runner import Snapshot

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
    source of every ratio (medians over medians); `ar`, `ppsd` (`_other`: on the other clock)
    and `eesd`: the metrics of the round shown (`shown`, 0-based), the one closest to the medians;
    `kind`: the executor kind the stages ran on (with `workers`, at once)."""

    ar: Metrics
    ppsd: Metrics
    ar_other: Metrics
    ppsd_other: Metrics
    num_stages: int
    device: str
    workers: bool
    stats: Stats
    eesd: Metrics | None = None
    plain: PlainWay | None = None  # how plain AR ran, when it was timed (with the stages at once)
    kind: ExecutorKind = field(default_factory=lambda: concurrent_kinds()[0])  # built by hand: the first concurrent kind
    stalls: Mapping[str, Stalls] = field(default_factory=dict)  # method -> its shown run's stalls
    stages: Stages | None = None
    shown: int | None = None  # which round the panels show (0-based)
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


def reading(snap: Snapshot, runs: Mapping[str, MethodRun], finished: Mapping[str, Clocks], stats: Stats,
            shown: int | None) -> Reading | None:
    """What the headline reports, once AR and PPSD have finished (None before): `runs`, the round
    shown (`shown`, 0-based, once done), and `stats`, the snapshot's statistic, each read once for
    the snapshot (`app.run_view.RunView.of`)."""
    if "ar" not in finished or "ppsd" not in finished:
        return None
    ar, ppsd_ = finished["ar"], finished["ppsd"]
    top = runs["ppsd"].shown()  # the trace the timeline draws on top: its rows' "util" are these
    stages = Stages(layers=tuple(len(r) for r in top.partition), utilization=tuple(top.utilization()),
                    costs=tuple(decode_costs(runs["ar"].shown())))
    rounds = snap.request.rounds
    return Reading(
        ar=ar.lead, ppsd=ppsd_.lead, ar_other=ar.other, ppsd_other=ppsd_.other, num_stages=snap.num_stages,
        device=snap.device, workers=snap.concurrent, stats=stats,
        eesd=finished["eesd"].measured if "eesd" in finished else None, plain=snap.plain,
        kind=KINDS[snap.pipeline], stalls={m: stalls(runs[m].trace()) for m in ("ar", "ppsd")}, stages=stages,
        shown=shown, rounds_asked=rounds,
        final=snap.done or snap.stopped or len(stats.runs("ppsd")) >= rounds,
        round_busy=round_busy(snap), forced=snap.request.forced, compiled=snap.state.compiled,
        others=snap.state.others)


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

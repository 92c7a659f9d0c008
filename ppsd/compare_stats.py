"""The comparison's one statistic, as plain arithmetic over walls: each method's time is the
median of its rounds' walls, every ratio is a ratio of those medians (so the ratios multiply:
plain/AR × AR/PPSD = plain/PPSD), and the round to show is the one closest to the medians whose
finishing order agrees with theirs. Numbers in, numbers out: `ppsd.compare` builds a `Stats`
from its runs, and tests build one from made-up walls.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Mapping

Walls = Mapping[str, tuple[float | None, ...]]  # method -> its wall in each round (None: not finished there)


def speedup(baseline_seconds: float, method_seconds: float) -> float:
    """How many times faster the method ran than its baseline: baseline wall / method wall, both
    on one clock. 0.0 when the method has no time yet, so a page never divides by zero."""
    return baseline_seconds / method_seconds if method_seconds > 0 else 0.0


@dataclass(frozen=True)
class Stats:
    """`walls`: each method's wall per round on the clock it is compared on (the pipeline's
    methods on the comparison's clock, plain AR measured); `measured` and `projected`: the same
    runs on those clocks (`clock=` below picks one)."""

    walls: Walls
    measured: Walls
    projected: Walls = field(default_factory=dict)

    def runs(self, method: str, *, clock: str | None = None) -> tuple[float, ...]:
        """The walls of `method`'s finished rounds (on its comparison clock, or on `clock`)."""
        walls = {None: self.walls, "measured": self.measured, "projected": self.projected}[clock]
        return tuple(w for w in walls.get(method, ()) if w is not None)

    def median(self, method: str, *, clock: str | None = None) -> float | None:
        """`method`'s time: the median of its finished rounds' walls (None: none finished)."""
        runs = self.runs(method, clock=clock)
        return statistics.median(runs) if runs else None

    def ratio(self, base: str, method: str, *, clock: str | None = None) -> float | None:
        """How many times faster `method` ran than `base`: median over median (None: either untimed)."""
        b, m = self.median(base, clock=clock), self.median(method, clock=clock)
        return None if b is None or m is None else speedup(b, m)

    def fastest_ar(self) -> tuple[str, float] | None:
        """The fastest AR measured here, (key, median measured seconds): plain AR (no pipeline)
        or AR on the pipeline, whichever ran faster; None before either has finished."""
        found = [(key, self.median(key, clock="measured")) for key in ("plain", "ar")]
        found = [(key, seconds) for key, seconds in found if seconds is not None]
        return min(found, key=lambda f: f[1]) if found else None

    def against_fastest(self, method: str = "ppsd") -> float | None:
        """`method` (its median on its comparison clock) against the fastest AR measured here."""
        fastest, seconds = self.fastest_ar() or (None, None)
        mine = self.median(method)
        return None if fastest is None or mine is None else speedup(seconds, mine)

    def shown(self) -> int | None:
        """The round to show (0-based): among the rounds where every timed method finished,
        those whose finishing order agrees with the medians' (so a race replayed from it ends
        as the headline says), the one closest to the medians (least summed |log(wall /
        median)|); any complete round when none agrees. None: no round is complete."""
        keys = list(self.walls)
        if not keys or not all(self.runs(m) for m in keys):
            return None
        medians = {m: self.median(m) for m in keys}
        complete = [i for i in range(max(len(self.walls[m]) for m in keys))
                    if all(i < len(self.walls[m]) and self.walls[m][i] is not None for m in keys)]
        if not complete:
            return None

        def distance(i: int) -> float:
            return sum(abs(math.log(self.walls[m][i] / medians[m])) for m in keys if medians[m] > 0
                       and self.walls[m][i] > 0)

        agreeing = [i for i in complete if _same_order(keys, {m: self.walls[m][i] for m in keys}, medians)]
        return min(agreeing or complete, key=distance)


def _same_order(keys: list[str], walls: Mapping[str, float], medians: Mapping[str, float]) -> bool:
    """Whether no two methods finish in `walls` the other way round from `medians` (a tie on
    either side counts as agreeing)."""
    return all(not (medians[a] < medians[b] and walls[a] > walls[b]) for a in keys for b in keys)

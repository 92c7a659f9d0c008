"""The speedup math of the bench: a setting's kept repeats on one prompt (`Cell`), tokens per
second with their spread, paired per-round speedups and acceptance. Pure arithmetic on
`Result`s and times; nothing here runs a model."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from ..compare_stats import speedup


@dataclass(frozen=True)
class Cell:
    """One setting on one prompt: counts from the run and the wall times of every kept repeat."""

    prompt: str
    category: str
    tokens: int
    accepted: int
    rejected: int
    flushed: int
    wasted_stage_slots: int
    walls: tuple[float, ...]  # measured, seconds, one per repeat
    projected_walls: tuple[float, ...]  # projected on K workers, one per repeat
    utilization: tuple[float, ...]  # per stage, projected clock, median repeat
    token_ids: tuple[int, ...]


def cell_from_results(prompt: str, category: str, results: Sequence) -> Cell:
    """Fold the repeats of one setting on one prompt (library `Result`s) into a Cell. Counts come
    from the first repeat: repeats are seeded identically, so they decode the same tokens."""
    first = results[0]
    projected = [r.metrics("projected") for r in results]
    middle = sorted(range(len(results)), key=lambda i: projected[i].wall_seconds)[len(results) // 2]
    m = projected[middle]
    return Cell(prompt=prompt, category=category, tokens=m.tokens, accepted=m.accepted, rejected=m.rejected,
                flushed=m.flushed, wasted_stage_slots=m.wasted_stage_slots,
                walls=tuple(r.measured_wall_seconds for r in results),
                projected_walls=tuple(p.wall_seconds for p in projected),
                utilization=tuple(m.stage_utilization), token_ids=tuple(first.token_ids))


@dataclass(frozen=True)
class Speed:
    """Tokens per second of a set of cells: median wall per prompt, summed over prompts, and the
    same sum over each prompt's fastest and slowest repeat (the spread)."""

    tokens: int
    median: float
    low: float
    high: float


def speed(cells: Sequence[Cell], *, projected: bool = False) -> Speed:
    return walls_speed(sum(c.tokens for c in cells), [c.projected_walls if projected else c.walls for c in cells])


def walls_speed(tokens: int, walls: Sequence[Sequence[float]]) -> Speed:
    """`Speed` of `tokens` generated over every prompt's repeats, `walls[p]` the seconds of prompt p's."""
    rate = lambda seconds: tokens / seconds if seconds > 0 else float("nan")  # noqa: E731
    return Speed(tokens, rate(sum(statistics.median(w) for w in walls)),
                 rate(sum(max(w) for w in walls)), rate(sum(min(w) for w in walls)))


def round_speedups(cells: Sequence[Cell], baseline: Sequence[Cell], *, projected: bool = False) -> list[float]:
    """Speedup per round: round r of the method ran right after round r of its AR baseline on
    every prompt, so the spread of these paired ratios is the honest spread of the speedup."""
    walls = lambda cs: [c.projected_walls if projected else c.walls for c in cs]  # noqa: E731
    mine, base = walls(cells), walls(baseline)
    ratio = sum(c.tokens for c in cells) / sum(c.tokens for c in baseline)
    return [ratio * speedup(sum(w[r] for w in base), sum(w[r] for w in mine)) for r in range(len(mine[0]))]


def acceptance_rate(cells: Sequence[Cell]) -> float | None:
    """Accepted drafts over verified drafts; None when nothing was drafted (AR)."""
    accepted, rejected = sum(c.accepted for c in cells), sum(c.rejected for c in cells)
    return accepted / (accepted + rejected) if accepted + rejected else None

"""The pipeline trace as data: validated against numbered invariants, replayed on K concurrent
workers (the projected clock), exported as a Chrome trace. Knows nothing of models or decoders.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Literal

from .steps import EVENT_KINDS, Event

Clock = Literal["measured", "projected"]
EPS = 1e-9


@dataclass(frozen=True)
class Trace:
    """Events in recording order (causal order) of a run on `num_stages` pipeline stages.

    `partition[k]` is the layer range of stage k+1; `length` the final sequence length (prompt plus
    committed tokens); `clock` says whether times were measured where they ran or projected;
    a measured trace of stages run in turn is not `concurrent`, so it cannot show overlap.
    """

    events: tuple[Event, ...]
    partition: tuple[range, ...]
    prompt_len: int
    length: int
    clock: Clock
    device: str = "cpu"
    concurrent: bool = False  # stages really ran at the same time (one worker each)

    @property
    def num_stages(self) -> int:
        return len(self.partition)

    @property
    def num_layers(self) -> int:
        return sum(len(r) for r in self.partition)

    @property
    def makespan(self) -> float:
        if not self.events:
            return 0.0
        return max(e.end for e in self.events) - min(e.start for e in self.events)

    def wall(self, measured_wall_seconds: float) -> float:
        """The run's wall on this trace's clock: on the measured clock the whole call's
        (`measured_wall_seconds`, set-up and host work included), on the projected one the makespan."""
        return measured_wall_seconds if self.clock == "measured" else self.makespan

    def utilization(self) -> list[float]:
        """Per stage: busy time / makespan."""
        span = self.makespan
        busy = [0.0] * (self.num_stages + 1)
        for e in self.events:
            if 1 <= e.stage <= self.num_stages:
                busy[e.stage] += e.duration
        return [busy[k] / span if span > 0 else 0.0 for k in range(1, self.num_stages + 1)]

    def violations(self) -> list[tuple[int, str]]:
        """Broken invariants as (number, message), every one `iter_violations` finds; empty when
        the trace is sound."""
        return list(self.iter_violations())

    def iter_violations(self) -> Iterator[tuple[int, str]]:
        """Broken invariants as (number, message), in the order below, found one at a time: a
        caller that needs the first (`validate`) does no more work than finding it. Every check
        costs the events (sorted) or the positions they cover, never the trace's length alone.

        1. Every event is well formed: stage in [1, K], 0 <= start <= end, width >= 1,
           0 <= kept <= width, kind known, clock known.
        2. At most one piece of work per stage at a time.
        3. Tokens pass the stages in order: work on stage k > 1 starts after the latest work of
           stage k - 1 on any of its positions, recorded before it, has ended.
        4. Every position in [0, length - 1) passed every stage exactly once in work that was
           kept (after its last flush); no kept work lies at or beyond length - 1. One message a
           stage: its first position that miscounts.
        5. Utilization of every stage lies in [0, 1].
        6. A correction restarts stage 1: stage-1 work fed from the final stage starts after the
           latest final-stage work recorded before it has ended.
        """
        for i, e in enumerate(self.events):
            if not (1 <= e.stage <= self.num_stages and 0 <= e.start <= e.end + EPS and e.width >= 1
                    and e.kind in EVENT_KINDS and 0 <= e.kept_width <= e.width):
                yield 1, f"event {i} is malformed: {e}"
        if self.clock not in ("measured", "projected"):
            yield 1, f"clock {self.clock!r} is neither measured nor projected"
        stages = self._by_stage()
        for k, on_stage in stages.items():
            on_stage = sorted(on_stage, key=lambda e: e.start)
            for a, b in zip(on_stage, on_stage[1:]):
                if b.start < a.end - EPS:
                    yield 2, f"stage {k} runs two pieces of work at once at t={b.start:.6f}"
        deps = dependencies(self.events, self.num_stages)
        for i, e in enumerate(self.events):
            if e.stage > 1 and e.kind != "prefill" and deps[i].producer is None:
                yield 3, f"event {i} on stage {e.stage} has no input from stage {e.stage - 1}"
            elif deps[i].producer is not None and e.start < self.events[deps[i].producer].end - EPS:
                yield 3, f"event {i} on stage {e.stage} starts before its input is ready"
            if deps[i].restart is not None and e.start < self.events[deps[i].restart].end - EPS:
                yield 6, f"event {i} restarts stage 1 before the final stage decided"
        for k, on_stage in stages.items():
            kept = [(e.position, e.position + e.kept_width) for e in on_stage if e.kept_width > 0]
            miscount = _first_miscount(kept, self.length - 1)
            if miscount is not None:
                yield 4, f"position {miscount[0]} passed stage {k} {miscount[1]} times"
            beyond = [max(a, self.length - 1) for a, b in kept if b > self.length - 1]
            if beyond:
                yield 4, f"stage {k} kept work at position {min(beyond)} >= length - 1"
        for k, u in enumerate(self.utilization(), start=1):
            if not 0.0 <= u <= 1.0 + 1e-6:
                yield 5, f"stage {k} utilization {u:.3f} is outside [0, 1]"

    def _by_stage(self) -> dict[int, list[Event]]:
        """Stages 1..K, each with its events in recording order (one pass, not K)."""
        stages: dict[int, list[Event]] = {k: [] for k in range(1, self.num_stages + 1)}
        for e in self.events:
            if e.stage in stages:
                stages[e.stage].append(e)
        return stages

    def validate(self) -> "Trace":
        """Raise ValueError naming the first broken invariant; return self when sound."""
        first = next(self.iter_violations(), None)
        if first is not None:
            number, message = first
            raise ValueError(f"trace invariant {number} broken: {message}")
        return self

    def project(self) -> "Trace":
        """Replay the same work on K concurrent workers, each piece costing what it measured.

        A piece starts when its stage is free, its input from the previous stage is ready, and,
        for stage-1 work fed by the final stage, when that decision is made (spec: ideal model).
        """
        deps = dependencies(self.events, self.num_stages)
        stage_free = [0.0] * (self.num_stages + 1)
        ends: list[float] = []
        projected = []
        for e, d in zip(self.events, deps):
            start = max([stage_free[e.stage]] + [ends[j] for j in (d.producer, d.restart) if j is not None])
            end = start + e.duration
            stage_free[e.stage] = end
            ends.append(end)
            projected.append(replace(e, start=start, end=end))
        return replace(self, events=tuple(projected), clock="projected")

    def to_chrome(self) -> dict:
        """Chrome trace JSON (chrome://tracing, Perfetto): one thread per stage, times in us."""
        names = [{"ph": "M", "pid": 1, "tid": k, "name": "thread_name",
                  "args": {"name": f"stage {k} (layers {r.start}-{r.stop - 1})"}}
                 for k, r in enumerate(self.partition, start=1)]
        work = [{"ph": "X", "pid": 1, "tid": e.stage, "name": f"{e.kind} p{e.position}", "cat": e.kind,
                 "ts": e.start * 1e6, "dur": e.duration * 1e6,
                 "args": {"position": e.position, "width": e.width, "token_id": e.token_id,
                          "slot": e.slot, "decision": e.decision}}
                for e in self.events]
        return {"traceEvents": names + work, "displayTimeUnit": "ms",
                "otherData": {"clock": self.clock, "device": self.device}}


@dataclass(frozen=True)
class Dependencies:
    """Indices of the events a piece of work waits for (None: no such dependency)."""

    producer: int | None
    restart: int | None


def dependencies(events: tuple[Event, ...] | list[Event], num_stages: int) -> list[Dependencies]:
    """For each event: the latest earlier work of the previous stage on any of its positions (an
    EESD verification spans g drafts, each pushed through stage 1 on its own), and, for stage-1
    work fed by the final stage, the latest earlier final-stage work.

    Each stage keeps a row, position -> the latest event there (-1: none), read and written a
    slice per event: an event costs its width at C speed (a prefill's thousands of positions
    are one slice), and the rows together hold each stage's furthest position."""
    last_final: int | None = None
    rows: dict[int, list[int]] = {}
    found = []
    for i, e in enumerate(events):
        stop = e.position + e.width
        below = rows.get(e.stage - 1) if e.stage > 1 else None
        latest = max(below[e.position:stop], default=-1) if below is not None else -1
        restart = last_final if e.stage == 1 and e.from_final else None
        found.append(Dependencies(latest if latest >= 0 else None, restart))
        row = rows.setdefault(e.stage, [])
        if len(row) < stop:
            row.extend([-1] * (stop - len(row)))
        row[e.position:stop] = [i] * e.width
        if e.stage == num_stages:
            last_final = i
    return found


def _first_miscount(spans: list[tuple[int, int]], end: int) -> tuple[int, int] | None:
    """The first position p in [0, end) that the half-open `spans` cover other than exactly
    once, with how many cover it; None when each is covered once. A sweep over the spans' ends:
    the cost is the spans', not `end`'s."""
    deltas: dict[int, int] = {}
    for a, b in spans:
        deltas[a] = deltas.get(a, 0) + 1
        deltas[b] = deltas.get(b, 0) - 1
    count, at = 0, 0  # positions from `at` up to the next end are covered `count` times
    for x in sorted(deltas):
        if x > at:
            if at >= end:
                return None
            if count != 1:
                return at, count
            at = x
        count += deltas[x]
    return (at, count) if at < end else None


class Stopwatch:
    """Seconds since the run began; `sync` (for example torch.cuda.synchronize) runs before each
    reading so asynchronous devices report when work finished, not when it was queued."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self._sync = sync
        self._origin = time.perf_counter()

    def now(self) -> float:
        if self._sync is not None:
            self._sync()
        return self.at(time.perf_counter())

    def at(self, t: float) -> float:
        """The reading for `time.perf_counter()` value `t` (CLOCK_MONOTONIC on Linux: the same in
        every process of the host, so other processes' stamps convert too)."""
        return t - self._origin

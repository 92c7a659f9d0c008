"""The pipeline trace as data: validated against numbered invariants, replayed on K concurrent
workers (the projected clock), exported as a Chrome trace. Knows nothing of models or decoders.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Literal

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

    def busy(self, stage: int) -> float:
        """Seconds `stage` (1-based) spent working."""
        return sum(e.duration for e in self.events if e.stage == stage)

    def utilization(self) -> list[float]:
        """Per stage: busy time / makespan."""
        span = self.makespan
        return [self.busy(k) / span if span > 0 else 0.0 for k in range(1, self.num_stages + 1)]

    def violations(self) -> list[tuple[int, str]]:
        """Broken invariants as (number, message); empty when the trace is sound.

        1. Every event is well formed: stage in [1, K], 0 <= start <= end, width >= 1,
           0 <= kept <= width, kind known, clock known.
        2. At most one piece of work per stage at a time.
        3. Tokens pass the stages in order: work on stage k > 1 starts after the latest work of
           stage k - 1 on any of its positions, recorded before it, has ended.
        4. Every position in [0, length - 1) passed every stage exactly once in work that was
           kept (after its last flush); no kept work lies at or beyond length - 1.
        5. Utilization of every stage lies in [0, 1].
        6. A correction restarts stage 1: stage-1 work fed from the final stage starts after the
           latest final-stage work recorded before it has ended.
        """
        found: list[tuple[int, str]] = []
        for i, e in enumerate(self.events):
            if not (1 <= e.stage <= self.num_stages and 0 <= e.start <= e.end + EPS and e.width >= 1
                    and e.kind in EVENT_KINDS and 0 <= e.kept_width <= e.width):
                found.append((1, f"event {i} is malformed: {e}"))
        if self.clock not in ("measured", "projected"):
            found.append((1, f"clock {self.clock!r} is neither measured nor projected"))
        for k in range(1, self.num_stages + 1):
            on_stage = sorted((e for e in self.events if e.stage == k), key=lambda e: e.start)
            for a, b in zip(on_stage, on_stage[1:]):
                if b.start < a.end - EPS:
                    found.append((2, f"stage {k} runs two pieces of work at once at t={b.start:.6f}"))
        deps = dependencies(self.events, self.num_stages)
        for i, e in enumerate(self.events):
            if e.stage > 1 and e.kind != "prefill" and deps[i].producer is None:
                found.append((3, f"event {i} on stage {e.stage} has no input from stage {e.stage - 1}"))
            elif deps[i].producer is not None and e.start < self.events[deps[i].producer].end - EPS:
                found.append((3, f"event {i} on stage {e.stage} starts before its input is ready"))
            if deps[i].restart is not None and e.start < self.events[deps[i].restart].end - EPS:
                found.append((6, f"event {i} restarts stage 1 before the final stage decided"))
        for k in range(1, self.num_stages + 1):
            counts: dict[int, int] = {}
            for e in self.events:
                if e.stage == k:
                    for p in range(e.position, e.position + e.kept_width):
                        counts[p] = counts.get(p, 0) + 1
            for p in range(self.length - 1):
                if counts.get(p, 0) != 1:
                    found.append((4, f"position {p} passed stage {k} {counts.get(p, 0)} times"))
            beyond = [p for p in counts if p >= self.length - 1]
            if beyond:
                found.append((4, f"stage {k} kept work at position {min(beyond)} >= length - 1"))
        for k, u in enumerate(self.utilization(), start=1):
            if not 0.0 <= u <= 1.0 + 1e-6:
                found.append((5, f"stage {k} utilization {u:.3f} is outside [0, 1]"))
        return found

    def validate(self) -> "Trace":
        """Raise ValueError naming the first broken invariant; return self when sound."""
        found = self.violations()
        if found:
            number, message = found[0]
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
    work fed by the final stage, the latest earlier final-stage work."""
    last_final: int | None = None
    last_at: dict[tuple[int, int], int] = {}
    found = []
    for i, e in enumerate(events):
        inputs = [last_at[(e.stage - 1, p)] for p in range(e.position, e.position + e.width)
                  if (e.stage - 1, p) in last_at] if e.stage > 1 else []
        producer = max(inputs) if inputs else None
        restart = last_final if e.stage == 1 and e.from_final else None
        found.append(Dependencies(producer, restart))
        for p in range(e.position, e.position + e.width):
            last_at[(e.stage, p)] = i
        if e.stage == num_stages:
            last_final = i
    return found


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

"""The comparison, as one object: AR, PPSD (and EESD) on one pipeline, and plain AR (the fastest
AR here with no pipeline), timed for R interleaved rounds, so a slow spell of the machine hits
every method alike. The page (`app.runner`) and `python -m ppsd bench-pipeline` both run it, so
"the comparison" and "plain AR" are defined here once.

`Comparison.run()` opens its executor (unless it was lent one), decodes, and yields immutable
`State`s: progress (the live run, what is starting or timing), then each finished round. The
one statistic lives in `ppsd.compare_stats` (`Stats`): each method's time is the median of its
rounds' walls, every ratio a ratio of those medians, and the round shown is the one closest to
them.

Timing covers the decoder alone: the stopwatch is paused while a state is handed out (a page
renders it then). No UI here; tensors stay inside the decoders.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Callable, Iterator, Mapping

import torch

from . import quiet
from .compare_stats import Stats
from .executors import Executor, PipelineError
from .executors.kinds import ExecutorKind
from .generate import Recording, Result, warm_up
from .plain_ar import PlainAR, fastest_ar
from .setup import RunSetup, device_sync
from .stop_guard import Stop, StopGuard
from .trace import Stopwatch, Trace

__all__ = ["Comparison", "ExecutorSource", "MethodRun", "PLAIN", "PausableStopwatch", "PlainWay", "State", "Stats"]

PLAIN = "plain"  # plain AR's key: no pipeline, measured, on the way (threads) that ran fastest here
PLAIN_CUT = 2.0  # a way of running plain AR still decoding at this many times the faster one's wall has lost
THROTTLE_SECONDS = 0.25  # least time between two progress states of a live run
LIVE_ROUNDS = 1  # rounds shown as they decode; a later round's states come as each method finishes


_STARTING = threading.Lock()  # one executor starts at a time in a process: two pools starting at once
# (a start-up preload and a visitor's Run) would both set up torch.distributed's one default group


def ready(kind: ExecutorKind, setup: RunSetup, progress: Callable[[str], None] | None = None) -> Executor | None:
    """`kind.ready(setup)`, warmed up by `ppsd.generate.warm_up`, one start at a time in this
    process (`_STARTING`)."""
    with _STARTING:
        return kind.ready(setup, warm_up=warm_up, progress=progress)


class PausableStopwatch(Stopwatch):
    """A `ppsd.trace.Stopwatch` that does not count the time spent paused (handing a state out).
    Stamps taken by pipeline workers during a pause (run-ahead work) read as the pause's start:
    the clock is stopped, whoever reads it."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        super().__init__(sync)
        self._pauses: list[tuple[float, float]] = []  # (start, end) in perf_counter time
        self._paused_at: float | None = None

    def at(self, t: float) -> float:
        pauses = self._pauses + ([(self._paused_at, float("inf"))] if self._paused_at is not None else [])
        return super().at(t) - sum(max(0.0, min(t, end) - start) for start, end in pauses)

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._pauses.append((self._paused_at, time.perf_counter()))
            self._paused_at = None


@dataclass
class MethodRun(Recording):
    """One method's run in one round: its steps so far (live), and its Result once finished."""

    setup: RunSetup = field(kw_only=True)
    clock: str = field(kw_only=True)  # the clock its wall is read on: "measured" or "projected"
    result: Result | None = field(default=None, kw_only=True)

    @classmethod
    def of(cls, setup: RunSetup, *, concurrent: bool, alone: bool = False) -> "MethodRun":
        """A run of `setup` on K stages at once (`concurrent`) or in turn in one process; `alone`:
        plain decoding with no pipeline, whose measured clock is the one to read."""
        clock = "measured" if concurrent or alone else "projected"
        return cls(setup.prompt_ids, setup.config, setup.partition, setup.model.info.device, concurrent=concurrent,
                   setup=setup, clock=clock)

    @property
    def method(self) -> str:
        return self.config.method

    @property
    def done(self) -> bool:
        return self.result is not None

    def trace(self) -> Trace:
        """The measured trace so far (the final validated one once done)."""
        return self.result.trace if self.result is not None else super().trace()

    def shown(self) -> Trace:
        """The trace to draw: measured when the stages really ran at once (or there was no
        pipeline), else projected."""
        return self.trace() if self.clock == "measured" else self.trace().project()

    def wall(self, clock: str | None = None) -> float:
        """Seconds of the finished run on `clock` (default: its own)."""
        return self.result.wall(clock or self.clock)


@dataclass(frozen=True)
class PlainWay:
    """How plain AR ran: on `threads` torch threads, in `words`; `trials`: (threads, seconds,
    finished) of each way timed in round 1 when there was a choice (the faster was kept; one
    not finished was cut after `seconds`, already the slower)."""

    threads: int
    words: str
    trials: tuple[tuple[int, float, bool], ...] = ()


@dataclass(frozen=True)
class State:
    """Where a comparison stands. `rounds`: every round begun, each a method -> run mapping (the
    run decoding now is live: its recording grows until it is done); `active`: what runs now
    ("workers" while the executor starts, a method, PLAIN); `status`: the same in words."""

    methods: tuple[str, ...]
    num_rounds: int
    kind: str  # the executor kind's name (`ppsd.executors.kinds.KINDS`)
    concurrent: bool  # the stages ran at once: the pipeline's methods read the measured clock, else projected
    rounds: tuple[Mapping[str, MethodRun], ...] = ()
    active: str | None = None
    status: str = ""
    plain: PlainWay | None = None
    done: bool = False
    stopped: bool = False
    aborted: bool = False  # a worker did not answer a stop within `ppsd.stop_guard.STOP_GRACE`: the executor was torn down
    compiled: tuple[int, ...] = ()  # rounds (0-based) during which something compiled in this process: not clean
    others: tuple[float, ...] = ()  # each round's cores used by other programs meanwhile (`quiet.others_cpu`)

    @property
    def clock(self) -> str:
        """The clock the pipeline's methods are compared on."""
        return "measured" if self.concurrent else "projected"

    def stats(self) -> Stats:
        """The one statistic over the finished runs (`ppsd.compare_stats.Stats`)."""
        def walls(method: str, clock: str | None = None) -> tuple[float | None, ...]:
            return tuple(r[method].wall(clock) if method in r and r[method].done else None for r in self.rounds)
        keys = (*self.methods, *((PLAIN,) if any(PLAIN in r for r in self.rounds) else ()))
        return Stats(walls={m: walls(m) for m in keys}, measured={m: walls(m, "measured") for m in keys},
                     projected={m: walls(m, "projected") for m in keys})

    def shown(self) -> Mapping[str, MethodRun]:
        """The runs to show: while the first round runs, its live runs; after, the round closest
        to the medians (`Stats.shown`)."""
        if not self.rounds:
            return {}
        index = self.stats().shown() if self.done else None
        return self.rounds[0 if index is None else index]

    def shown_index(self) -> int | None:
        """0-based index of the round `shown` gives, once done."""
        return self.stats().shown() if self.done and self.rounds else None


Opener = Callable[[ExecutorKind, RunSetup, Callable[[str], None]], "Executor | None"]
Releaser = Callable[[ExecutorKind, "Executor | None"], None]


def _release(kind: ExecutorKind, executor: Executor | None) -> None:
    kind.release(executor)


@dataclass(frozen=True)
class ExecutorSource:
    """Where a comparison's executor comes from: `lent`, one already open (its owner closes it);
    else the comparison opens its own with `opener` and lets it go at the end with `releaser` (a
    ZeroGPU worker keeps it for its next call: `app.zerogpu`)."""

    lent: Executor | None = None
    opener: Opener = ready
    releaser: Releaser = _release


class Comparison:
    """AR, PPSD (and EESD) of `setup` on an executor of `kind` (from `source`), with plain AR
    beside them when `plain`, for `rounds` interleaved rounds; a live run's states come at most
    every `throttle` seconds, and `stop` ends it between steps."""

    def __init__(self, setup: RunSetup, methods: tuple[str, ...] = ("ar", "ppsd"), *, kind: ExecutorKind,
                 rounds: int = 3, plain: bool = False, stop: Stop | None = None,
                 throttle: float = THROTTLE_SECONDS, source: ExecutorSource = ExecutorSource()) -> None:
        if rounds < 1:
            raise ValueError(f"rounds={rounds}: a comparison times each method at least once")
        self.setup, self.methods, self.kind, self.num_rounds = setup, tuple(methods), kind, rounds
        self.plain, self.throttle, self.source = plain, throttle, source
        self.stop: Stop = stop or threading.Event()
        self._state = State(self.methods, rounds, kind.name, kind.concurrent)
        self._plain_threads = 0
        self._ways: tuple[PlainAR, ...] | None = None  # plain AR's ways here, found when it first runs

    def _with(self, **changes) -> State:
        self._state = replace(self._state, **changes)
        return self._state

    def run(self) -> Iterator[State]:
        """Open the executor (saying so), then every round; the last state is `done` (a stop after the
        first round leaves the rounds finished standing) or `stopped`."""
        executor = self.source.lent
        if executor is None and self.kind.concurrent:
            executor = yield from self._open()
            if executor is None:
                yield self._with(stopped=True, active=None)
                return
        try:
            yield from self._rounds(executor)
        finally:
            if self.source.lent is None and executor is not None:
                self.source.releaser(self.kind, executor)  # the shared worker processes stay for the next comparison
            for way in self._ways or ():
                if way.executor is not None and way.executor is not executor:
                    way.executor.close()
        if not self._state.stopped:
            yield self._with(done=True, active=None, status="")

    def _open(self) -> Iterator[State]:
        """The kind's executor, ready, saying what it does as it starts (worker processes take
        seconds, a compilation minutes); None once stopped (what was built for this comparison
        alone is let go)."""
        box: dict = {}
        told: list[str] = [f"Starting the {self.kind.noun}"]

        def start() -> None:
            try:
                box["executor"] = self.source.opener(self.kind, self.setup, told.append)
            except BaseException as error:  # noqa: BLE001 - raised again in the caller's thread
                box["error"] = error

        thread = threading.Thread(target=start, name="pipeline-start", daemon=True)
        thread.start()
        began = time.perf_counter()
        while thread.is_alive() and not self.stop.is_set():
            yield self._with(active="workers", status=f"{told[-1]}… {time.perf_counter() - began:.0f} s")
            thread.join(0.5)
        if self.stop.is_set() and thread.is_alive() and self.kind.shared:
            return None  # a shared pipeline keeps starting, for the next comparison
        thread.join()
        if "error" in box:
            raise box["error"]
        if self.stop.is_set():
            self.source.releaser(self.kind, box.get("executor"))
            return None
        return box.get("executor")

    def _rounds(self, executor: Executor | None) -> Iterator[State]:
        rounds: list[dict[str, MethodRun]] = []
        if quiet.compiling_now():
            yield self._with(status=f"Waiting for a background compile's step to finish before timing "
                                    f"(at most {quiet.WAIT_FOR_COMPILE:.0f} s)")
        with quiet.timing():  # one under way finishes first; none starts until the last round ends
            for index in range(self.num_rounds):
                runs: dict[str, MethodRun] = {}
                rounds.append(runs)
                compiles, others = quiet.compiles(), quiet.others_cpu()
                finished = yield from self._round(index, executor, runs, rounds)
                self._with(others=(*self._state.others, others()))
                if quiet.compiles() != compiles:
                    self._with(compiled=(*self._state.compiled, index))
                if not finished:
                    return
        self._with(rounds=_frozen(rounds))

    def _round(self, index: int, executor: Executor | None, runs: dict, rounds: list) -> Iterator[State]:
        """Round `index`: every method once, in order; False when it ended the comparison (a stop,
        or a method cut short)."""
        live = index < LIVE_ROUNDS
        for method in (*self.methods, *((PLAIN,) if self.plain else ())):
            quiet.wait_for_quiet()  # a background build's own round gives way to a timed one, method by method
            name = "plain AR" if method == PLAIN else method.upper()
            status = (f"Round {index + 1} of {self.num_rounds}: {name}" if method != PLAIN or index else
                      "Timing plain AR, the fastest AR here with no pipeline")
            if method == PLAIN:
                yield self._with(rounds=_frozen(rounds), active=method, status=status)
                run = yield from self._plain(executor, runs, rounds)
            else:
                run = runs[method] = MethodRun.of(self.setup.with_method(method), concurrent=executor is not None)
                yield self._with(rounds=_frozen(rounds), active=method, status=status)
                yield from self._decode(run, executor, rounds, self.throttle if live else float("inf"),
                                        self.stop)
            if self.stop.is_set() or run is None or not run.done:  # a method cut short stays, as far as it got
                self._with(rounds=_frozen(rounds))
                if index == 0:  # nothing timed in full: stopped; else the rounds finished stand
                    yield self._with(stopped=True)
                return False
        return True

    def _plain(self, executor: Executor | None, runs: dict, rounds: list) -> Iterator[State]:
        """Plain AR once, on the way kept (round 1: each way timed, the faster kept; a way still
        decoding at PLAIN_CUT times the fastest so far is cut there)."""
        if self._ways is None:
            self._ways = fastest_ar(self.setup, self.kind.name, executor, warm_up=warm_up)
        ways = [w for w in self._ways if w.threads == self._plain_threads] if self._plain_threads else self._ways
        timed: list[tuple[PlainAR, MethodRun]] = []
        trials: list[tuple[int, float, bool]] = []
        for way in ways:
            limit = PLAIN_CUT * min(r.wall() for _, r in timed) if timed else None
            stop = self.stop if limit is None else _Deadline(self.stop, limit)
            run = MethodRun.of(self.setup.with_method("ar"), concurrent=False, alone=True)
            threads = torch.get_num_threads()
            torch.set_num_threads(way.threads)
            try:
                yield from self._decode(run, way.executor, rounds, float("inf"), stop)
            finally:
                torch.set_num_threads(threads)
            if self.stop.is_set():
                return None
            trials.append((way.threads, run.wall(), True) if run.done else (way.threads, limit, False))
            if run.done:
                timed.append((way, run))
        if not timed:
            return None
        way, run = min(timed, key=lambda t: t[1].wall())
        runs[PLAIN] = run
        if not self._plain_threads:
            self._plain_threads = way.threads
            self._with(plain=PlainWay(way.threads, way.words, tuple(trials) if len(trials) > 1 else ()))
        return run

    def _decode(self, run: MethodRun, executor: Executor | None, rounds: list, throttle: float,
                stop: Stop) -> Iterator[State]:
        """Decode `run` to its end (or a stop, between steps), yielding at most every `throttle` s.
        A stop the executor does not answer (a frozen worker) tears it down (`StopGuard`)."""
        stopwatch = PausableStopwatch(device_sync(run.setup.model))
        steps = run.setup.steps(stopwatch=stopwatch, executor=executor)
        shown = time.perf_counter()
        guard = StopGuard(self.stop, getattr(executor, "abort", None))  # a deadline (plain AR cut) is no Stop
        try:
            with guard:
                for step in steps:
                    run.add(step)
                    if stop.is_set():
                        return  # between steps: the workers hold no half-done call, so they are kept
                    if time.perf_counter() - shown >= throttle:
                        stopwatch.pause()  # whoever reads the state: its time is not the decoder's
                        with guard.handing():
                            yield self._with(rounds=_frozen(rounds))
                        stopwatch.resume()
                        shown = time.perf_counter()
            wall = stopwatch.now()
        except PipelineError:
            executor.close()  # a worker died or hung: whoever runs next starts fresh ones
            if guard.fired:  # torn down by the guard: a stop, not a failure
                self._with(aborted=True)
                return
            raise
        finally:
            steps.close()  # a stop: close the decoder now, not when the garbage collector gets to it
        run.result = run.finish(wall)
        yield self._with(rounds=_frozen(rounds))


class _Deadline:
    """A stop that also fires `seconds` after it is made: a plain AR way that has lost is cut,
    so a busy machine's slow way (27.6 s against 2.9 s on 2 threads) does not hold the round."""

    def __init__(self, stop: Stop, seconds: float) -> None:
        self.stop, self.at = stop, time.perf_counter() + seconds

    def is_set(self) -> bool:
        return self.stop.is_set() or time.perf_counter() >= self.at


def _frozen(rounds: list[dict[str, MethodRun]]) -> tuple[Mapping[str, MethodRun], ...]:
    return tuple(MappingProxyType(dict(r)) for r in rounds)


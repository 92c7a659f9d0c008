"""Run orchestration over the library: decode one prompt with AR, PPSD and optionally EESD one
after another (then again, interleaved, for the spread), yielding snapshots for the UI at a
throttled rate. Each method runs either in this process (stages in turn; the page shows the
projected clock) or with the K stages at once on a concurrent kind of `ppsd.executors.kinds`
(the page shows the measured clock): K worker processes, started once and reused, also after
Stop, closed on a worker's failure; or K threads, started for the run.
Models come from `app.models`.

Timing covers the decoder alone: the stopwatch that stamps the trace is paused while a snapshot
is handed to the UI, so rendering never leaks into a method's wall time or its trace. No Gradio
and no HTML here; tensors stay inside `ppsd`.
"""

from __future__ import annotations

import multiprocessing
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Generator, Iterator

import torch

from ppsd import Result, Trace
from ppsd.executors import Executor
from ppsd.executors.kinds import KINDS, ExecutorKind, PlainAR, choose, concurrent_kinds, fastest_ar
from ppsd.executors.pool import PipelineError
from ppsd.chat import check_text
from ppsd.generate import Recording
from ppsd.metrics import speedup
from ppsd.setup import RunSetup, device_sync
from ppsd.trace import Stopwatch

from . import zerogpu
from .line import Background, StopGuard
from .models import Loaded, ModelCache
from .request import MAX_RUN_SECONDS, PLAIN, RunRequest

Pipeline = Executor  # the stages at once, of a concurrent kind (`ppsd.executors.kinds`)
THROTTLE_SECONDS = 0.25  # live UI refresh period; the final snapshot always follows

class PausableStopwatch(Stopwatch):
    """A `ppsd.trace.Stopwatch` that does not count the time spent paused (handing snapshots to
    the UI). Stamps taken by pipeline workers during a pause (run-ahead work) read as the pause's
    start: the clock is stopped, whoever reads it."""

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
    """One method's run, live: the folded steps so far, and the Result once it has finished."""

    setup: RunSetup = field(kw_only=True)
    clock: str = field(kw_only=True)  # the page's clock for this run: "measured" or "projected"
    result: Result | None = field(default=None, kw_only=True)

    @classmethod
    def of(cls, setup: RunSetup, *, concurrent: bool, alone: bool = False) -> "MethodRun":
        """A run of `setup` on K stages at once (`concurrent`) or in turn in one process; `alone`:
        plain decoding with no pipeline, whose measured clock is the one to show."""
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

    def projected(self) -> Trace:
        return self.trace().project()

    def shown(self) -> Trace:
        """The trace the page plots: measured when the stages really ran at once (or there was no
        pipeline), else projected."""
        return self.trace() if self.clock == "measured" else self.projected()

    def wall(self) -> float:
        """Seconds of the finished run on its page clock."""
        return self.result.metrics(self.clock).wall_seconds


@dataclass
class Snapshot:
    """The state of a comparison handed to the UI: every method run so far, the active one."""

    request: RunRequest
    loaded: Loaded
    runs: dict[str, MethodRun]
    active: str | None
    num_stages: int  # K, validated
    done: bool = False
    head: str = "shared"  # which exit head drafted, in words
    stopped: bool = False  # Stop or the time limit: `active` is the method that was cut short
    time_limit: float | None = None  # the seconds a run may hold the device, when it was what stopped it
    status: str = ""  # what a long preparation (starting the workers, timing again) is doing now
    walls: dict[str, list[float]] = field(default_factory=dict)  # method -> wall of each timed run, page's clock
    plain_threads: int = 0  # the threads plain AR (walls[PLAIN], measured) ran on; 0: not timed
    plain_on: str = ""  # how plain AR ran, in words ("in this one process on 1 thread with no pipeline")
    # (threads, measured seconds, finished) of each way plain AR was first timed, when there were 2+; a way
    # not finished was cut after `seconds`, PLAIN_CUT times the faster way's wall
    plain_trials: tuple[tuple[int, float, bool], ...] = ()
    pipeline: str = "in-process"  # the name of the kind the methods ran on (`ppsd.executors.kinds.KINDS`)
    plain_run: MethodRun | None = None  # plain AR's first timed run (measured), for the race
    note: str = ""  # what the page must say of how the run went against what was asked (a pipeline that could not run here)

    def speedups(self) -> list[float]:
        """AR's wall over PPSD's, one per timed round (round i of each: they ran back to back)."""
        return [speedup(ar, p) for ar, p in zip(self.walls.get("ar", []), self.walls.get("ppsd", [])) if p > 0]

    @property
    def device(self) -> str:
        return self.loaded.model.info.device

    @property
    def concurrent(self) -> bool:
        """Did (do) the methods run on K worker processes?"""
        return self.request.workers


def run_comparison(request: RunRequest, cache: ModelCache, *, throttle: float = THROTTLE_SECONDS,
                   stop: threading.Event | None = None,
                   time_limit: float | None = MAX_RUN_SECONDS,
                   shared_limit: float | None = None) -> Iterator[Snapshot]:
    """Validate everything first, then run AR, PPSD (and EESD) in turn, yielding snapshots at
    most every `throttle` seconds of wall time and once when each method finishes. Once `stop`
    is set, or `time_limit` seconds have passed since this call, the running method ends at its
    next step and a last snapshot says so (`stopped`, and `time_limit` when it was the limit; a
    `stop` that was `handed_over` to a waiting visitor ended it at `shared_limit`, and says so)."""
    stop = stop or threading.Event()
    expired = threading.Event()  # the limit, not a user, stopped it

    def expire() -> None:
        expired.set()
        stop.set()

    timer = threading.Timer(time_limit, expire) if time_limit is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        for snapshot in _compare(request, cache, throttle, stop):
            if expired.is_set():
                snapshot.time_limit = time_limit
            elif getattr(stop, "handed_over", False):
                snapshot.time_limit = shared_limit
                snapshot.note = (f"Another visitor was waiting for the device: while others wait, a run may hold it "
                                 f"{shared_limit:g} s.")
            yield snapshot
    finally:
        if timer is not None:
            timer.cancel()


def _compare(request: RunRequest, cache: ModelCache, throttle: float, stop: threading.Event) -> Iterator[Snapshot]:
    check_text(request.prompt)  # before a load: an empty prompt is refused at once
    loaded = cache.get(request.model, warm=True)  # warmed in this process: a forked call warms its copy
    setup = cache.set_up(loaded, request.prompt, request.settings(), exit_head=request.exit_head,
                         chat=request.chat and loaded.chat)
    runs: dict[str, MethodRun] = {}
    snapshot = Snapshot(request, loaded, runs, active=None, num_stages=setup.config.num_stages, head=setup.head)
    pipeline = None
    if request.workers:
        kind, snapshot.note = _kind_here(request.pipeline, setup)
        pipeline = yield from _start_pipeline(kind, setup, snapshot, stop)
        if pipeline is None:  # stopped: a shared pipeline keeps starting, for the next run
            snapshot.stopped = True
            yield snapshot
            return
    try:
        for method in request.methods:
            run = runs[method] = MethodRun.of(setup.with_method(method), concurrent=pipeline is not None)
            snapshot.active = method
            yield snapshot
            yield from _decode(run, snapshot, throttle, pipeline, stop)
            if stop.is_set():
                snapshot.stopped = True
                yield snapshot
                return
            snapshot.walls[method] = [run.wall()]
        yield from _time_again(snapshot, request.rounds(), pipeline, stop)
    finally:
        # threads live for one run (in a ZeroGPU call, until the next); the worker processes stay
        zerogpu.release_pipeline(KINDS[snapshot.pipeline], pipeline)
    snapshot.active, snapshot.done, snapshot.status = None, True, ""
    yield snapshot


def _kind_here(requested: str, setup: RunSetup) -> tuple[ExecutorKind, str]:
    """The concurrent kind to run `setup` on, decided in the process that runs it, and a note for
    the page when it is not the one `requested`. A ZeroGPU call runs in a daemonic child, where
    worker processes cannot start, whatever the page's own process could: there a kind that
    cannot run gives way to what "auto" picks in the call. Elsewhere it is refused in words (by
    `ready`), as is a non-concurrent kind."""
    device, stages = setup.model.info.device, setup.config.num_stages
    kind = choose(requested, stages, device)
    if not kind.concurrent:
        raise ValueError(f"pipeline {kind.name!r} runs the stages in turn; at once they run on: "
                         f"{', '.join(k.name for k in concurrent_kinds())}")
    reason = kind.unavailable(device, stages)
    here = choose("auto", stages, device)
    if reason is None or not multiprocessing.current_process().daemon or here.unavailable(device, stages) is not None:
        return kind, ""
    return here, f"The {kind.choice} cannot run here ({reason}), so the stages ran on {here.choice}."


def _start_pipeline(kind: ExecutorKind, setup: RunSetup, snapshot: Snapshot, stop: threading.Event
                    ) -> Generator[Snapshot, None, Pipeline | None]:
    """`kind`'s executor, ready, saying what it does as it starts (worker processes take
    seconds); None once `stop` is set (what was built for this run alone is let go)."""
    snapshot.active, snapshot.pipeline = "workers", kind.name
    starting = Background(lambda tell: zerogpu.ready_pipeline(kind, setup, tell), "pipeline-start")
    for snapshot.status in starting.progress(stop, f"Starting the {kind.choice}"):
        yield snapshot
    if stop.is_set():
        if not kind.shared:  # built for this run alone: wait the moment it takes, and let it go
            zerogpu.release_pipeline(kind, starting.value())
        return None
    snapshot.status = ""
    return starting.value()


def _time_again(snapshot: Snapshot, rounds: int, pipeline: Pipeline | None,
                stop: threading.Event) -> Iterator[Snapshot]:
    """Rounds 2..`rounds` of every method and, with workers, every round of plain AR (`PLAIN`),
    untimed on screen, their walls into the snapshot; interleaved, so a slow spell of the machine
    hits every method alike."""
    for round_ in range(1, rounds + 1):
        timed = [*(snapshot.runs.items() if round_ > 1 else ()),
                 *([(PLAIN, snapshot.runs["ar"])] if pipeline is not None else [])]
        for method, run in timed:
            snapshot.active = "repeats" if round_ > 1 else PLAIN
            name = "plain AR" if method == PLAIN else method.upper()
            on_steps = snapshot.pipeline == KINDS["graphed"].name or run.setup.model.info.device.startswith("cuda")
            snapshot.status = (f"Timing again for the spread: run {round_} of {rounds}, {name}" if round_ > 1 else
                               "Timing plain AR on the captured steps, the fastest AR here" if on_steps else
                               "Timing plain AR in this one process, on 1 thread and on every core, no pipeline")
            yield snapshot
            wall = (_time_plain(run, snapshot, pipeline, stop) if method == PLAIN else
                    _time_once(run, snapshot, pipeline, stop))
            if wall is None:  # stopped: the runs timed so far stand
                return
            snapshot.walls.setdefault(method, []).append(wall)


def _time_once(run: MethodRun, snapshot: Snapshot, pipeline: Pipeline | None,
               stop: threading.Event) -> float | None:
    """The wall of one more untimed-on-screen run of `run`'s method (page's clock); None if stopped."""
    again = MethodRun.of(run.setup, concurrent=run.concurrent)
    for _ in _decode(again, snapshot, float("inf"), pipeline, stop):
        pass
    return None if again.result is None else again.wall()


PLAIN_CUT = 2.0  # a way of running plain AR still decoding at this many times the faster one's wall has lost


class _Deadline:
    """A Stop that also fires `seconds` after it is made: a plain AR trial that has lost is cut,
    so a busy machine's slow way (27.6 s against 2.9 s on 2 threads) does not hold the run."""

    def __init__(self, stop: threading.Event, seconds: float) -> None:
        self.stop, self.at = stop, time.perf_counter() + seconds

    def is_set(self) -> bool:
        return self.stop.is_set() or time.perf_counter() >= self.at


def _time_plain(ar: MethodRun, snapshot: Snapshot, pipeline: Pipeline | None, stop: threading.Event) -> float | None:
    """The measured wall of the fastest plain AR here, the decoding PPSD on K workers must beat;
    None if stopped. The ways it may run are `ppsd.executors.kinds.fastest_ar`'s: the first time,
    each is timed and the faster kept (`plain_trials` holds each one's wall, for the page to say
    which and why; a way still running at `PLAIN_CUT` times the fastest so far is cut there), then
    only the kept one, so its median is of one way of running."""
    ways = fastest_ar(ar.setup, snapshot.pipeline, pipeline)
    kept = [w for w in ways if w.threads == snapshot.plain_threads] if snapshot.plain_threads else list(ways)
    timed: list[tuple[PlainAR, MethodRun]] = []
    trials: list[tuple[int, float, bool]] = []
    try:
        for way in kept:
            limit = PLAIN_CUT * min(r.wall() for _, r in timed) if timed else None
            run = _run_plain(ar, way, snapshot, stop if limit is None else _Deadline(stop, limit))
            if stop.is_set() or (run is None and limit is None):
                return None
            trials.append((way.threads, limit, False) if run is None else (way.threads, run.wall(), True))
            if run is not None:
                timed.append((way, run))
    finally:
        for way in ways:
            if way.executor is not None and way.executor is not pipeline:
                way.executor.close()
    way, run = min(timed, key=lambda t: t[1].wall())
    if not snapshot.plain_threads:
        snapshot.plain_threads, snapshot.plain_on, snapshot.plain_run = way.threads, way.words, run
        snapshot.plain_trials = tuple(trials) if len(trials) > 1 else ()
    return run.wall()


def _run_plain(ar: MethodRun, way: PlainAR, snapshot: Snapshot, stop: threading.Event | _Deadline
               ) -> MethodRun | None:
    """One plain AR run of `ar`'s setup on `way` (measured, no pipeline); None if stopped."""
    plain = MethodRun.of(ar.setup, concurrent=False, alone=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(way.threads)
    try:
        for _ in _decode(plain, snapshot, float("inf"), way.executor, stop):
            pass
    finally:
        torch.set_num_threads(threads)
    return plain if plain.result is not None else None


def _decode(run: MethodRun, snapshot: Snapshot, throttle: float, pipeline: Pipeline | None,
            stop: threading.Event) -> Iterator[Snapshot]:
    stopwatch = PausableStopwatch(device_sync(run.setup.model))
    steps = run.setup.steps(stopwatch=stopwatch, executor=pipeline)
    shown = time.perf_counter()
    guard = StopGuard(stop, getattr(pipeline, "abort", None))  # worker processes: one frozen would hold Stop up
    try:
        with guard:
            for step in steps:
                run.add(step)
                if stop.is_set():
                    return  # between steps: the workers hold no half-done call, so they are kept
                if time.perf_counter() - shown >= throttle:
                    stopwatch.pause()  # the UI's time is not the decoder's
                    with guard.handing():
                        yield snapshot
                    stopwatch.resume()
                    shown = time.perf_counter()
        wall = stopwatch.now()
    except PipelineError as error:
        pipeline.close()  # a worker died or hung: the next run starts fresh ones
        if guard.fired:
            snapshot.note = ("A worker process did not answer within a second of Stop, so the worker processes "
                             "were shut down; the next run starts fresh ones.")
            return
        print(f"pipeline failed: {error}", file=sys.stderr, flush=True)  # the pids are the log's, not a visitor's
        reason = re.sub(r" [(]pid [0-9]+[)]", "", str(error))
        raise ValueError(f"the worker processes failed and were shut down: {reason}") from None
    finally:
        steps.close()  # Stop: close the decoder now, not when the garbage collector gets to it
    run.result = run.finish(wall)
    yield snapshot

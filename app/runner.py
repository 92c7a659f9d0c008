"""Run orchestration over the library: load the model a request names, set the run up, choose
where its stages run, and hand `ppsd.compare.Comparison` the rest (AR, PPSD, EESD and plain AR,
timed for the rounds asked, interleaved), wrapping each of its states in a `Snapshot` for the
page. The page's own rules live here: the time limit, a pipeline that cannot run in a ZeroGPU
call giving way, a worker's failure said in words. No Gradio and no HTML; tensors stay inside
`ppsd`. Models come from `app.models`.
"""

from __future__ import annotations

import multiprocessing
import re
import sys
import threading
import time
from dataclasses import dataclass
from typing import Iterator, Mapping

from ppsd.bench.forced import ForcedSetup
from ppsd.chat import check_text
from ppsd.compare import PLAIN, Comparison, MethodRun, PlainWay, State, Stats, ready
from ppsd.compare import THROTTLE_SECONDS, ExecutorSource
from ppsd.config import DEFAULTS
from ppsd import compile_cache
from ppsd.executors.background import Background
from ppsd.executors.kinds import (AUTO, KINDS, Choice, ExecutorKind, choose, choose_measured, concurrent_by_default,
                                  concurrent_kinds)
from ppsd.executors import PipelineError
from ppsd.generate import warm_up
from ppsd.setup import RunSetup

from . import zerogpu
from .models import Loaded, ModelCache
from .page_text import load_examples
from .request import MAX_RUN_SECONDS, RunRequest

__all__ = ["MethodRun", "Snapshot", "background_words", "prestart", "run_comparison"]

# The kinds compiling (or compiled) in the background since start-up, by name, each with the key
# of the run setup it was built for (the weights, exit head and stages): "auto" runs on one only
# for a setup it fits. One process, one page: module state, as the shared worker processes are.
_BACKGROUND: dict[str, tuple[tuple, Background]] = {}


@dataclass(frozen=True)
class Limit:
    """What may end a run by time: `seconds` after it starts, said as `words` after "Ended by "."""

    seconds: float
    words: str

    @classmethod
    def device(cls, seconds: float) -> "Limit":
        return cls(seconds, f"the time limit (a run may hold the device {seconds:g} s)")


@dataclass(frozen=True)
class Snapshot:
    """A comparison's state (`ppsd.compare.State`) with what the page adds: the request, the model,
    which exit head drafted, and how the run went against what was asked."""

    request: RunRequest
    loaded: Loaded
    state: State
    num_stages: int  # K, validated
    head: str = "shared"  # which exit head drafted, in words
    note: str = ""  # what the page must say of how the run went against what was asked
    limit: Limit | None = None  # what ended it by time, when something did

    @property
    def runs(self) -> Mapping[str, MethodRun]:
        """The pipeline's runs to show (the live round, then the round closest to the medians)."""
        return {m: r for m, r in self.state.shown().items() if m != PLAIN}

    @property
    def plain_run(self) -> MethodRun | None:
        """Plain AR's run in the round shown, for the race."""
        return self.state.shown().get(PLAIN)

    @property
    def active(self) -> str | None:
        return self.state.active

    @property
    def phase(self) -> str | None:
        """Where the run is among `RunRequest.phases`: a later round is "repeats"."""
        if self.state.active in (None, "workers") or len(self.state.rounds) <= 1:
            return self.state.active
        return "repeats"

    @property
    def done(self) -> bool:
        return self.state.done

    @property
    def stopped(self) -> bool:
        return self.state.stopped

    @property
    def status(self) -> str:
        return self.state.status

    @property
    def pipeline(self) -> str:
        return self.state.kind

    @property
    def plain(self) -> PlainWay | None:
        return self.state.plain

    def stats(self) -> Stats:
        return self.state.stats()

    @property
    def device(self) -> str:
        return self.loaded.model.info.device

    @property
    def concurrent(self) -> bool:
        """Did (do) the methods run with their stages at once?"""
        return self.state.concurrent


def run_comparison(request: RunRequest, cache: ModelCache, *, throttle: float = THROTTLE_SECONDS,
                   stop: threading.Event | None = None,
                   time_limit: float | None = MAX_RUN_SECONDS,
                   shared_limit: float | None = None, lease: Limit | None = None) -> Iterator[Snapshot]:
    """Validate everything first, then the comparison, yielding snapshots at most every
    `throttle` seconds of its first round and once when each method finishes. Once `stop` is
    set, or `time_limit` seconds have passed since this call (or the `lease` of a ZeroGPU call,
    if it ends first), the running method ends at its next step and a last snapshot says so
    (`stopped`, and the `limit` when one ended it; a `stop` that was `handed_over` to a waiting
    visitor ended it at `shared_limit`, and says so)."""
    stop = stop or threading.Event()
    expired = threading.Event()  # a limit, not a user, stopped it
    limits = [limit for limit in (None if time_limit is None else Limit.device(time_limit), lease) if limit]
    first = min(limits, key=lambda limit: limit.seconds, default=None)

    def expire() -> None:
        expired.set()
        stop.set()

    timer = threading.Timer(max(first.seconds, 0.0), expire) if first is not None else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        check_text(request.prompt)  # before a load: an empty prompt is refused at once
        rounds, forced = request.rounds(), request.forced()
        loaded = cache.get(request.model, warm=True)  # warmed in this process: a forked call warms its copy
        setup = cache.set_up(loaded, request.prompt, request.settings(), exit_head=request.exit_head,
                             chat=request.chat and loaded.chat)
        if forced is not None:  # the what-if: the same setup, every verdict on a draft a seeded coin
            setup = ForcedSetup(**vars(setup), acceptance=forced)
        kind, note = _kind_here(request.pipeline, setup) if request.workers else (KINDS["in-process"], "")
        if request.workers and request.pipeline == AUTO and not note:
            choice = _auto(setup)
            kind, note = choice.kind, _chosen(choice)
        lent = _kept(kind, setup) if request.workers else None  # compiled in the background, kept open
        # threads live for one run (in a ZeroGPU call, until the next); the worker processes stay
        comparison = Comparison(setup, request.methods, kind=kind, rounds=rounds, plain=request.workers,
                                stop=stop, throttle=throttle,
                                source=ExecutorSource(lent, zerogpu.ready_pipeline, zerogpu.release_pipeline))
        try:
            for state in comparison.run():
                if state.done and forced is None and kind.concurrent and setup.model.info.device == "cpu" and _measuring():
                    _note_speed(kind, setup, state)
                limit, said = first if expired.is_set() else None, note
                if getattr(stop, "handed_over", False):
                    limit, said = Limit.device(shared_limit), _joined(note, f"Another visitor was waiting for the device: while "
                                                              f"others wait, a run may hold it {shared_limit:g} s.")
                if state.aborted:
                    said = _joined(said, "A worker process did not answer within a second of Stop, so the worker "
                                         "processes were shut down; the next run starts fresh ones.")
                yield Snapshot(request, loaded, state, setup.config.num_stages, setup.head, said, limit)
        except PipelineError as error:
            print(f"pipeline failed: {error}", file=sys.stderr, flush=True)  # the pids are the log's, not a visitor's
            reason = re.sub(r" [(]pid [0-9]+[)]", "", str(error))
            raise ValueError(f"the worker processes failed and were shut down: {reason}") from None
    finally:
        if timer is not None:
            timer.cancel()


def prestart(cache: ModelCache, model: str, progress=None) -> str:
    """What a first Run of `model` with the page's defaults needs beyond the model: its shared
    pipeline (the worker processes), started and warmed up now, so that Run's first token does
    not wait for them; then the kinds that compile first (on a CPU) start compiling in the
    background (`_compile_in_background`). `progress` hears each step as it begins. Returns what
    was started, in words ("" when the defaults run the stages in turn, or on a kind built per run)."""
    tell = progress or (lambda message: None)
    tell(f"Loading {model} and warming it up (untimed)")
    loaded = cache.get(model, progress=progress, warm=True)
    device, stages = loaded.model.info.device, DEFAULTS.num_stages
    if not concurrent_by_default(stages, device):
        return ""
    kind = choose("auto", stages, device)
    if not kind.shared or kind.unavailable(device, stages) is not None:
        return ""
    request = RunRequest(prompt=load_examples()[0]["prompt"])  # the page's defaults: what a first Run asks for
    setup = cache.set_up(loaded, request.prompt, request.settings(), exit_head=request.exit_head,
                         chat=request.chat and loaded.chat)
    ready(kind, setup, tell)
    for compiled in concurrent_kinds():
        if compiled.compiles_on(device) and compiled.unavailable(device, stages) is None:
            _compile_in_background(compiled, setup)
    return f"{stages} {kind.choice.split(',')[0]}"


def _compile_in_background(kind: ExecutorKind, setup: RunSetup) -> Background:
    """`kind` built, compiled and run once through a default comparison round (untimed: every
    step a default Run reaches compiles now, not in a Run) on a thread of its own; the terminal
    hears how far it is every 10 s. Runs meanwhile go on the kind that needs no compile."""
    kept = compile_cache.kept()
    last = compile_cache.last_seconds()
    said = (f"loading the kept compiled steps ({compile_cache.folder()})" if kept else
            "a one-time compile" + (f" (it took {last:.0f} s last time)" if last else " (a minute or more on a small CPU)"))
    print(f"Compiling {kind.compiles} in the background, {said}; Runs use the kind that needs no compile meanwhile",
          flush=True)

    def build():
        began = time.monotonic()
        executor = kind.ready(setup, warm_up=warm_up)
        for _ in Comparison(setup, ("ar", "ppsd"), kind=kind, rounds=1, plain=True, source=ExecutorSource(executor),
                            throttle=float("inf")).run():
            pass
        compile_cache.record(None if kept else time.monotonic() - began)  # every step a default Run reaches
        return executor

    background = Background(kind.compiles, build, kept=kept,
                            say=lambda words: print(words[0].upper() + words[1:], flush=True))
    _BACKGROUND[kind.name] = (_setup_key(setup), background.start())
    return background


def compiling_in_background() -> bool:
    """Whether a background compile is still running (its thread inside torch)."""
    return any(background.state == "compiling" for _, background in _BACKGROUND.values())


def background_words() -> str:
    """What compiles in the background, in words, for the page ("" when nothing does or did)."""
    return "; ".join(background.words() for _, background in _BACKGROUND.values())


def _setup_key(setup: RunSetup) -> tuple:
    """What a kept executor was built for: the weights, the exit head and the stages."""
    return id(setup.model.hf_model), id(setup.model.exit_head), setup.partition


def _kept(kind: ExecutorKind, setup: RunSetup):
    """The background-built executor of `kind` when it is ready and fits `setup`, else None."""
    key, background = _BACKGROUND.get(kind.name, (None, None))
    return background.executor if background and background.state == "ready" and key == _setup_key(setup) else None


def _auto(setup: RunSetup) -> Choice:
    """"auto" here: the fastest PPSD measured on this machine among what is ready for `setup`."""
    ready_here = tuple(name for name, (key, b) in _BACKGROUND.items()
                       if b.state == "ready" and key == _setup_key(setup))
    return choose_measured(setup.config.num_stages, setup.model.info.device, ready_here,
                           compile_cache.speeds(setup.model.info.name))


def _chosen(choice: Choice) -> str:
    """The page's sentence on which kind ran and why (shown with the run's end)."""
    return f"The stages ran on the {choice.kind.choice.split(',')[0]}, chosen by auto: {choice.why}."


def _measuring() -> bool:
    """Does a Run's PPSD speed count for "auto"? On a server that compiles a kind in the background
    (tests never write the user's cache), once nothing compiles: a Run beside a compile ran at a
    fraction of its speed (3.9 tokens/s against 8.0 after it, at load 8-9 on 2 cores, measured here)."""
    return bool(_BACKGROUND) and all(b.state != "compiling" for _, b in _BACKGROUND.values())


def _note_speed(kind: ExecutorKind, setup: RunSetup, state) -> None:
    """PPSD's tokens/s of this run (the median of its timed rounds), kept for "auto" to compare."""
    median = state.stats().median("ppsd")
    run = state.rounds[0].get("ppsd") if state.rounds else None
    if median and run is not None and run.result is not None:
        compile_cache.note_speed(setup.model.info.name, kind.name, len(run.result.token_ids) / median)


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


def _joined(*notes: str) -> str:
    return " ".join(n for n in notes if n)

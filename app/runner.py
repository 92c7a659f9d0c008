"""The page's run loop over the library: load the model a checked request names, set the run up,
take the kind its stages run on (`ppsd.choice`, through the process's one `READY`: what "auto"
picks here, what compiled in the background, a kind giving way in a ZeroGPU call), and hand
`ppsd.compare.Comparison` the rest (AR, PPSD, EESD and plain AR, timed for the rounds asked,
interleaved), wrapping each of its states in a `Snapshot` for the page. The page's own rules
live here: the time limit, a turn handed to a waiting visitor, a worker's failure said in words.
No Gradio and no HTML; tensors stay inside `ppsd`. Models come from `app.models`; the page's
words on the kind that ran, from `app.kind_words`.
"""

from __future__ import annotations

import re
import sys
import threading
from dataclasses import dataclass
from typing import Iterator

from ppsd import choice
from ppsd.bench.forced import ForcedSetup
from ppsd.compare import THROTTLE_SECONDS, Comparison, PlainWay, State
from ppsd.config import DEFAULTS
from ppsd.executors.kinds import IN_TURN
from ppsd.executors import PipelineError
from ppsd.setup import RunSetup

from . import kind_words
from .models import Loaded, ModelCache
from .page_text import load_examples
from .request import MAX_RUN_SECONDS, CheckedRequest, RunRequest

# What this server process has ready (the kinds compiled in the background since start-up; in a
# ZeroGPU call, the executor the last call left): the page's, as its shared worker processes are;
# a ZeroGPU call's fork works on its copy.
READY = choice.ReadyKinds()


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
    which exit head drafted, and how the run went against what was asked. The page reads it once
    into `app.reading.RunView`, the one place that picks the shown round and asks for the stats."""

    request: CheckedRequest
    loaded: Loaded
    state: State
    num_stages: int  # K, validated
    head: str = "shared"  # which exit head drafted, in words
    note: str = ""  # what the page must say of how the run went against what was asked
    limit: Limit | None = None  # what ended it by time, when something did

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
    """The comparison `request` asks for (checked first, unless it is a `CheckedRequest` already:
    `RunRequest.checked`), yielding snapshots at most every `throttle` seconds of its first round
    and once when each method finishes. Once `stop` is set, or `time_limit` seconds have passed
    since this call (or the `lease` of a ZeroGPU call, if it ends first), the running method ends
    at its next step and a last snapshot says so (`stopped`, and the `limit` when one ended it; a
    `stop` that was `handed_over` to a waiting visitor ended it at `shared_limit`, and says so)."""
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
        request = request.checked()  # before a load: a request that does not check out is refused at once
        rounds, forced = request.rounds, request.forced
        loaded = cache.get(request.model, warm=True)  # warmed in this process: a forked call warms its copy
        setup = cache.set_up(loaded, request.prompt, request.config, exit_head=request.exit_head,
                             chat=request.chat and loaded.chat)
        if forced is not None:  # the what-if: the same setup, every verdict on a draft a seeded coin
            setup = ForcedSetup(**vars(setup), acceptance=forced)
        load = choice.load()  # before this Run's own work: what its speed is measured at
        run = READY.for_run(request.pipeline, setup) if request.workers else choice.ForRun(IN_TURN)
        kind, note = run.kind, kind_words.note(run)
        # threads live for one run (in a ZeroGPU call, until the next); the worker processes stay
        comparison = Comparison(setup, request.methods, kind=kind, rounds=rounds, plain=request.workers,
                                stop=stop, throttle=throttle, source=READY.source(run))
        try:
            for state in comparison.run():
                if forced is None:  # a what-if's speed is no speed of the kind
                    READY.note_speed(kind, setup, state, load)
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
    """What a first Run of `model` with the page's defaults needs beyond the model, started now
    (`READY.start`: the shared worker processes warmed up, then the kinds that compile first
    building in the background), so that Run's first token does not wait for them. `progress`
    hears each step as it begins. Returns what was started, in words ("" when the defaults run
    the stages in turn, or on a kind built per run)."""
    tell = progress or (lambda message: None)
    tell(f"Loading {model} and warming it up (untimed)")
    loaded = cache.get(model, progress=progress, warm=True)

    def set_up() -> RunSetup:
        request = RunRequest(prompt=load_examples()[0]["prompt"]).checked()  # the page's defaults: a first Run's
        return cache.set_up(loaded, request.prompt, request.config, exit_head=request.exit_head,
                            chat=request.chat and loaded.chat)

    kind = READY.start(loaded.model.info.device, DEFAULTS.num_stages, set_up, tell)
    return "" if kind is None else f"{DEFAULTS.num_stages} {kind.noun}"


def _joined(*notes: str) -> str:
    return " ".join(n for n in notes if n)

"""Which executor kind a run takes in this process, and what is ready for it: the kinds whose
steps compile first (on a CPU) building in the background since start-up, "auto" among those
ready (the fastest PPSD measured on this machine), and the speeds it compares. The state is one
`ReadyKinds`, which the front end owns and passes in: the library keeps none at module level.

Boundary: choosing and readying kinds for the runs of this process. The kinds and the rules of
"auto" are `ppsd.executors.kinds`', a background build's own state is
`ppsd.executors.background`'s, the measured speeds are kept by `ppsd.compile_cache`; what a front
end says of the choice, and its run loop, are the front end's (`app.runner`).
"""

from __future__ import annotations

import multiprocessing
import os
import time

from . import compile_cache, kept_steps
from .compare import Comparison, ExecutorSource, State
from .executors import Executor
from .executors.background import Background
from .executors.choice import Choice, choose, choose_measured
from .executors.kinds import AUTO, ExecutorKind, concurrent_kinds
from .generate import warm_up
from .setup import RunSetup

__all__ = ["ReadyKinds", "kind_here", "load", "note_speed", "setup_key", "took_here"]


class ReadyKinds:
    """What one front end's process has ready: the kinds compiling (or compiled) in the
    background since start-up, by name, each with the key of the run setup it was built for (the
    weights, exit head and stages), so "auto" runs on one only for a setup it fits. The front end
    owns one (`app.runner.READY`), as it owns its shared worker processes."""

    def __init__(self) -> None:
        self.builds: dict[str, tuple[tuple, Background]] = {}

    def compile_in_background(self, kind: ExecutorKind, setup: RunSetup) -> Background:
        """`kind` built, compiled and run once through a default comparison round (untimed: every
        step a default Run reaches compiles now, not in a Run) on a thread of its own; the terminal
        hears how far it is every 10 s. Runs meanwhile go on the kind that needs no compile."""
        loading = compile_cache.kept() and kept_steps.kept()  # this code's steps are kept: a load, not a compile
        said = (f"loading the kept compiled steps ({compile_cache.folder()}){took_here(loading)}" if loading else
                f"a one-time compile{took_here(loading)}")
        print(f"Compiling {kind.compiles} in the background, {said}; Runs use the kind that needs no compile "
              "meanwhile", flush=True)

        def build():
            began, compiled = time.monotonic(), kept_steps.compiled()
            executor = kind.ready(setup, warm_up=warm_up)
            for _ in Comparison(setup, ("ar", "ppsd"), kind=kind, rounds=1, plain=True,
                                source=ExecutorSource(executor), throttle=float("inf")).run():
                pass
            background.loaded = kept_steps.compiled() == compiled  # what it did, whatever was expected
            kept_steps.prune()
            took = time.monotonic() - began  # all a default Run reaches
            compile_cache.record(None if background.loaded else took, load_seconds=took if background.loaded else None)
            return executor

        background = Background(kind.compiles, build, kept=loading,
                                say=lambda words: print(words[0].upper() + words[1:], flush=True))
        self.builds[kind.name] = (setup_key(setup), background.start())
        return background

    def compiling(self) -> bool:
        """Whether a background compile is still running (its thread inside torch)."""
        return any(background.state == "compiling" for _, background in self.builds.values())

    def words(self) -> str:
        """What compiles in the background, in words, for the page ("" when nothing does or did)."""
        return "; ".join(background.words() for _, background in self.builds.values())

    def kept(self, kind: ExecutorKind, setup: RunSetup) -> Executor | None:
        """The background-built executor of `kind` when it is ready and fits `setup`, else None."""
        background = self._ready_for(setup).get(kind.name)
        return background.executor if background is not None else None

    def auto(self, setup: RunSetup) -> Choice:
        """"auto" here: the fastest PPSD measured on this machine among what is ready for `setup`, a
        stale speed measured again (at the load now: `load`)."""
        return choose_measured(setup.config.num_stages, setup.model.info.device, tuple(self._ready_for(setup)),
                               compile_cache.speeds(setup.model.info.name), load=load())

    def _ready_for(self, setup: RunSetup) -> dict[str, Background]:
        """The background builds that are ready and were built for `setup`'s weights, head and stages."""
        key = setup_key(setup)
        return {name: b for name, (built_for, b) in self.builds.items() if b.state == "ready" and built_for == key}

    def measuring(self) -> bool:
        """Does a Run's PPSD speed count for "auto"? On a server that compiles a kind in the
        background (tests never write the user's cache), once nothing compiles: a Run beside a
        compile ran at a fraction of its speed (3.9 tokens/s against 8.0 after it, at load 8-9 on 2
        cores, measured here)."""
        return bool(self.builds) and not self.compiling()


def took_here(loading: bool) -> str:
    """What this machine measured the last time it loaded (`loading`) or compiled the steps, in
    words: a fixed guess ("a minute or more") was off by ten times under load (issue 58)."""
    last = compile_cache.last_load_seconds() if loading else compile_cache.last_seconds()
    return f" (it took {last:.0f} s here last time)" if last else " (not yet timed on this machine)"


def setup_key(setup: RunSetup) -> tuple:
    """What a kept executor was built for: the weights, the exit head and the stages."""
    return id(setup.model.hf_model), id(setup.model.exit_head), setup.partition


def load() -> float:
    """The machine's 1-minute load average now: what a speed is measured at, and compared with."""
    return os.getloadavg()[0]


def note_speed(kind: ExecutorKind, setup: RunSetup, state: State, load: float) -> bool:
    """PPSD's tokens/s of this run (the median of its timed rounds), kept for "auto" to compare,
    with `load`, the load average just before the Run; not when something compiled in a round (the
    compile was measured too). True when kept."""
    median = state.stats().median("ppsd")
    run = state.rounds[0].get("ppsd") if state.rounds else None
    if not median or run is None or run.result is None or state.compiled:
        return False
    compile_cache.note_speed(setup.model.info.name, kind.name, len(run.result.token_ids) / median, load)
    return True


def kind_here(requested: str, setup: RunSetup) -> tuple[ExecutorKind, str]:
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
    here = choose(AUTO, stages, device)
    if reason is None or not multiprocessing.current_process().daemon or here.unavailable(device, stages) is not None:
        return kind, ""
    return here, f"The {kind.choice} cannot run here ({reason}), so the stages ran on {here.choice}."

"""Which executor kind a run takes, and what is ready for it: the one place that chooses. "auto"
is the fastest PPSD measured on this machine (on a GPU, the fastest measured on a GPU); a kind
asked for by name is that kind, or in a ZeroGPU call the kind that can run there. What one
process has ready is one `ReadyKinds`, which the front end owns (`app.runner.READY`) and asks for
each run: the kinds compiling in the background since start-up, the speeds "auto" compares, and
in a ZeroGPU call the executor the last call left ready. The library keeps none at module level.

It also prices a run on a leased GPU by its kind (`gpu_cost`): the seconds a token takes there
and the captures a kind pays first. What a lease is made of beyond that (the call's set-up, the
share of a card, the package's own factor) is the front end's (`app.lease`).

Boundary: the rule of "auto" and readying a run's executor, over the kinds' facts
(`ppsd.executors.kinds`) and the speeds kept by `ppsd.compile_cache`; a background build's own
state is `ppsd.executors.background`'s; what a front end says of a choice, in its words, is the
front end's (`app.kind_words`).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping

from . import compile_cache, kept_steps, quiet
from .compare import Comparison, ExecutorSource, State, ready
from .compile_cache import Speed
from .config import DecodeConfig
from .executors import Executor, host
from .executors.background import Background
from .executors.kinds import AUTO, IN_TURN, KINDS, ExecutorKind, concurrent_kinds, kind_named, reach
from .generate import warm_up
from .setup import RunSetup
from .static_cache import buckets_to, run_reach

__all__ = ["Choice", "ForRun", "GpuCost", "ReadyKinds", "choose", "choose_measured", "concurrent_by_default",
           "gpu_cost", "load", "setup_key", "stale", "took_here"]

Progress = Callable[[str], None]

# On a GPU "auto" takes the first of these that can run: the fastest PPSD measured on a GPU first
# (docs/benchmarks.md). Only "graphed" has been measured there so far; "stacked" joins this order
# where a device check measures it faster.
GPU_PPSD_ORDER = ("graphed",)


def choose(requested: str, num_stages: int, device: str) -> ExecutorKind:
    """The kind `requested` names, or for "auto" with nothing measured: on a GPU the captured
    steps (CUDA graphs, one stream per stage: docs/benchmarks.md); on a CPU worker processes where
    they can start (no compilation before the first run), else threads. A kind asked for by name
    is returned even where it cannot run: its `ready` says why. ValueError for unknown names."""
    if requested != AUTO:
        return kind_named(requested)
    if device.startswith("cuda"):
        return next(KINDS[name] for name in GPU_PPSD_ORDER if KINDS[name].unavailable(device, num_stages) is None)
    processes = KINDS["processes"]
    return processes if processes.unavailable(device, num_stages) is None else KINDS["threads"]


def concurrent_by_default(num_stages: int, device: str) -> bool:
    """Whether a front end should run the K stages at once by default: on a GPU (worker processes
    or CUDA streams), or where K cores are there for them."""
    return device.startswith("cuda") or host.usable_cores() >= num_stages


@dataclass(frozen=True)
class Choice:
    """The kind "auto" runs on, and why, in words (after "chosen: ")."""

    kind: ExecutorKind
    why: str


STALE_SECONDS = 24 * 3600.0  # a speed older than this is measured again: the machine's other work changes
STALE_LOAD = 1.0  # nor is one kept that was measured at a load this much above the load now (a core was taken)


def stale(speed: Speed, load: float | None, now: float) -> str:
    """Why `speed` no longer stands for this machine now ("" when it does): measured with no load
    recorded, more than a day ago, or while the machine was at least `STALE_LOAD` busier than now
    (`load`: the 1-minute load average now; None: not known)."""
    if speed.load is None or speed.at is None:
        return "it was kept with no load recorded"
    if now - speed.at > STALE_SECONDS:
        return "it was measured more than a day ago"
    if load is not None and speed.load - load >= STALE_LOAD:
        return f"it was measured at load {speed.load:.1f}, busier than now ({load:.1f})"
    return ""


def choose_measured(num_stages: int, device: str, ready: tuple[str, ...], speeds: Mapping[str, Speed], *,
                    measures: bool = True, load: float | None = None, now: float | None = None) -> Choice:
    """"auto" for PPSD once this machine has measured: on a GPU as `choose`; on a CPU the fastest
    PPSD measured here (`speeds`, `ppsd.compile_cache.Speed` by kind) among the kind that needs no
    compile and the compiled kinds `ready` now. A candidate not measured yet, or whose speed is
    `stale` at `load` (the load average now) and `now`, is taken first where a run `measures`
    (the page's): that run measures it. Else (the CLI) the speeds kept are compared, and with
    fewer than two the compiled kind is taken, fastest on a quiet 2-core CPU
    (docs/benchmarks.md). With no compiled kind ready, the kind that needs no compile."""
    default = choose(AUTO, num_stages, device)
    if device.startswith("cuda"):
        return Choice(default, "the fastest PPSD measured on a GPU (docs/benchmarks.md)")
    candidates = [default, *(KINDS[name] for name in ready if name in KINDS and name != default.name
                             and KINDS[name].unavailable(device, num_stages) is None)]
    if len(candidates) == 1:
        pending = [k.compiles for k in KINDS.values()
                   if k.compiles_on(device) and k.unavailable(device, num_stages) is None]
        return Choice(default, "it needs no compile" + (f" ({pending[0]} are not compiled yet)" if pending else ""))
    now = time.time() if now is None else now
    why_stale = {k.name: stale(speeds[k.name], load, now) for k in candidates if k.name in speeds}
    untried = [kind for kind in candidates if kind.name not in speeds or why_stale[kind.name]]
    if untried and measures:
        kind = untried[-1]
        if kind.name not in speeds:
            return Choice(kind, "not measured on this machine yet: this run measures it")
        return Choice(kind, f"its speed kept here ({speeds[kind.name].tokens_per_second:.1f} tokens/s) is stale: "
                            f"{why_stale[kind.name]}; this run measures it again")
    measured = [kind for kind in candidates if kind.name in speeds]
    if len(measured) < 2:  # nothing to compare: the compiled kind, measured fastest on a quiet 2-core CPU
        return Choice(candidates[-1], "the fastest PPSD on a quiet 2-core CPU (docs/benchmarks.md); not measured "
                                      "against the others on this machine yet")
    best = max(measured, key=lambda kind: speeds[kind.name].tokens_per_second)
    said = lambda k, unit="": f"{speeds[k.name].tokens_per_second:.1f}{unit}{_at(speeds[k.name])}"  # noqa: E731
    others = ", ".join(f"{said(k)} on the {k.noun}" for k in measured if k is not best)
    return Choice(best, f"the fastest PPSD measured on this machine ({said(best, ' tokens/s')}, against {others})")


def _at(speed: Speed) -> str:
    return "" if speed.load is None else f" at load {speed.load:.1f}"


# --------------------------------------------------------------------------- a run on a leased GPU

# A token on a whole NVIDIA H200 (docs/benchmarks.md, "The captured-step engine"): eager, the
# stages in turn in one process (21.38 ms), and graphed PPSD at acceptance 0, the slower of the
# two captured methods (4.93 ms; graphed AR 3.74 ms). The stacked chain is not measured on a GPU
# yet: its slot dispatches a quarter of graphed PPSD's ops ("The stacked engine"), so a kind that
# captures is priced at graphed PPSD's token.
EAGER_GPU_TOKEN_SECONDS = 0.0214
CAPTURED_GPU_TOKEN_SECONDS = 0.00493
# Per length bucket a run reaches, on a kind that captures: its steps' capture (two warm-up steps
# and a capture per stage and drafting). Projected, not measured on ZeroGPU.
CAPTURE_SECONDS_PER_BUCKET = 1.0
LEASED_DEVICE = "cuda"  # what a lease lends: the kind "auto" picks is a GPU's


def gpu_token_seconds(kind: ExecutorKind) -> float:
    """What a token of any method costs on a whole GPU on `kind`."""
    return CAPTURED_GPU_TOKEN_SECONDS if kind.gpu_captures else EAGER_GPU_TOKEN_SECONDS


@dataclass(frozen=True)
class GpuCost:
    """What a run costs on a whole GPU: its kind, its tokens' decoding and its captures, in seconds."""

    kind: ExecutorKind
    decode_seconds: float
    capture_seconds: float


def gpu_cost(pipeline: str | None, config: DecodeConfig, *, methods: int, rounds: int,
             prompt_tokens: int) -> GpuCost:
    """A run of `methods` methods for `rounds` timed rounds on a GPU, its stages at once on the
    kind `pipeline` names ("auto": the GPU's) or in turn (None): every token of every timed run
    (plain AR too, with the stages at once) at its kind's cost a token, and the capture of every
    bucket it reaches on a kind that captures. ValueError for a kind that is not one."""
    kind = choose(pipeline, config.num_stages, LEASED_DEVICE) if pipeline is not None else IN_TURN
    runs = rounds * (methods + kind.times_plain)
    decode = runs * config.max_new_tokens * gpu_token_seconds(kind)
    reaches = run_reach(prompt_tokens, config.max_new_tokens, config.num_stages, config.draft_len)
    capture = len(buckets_to(reaches)) * CAPTURE_SECONDS_PER_BUCKET if kind.gpu_captures else 0.0
    return GpuCost(kind, decode, capture)


# --------------------------------------------------------------------------- what this process has ready


@dataclass(frozen=True)
class ForRun:
    """The kind a run takes here and what is ready for it: `executor`, one kept open for its setup
    (built in the background; None: the run readies its own), `chosen`, what "auto" chose and why,
    and `instead_of`, the kind asked for where it cannot run in this process, with `reason`."""

    kind: ExecutorKind
    executor: Executor | None = None
    chosen: Choice | None = None
    instead_of: ExecutorKind | None = None
    reason: str = ""


def _in_a_call() -> bool:
    """In a ZeroGPU call: a daemonic worker forked from the server, reused for the next call."""
    return host.on_zerogpu() and multiprocessing.current_process().daemon


class ReadyKinds:
    """What one front end's process has ready: the kinds compiling (or compiled) in the
    background since start-up, by name, each with the key of the run setup it was built for (the
    weights, exit head and stages), so "auto" runs on one only for a setup it fits; and, in a
    ZeroGPU call, the executor the last call readied. The front end owns one (`app.runner.READY`),
    as it owns its shared worker processes; a ZeroGPU call's fork works on its copy."""

    def __init__(self) -> None:
        self.builds: dict[str, tuple[tuple, Background]] = {}
        self._call: tuple[tuple, Executor] | None = None  # in a ZeroGPU call: (kind and setup key, executor)

    def for_run(self, requested: str, setup: RunSetup) -> ForRun:
        """The concurrent kind to run `setup` on, decided in the process that runs it. "auto": the
        fastest PPSD measured here among what is ready (`auto`). A ZeroGPU call runs in a daemonic
        child, where worker processes cannot start, whatever the page's own process could: there a
        kind that cannot run gives way to what "auto" picks. Elsewhere it is refused in words (by
        `ready`), as is a non-concurrent kind (here)."""
        device, stages = setup.model.info.device, setup.config.num_stages
        kind = choose(requested, stages, device)
        if not kind.concurrent:
            raise ValueError(f"pipeline {kind.name!r} runs the stages in turn; at once they run on: "
                             f"{', '.join(k.name for k in concurrent_kinds())}")
        reason, here = kind.unavailable(device, stages), choose(AUTO, stages, device)
        if reason is not None and multiprocessing.current_process().daemon and here.unavailable(device, stages) is None:
            return ForRun(here, self.kept(here, setup), instead_of=kind, reason=reason)
        chosen = self.auto(setup) if requested == AUTO else None
        kind = chosen.kind if chosen is not None else kind
        return ForRun(kind, self.kept(kind, setup), chosen)

    def source(self, run: ForRun) -> ExecutorSource:
        """Where `run`'s comparison gets its executor: the kept one, else readied here (`ready`)."""
        return ExecutorSource(run.executor, self.ready, self.release)

    def ready(self, kind: ExecutorKind, setup: RunSetup, progress: Progress) -> Executor | None:
        """`ppsd.compare.ready(kind, setup)`; in a ZeroGPU call, kept for the next call with the same
        kind, weights, exit head and stages, which then starts at once with its threads, warm-up
        and captured steps (made ready for the new run's length where the kind `prepares`). One is
        kept at a time; a kind shared anyway (worker processes) is left to itself."""
        if not _in_a_call() or kind.shared:
            return ready(kind, setup, progress)
        key = (kind.name, *setup_key(setup))
        if self._call is not None and self._call[0] == key:  # the weights it holds keep their ids its own
            if kind.prepares:
                progress("Making the kept steps ready for this run's length")
                self._call[1].prepare(reach(setup))
            return self._call[1]
        if self._call is not None:
            (_, old), self._call = self._call, None
            old.close()
        executor = ready(kind, setup, progress)
        if executor is not None:
            self._call = (key, executor)
        return executor

    def release(self, kind: ExecutorKind, executor: Executor | None) -> None:
        """After a run: `kind.release(executor)`, unless this ZeroGPU worker keeps it for the next call."""
        if self._call is None or executor is not self._call[1]:
            kind.release(executor)

    def start(self, device: str, num_stages: int, set_up: Callable[[], RunSetup],
              progress: Progress) -> ExecutorKind | None:
        """At start-up, what a first default Run needs beyond the model: the shared kind "auto"
        starts on (the worker processes), started and warmed up now for the setup `set_up` makes;
        then the kinds that compile first (on a CPU) compile in the background. The kind started,
        or None where the defaults run the stages in turn or on a kind built per run."""
        if not concurrent_by_default(num_stages, device):
            return None
        kind = choose(AUTO, num_stages, device)
        if not kind.shared or kind.unavailable(device, num_stages) is not None:
            return None
        setup = set_up()
        ready(kind, setup, progress)
        for compiled in concurrent_kinds():
            if compiled.compiles_on(device) and compiled.unavailable(device, num_stages) is None:
                self.compile_in_background(compiled, setup)
        return kind

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

    def note_speed(self, kind: ExecutorKind, setup: RunSetup, state: State, load: float) -> bool:
        """PPSD's tokens/s of this finished run (the median of its timed rounds), kept for "auto" to
        compare, with `load`, the load average just before the Run: where its speed counts (the
        stages at once on a CPU, `measuring`), and not when something compiled in a round (the
        compile was measured too) or other programs crowded one (`quiet.crowded`). True when kept."""
        if not (state.done and kind.concurrent and setup.model.info.device == "cpu" and self.measuring()):
            return False
        median = state.stats().median("ppsd")
        run = state.rounds[0].get("ppsd") if state.rounds else None
        if not median or run is None or run.result is None or state.compiled or quiet.crowded(state.others):
            return False
        compile_cache.note_speed(setup.model.info.name, kind.name, len(run.result.token_ids) / median, load)
        return True


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

"""The executor kinds: what each is, as facts (its name, whether its stages run at once, why it
cannot run somewhere, what it compiles or prepares, whether it is shared, the measured case it is
kept for) and how to get one ready and let it go. The CLI's `--executor`, bench-pipeline's rows,
the page and `ppsd.choice` all read `KINDS`, so a kind is defined once.

Boundary: the registry and readying executors. Which kind a run takes ("auto" among them, what
is ready in a process, what a run of a kind costs on a leased GPU) is `ppsd.choice`'s; the page's
sentences on each kind are `app.kind_words`'; plain AR's ways are `ppsd.plain_ar`'s. The
executors themselves live in `runtime`, `stacked` and `distributed` (the K-process pipeline,
imported only when a kind needs it).

Adding a kind: write its executor in a module of its own (the `Executor` protocol of `base`,
with `close()`), then add one `ExecutorKind` to `KINDS`: its name and the library's words for it,
whether its stages run at once, why it cannot run somewhere (`unavailable`), and `build`, which
constructs it and warms it up untimed with the warm-up its caller gives (`ready` checks
`unavailable` before it calls `build`; the warm-up decodes, so it comes from above,
`ppsd.generate.warm_up`: the kinds sit below the decoding entry points and import none of them);
whether it captures each length bucket on a GPU (`gpu_captures`, which `ppsd.choice` prices at the
captured rate) and takes `prepare(length)` (`prepares`); and `fastest` or `earns`, the measured
case it is kept for (docs/benchmarks.md, "Why each kind exists"). The page offers a kind on its
radio only where `fastest` names a case (`app.ui`); its words there are one entry of
`app.kind_words.WORDS`. "stacked" is the newest such entry: `_stacked_unavailable`, `_stacked`
and one line in `KINDS`.

A kind whose steps compile before first use on a CPU names what compiles in `compiles`: the page
builds it in the background at start-up (`ppsd.choice.ReadyKinds.start`), and "auto" moves to it
once it is ready where this machine measured it fastest (the compile is kept by
`ppsd.compile_cache`). `tests/test_kinds.py` then wants a case where it cannot run.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import Callable, Protocol

from ..config import DecodeConfig
from ..model import StagedModel
from .base import Executor


__all__ = ["AUTO", "ExecutorKind", "IN_TURN", "KINDS", "WorkerOptions", "concurrent_kinds", "kind_named", "reach"]

Progress = Callable[[str], None]

class Setup(Protocol):
    """What readying an executor reads of a run's setup (`ppsd.setup.RunSetup` is one)."""

    @property
    def model(self) -> StagedModel: ...
    @property
    def config(self) -> DecodeConfig: ...
    @property
    def partition(self) -> tuple[range, ...]: ...
    @property
    def prompt_ids(self) -> tuple[int, ...]: ...


class WarmUp(Protocol):
    """A few untimed tokens of every method on `executor` (`ppsd.generate.warm_up`), so first-call
    costs stay out of timed runs."""

    def __call__(self, model: StagedModel, prompt_ids: list[int], config: DecodeConfig, *,
                 executor: Executor) -> None: ...


@dataclass(frozen=True)
class WorkerOptions:
    """How a kind with worker processes starts them; other kinds ignore it."""

    threads_per_worker: int = 1  # torch threads of each worker
    timeout: float = 30.0  # seconds a worker may take to answer before the run fails


@dataclass(frozen=True)
class ExecutorKind:
    """One way to run the K stages: facts about it, and the few words the library's own output
    (the CLI, bench-pipeline's rows, a comparison's status) names it by. The page's sentences on a
    kind are the page's (`app.kind_words`)."""

    name: str  # what the CLI takes, the page's choice sends and a bench row records
    label: str  # the CLI's summary, bench-pipeline's progress and a record's "executor": "K worker processes"
    noun: str  # what the library's sentences call it, after "the": "worker processes"
    row: str  # a bench-pipeline row after the method, "{k}" for K: "{k}-worker pipeline"
    concurrent: bool  # the stages at once, so the measured clock shows the overlap (else projected)
    unavailable: Callable[[str, int], str | None]  # (model device, K) -> None, or why it cannot run here
    build: Callable[[Setup, WarmUp, Progress, WorkerOptions], Executor | None]  # warmed up; None: in-process, one per run
    # Why it is kept: the measured case where it is the fastest way to run PPSD
    # (docs/benchmarks.md, "Why each kind exists"), "" where it is the fastest nowhere measured; and
    # what it is for otherwise.
    fastest: str = ""
    earns: str = ""
    shared: bool = False  # one per process, reused run after run: a run leaves it open, a command closes it
    # What compiles before its first use on a CPU ("the captured steps": minutes cold, seconds once
    # kept by `ppsd.compile_cache`), so a front end builds it in the background; "" for none.
    compiles: str = ""
    prepares: bool = False  # its executor takes `prepare(length)`: room (and captures) for a run's length
    gpu_captures: bool = False  # on a GPU, each length bucket a run reaches is captured (a CUDA graph) first

    @property
    def times_plain(self) -> bool:
        """Does a comparison on this kind time plain AR beside it? With the stages at once, PPSD
        is put against the fastest AR with no pipeline; in turn, AR is that already."""
        return self.concurrent

    def compiles_on(self, device: str) -> bool:
        """Does this kind compile before its first use on `device` (a CPU; a GPU captures in seconds)?"""
        return bool(self.compiles) and not device.startswith("cuda")

    def ready(self, setup: Setup, *, warm_up: WarmUp, progress: Progress | None = None,
              options: WorkerOptions = WorkerOptions()) -> Executor | None:
        """An executor for `setup`'s model and stages, warmed up (untimed) by `warm_up`, telling
        `progress` what takes long; ValueError saying why it cannot run here."""
        reason = self.unavailable(setup.model.info.device, setup.config.num_stages)
        if reason is not None:
            raise ValueError(reason)
        return self.build(setup, warm_up, progress or (lambda message: None), options)

    def release(self, executor: Executor | None) -> None:
        """After a run: close what was built for it; the shared one stays for the next run."""
        if executor is not None and not self.shared:
            executor.close()


def _nowhere(device: str, num_stages: int) -> str | None:
    return None


def _threads_unavailable(device: str, num_stages: int) -> str | None:
    if device.startswith(("cpu", "cuda")):
        return None
    return f"the threads executor runs on CPU or CUDA, not {device}: use one process (projected clock)"


def _processes_unavailable(device: str, num_stages: int) -> str | None:
    from .distributed.pool import workers_unavailable  # brings torch.distributed: imported when asked

    return workers_unavailable(num_stages, device)


def _graphed_unavailable(device: str, num_stages: int) -> str | None:
    if device.startswith("cuda"):
        return None
    if device != "cpu":
        return f"the graphed executor runs on CPU or CUDA, not {device}: use one process (projected clock)"
    if shutil.which("g++") is None and shutil.which("c++") is None:
        return "the graphed executor compiles its steps on a CPU, and this machine has no C++ compiler (g++)"
    return None


def _stacked_unavailable(device: str, num_stages: int) -> str | None:
    if device.startswith(("cpu", "cuda")):
        return None
    return f"the stacked executor runs on CPU or CUDA, not {device}: use one process (projected clock)"


def _in_process(setup: Setup, warm_up: WarmUp, tell: Progress, options: WorkerOptions) -> None:
    return None  # each run makes its own `InProcessExecutor` on its stopwatch


def _warmed(setup: Setup, executor: Executor, warm_up: WarmUp) -> Executor:
    """`executor` after a few untimed tokens of every method: first-call costs stay out of runs."""
    warm_up(setup.model, [0], setup.config, executor=executor)
    return executor


def _threads(setup: Setup, warm_up: WarmUp, tell: Progress, options: WorkerOptions) -> Executor:
    from .runtime import ThreadedExecutor

    tell(f"Starting {setup.config.num_stages} stage threads in this process and warming them up")
    return _warmed(setup, ThreadedExecutor(setup.model, setup.partition), warm_up)


def _graphed(setup: Setup, warm_up: WarmUp, tell: Progress, options: WorkerOptions) -> Executor:
    from .runtime import GraphedExecutor

    cuda = setup.model.info.device.startswith("cuda")
    tell("Capturing each stage's step as a CUDA graph, at every length the run reaches" if cuda else
         "Compiling each stage's step (first use: about a minute on a small CPU)")
    from .. import compile_cache, kept_steps

    began, cold = time.perf_counter(), not cuda and not (compile_cache.kept() and kept_steps.kept())
    executor = GraphedExecutor(setup.model, setup.partition, compiled=not cuda)
    executor.prepare(reach(setup))  # before the warm-up: its bucket is then captured on the final buffers
    _warmed(setup, executor, warm_up)
    if not cuda:  # what compiled is kept, checked, for the next start; a cold compile's time is said next time
        kept_steps.prune()
        compile_cache.record(time.perf_counter() - began if cold else None)
    return executor


def reach(setup: Setup) -> int:
    """The furthest position a run of `setup` may write (`ppsd.static_cache.run_reach`)."""
    from ..static_cache import run_reach

    config = setup.config
    return min(run_reach(len(setup.prompt_ids), config.max_new_tokens, config.num_stages, config.draft_len),
               setup.model.info.max_context)


def _stacked(setup: Setup, warm_up: WarmUp, tell: Progress, options: WorkerOptions) -> Executor:
    from .stacked import StackedExecutor

    cuda = setup.model.info.device.startswith("cuda")
    tell("Stacking the stages' layers and capturing each slot as a CUDA graph" if cuda else
         "Stacking the stages' layers (eager on a CPU)")
    return _warmed(setup, StackedExecutor(setup.model, setup.partition), warm_up)


def _processes(setup: Setup, warm_up: WarmUp, tell: Progress, options: WorkerOptions) -> Executor:
    from .distributed.pool import ready_pipeline

    return ready_pipeline(setup.model, setup.config, warm_up=warm_up, progress=tell,
                          threads_per_worker=options.threads_per_worker, timeout=options.timeout)


KINDS: dict[str, ExecutorKind] = {kind.name: kind for kind in (
    ExecutorKind("in-process", "one process", "one process", "1 process", concurrent=False, unavailable=_nowhere,
                 build=_in_process,
                 earns="runs anywhere, any K on any device: the stages in turn, their overlap projected"),
    ExecutorKind("processes", "K worker processes", "worker processes", "{k}-worker pipeline", concurrent=True,
                 unavailable=_processes_unavailable, build=_processes, shared=True,
                 fastest="PPSD with no compile on a CPU (26.4 tokens/s against 25.2 on threads, 2 stages), and "
                         "decoding of any kind on a host where a second thread gives AR nothing (PPSD 17.4 against "
                         "AR's best 16.8)",
                 earns="the stages at once with nothing to compile: what a CPU runs until the captured steps are"),
    ExecutorKind("threads", "K threads in one process", "threads in this process", "{k} threads in 1 process",
                 concurrent=True, unavailable=_threads_unavailable, build=_threads, prepares=True,
                 earns="the stages at once where worker processes cannot start: in a daemonic process (a ZeroGPU "
                       "call) or with fewer cores than stages (PPSD 25.2 tokens/s, 2 stages)"),
    ExecutorKind("graphed", "K captured steps in one process", "captured steps", "{k} captured steps",
                 concurrent=True, unavailable=_graphed_unavailable, build=_graphed, compiles="the captured steps",
                 prepares=True, gpu_captures=True,
                 fastest="PPSD on a quiet 2-core CPU (32.1 tokens/s against 26.4 on worker processes), and on a "
                         "GPU, the one kind measured there (an H200: AR 3.74 ms a token, 5.71x eager AR; PPSD 2.76 ms "
                         "with every draft accepted)",
                 earns="the fastest PPSD measured, once compiled (on a CPU) or captured (on a GPU)"),
    ExecutorKind("stacked", "K stages stacked in one chain", "stacked stages", "{k} stacked stages", concurrent=True,
                 unavailable=_stacked_unavailable, build=_stacked, prepares=True, gpu_captures=True,
                 earns="experimental: a slot dispatches a quarter of graphed PPSD's ops (312 against 1,245), which a "
                       "GPU may turn into time; slower on every CPU measured (PPSD 11.7 tokens/s), not yet run on a "
                       "GPU"),
)}
IN_TURN = KINDS["in-process"]  # the stages in turn in one process: a run that is not "at once"
ALIASES = {"distributed": "processes"}  # the CLI's earlier name
AUTO = "auto"


def concurrent_kinds() -> tuple[ExecutorKind, ...]:
    """The kinds that run the stages at once: the page's choices, bench-pipeline's rows."""
    return tuple(kind for kind in KINDS.values() if kind.concurrent)


def kind_named(name: str) -> ExecutorKind:
    """The kind `name` (or its alias) names; ValueError naming the choices for any other."""
    kind = KINDS.get(ALIASES.get(name, name))
    if kind is None:
        raise ValueError(f"executor {name!r} is unknown; choose one of: {', '.join((AUTO, *KINDS))}")
    return kind

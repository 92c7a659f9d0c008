"""The executor kinds a front end can choose: their names, their words, whether they can run
here, and how to get one ready and let it go. The CLI's `--executor`, the page's "at once"
choice and its summary, and `bench-pipeline`'s rows all read `KINDS`, so a kind is named and
described once.

Boundary: the registry and readying executors (which kind "auto" runs on is `choice`'s); the executors themselves live in `local`,
`threads`, `pipeline` (with `pool`, the process's shared pipeline). Those that bring
torch.distributed are imported only when a kind needs them.

Adding a kind: write its executor in a module of its own (the `Executor` protocol of `base`,
with `close()`), then add one `ExecutorKind` to `KINDS`: its name and words (a concurrent kind
also says how a run of it ran, for the page's headline), whether its stages run at once, why it cannot run somewhere (`unavailable`), and `build`, which constructs it and
warms it up untimed with the warm-up its caller gives (`ready` checks `unavailable` before it calls
`build`; the warm-up decodes, so it comes from above, `ppsd.generate.warm_up`: the kinds sit
below the decoding entry points and import none of them), and, when it runs faster than eager on
a GPU, what a token costs there (`gpu_token_seconds`, which sizes a ZeroGPU lease) and whether it
captures each length bucket first (`gpu_captures`). "stacked" is the newest such entry:
`_stacked_unavailable`, `_stacked` and one line in `KINDS`.

A kind whose steps compile before first use on a CPU names what compiles in `compiles`: the page
builds it in the background at start-up (`ppsd.ready_here`, from `app.runner.prestart`), and
"auto" moves to it once it is ready where this machine measured it fastest (`ppsd.executors.choice`; the compile
is kept by `ppsd.compile_cache`).

Every front end then offers it: the CLI's `--executor` by name; the page, when it is
concurrent, as a choice under "The stages at once on" ("auto" keeps today's rule); and
bench-pipeline, when it is concurrent and can run here, as an AR and a PPSD row.
`tests/test_kinds.py` then wants a case where it cannot run.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import torch

from ..config import DecodeConfig
from ..model import StagedModel
from .base import Executor


__all__ = ["AUTO", "AUTO_CHOICE", "ExecutorKind", "IN_TURN", "KINDS", "PlainAR", "WorkerOptions", "concurrent_kinds",
           "fastest_ar", "kind_named"]

Progress = Callable[[str], None]

# A token on a whole NVIDIA H200 (docs/benchmarks.md, "The captured-step engine"): eager, the
# stages in turn in one process (21.38 ms), and graphed PPSD at acceptance 0, the slower of the
# two captured methods (4.93 ms; graphed AR 3.74 ms).
EAGER_GPU_TOKEN_SECONDS = 0.0214
CAPTURED_GPU_TOKEN_SECONDS = 0.00493


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
    """One way to run the K stages. Its words are the ones the page and the summaries show."""

    name: str  # what the CLI takes, the page's choice sends and a bench row records
    label: str  # the summary's "executor": "K worker processes"
    choice: str  # the page's radio button: "worker processes, one per stage"
    where: str  # where its measured clock ran: "each stage in its own worker process, at once"
    row: str  # a bench-pipeline row after the method, "{k}" for K: "{k}-worker pipeline"
    concurrent: bool  # the stages at once, so the measured clock shows the overlap (else projected)
    unavailable: Callable[[str, int], str | None]  # (model device, K) -> None, or why it cannot run here
    build: Callable[[Setup, WarmUp, Progress, WorkerOptions], Executor | None]  # warmed up; None: in-process, one per run
    shared: bool = False  # one per process, reused run after run: a run leaves it open, a command closes it
    # The page's words for a run of K stages on it ({k}: K; {each}: "a core" or "a CUDA stream"; {where}):
    ran: str = ""  # how the stages and AR ran, after "Measured: "
    stages: str = ""  # the stages as one thing, after "PPSD on "
    # What the measured clock pays that the projected one (the same stage costs replayed) does not:
    # "" when there is nothing to name; None when a projection says nothing of this kind.
    overhead: str | None = ""
    # What compiles before its first use on a CPU ("the captured steps": minutes cold, seconds once
    # kept by `ppsd.compile_cache`), so a front end builds it in the background; "" for none.
    compiles: str = ""
    # What a token of any method costs on a whole GPU, in seconds, for a front end that leases GPU
    # time by the token (ZeroGPU: `app.lease`): the stages in turn, eager, unless a kind says less.
    gpu_token_seconds: float = EAGER_GPU_TOKEN_SECONDS
    gpu_captures: bool = False  # on a GPU, each length bucket a run reaches is captured (a CUDA graph) first

    @property
    def times_plain(self) -> bool:
        """Does a comparison on this kind time plain AR beside it? With the stages at once, PPSD
        is put against the fastest AR with no pipeline; in turn, AR is that already."""
        return self.concurrent

    def compiles_on(self, device: str) -> bool:
        """Does this kind compile before its first use on `device` (a CPU; a GPU captures in seconds)?"""
        return bool(self.compiles) and not device.startswith("cuda")

    def words(self, text: str, num_stages: int, device: str) -> str:
        """`text` (`ran` or `stages`) for K = `num_stages` stages on `device`."""
        each = "a CUDA stream" if device.startswith("cuda") else "a core"
        return text.format(k=num_stages, each=each, where=self.where)

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
    ExecutorKind("in-process", "one process", "one process, the stages in turn", "stages in turn on one device",
                 "1 process", concurrent=False, unavailable=_nowhere, build=_in_process),
    ExecutorKind("processes", "K worker processes", "worker processes, one per stage",
                 "each stage in its own worker process, at once", "{k}-worker pipeline", concurrent=True,
                 unavailable=_processes_unavailable, build=_processes, shared=True,
                 ran="each of the K={k} stages ran in its own worker process (pinned to its own cores or GPU), at the "
                     "same time; AR ran on the same pipeline",
                 stages="the {k} worker processes",
                 overhead="the cost of moving hidden states and logits between processes"),
    ExecutorKind("threads", "K threads in one process", "threads in this process",
                 "each stage on its own thread in one process, at once", "{k} threads in 1 process", concurrent=True,
                 unavailable=_threads_unavailable, build=_threads,
                 ran="each of the K={k} stages ran on its own thread in this one process ({each} each), at the same "
                     "time, sharing the weights and the KV cache; AR ran on the same threads",
                 stages="the {k} stage threads",
                 overhead="what the threads lose to each other (on a CPU, Python's lock between short kernels)"),
    ExecutorKind("graphed", "K captured steps in one process", "captured steps, one per stage",
                 "each stage a captured step (a CUDA graph on its stream, or a compiled step on its thread), at once",
                 "{k} captured steps", concurrent=True, unavailable=_graphed_unavailable, build=_graphed,
                 ran="each of the K={k} stages ran as one captured step in this one process ({where}), sharing the "
                     "weights and a static KV cache; AR ran on the same steps",
                 stages="the {k}-stage pipeline ({where})", compiles="the captured steps",
                 gpu_token_seconds=CAPTURED_GPU_TOKEN_SECONDS, gpu_captures=True),
    ExecutorKind("stacked", "K stages stacked in one chain",
                 "stacked stages, one chain a slot (experimental: slower on every CPU measured, not yet run on a GPU)",
                 "every stage at once in one chain of stacked layers (a CUDA graph a slot, or eager on a CPU)",
                 "{k} stacked stages", concurrent=True, unavailable=_stacked_unavailable, build=_stacked,
                 ran="the K={k} stages ran as one stacked chain in this one process ({where}): each slot runs layer "
                     "j of every stage as one batched step over the K stages' tokens, on one KV cache; AR ran on the "
                     "same engine",
                 stages="the {k}-stage pipeline ({where})", overhead=None,
                 # Not measured on a GPU yet: its slot dispatches a quarter of graphed PPSD's ops
                 # (docs/benchmarks.md, "The stacked engine"), so graphed PPSD's token bounds it.
                 gpu_token_seconds=CAPTURED_GPU_TOKEN_SECONDS, gpu_captures=True),
)}
IN_TURN = KINDS["in-process"]  # the stages in turn in one process: a run that is not "at once"
ALIASES = {"distributed": "processes"}  # the CLI's earlier name
AUTO = "auto"
AUTO_CHOICE = "auto: the fastest PPSD measured here"  # the page's radio button for AUTO (`choice.choose_measured`)


def concurrent_kinds() -> tuple[ExecutorKind, ...]:
    """The kinds that run the stages at once: the page's choices, bench-pipeline's rows."""
    return tuple(kind for kind in KINDS.values() if kind.concurrent)


def kind_named(name: str) -> ExecutorKind:
    """The kind `name` (or its alias) names; ValueError naming the choices for any other."""
    kind = KINDS.get(ALIASES.get(name, name))
    if kind is None:
        raise ValueError(f"executor {name!r} is unknown; choose one of: {', '.join((AUTO, *KINDS))}")
    return kind


@dataclass(frozen=True)
class PlainAR:
    """One way to run plain AR here: on `executor` (None: in process), on `threads` torch threads,
    described in `words` ("in this one process on 1 thread with no pipeline")."""

    executor: Executor | None
    threads: int
    words: str


def fastest_ar(setup: Setup, kind: str, pipeline: Executor | None, *, warm_up: WarmUp) -> tuple[PlainAR, ...]:
    """The ways the fastest plain AR here may run, beside a pipeline of `kind` (`pipeline`,
    reused where it serves; one built here is warmed up by `warm_up`): the caller times each and
    keeps the faster, as which is faster is the machine's to say. On a GPU: the captured steps
    (eager AR there pays about 1,300 kernel launches a token and runs 5-6x slower:
    docs/benchmarks.md). On a CPU, whatever kind PPSD runs on: in-process AR on 1 thread and on
    every core, each warmed up at its thread count. On a busy 2-core machine torch on 2 threads
    ran 3.5x slower than on 1 (issue 34), on a quiet one faster; plain AR on the captured steps
    had no 1-thread trial (a second thread count compiles again, for minutes) and was timed 3-10x
    too slow beside them (issue 56). The caller closes what it did not pass in, and gives the
    process its threads back."""
    from .host import usable_cores

    graphed, cores = KINDS["graphed"], usable_cores()
    if setup.model.info.device.startswith("cuda"):
        executor = pipeline if kind == graphed.name else graphed.ready(setup, warm_up=warm_up)
        return (PlainAR(executor, 1, f"on the captured steps in this one process ({graphed.where})"),)
    ways, threads = [], torch.get_num_threads()
    try:
        for n in sorted({1, cores}):
            torch.set_num_threads(n)
            warm_up(setup.model, [0], setup.config)  # first calls at this thread count stay out of the timed rounds
            ways.append(PlainAR(None, n, f"in this one process on {n} thread{'s' * (n != 1)} with no pipeline"))
    finally:
        torch.set_num_threads(threads)
    return tuple(ways)

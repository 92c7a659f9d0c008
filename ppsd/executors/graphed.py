"""`GraphedExecutor`: every stage in this process as one pure step on a static KV cache: replayed
as a CUDA graph on a GPU, compiled on a CPU.

Boundary: the same `schedule` plans and the same `Output`s as `InProcessExecutor`; what differs is
how a stage computes. A stage's step (`ppsd.executors.graphed_steps.StageSteps`) goes from its
input and its positions, a device tensor, to its hidden output and the logits it gives with their
argmax. It reads nothing back to the host and runs the same kernels at every position, for an
accepted draft and a corrected one alike; the attention covers a power-of-two length bucket
(`ppsd.static_cache`). The executor plans each call, takes each stage's input off its queue,
queues its output and makes the call's `Output` after one host read; how the steps run is the
one backend it chooses at construction (`ppsd.executors.backends`):

- on CUDA, each one-token step captured as a CUDA graph and replayed on a stream per stage
  (`CudaGraphStages`); pieces wider than one token run the same step eagerly;
- on a CPU with `compiled`, each one-token step compiled by Inductor with its C++ wrapper, stages
  2..K on threads of their own (`CompiledStageThreads`; with `stage_threads=False`, in turn,
  every core on one stage: `CompiledStages`);
- on a CPU without it, the steps eagerly, in turn (`EagerStages`: the tests' fast path; PPSD's
  overlap is then projected, as in process).
"""

from __future__ import annotations

import threading

from ..model import StagedModel
from ..trace import Stopwatch
from . import schedule
from .backends import StageBackend
from .backends.cpu import CompiledStages, CompiledStageThreads, EagerStages
from .backends.cuda import CudaGraphStages
from .base import Feed, Output, final_position
from .graphed_steps import Done, Launch, StageSteps
from .threads import StageThreads
from .waiting import QueuedStages


class GraphedExecutor(QueuedStages):
    """All stages here, each a pure step on a static cache: CUDA graphs on a GPU; on a CPU compiled
    steps on stage threads (`compiled`), or eager steps in turn."""

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch | None = None, *,
                 compiled: bool = False, stage_threads: bool = True) -> None:
        if len(partition) < 2:
            raise ValueError("the graphed executor runs a pipeline of K >= 2 stages")
        self.model, self.partition = model, partition
        self.device = model.info.device
        cuda = self.device.startswith("cuda")
        if not (cuda or self.device == "cpu"):
            raise ValueError(f"the graphed executor runs on CPU or CUDA, not {self.device}")
        if compiled and cuda:
            raise ValueError("compiled steps are for a CPU: on CUDA the steps are captured as CUDA graphs")
        self.steps = StageSteps(model, partition, pinned=cuda)
        self.cache = self.steps.cache
        self.backend: StageBackend = _backend(self.steps, stopwatch or Stopwatch(), cuda=cuda,
                                              compiled=compiled, stage_threads=stage_threads)
        # At once: on a GPU a stream per stage; on a CPU a thread per stage, which pays only for
        # compiled steps (their C++ wrapper releases the GIL; eager steps hold it).
        self.concurrent = self.backend.concurrent
        self._empty_queues()
        self._run_lock = threading.Lock()
        self.host_reads = 0  # calls that waited for the device: one per executor call

    # The Executor protocol -------------------------------------------------------------------

    def begin(self, stopwatch: Stopwatch) -> None:
        """One run at a time (a second waits); on CUDA, one clock stamp places the run's events."""
        self._run_lock.acquire()
        self.rollback(0)
        self.backend.begin(stopwatch)

    def end(self) -> None:
        self.backend.end()
        self._run_lock.release()

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        return self._execute(schedule.slot(self._queues, feed), feed, slot, at_once=True)

    def push(self, feed: Feed) -> Output:
        return self._execute(schedule.enter(self._queues, feed), feed, None, at_once=False)

    def flow(self) -> Output:
        return self._execute(schedule.flow(self._queues), None, None, at_once=False)

    def rollback(self, length: int) -> None:
        self._empty_queues()
        self.cache.truncate(length)

    def prepare(self, length: int) -> None:
        """Room for positions [0, length) and, on CUDA, every stage's one-token step captured at
        every bucket a run writing them reads, drafting or not: no reallocation and no capture
        then lands in a timed run (a run past `length` still grows and captures as it goes). A CPU
        compiles its steps on first use (minutes each): only what runs is compiled."""
        if self.cache.reserve(length):
            self.backend.grown()
        self.backend.prepare(length)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> "GraphedExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # One call ---------------------------------------------------------------------------------

    def _execute(self, plan: schedule.Plan, feed: Feed | None, slot: int | None, *, at_once: bool) -> Output:
        """`plan`'s actions: in a slot every stage takes what earlier calls queued, so all start
        at once (each on its stream or thread); a push or flow chains them in recording order."""
        actions = plan.actions
        if self.cache.reserve(max(a.item.position + a.item.width for a in actions)):
            self.backend.grown()
        handles = self.backend.ready(actions)  # before the inputs: a capture writes them
        self.steps.set_inputs(actions, feed)
        done = self._at_once(actions, handles, feed) if at_once else self._chained(actions, handles, feed)
        self._queues = plan.queues
        return self._read(done, slot)

    def _at_once(self, actions: tuple[schedule.Action, ...], handles: list, feed: Feed | None) -> list[Done]:
        done = self.backend.at_once([Launch(a, self._waiting.take(a), h) for a, h in zip(actions, handles)], feed)
        self.backend.join(done)  # only now: a stream joined earlier would hold back the stages after it
        for d in done:
            self._pass_on(d)
        return done

    def _chained(self, actions: tuple[schedule.Action, ...], handles: list, feed: Feed | None) -> list[Done]:
        done = []
        for a, h in zip(actions, handles):
            done.append(self.backend.launch(Launch(a, self._waiting.take(a), h), feed))
            self.backend.join(done[-1:])
            self._pass_on(done[-1])
        return done

    def _pass_on(self, done: Done) -> None:
        """`done`'s hidden states onto the next stage's queue (a replayed graph's copied: its
        buffer is the graph's and is overwritten when it runs again)."""
        self._waiting.pass_on(done.action.index, done.hidden, copy=done.replayed)

    def _read(self, done: list[Done], slot: int | None) -> Output:
        """The call's one host read: every argmax in one copy, after one wait; then its Output."""
        self.host_reads += 1
        values = self.backend.read([d.best for d in done if d.best is not None])
        results: dict = {}
        events = []
        for d in done:
            a, ids = d.action, []
            events.append(a.event(*self.backend.times(d), slot))
            if d.best is not None:
                ids, values = values[:d.best.numel()], values[d.best.numel():]
            if a.index == 0:
                results["exit_logits"] = d.logits if a.kind == "draft" else None
                results["exit_best"] = ids[0] if a.kind == "draft" else None
            if a.index + 1 == len(self.partition):
                results.update(final_logits=d.logits, final_position=final_position(a.item), final_best=tuple(ids))
        return Output(tuple(events), **results)


def _backend(steps: StageSteps, clock: Stopwatch, *, cuda: bool, compiled: bool, stage_threads: bool) -> StageBackend:
    """The one way this executor's steps run, chosen once."""
    if cuda:
        return CudaGraphStages(steps)
    if compiled and stage_threads:
        return CompiledStageThreads(steps, clock, StageThreads(len(steps.partition)))
    if compiled:
        return CompiledStages(steps, clock)
    return EagerStages(steps, clock)

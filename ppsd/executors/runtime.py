"""The one runtime that interprets the schedule, for every executor kind, and the kinds of this process.

Boundary: it plans each call (`schedule`), advances the host lengths of its one static KV cache
(`ppsd.static_cache`, with the same pure step per stage, `StageSteps`, for every kind), takes each
stage's input off its queue and queues its output (`waiting`), makes the call's `Output` after one
host read, and rolls back (the cache's `truncate`: host lengths only). A kind is a pair of small
objects chosen when it is built (`ppsd.executors.backends`): *where* the stages run (`Clocked`: in
turn or on a thread each; `Streams`: a CUDA stream each; `distributed.pipeline.Workers`: stages
2..K in worker processes) and *how* a stage's one-token step runs (`EagerStep`, `CompiledStep`,
`CudaGraphStep`). The kinds here are `InProcessExecutor`, `ThreadedExecutor` and `GraphedExecutor`
(each class says how it runs); `stacked.StackedExecutor` and `distributed.pipeline.DistributedExecutor`
are this runtime too.
"""

from __future__ import annotations

import threading

from ..model import StagedModel
from ..trace import Stopwatch
from . import schedule
from .backends import How, Job, Ran, Where
from .backends.cpu import Clocked, CompiledStep, EagerStep
from .backends.stage_threads import HERE, StageThreads
from .base import Feed, Output, PipelineBusy, final_position
from .stage_steps import Done, StageSteps
from .waiting import Waiting


class Runtime:
    """The K stages, each a pure step on one static cache; `where` and `how` set by the kind."""

    where: Where
    how: How
    busy_after = -1.0  # seconds a second run waits for the one holding the executor (-1: as long as it takes)

    def __init__(self, model: StagedModel, partition: tuple[range, ...], *, name: str,
                 stage_one_only: bool = False) -> None:
        """`stage_one_only`: this process holds stage 1 alone (the K-process kind): the cache keeps
        its layers' buffers (and every layer's host lengths), and only stage 2's input waits here."""
        if len(partition) < 2:
            raise ValueError(f"the {name} executor runs a pipeline of K >= 2 stages")
        self.model, self.partition, self.name = model, partition, name
        self.device = model.info.device
        if not self.device.startswith(("cpu", "cuda")):
            raise ValueError(f"the {name} executor runs on CPU or CUDA, not {self.device}: use one process "
                             "(projected clock)")
        self.steps = StageSteps(model, partition, pinned=self.device.startswith("cuda"),
                                layers=partition[0] if stage_one_only else None)
        self.cache = self.steps.cache
        self._held = 2 if stage_one_only else None
        self._empty_queues()
        self._run_lock = threading.Lock()
        self.host_reads = 0  # calls that waited for the device: one per executor call
        self.runs = 0  # runs begun

    @property
    def concurrent(self) -> bool:
        return self.where.concurrent

    # The Executor protocol -------------------------------------------------------------------

    def begin(self, stopwatch: Stopwatch) -> None:
        """One run at a time (a second waits, at most `busy_after` s, then `PipelineBusy`); the
        run's clock goes to where the stages run, and every cache and queue is emptied."""
        if not self._run_lock.acquire(timeout=self.busy_after):
            raise PipelineBusy(f"the {self.name} executor is busy with another run: try again in a moment")
        try:
            self.where.begin(stopwatch)
            self.rollback(0)
            self.runs += 1
        except BaseException:
            self._run_lock.release()  # no run began, so no `end` will come
            raise

    def end(self) -> None:
        try:
            self.where.end()
        finally:
            self._run_lock.release()

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        return self._execute(schedule.slot(self._queues, feed), feed, slot, at_once=True)

    def push(self, feed: Feed) -> Output:
        return self._execute(schedule.enter(self._queues, feed), feed, None, at_once=False)

    def flow(self) -> Output:
        return self._execute(schedule.flow(self._queues), None, None, at_once=False)

    def rollback(self, length: int) -> None:
        """The only rollback: the schedule's queued items, their hidden states and the work run
        ahead dropped, the cache's host lengths truncated (and, in other processes, theirs)."""
        self._empty_queues()
        self.cache.truncate(length)
        self.where.rollback(length)

    def _empty_queues(self) -> None:
        self._queues = schedule.empty(len(self.partition))
        self._waiting = Waiting(len(self.partition), self._held)
        self._ahead: dict[schedule.Action, Ran] = {}  # the next slot's work, launched early (`_run_ahead`)

    def prepare(self, length: int) -> None:
        """Room for positions [0, length) and, on CUDA, every stage's one-token step captured at
        every bucket a run writing them reads, drafting or not: no reallocation and no capture
        then lands in a timed run (a run past `length` still grows and captures as it goes). A CPU
        compiles its steps on first use (minutes each): only what runs is compiled."""
        self._reserve(length)
        self.how.prepare(length)

    def close(self) -> None:
        self.where.close()
        self.how.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # One call ---------------------------------------------------------------------------------

    def _execute(self, plan: schedule.Plan, feed: Feed | None, slot: int | None, *, at_once: bool) -> Output:
        """`plan`'s actions: in a slot every stage takes what earlier calls queued, so all start
        at once (each where its kind runs it); a push or flow chains them in recording order (where
        stages run elsewhere, they chain themselves: launched at once too)."""
        ahead, self._ahead = self._ahead, {}
        if ahead and not at_once:
            raise RuntimeError("push/flow after slot without a rollback: no decoder does this")
        fresh = self._prepare(tuple(a for a in plan.actions if a not in ahead), feed)
        if at_once or self.where.remote:
            done = self._at_once(plan.actions, fresh, ahead, feed)
        else:
            done = self._chained(fresh, feed)
        self._queues = plan.queues
        if at_once and self.where.remote and any(plan.queues[1:]):
            self._ahead = self._run_ahead()
        return self._read(done, slot)

    def _prepare(self, actions: tuple[schedule.Action, ...], feed: Feed | None) -> tuple[schedule.Action, ...]:
        self._reserve(max((a.item.position + a.item.width for a in actions), default=0))
        for a in actions:  # host lengths advance here alone, checked: a gap or an overlap raises
            self.cache.advance(self.partition[a.index], a.item.position, a.item.width)
        self.how.ready(actions)  # before the inputs: a capture writes them
        self.steps.set_inputs(actions, feed)
        return actions

    def _run_ahead(self) -> dict[schedule.Action, Ran]:
        """The next slot's stages 2..K launched before this slot is read: they depend on the queues
        alone (a correction's rollback drops them, as all work in flight), so each worker goes from
        one slot's work to the next without waiting for a message. The next slot adopts them."""
        actions = self._prepare(schedule.advance(self._queues).actions, None)
        return dict(zip(actions, self.where.at_once([self._job(a, None) for a in actions], True)))

    def _reserve(self, length: int) -> None:
        """Room in the cache for positions [0, length); a grown cache drops what the step made
        against the old one (`How.grown`)."""
        if self.cache.reserve(length):
            self.how.grown()

    def _job(self, action: schedule.Action, feed: Feed | None) -> Job:
        hidden = self._waiting.take(action)
        return Job(action, hidden, lambda: self.steps.run_now(action, hidden, feed, self.how.one_token))

    def _done(self, action: schedule.Action, ran: Ran) -> Done:
        out, start, end = ran
        return Done(action, *out, start, end, replayed=self.how.reuses_outputs and action.item.width == 1)

    def _at_once(self, actions: tuple[schedule.Action, ...], fresh: tuple[schedule.Action, ...],
                 ahead: dict[schedule.Action, Ran], feed: Feed | None) -> list[Done]:
        jobs = [self._job(a, feed) for a in fresh]
        ran = {**ahead, **dict(zip(fresh, self.where.at_once(jobs, self.how.anywhere(fresh))))}
        done = [self._done(a, ran[a]) for a in actions]
        self.where.join(done)  # only now: a stream joined earlier would hold back the stages after it
        for d in done:
            self._pass_on(d)
        return done

    def _chained(self, actions: tuple[schedule.Action, ...], feed: Feed | None) -> list[Done]:
        done = []
        for a in actions:
            done.append(self._done(a, self.where.launch(self._job(a, feed))))
            self.where.join(done[-1:])
            self._pass_on(done[-1])
        return done

    def _pass_on(self, done: Done) -> None:
        """`done`'s hidden states onto the next stage's queue (a replayed graph's copied: its
        buffer is the graph's and is overwritten when it runs again)."""
        self._waiting.pass_on(done.action.index, done.hidden, copy=done.replayed)

    def _read(self, done: list[Done], slot: int | None) -> Output:
        """The call's one host read: every argmax in one copy, after one wait; then its Output."""
        self.host_reads += 1
        values = self.where.read([d.best for d in done if d.best is not None])
        results: dict = {}
        events = []
        for d in done:
            a, ids = d.action, []
            events.append(a.event(*self.where.times(d), slot))
            if d.best is not None:
                ids, values = values[:d.best.numel()], values[d.best.numel():]
            if a.index == 0:
                results["exit_logits"] = d.logits if a.kind == "draft" else None
                results["exit_best"] = ids[0] if a.kind == "draft" else None
            if a.index + 1 == len(self.partition):
                results.update(final_logits=d.logits, final_position=final_position(a.item),
                               final_best=None if d.best is None else tuple(ids))
        return Output(tuple(events), **results)


class InProcessExecutor(Runtime):
    """Eager steps, in turn, each timed where it ran: measured, not concurrent."""

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch) -> None:
        super().__init__(model, partition, name="in-process")
        self.where, self.how = Clocked(stopwatch), EagerStep(self.steps)


class ThreadedExecutor(Runtime):
    """Eager steps; within a slot, at once, each stage on its own thread (and core, where it can;
    on a GPU, and a stream)."""

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch | None = None) -> None:
        super().__init__(model, partition, name="threads")
        threads = StageThreads(len(partition))
        if self.device.startswith("cuda"):
            from .backends.cuda import Streams

            self.where = Streams(self.device, len(partition), threads)
        else:
            self.where = Clocked(stopwatch or Stopwatch(), threads)
        self.how = EagerStep(self.steps)


class GraphedExecutor(Runtime):
    """The captured steps: CUDA graphs on a GPU; on a CPU compiled steps on stage threads
    (`compiled`; in turn with `stage_threads=False`), or eager steps in turn."""

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch | None = None, *,
                 compiled: bool = False, stage_threads: bool = True) -> None:
        super().__init__(model, partition, name="graphed")
        if self.device.startswith("cuda"):
            if compiled:
                raise ValueError("compiled steps are for a CPU: on CUDA the steps are captured as CUDA graphs")
            from .backends.cuda import CudaGraphStep, Streams

            self.where, self.how = Streams(self.device, len(partition)), CudaGraphStep(self.steps)
            return
        clock = stopwatch or Stopwatch()
        if compiled:
            self.where = Clocked(clock, StageThreads(len(partition)) if stage_threads else HERE)
            self.how = CompiledStep(self.steps)
        else:
            self.where, self.how = Clocked(clock), EagerStep(self.steps)

"""`InProcessExecutor`: every stage in this process, on one device, one after the other.

Boundary: it computes the `schedule`'s actions in their recording order and times each where it
ran, so its trace is measured but not concurrent; the projected clock (`Trace.project`)
replays it on K workers.
"""

from __future__ import annotations

import torch

from ..model import KVCache, StagedModel
from ..trace import Stopwatch
from . import schedule
from .base import Feed, Output, final_logits, final_position, first_stage
from .waiting import QueuedStages


class InProcessExecutor(QueuedStages):
    """All stages here, in turn, each timed where it ran."""

    concurrent = False

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch) -> None:
        self.model = model
        self.partition = partition
        self.device = model.info.device
        self.cache = KVCache()
        self._clock = stopwatch
        self._empty_queues()

    def begin(self, stopwatch: Stopwatch) -> None:
        self._clock = stopwatch
        self.rollback(0)

    def end(self) -> None:
        pass

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        return self._execute(schedule.slot(self._queues, feed), feed, slot)

    def push(self, feed: Feed) -> Output:
        return self._execute(schedule.enter(self._queues, feed), feed, None)

    def flow(self) -> Output:
        return self._execute(schedule.flow(self._queues), None, None)

    def rollback(self, length: int) -> None:
        self._empty_queues()
        self.cache.truncate(length)

    def _execute(self, plan: schedule.Plan, feed: Feed | None, slot: int | None) -> Output:
        results: dict = {}
        events = [self._deliver(action, self._compute(action, self._waiting.take(action), feed, slot), results)
                  for action in plan.actions]
        self._queues = plan.queues
        return Output(tuple(events), **results)

    def _compute(self, action: schedule.Action, hidden: torch.Tensor | None, feed: Feed | None,
                 slot: int | None) -> tuple:
        """One stage's layers for `action`: (hidden, exit logits or None, event timed where it ran)."""
        start = self._clock.now()
        hidden, logits = self._layers(action, hidden, feed)
        return hidden, logits, action.event(start, self._clock.now(), slot)

    def _layers(self, action: schedule.Action, hidden: torch.Tensor | None,
                feed: Feed | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`action`'s stage layers, untimed: (hidden, exit logits or None)."""
        if action.index == 0:
            return first_stage(self.model, self.partition[0], feed, self.cache)
        return self.model.run_layers(hidden, self.partition[action.index], position=action.item.position,
                                     cache=self.cache), None

    def _deliver(self, action: schedule.Action, done: tuple, results: dict):
        """`action`'s output onto the next stage's queue, or, from the last stage, into `results`
        as final logits (stage 1's exit logits too); its event."""
        hidden, logits, event = done
        if action.index == 0:
            results["exit_logits"] = logits
        self._waiting.pass_on(action.index, hidden)
        if action.index + 1 == len(self.partition):
            results["final_logits"] = final_logits(self.model, hidden, action.item.kind)
            results["final_position"] = final_position(action.item)
        return event

"""`Waiting`: the hidden states waiting before each stage, beside the schedule's queued items.

Boundary: tensors only, in the order the schedule queued their items (`schedule.Queues` says what
they are); every executor that holds its stages in this process takes a stage's input off here
and queues a stage's output here, so the two stay one rule: an action takes the first `take`
tensors before its stage, merged along positions, and its output waits before the next stage.
"""

from __future__ import annotations

from collections import deque

import torch

from . import schedule


class Waiting:
    """A queue of hidden states before each of the first `held` of `num_stages` stages (stage 1's
    stays empty: its input is the call's feed). The rest wait in the processes that run those
    stages (the K-process kind holds stage 2's only: stage 1's output, until it is sent)."""

    def __init__(self, num_stages: int, held: int | None = None) -> None:
        self._queues: list[deque[torch.Tensor]] = [deque() for _ in range(num_stages if held is None else held)]

    def take(self, action: schedule.Action) -> torch.Tensor | None:
        """`action`'s input, off its stage's queue: its first `take` tensors, merged (None for
        stage 1, and for a stage whose input is held elsewhere)."""
        if action.index == 0 or action.index >= len(self._queues):
            return None
        taken = [self._queues[action.index].popleft() for _ in range(action.take)]
        return taken[0] if len(taken) == 1 else torch.cat(taken, dim=1)

    def head(self, index: int) -> torch.Tensor:
        """What stage `index` takes next, left on its queue."""
        return self._queues[index][0]

    def pass_on(self, index: int, hidden: torch.Tensor, *, copy: bool = False) -> None:
        """Stage `index`'s output onto the next stage's queue (none after the last stage, nor
        before a stage whose input is held elsewhere); a copy
        of it with `copy` (a buffer overwritten before the next stage reads it)."""
        if index + 1 < len(self._queues):
            self._queues[index + 1].append(hidden.clone() if copy else hidden)

    def copied(self) -> "Waiting":
        """The same queues holding copies: what waits then outlives the buffers it was read from."""
        waiting = Waiting(0)
        waiting._queues = [deque(t.clone() for t in queue) for queue in self._queues]
        return waiting


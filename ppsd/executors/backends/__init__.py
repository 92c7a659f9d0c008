"""Step backends: how the graphed and stacked executors launch their steps, one backend per
executor, chosen at construction from the device, so no executor method asks which device it is on.

Boundary: launching, timing and reading back what `ppsd.executors.graphed_steps.StageSteps` and
`ppsd.executors.stacked_step.SlotStep` compute; the schedule, the queues and the `Output`s stay
the executors'. `cpu` runs the steps eagerly on the run's clock or (graphed, `compiled`) compiled
by Inductor, in turn or with stages 2..K on threads of their own; `cuda` captures them as CUDA
graphs and times them with CUDA events (it runs only on a GPU: `tools/device_check.sh`).
"""

from __future__ import annotations

from typing import Protocol

import torch

from ...trace import Stopwatch
from .. import schedule
from ..base import Feed
from ..graphed_steps import Done, Launch
from ..stacked_step import SlotOutput, Span


class StageBackend(Protocol):
    """How a graphed executor's stage steps run: `EagerStages`, `CompiledStages`,
    `CompiledStageThreads` or `CudaGraphStages`."""

    concurrent: bool  # do a slot's stages run at the same time?

    def begin(self, stopwatch: Stopwatch) -> None: ...  # a run starts on this clock
    def end(self) -> None: ...
    def close(self) -> None: ...
    def grown(self) -> None: ...  # the cache was reallocated: drop what was made against it
    def prepare(self, length: int) -> None: ...  # ready for a run writing positions [0, length)
    def ready(self, actions: tuple[schedule.Action, ...]) -> list: ...  # a handle each, before the inputs are set
    def launch(self, work: Launch, feed: Feed | None) -> Done: ...
    def at_once(self, work: list[Launch], feed: Feed | None) -> list[Done]: ...  # a slot's, all ready
    def join(self, done: list[Done]) -> None: ...  # their outputs readable on the caller's side
    def read(self, bests: list[torch.Tensor]) -> list[int]: ...  # the call's one host read
    def times(self, done: Done) -> tuple[float, float]: ...  # on the run's clock


class SlotBackend(Protocol):
    """How a stacked executor's slots run: `EagerSlots` or `CudaGraphSlots`."""

    def begin(self, stopwatch: Stopwatch) -> None: ...
    def close(self) -> None: ...
    def grown(self) -> None: ...
    def launch(self, parity: int, bucket: int, live: tuple[int, ...], draft: bool) -> tuple[SlotOutput, Span]: ...
    def settle(self, parity: int) -> None: ...  # the slot on `parity` is done with its buffers
    def read(self, parity: int, best: torch.Tensor) -> list[int]: ...
    def times(self, span: Span) -> tuple[float, float]: ...

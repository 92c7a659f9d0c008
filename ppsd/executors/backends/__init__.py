"""Step backends: where the runtime's stages run and how a stage's step runs, each a small object
chosen when an executor is built, so no runtime method asks which device it is on.

Boundary: launching, timing and reading back what `ppsd.executors.stage_steps.StageSteps` and
`ppsd.executors.stacked_step.SlotStep` compute; the schedule, the queues, the host lengths and
the `Output`s stay the runtime's (`ppsd.executors.runtime`).

- Where (`Where`): `Clocked` (`cpu`) times each stage on the run's clock, its stages in turn
  (`HERE`) or a slot's on a thread each (`StageThreads`, `stage_threads`); `Streams` (`cuda`) gives
  each stage a CUDA stream, timed by CUDA events, launched from here or from stage threads;
  `ppsd.executors.distributed.pipeline.Workers` sends stages 2..K to worker processes.
- How (`How`): `EagerStep` runs the pure step as it is, `CompiledStep` compiles it with Inductor
  (`cpu`), `CudaGraphStep` captures it once as a CUDA graph and replays it (`cuda`: it runs only
  on a GPU, `tools/device_check.sh`).
- The stacked executor's slots: `EagerSlots` (`cpu`) or `CudaGraphSlots` (`cuda`).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Protocol

import torch

from ...trace import Stopwatch
from .. import schedule
from ..stacked_step import SlotOutput, Span
from ..stage_steps import Done, StepResult


class Job(NamedTuple):
    """One stage's work, ready to start: its `action`, its hidden input (None for stage 1, whose
    token is in the static inputs, and for a stage whose input is in another process) and
    `compute`, which runs its step here."""

    action: schedule.Action
    hidden: torch.Tensor | None
    compute: Callable[[], StepResult]

    @property
    def k(self) -> int:
        return self.action.index


Ran = tuple[StepResult, object, object]  # a step's results and its start and end (floats, or CUDA events)


class Where(Protocol):
    """Where a runtime's stages run, and how their time and their ids are read."""

    concurrent: bool  # do a slot's stages run at the same time?
    # Stages 2..K run in other processes, passing their outputs on themselves: a call's jobs are
    # all launched at once, and the next slot's before this one is read (run-ahead).
    remote: bool

    def begin(self, stopwatch: Stopwatch) -> None: ...  # a run starts on this clock
    def end(self) -> None: ...
    def close(self) -> None: ...
    def launch(self, job: Job) -> Ran: ...  # now, from this thread
    def at_once(self, jobs: list[Job], anywhere: bool) -> list[Ran]: ...  # a slot's; off this thread if `anywhere`
    def join(self, done: list[Done]) -> None: ...  # their outputs readable on the caller's side
    def read(self, bests: list[torch.Tensor]) -> list[int]: ...  # the call's one host read
    def times(self, done: Done) -> tuple[float, float]: ...  # on the run's clock
    def rollback(self, length: int) -> None: ...  # drop what runs elsewhere past `length`


class How(Protocol):
    """How a stage's one-token step runs (a wider piece always runs the step eagerly)."""

    reuses_outputs: bool  # a one-token step's outputs are buffers its next run overwrites

    def close(self) -> None: ...
    def grown(self) -> None: ...  # the cache was reallocated: drop what was made against it
    def prepare(self, length: int) -> None: ...  # ready for a run writing positions [0, length)
    def ready(self, actions: tuple[schedule.Action, ...]) -> None: ...  # before the inputs are set
    def one_token(self, k: int, bucket: int, draft: bool) -> StepResult: ...
    def anywhere(self, actions: tuple[schedule.Action, ...]) -> bool: ...  # may they run off the caller's thread?


class SlotBackend(Protocol):
    """How a stacked executor's slots run: `EagerSlots` or `CudaGraphSlots`."""

    def begin(self, stopwatch: Stopwatch) -> None: ...
    def close(self) -> None: ...
    def grown(self) -> None: ...
    def launch(self, parity: int, bucket: int, live: tuple[int, ...], draft: bool) -> tuple[SlotOutput, Span]: ...
    def settle(self, parity: int) -> None: ...  # the slot on `parity` is done with its buffers
    def read(self, parity: int, best: torch.Tensor) -> list[int]: ...
    def times(self, span: Span) -> tuple[float, float]: ...

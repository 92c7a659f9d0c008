"""The CPU backends: stages timed on the run's clock, in turn or on stage threads; steps eager or
compiled.

Boundary: how a step runs on a CPU and how its ids are read; what a step computes is
`StageSteps`'s and `SlotStep`'s.

- `Clocked` (where) times each stage on the run's clock, in a pool: `HERE` (in turn, the
  in-process kind) or `StageThreads` (a slot's stages 2..K on threads of their own, the threads
  kind, and the compiled steps whose C++ call releases the GIL so the stages really overlap). It
  is also the in-process kind's where on a GPU, timed by a clock that synchronises.
- `EagerStep` (how) runs the pure step as it is; `CompiledStep` compiles each one-token step with
  Inductor's C++ wrapper (on the caller's thread: compiling is not thread-safe).
- `EagerSlots` runs the stacked executor's slots (not faster on a CPU: it is bandwidth-bound, and
  stacking adds no bandwidth).

What Inductor compiles is kept on disk beside the converted models and checked before use
(`ppsd.compile_cache`): a new process loads it instead of compiling again.
"""

from __future__ import annotations

import torch

from ...kept_steps import KeptSteps
from ...static_cache import bucket_for
from ...trace import Stopwatch
from .. import schedule
from ..stacked_step import SlotOutput, SlotStep, Span
from ..stage_steps import Done, StageSteps, StepResult
from . import Job, Ran
from .stage_threads import HERE, Here, OnPool, StageThreads


class Clocked(OnPool):
    """Each stage timed on the run's clock where it ran: in `pool`'s order on the caller's thread
    (`HERE`), or a slot's stages 2..K on stage threads (`StageThreads`)."""

    def __init__(self, clock: Stopwatch, pool: Here | StageThreads = HERE) -> None:
        self.clock, self.pool = clock, pool
        self.concurrent = pool.concurrent

    def begin(self, stopwatch: Stopwatch) -> None:
        self.clock = stopwatch
        self.pool.begin()

    def launch(self, job: Job) -> Ran:
        start = self.clock.now()
        out = job.compute()
        return out, start, self.clock.now()

    def join(self, done: list[Done]) -> None:
        pass  # a CPU step is done when it returns

    def read(self, bests: list[torch.Tensor]) -> list[int]:
        return torch.cat(bests).tolist() if bests else []

    def times(self, done: Done) -> tuple[float, float]:
        return done.start, done.end


class EagerStep:
    """The pure step as it is: each op dispatched from Python (the tests' fast path)."""

    reuses_outputs = False

    def __init__(self, steps: StageSteps) -> None:
        self.steps = steps

    def close(self) -> None:
        pass

    def grown(self) -> None:
        pass  # nothing was made against the old buffers

    def prepare(self, length: int) -> None:
        pass  # nothing to capture; compiled steps compile on first use (minutes each): only what runs

    def ready(self, actions: tuple[schedule.Action, ...]) -> None:
        pass

    def one_token(self, k: int, bucket: int, draft: bool) -> StepResult:
        return self.steps.static_step(k, bucket, draft)

    def anywhere(self, actions: tuple[schedule.Action, ...]) -> bool:
        return True


class CompiledStep(EagerStep):
    """The one-token steps compiled by Inductor with its C++ wrapper (each then runs as one C++
    call, without the GIL)."""

    def __init__(self, steps: StageSteps) -> None:
        super().__init__(steps)
        self.compiled_keys: set[tuple[int, int, bool]] = set()
        _configure_compiler()

    def one_token(self, k: int, bucket: int, draft: bool) -> StepResult:
        """Compiled on first use of each (stage, bucket, drafting), which takes up to a minute or two
        each on a small CPU with a cold compiler cache, and kept whole: a new process loads it
        (`ppsd.kept_steps`)."""
        out = _COMPILED_STEP(self.steps, k, bucket, draft, shape_key=self.steps.shape_key())
        self.compiled_keys.add((k, bucket, draft))
        return out

    def anywhere(self, actions: tuple[schedule.Action, ...]) -> bool:
        """Only once every step is compiled: a step compiled now compiles on the caller's thread."""
        return all(a.item.width > 1 or (a.index, bucket_for(a.item.position + 1), a.kind == "draft")
                   in self.compiled_keys for a in actions)


def _configure_compiler() -> None:
    from ... import compile_cache

    compile_cache.use()  # torch keeps what it compiles beside the converted models, checked
    # Set for the whole process, once: the compiler's settings are part of what a compiled
    # step is checked against before each call, so switching them per call recompiles.
    torch._inductor.config.cpp_wrapper = True
    # Each (stage, bucket, drafting, buffer size, thread count) is a compile of its own: a
    # server's Runs of many lengths add up (64 was reached within a few page Runs).
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 256)


_COMPILED_STEP = KeptSteps(StageSteps.static_step)


class EagerSlots:
    """The stacked executor's slots run now, timed on the run's clock; its ids read as they are."""

    def __init__(self, step: SlotStep, clock: Stopwatch) -> None:
        self.step, self.clock = step, clock

    def begin(self, stopwatch: Stopwatch) -> None:
        self.clock = stopwatch

    def close(self) -> None:
        pass

    def grown(self) -> None:
        pass  # nothing was made against the old cache

    def launch(self, parity: int, bucket: int, live: tuple[int, ...], draft: bool) -> tuple[SlotOutput, Span]:
        start = self.clock.now()
        out = self.step.run(parity, bucket, live, draft)
        return out, Span(start, self.clock.now())

    def settle(self, parity: int) -> None:
        pass  # a slot run here is done when `launch` returns

    def read(self, parity: int, best: torch.Tensor) -> list[int]:
        return best.tolist()

    def times(self, span: Span) -> tuple[float, float]:
        return span

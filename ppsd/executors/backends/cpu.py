"""The CPU backends: steps run eagerly, timed on the run's clock, or (graphed) compiled.

Boundary: how a step runs on a CPU and how its ids are read; what a step computes is
`StageSteps`'s and `SlotStep`'s.

- `EagerStages` runs the graphed executor's steps in turn (the tests' fast path: PPSD's overlap
  is then projected, as in process).
- `CompiledStages` compiles each one-token step with Inductor's C++ wrapper and runs them in turn;
  `CompiledStageThreads` runs a slot's stages 2..K on threads of their own (the C++ call releases
  the GIL, so the stages overlap).
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
from ..base import Feed
from ..graphed_steps import Done, Launch, StageSteps, StepResult
from ..stacked_step import SlotOutput, SlotStep, Span
from ..threads import StageThreads


class EagerStages:
    """The graphed executor's steps run now, in turn, on the caller's thread."""

    concurrent = False

    def __init__(self, steps: StageSteps, clock: Stopwatch) -> None:
        self.steps, self.clock = steps, clock

    def begin(self, stopwatch: Stopwatch) -> None:
        self.clock = stopwatch

    def end(self) -> None:
        pass

    def close(self) -> None:
        pass

    def grown(self) -> None:
        pass  # nothing was made against the old buffers

    def prepare(self, length: int) -> None:
        pass  # nothing to capture; compiled steps compile on first use (minutes each): only what runs

    def ready(self, actions: tuple[schedule.Action, ...]) -> list[None]:
        return [None] * len(actions)

    def launch(self, work: Launch, feed: Feed | None) -> Done:
        """`work`'s step, done when this returns, timed on the run's clock."""
        start = self.clock.now()
        out = self.steps.run_now(work.action, work.hidden, feed, self.one_token)
        return Done(work.action, *out, start, self.clock.now())

    def one_token(self, k: int, bucket: int, draft: bool) -> StepResult:
        return self.steps.static_step(k, bucket, draft)

    def at_once(self, work: list[Launch], feed: Feed | None) -> list[Done]:
        """A slot's actions, in turn, here."""
        return [self.launch(w, feed) for w in work]

    def join(self, done: list[Done]) -> None:
        pass  # a CPU step is done when it returns

    def read(self, bests: list[torch.Tensor]) -> list[int]:
        return torch.cat(bests).tolist() if bests else []

    def times(self, done: Done) -> tuple[float, float]:
        return done.start, done.end


class CompiledStages(EagerStages):
    """The one-token steps compiled by Inductor with its C++ wrapper (each then runs as one C++
    call, without the GIL), in turn on the caller's thread with its torch threads (AR alone: one
    stage at a time, every core on it)."""

    def __init__(self, steps: StageSteps, clock: Stopwatch) -> None:
        super().__init__(steps, clock)
        self.compiled_keys: set[tuple[int, int, bool]] = set()
        _configure_compiler()

    def one_token(self, k: int, bucket: int, draft: bool) -> StepResult:
        """Compiled on first use of each (stage, bucket, drafting), on the caller's thread
        (compiling is not thread-safe), which takes up to a minute or two each on a small CPU
        with a cold compiler cache, and kept whole: a new process loads it (`ppsd.kept_steps`)."""
        out = _COMPILED_STEP(self.steps, k, bucket, draft, shape_key=self.steps.shape_key())
        self.compiled_keys.add((k, bucket, draft))
        return out

    def compiled_already(self, action: schedule.Action) -> bool:
        return action.item.width > 1 or (action.index, bucket_for(action.item.position + 1),
                                          action.kind == "draft") in self.compiled_keys


class CompiledStageThreads(CompiledStages):
    """The compiled steps with a slot's stages 2..K on threads of their own (`StageThreads`), at
    once with stage 1 on the caller's."""

    concurrent = True

    def __init__(self, steps: StageSteps, clock: Stopwatch, threads: StageThreads) -> None:
        super().__init__(steps, clock)
        self.threads = threads

    def begin(self, stopwatch: Stopwatch) -> None:
        self.threads.begin()
        super().begin(stopwatch)

    def end(self) -> None:
        self.threads.end()

    def close(self) -> None:
        self.threads.close()

    def at_once(self, work: list[Launch], feed: Feed | None) -> list[Done]:
        """On the stage threads once every step is compiled; a step compiled now compiles here."""
        if not all(self.compiled_already(w.action) for w in work):
            return super().at_once(work, feed)
        running = {i: self.threads.submit(w.action.index, self.launch, w, feed)
                   for i, w in enumerate(work) if w.action.index > 0}
        here = {i: self.launch(w, feed) for i, w in enumerate(work) if i not in running}
        return [here[i] if i in here else running[i].result() for i in range(len(work))]


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

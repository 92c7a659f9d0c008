"""Entry point of the library: run a decoder on a prompt and keep its full record.

`stream` yields the decoder's steps live (for UIs); `generate` runs to the end and returns a
`Result` with tokens, drafts, trace and metrics. Both set the run up first (`ppsd.setup`);
`decode` takes a `RunSetup` an entry point made once (`RunSetup.steps` is its live form). Token ids in, token ids
out: tokenizers stay with the caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Iterator


from .config import DecodeConfig
from .executors import Executor, InProcessExecutor
from .metrics import Metrics, exit_fraction, summarize
from .model import StagedModel
from .setup import RunSetup, device_sync, set_up
from .steps import Draft, Recorder, Step, Token
from .trace import Stopwatch, Trace


@dataclass(frozen=True)
class Result:
    """Everything one run produced. `trace` is on the clock the executor measured."""

    prompt_ids: tuple[int, ...]
    tokens: tuple[Token, ...]
    drafts: tuple[Draft, ...]
    trace: Trace
    config: DecodeConfig
    measured_wall_seconds: float

    @property
    def token_ids(self) -> list[int]:
        return [t.id for t in self.tokens]

    def metrics(self, clock: str | None = None) -> Metrics:
        """Metrics on `clock` (default: projected for in-process PPSD, else what was measured)."""
        trace = self._on(clock)
        return summarize(
            method=self.config.method, tokens=list(self.tokens), drafts=list(self.drafts), trace=trace,
            measured_wall_seconds=self.measured_wall_seconds, draft_len=self.config.draft_len,
            exit_fraction=exit_fraction(trace.partition),
        )

    def wall(self, clock: str | None = None) -> float:
        """Seconds of the run on `clock`: `metrics(clock).wall_seconds` without the rest."""
        return self._on(clock).wall(self.measured_wall_seconds)

    def _on(self, clock: str | None) -> Trace:
        """The trace on `clock` (None: projected for in-process PPSD, else the one measured)."""
        trace = self.trace
        if clock is None:
            serial_ppsd = self.config.method == "ppsd" and not trace.concurrent
            clock = "projected" if serial_ppsd else trace.clock
        if clock == "projected" and trace.clock == "measured":
            return trace.project()
        if clock != trace.clock:
            raise ValueError(f"a {trace.clock} trace cannot be shown on the {clock} clock")
        return trace


@dataclass
class Recording:
    """One run's steps, folded as they come (`add`), its measured trace so far (`trace`), and its
    validated `Result` once it has ended (`finish`): the one way a run ends, for `generate` and
    for live front ends alike."""

    prompt_ids: tuple[int, ...]
    config: DecodeConfig
    partition: tuple[range, ...]
    device: str
    concurrent: bool = False  # the stages ran at once (K processes): the measured trace shows overlap
    recorder: Recorder = field(default_factory=Recorder)

    def add(self, step: Step) -> None:
        self.recorder.add(step)

    def trace(self) -> Trace:
        """The measured trace of the steps so far (validated by `finish`, once the run is whole)."""
        r = self.recorder
        return Trace(events=tuple(r.events), partition=self.partition, prompt_len=len(self.prompt_ids),
                     length=len(self.prompt_ids) + len(r.tokens), clock="measured", device=self.device,
                     concurrent=self.concurrent)

    def finish(self, measured_wall_seconds: float) -> Result:
        """The run's `Result`, its trace validated (ValueError names a broken trace invariant)."""
        r = self.recorder
        return Result(self.prompt_ids, tuple(r.tokens), tuple(r.drafts), self.trace().validate(), self.config,
                      measured_wall_seconds)


def stream(model: StagedModel, prompt_ids: list[int], config: DecodeConfig | None = None, *,
           executor: Executor | None = None, stopwatch: Stopwatch | None = None) -> Iterator[Step]:
    """Set up the run (`ppsd.setup.set_up`: the model's default E and exit head when not given),
    then yield its steps live."""
    yield from set_up(model, config, prompt_ids=prompt_ids).steps(executor=executor, stopwatch=stopwatch)


def generate(model: StagedModel, prompt_ids: list[int], config: DecodeConfig | None = None, *,
             executor: Executor | None = None, stopwatch: Stopwatch | None = None) -> Result:
    """Set up the run (`ppsd.setup.set_up`) and run it to the end; the returned trace is validated."""
    return decode(set_up(model, config, prompt_ids=prompt_ids), executor=executor, stopwatch=stopwatch)


def decode(setup: RunSetup, *, executor: Executor | None = None, stopwatch: Stopwatch | None = None) -> Result:
    """Run a run already set up to the end; the returned trace is validated."""
    stopwatch = stopwatch or Stopwatch(device_sync(setup.model))
    executor = executor or InProcessExecutor(setup.model, setup.partition, stopwatch)
    recording = Recording(setup.prompt_ids, setup.config, executor.partition, executor.device, executor.concurrent)
    started = time.perf_counter()
    for step in setup.steps(executor=executor, stopwatch=stopwatch):
        recording.add(step)
    return recording.finish(time.perf_counter() - started)


WARMUP_TOKENS = 4


def warm_up(model: StagedModel, prompt_ids: list[int], config: DecodeConfig = DecodeConfig(), *,
            executor: Executor | None = None) -> None:
    """A few untimed tokens of every method (on `executor` when given), so lazy initialisation
    (kernels, allocator, first calls and messages) does not land in the first timed run."""
    for method in ("ar", "ppsd", "eesd"):
        generate(model, prompt_ids, replace(config, method=method, max_new_tokens=WARMUP_TOKENS), executor=executor)

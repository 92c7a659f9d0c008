"""Entry point of the library: run a decoder on a prompt and keep its full record.

`stream` yields the decoder's steps live (for UIs); `generate` runs to the end and returns a
`Result` with tokens, drafts, trace and metrics. Token ids in, token ids out: tokenizers stay
with the caller.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from .config import DecodeConfig
from .decoders import DECODERS
from .executors import Executor, InProcessExecutor
from .metrics import Metrics, summarize
from .model import StagedModel
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
        trace = self.trace
        if clock is None:
            serial_ppsd = self.config.method == "ppsd" and not trace.concurrent
            clock = "projected" if serial_ppsd else trace.clock
        if clock == "projected" and trace.clock == "measured":
            trace = trace.project()
        elif clock != trace.clock:
            raise ValueError(f"a {trace.clock} trace cannot be shown on the {clock} clock")
        return summarize(
            method=self.config.method, tokens=list(self.tokens), drafts=list(self.drafts), trace=trace,
            measured_wall_seconds=self.measured_wall_seconds, draft_len=self.config.draft_len,
            exit_fraction=self.config.exit_layer / trace.num_layers,
        )


@dataclass
class Recording:
    """One run's steps, folded as they come (`add`), its measured trace so far (`trace`), and its
    validated `Result` once it has ended (`finish`): the one way a run ends, for `generate` and
    for live front ends alike."""

    prompt_ids: tuple[int, ...]
    config: DecodeConfig
    stages: tuple[range, ...]
    device: str
    concurrent: bool = False  # the stages ran at once (K processes): the measured trace shows overlap
    recorder: Recorder = field(default_factory=Recorder)

    def add(self, step: Step) -> None:
        self.recorder.add(step)

    def trace(self) -> Trace:
        """The measured trace of the steps so far (validated by `finish`, once the run is whole)."""
        r = self.recorder
        return Trace(events=tuple(r.events), stages=self.stages, prompt_len=len(self.prompt_ids),
                     length=len(self.prompt_ids) + len(r.tokens), clock="measured", device=self.device,
                     concurrent=self.concurrent)

    def finish(self, measured_wall_seconds: float) -> Result:
        """The run's `Result`, its trace validated (ValueError names a broken trace invariant)."""
        r = self.recorder
        return Result(self.prompt_ids, tuple(r.tokens), tuple(r.drafts), self.trace().validate(), self.config,
                      measured_wall_seconds)


def check_prompt(model: StagedModel, prompt_ids: list[int], config: DecodeConfig) -> None:
    """Raise ValueError when the prompt is empty or prompt plus output exceeds the context."""
    if not prompt_ids:
        raise ValueError("prompt is empty: give at least one token of text")
    room = model.info.max_context - config.max_new_tokens
    if len(prompt_ids) > room:
        raise ValueError(
            f"prompt of {len(prompt_ids)} tokens is too long: with max_new_tokens={config.max_new_tokens} "
            f"the model's context of {model.info.max_context} allows at most {max(room, 0)}"
        )


def stream(model: StagedModel, prompt_ids: list[int], config: DecodeConfig, *,
           executor: Executor | None = None, stopwatch: Stopwatch | None = None) -> Iterator[Step]:
    """Validate, then yield the steps of `config.method` on `prompt_ids`, live."""
    config = config.resolved(model.num_layers)
    check_prompt(model, prompt_ids, config)
    stopwatch = stopwatch or _stopwatch(model)
    executor = executor or InProcessExecutor.for_config(model, config, stopwatch)
    executor.begin(stopwatch)
    try:
        yield from _inference_mode(DECODERS[config.method](executor, list(prompt_ids), config,
                                                           model.info.eos_token_ids))
    finally:
        executor.end()


def _inference_mode(steps: Iterator[Step]) -> Iterator[Step]:
    """`steps`, each resumed inside `torch.inference_mode()`. The mode is per thread, and a
    server (Gradio) may resume a generator on a different thread each time, so one `with` around
    the whole loop would leave later resumptions outside it (the KV cache, made of inference
    tensors, then refuses in-place updates)."""
    try:
        while True:
            with torch.inference_mode():
                try:
                    step = next(steps)
                except StopIteration:
                    return
            yield step
    finally:
        with torch.inference_mode():
            steps.close()


def generate(model: StagedModel, prompt_ids: list[int], config: DecodeConfig, *,
             executor: Executor | None = None, stopwatch: Stopwatch | None = None) -> Result:
    """Run to the end; the returned trace is validated."""
    config = config.resolved(model.num_layers)
    stopwatch = stopwatch or _stopwatch(model)
    executor = executor or InProcessExecutor.for_config(model, config, stopwatch)
    recording = Recording(tuple(prompt_ids), config, executor.stages, executor.device, executor.concurrent)
    started = time.perf_counter()
    for step in stream(model, prompt_ids, config, executor=executor, stopwatch=stopwatch):
        recording.add(step)
    return recording.finish(time.perf_counter() - started)


def device_sync(model: StagedModel) -> Callable[[], None] | None:
    """What a stopwatch on `model`'s device waits for before it reads the time: CUDA kernels run
    asynchronously, so without it a stamp would time their launch, not their work."""
    return torch.cuda.synchronize if model.info.device.startswith("cuda") else None


def _stopwatch(model: StagedModel) -> Stopwatch:
    return Stopwatch(device_sync(model))

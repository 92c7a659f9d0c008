"""Run orchestration over the library: load models once (lazily, cached by name), then decode
one prompt with AR, PPSD and optionally EESD one after another, yielding snapshots for the UI at
a throttled rate. Each method runs either in this process (stages in turn; the page shows the
projected clock) or on K worker processes, one per stage (`ppsd.distributed`; the page shows the
measured clock), started once and reused, closed on Stop and on error.

Timing covers the decoder alone: the stopwatch that stamps the trace is paused while a snapshot
is handed to the UI, so rendering never leaks into a method's wall time or its trace. No Gradio
and no HTML here; tensors stay inside `ppsd`.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable, Iterator

import ppsd
from ppsd import DecodeConfig, Recorder, Result, StagedModel, Trace
from ppsd.chat import encode_prompt, has_chat_template
from ppsd.distributed import DistributedExecutor, PipelineError, make_executor
from ppsd.generate import check_prompt
from ppsd.heads import HeadChoice, choose_exit_head
from ppsd.model_source import Progress
from ppsd.pipeline_wire import usable_cores
from ppsd.trace import Stopwatch

THROTTLE_SECONDS = 0.25  # live UI refresh period; the final snapshot always follows
WARMUP_TOKENS = 4

_counts = {"open": 0, "finished": 0}  # decoders open now; comparisons run to the end
_counts_lock = threading.Lock()


def active_decodes() -> int:
    """How many decoders are open right now: Stop must bring this back to 0."""
    return _counts["open"]


def finished_runs() -> int:
    """How many comparisons ran to their end in this process (a stopped one does not count)."""
    return _counts["finished"]


def _count(key: str, delta: int) -> None:
    with _counts_lock:
        _counts[key] += delta


class PausableStopwatch(Stopwatch):
    """A `ppsd.trace.Stopwatch` that does not count the time spent paused (handing snapshots to
    the UI). Stamps taken by pipeline workers during a pause (run-ahead work) read as the pause's
    start: the clock is stopped, whoever reads it."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        super().__init__(sync)
        self._pauses: list[tuple[float, float]] = []  # (start, end) in perf_counter time
        self._paused_at: float | None = None

    def at(self, t: float) -> float:
        pauses = self._pauses + ([(self._paused_at, float("inf"))] if self._paused_at is not None else [])
        return super().at(t) - sum(max(0.0, min(t, end) - start) for start, end in pauses)

    def pause(self) -> None:
        if self._paused_at is None:
            self._paused_at = time.perf_counter()

    def resume(self) -> None:
        if self._paused_at is not None:
            self._pauses.append((self._paused_at, time.perf_counter()))
            self._paused_at = None


@dataclass(frozen=True)
class Loaded:
    """A loaded model with its tokenizer; `piece` renders one token id as display text."""

    name: str
    model: StagedModel
    tokenizer: object
    load_seconds: float

    def encode(self, text: str, *, chat: bool = False) -> list[int]:
        """Token ids of `text`: a chat user turn when `chat`, else raw text."""
        return encode_prompt(self.tokenizer, text, chat=chat)

    @property
    def chat(self) -> bool:
        """Has the model a chat template (an instruct model)?"""
        return has_chat_template(self.tokenizer)

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens (a chat model's end-of-turn) left out."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @property
    def piece(self) -> Callable[[int], str]:
        return _piece_function(self.tokenizer)


@lru_cache(maxsize=8)
def _piece_function(tokenizer) -> Callable[[int], str]:
    # SentencePiece tokenizers drop a token's leading space when it is decoded alone; decoding it
    # after a fixed anchor token and cutting the anchor off keeps the space.
    anchor = tokenizer("a", add_special_tokens=False)["input_ids"][-1:] or []
    anchor_text = tokenizer.decode(anchor) if anchor else ""

    @lru_cache(maxsize=65536)
    def piece(token_id: int) -> str:
        both = tokenizer.decode(anchor + [token_id])
        if anchor and both.startswith(anchor_text):
            return both[len(anchor_text):]
        return tokenizer.decode([token_id])

    return piece


class ModelCache:
    """Models by name, loaded on first use and kept; a failed load leaves the cache unchanged."""

    def __init__(self, *, device: str | None = "auto",
                 loader: Callable[..., tuple[StagedModel, object]] = ppsd.load_model) -> None:
        self._device = device
        self._loader = loader
        self._models: dict[str, Loaded] = {}
        self._heads: dict[tuple[str, str, int], object] = {}
        self._lock = threading.Lock()

    def __contains__(self, name: str) -> bool:
        return name.strip() in self._models

    def __len__(self) -> int:
        return len(self._models)

    def names(self) -> list[str]:
        return list(self._models)

    def exit_head(self, spec: str, loaded: "Loaded", exit_layer: int) -> HeadChoice:
        """The exit head `spec` names for `loaded` at `exit_layer` ("" or "auto": the shipped one
        when it fits, else shared), loaded once; ValueError when a given head was made for
        another model or another E (`ppsd.heads.load_exit_head` says which)."""
        key = (spec.strip(), loaded.name, exit_layer)
        with self._lock:
            if key not in self._heads:
                self._heads[key] = choose_exit_head(loaded.model, exit_layer, key[0])
            return self._heads[key]

    def get(self, name: str, *, progress: Progress | None = None) -> Loaded:
        """The loaded model `name`, loading and warming it up on first use (ValueError if it
        cannot be loaded); `progress` hears of a first-use download or conversion."""
        name = name.strip()
        if not name:
            raise ValueError("model name is empty: give a local directory or a Hugging Face hub id")
        with self._lock:
            if name not in self._models:
                started = time.perf_counter()
                model, tokenizer = self._loader(name, device=self._device, progress=progress)
                loaded = Loaded(name, model, tokenizer, time.perf_counter() - started)
                warm_up(model, loaded.encode("Hello") or [0])
                self._models[name] = loaded
            return self._models[name]


def warm_up(model: StagedModel, prompt_ids: list[int], config: DecodeConfig = DecodeConfig(), *,
            executor: DistributedExecutor | None = None) -> None:
    """A few untimed tokens of every method (on `executor` when given), so lazy initialisation
    (kernels, allocator, first calls and messages) does not land in AR's timing, which runs first."""
    for method in ("ar", "ppsd", "eesd"):
        ppsd.generate(model, prompt_ids, replace(config, method=method, max_new_tokens=WARMUP_TOKENS),
                      executor=executor)


@dataclass(frozen=True)
class RunRequest:
    """What the user asked for; `exit_layer` None means balanced (E = L/K)."""

    prompt: str
    model: str = ppsd.DEFAULT_MODEL
    exit_layer: int | None = None
    stages: int = 2
    eesd: bool = False
    draft_len: int = 4
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    exit_head: str = ""  # "" or "auto": the shipped head if one fits; "shared"; or a train-head directory
    workers: bool = False  # K worker processes, one per stage (measured), instead of one process (projected)
    chat: bool = True  # the prompt as a chat user turn (when the model has a template), else raw text

    @property
    def methods(self) -> tuple[str, ...]:
        return ("ar", "ppsd", "eesd") if self.eesd else ("ar", "ppsd")

    def config(self, method: str, num_layers: int) -> DecodeConfig:
        """The validated config of `method` (ValueError names the bad value)."""
        return DecodeConfig(
            method=method, exit_layer=self.exit_layer, stages=int(self.stages), draft_len=int(self.draft_len),
            max_new_tokens=int(self.max_new_tokens), temperature=float(self.temperature),
            top_p=float(self.top_p), seed=int(self.seed),
        ).resolved(num_layers)


@dataclass
class MethodRun:
    """One method's run, live: the folded steps so far, and the Result once it has finished."""

    method: str
    config: DecodeConfig
    stages: tuple[range, ...]
    prompt_ids: tuple[int, ...]
    device: str
    concurrent: bool = False  # ran on K worker processes: the measured trace shows real overlap
    recorder: Recorder = field(default_factory=Recorder)
    result: Result | None = None

    @property
    def done(self) -> bool:
        return self.result is not None

    def trace(self) -> Trace:
        """The measured trace so far (the final validated one once done)."""
        if self.result is not None:
            return self.result.trace
        return Trace(events=tuple(self.recorder.events), stages=self.stages, prompt_len=len(self.prompt_ids),
                     length=len(self.prompt_ids) + len(self.recorder.tokens), clock="measured",
                     device=self.device, concurrent=self.concurrent)

    def projected(self) -> Trace:
        return self.trace().project()

    def shown(self) -> Trace:
        """The trace the page plots: measured when the stages really ran at once, else projected."""
        return self.trace() if self.concurrent else self.projected()


@dataclass
class Snapshot:
    """The state of a comparison handed to the UI: every method run so far, the active one."""

    request: RunRequest
    loaded: Loaded
    runs: dict[str, MethodRun]
    active: str | None
    done: bool = False
    head: str = "shared"  # which exit head drafted, in words

    @property
    def stages(self) -> int:
        return int(self.request.stages)

    @property
    def device(self) -> str:
        return self.loaded.model.info.device

    @property
    def concurrent(self) -> bool:
        """Did (do) the methods run on K worker processes?"""
        return self.request.workers


def run_comparison(request: RunRequest, cache: ModelCache, *,
                   throttle: float = THROTTLE_SECONDS) -> Iterator[Snapshot]:
    """Validate everything first, then run AR, PPSD (and EESD) in turn, yielding snapshots at
    most every `throttle` seconds of wall time and once when each method finishes."""
    if not request.prompt.strip():
        raise ValueError("prompt is empty: type some text for the model to continue")
    loaded = cache.get(request.model)
    model = loaded.model
    configs = {m: request.config(m, model.num_layers) for m in request.methods}
    head = cache.exit_head(request.exit_head, loaded, configs["ar"].exit_layer)
    model = model.with_exit_head(head.head)
    prompt_ids = loaded.encode(request.prompt, chat=request.chat and loaded.chat)
    check_prompt(model, prompt_ids, configs["ar"])
    stages = ppsd.stage_layers(model.num_layers, configs["ar"].exit_layer, configs["ar"].stages)
    runs: dict[str, MethodRun] = {}
    snapshot = Snapshot(request, loaded, runs, active=None, head=head.label)
    pipeline = None
    if request.workers:
        snapshot.active = "workers"
        yield snapshot  # starting K processes takes seconds: say so first
        pipeline = start_pipeline(model, configs["ar"])
    for method, config in configs.items():
        run = MethodRun(method, config, stages, tuple(prompt_ids), model.info.device, concurrent=pipeline is not None)
        runs[method] = run
        snapshot.active = method
        yield snapshot
        yield from _decode(run, model, snapshot, throttle, pipeline)
    snapshot.active, snapshot.done = None, True
    _count("finished", +1)
    yield snapshot


def workers_available(stages: int, device: str) -> str | None:
    """None when K worker processes can run here, else why not (shown to the user)."""
    if device.startswith("cuda"):
        if importlib.util.find_spec("spaces") is None:
            return None
        # ZeroGPU lends the GPU to one function call of one process, not to worker processes.
        return "on ZeroGPU the GPU is lent to one process for one call: worker processes cannot share it"
    cores = usable_cores()
    if cores < stages:
        return (f"K = {stages} worker processes need {stages} CPU cores, one each; this machine gives "
                f"{cores}: lower K, or run in one process (projected clock)")
    return None


def start_pipeline(model: StagedModel, config: DecodeConfig) -> DistributedExecutor:
    """The process's K-worker pipeline for `model` and `config`'s stages (started and warmed up
    untimed on first use, reused while the settings match). ValueError says why it cannot run."""
    reason = workers_available(config.stages, model.info.device)
    if reason is not None:
        raise ValueError(reason)
    try:
        pipeline = make_executor(model, config)
        if pipeline.runs == 0:
            with pipeline.lock:
                warm_up(model, [0], config, executor=pipeline)
    except PipelineError as error:
        raise ValueError(f"the worker processes failed: {error}") from None
    return pipeline


def _decode(run: MethodRun, model: StagedModel, snapshot: Snapshot, throttle: float,
            pipeline: DistributedExecutor | None = None) -> Iterator[Snapshot]:
    sync = None
    if model.info.device.startswith("cuda"):
        import torch

        sync = torch.cuda.synchronize
    stopwatch = PausableStopwatch(sync)
    if pipeline is not None and not pipeline.lock.acquire(timeout=pipeline.spec.timeout):
        raise ValueError("the worker processes are busy with another run: try again in a moment")
    steps = ppsd.stream(model, list(run.prompt_ids), run.config, stopwatch=stopwatch, executor=pipeline)
    shown = time.perf_counter()
    finished = False
    _count("open", +1)
    try:
        for step in steps:
            run.recorder.add(step)
            if time.perf_counter() - shown >= throttle:
                stopwatch.pause()  # the UI's time is not the decoder's
                yield snapshot
                stopwatch.resume()
                shown = time.perf_counter()
        wall = stopwatch.now()
        finished = True
    except PipelineError as error:
        raise ValueError(f"the worker processes failed and were shut down: {error}") from None
    finally:
        steps.close()  # Stop: close the decoder now, not when the garbage collector gets to it
        if pipeline is not None:
            if not finished:
                pipeline.close()  # Stop or error: the workers go too (a new run starts fresh ones)
            pipeline.lock.release()
        _count("open", -1)
    run.result = Result(run.prompt_ids, tuple(run.recorder.tokens), tuple(run.recorder.drafts),
                        run.trace().validate(), run.config, wall)
    yield snapshot

"""One place that turns a request into a ready run: the model drafting with its exit head, the
prompt's token ids and a resolved config. `generate`, the CLI, the page and both benches set up
their runs here, so the library's defaults are the demo's; `RunSetup.steps` starts the run's
decoder on an executor, so a front end goes from its button to the decoder through here.

Boundary: settings and names in, a `RunSetup` out, and its steps; what a run's steps add up to
(its `Result`, its metrics) is `ppsd.generate`'s.

Defaults, said in `RunSetup.head`: with no E given and the "auto" head, a run drafts with the
shipped head for these weights and K at its E (chosen by measured speed); when no shipped head
fits, with the model's own norm + LM head (the shared head) at the balanced E = L/K.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, replace
from typing import Callable, Iterator

import torch

from .chat import EMPTY_PROMPT, check_text, encode_prompt, use_chat
from .config import DecodeConfig, balanced_exit_layer, stage_bounds, stage_layers
from .decoders import DECODERS
from .executors import Executor, InProcessExecutor
from .heads.shipped import AUTO_HEAD, HeadChoice, choose_exit_head, default_exit_layer
from .model import StagedModel
from .steps import Step
from .trace import Stopwatch


@dataclass(frozen=True)
class RunSetup:
    """A run ready to decode. `config` is resolved against `model`, whose exit head is the one
    `head` names; `prompt_ids` are checked against the context (empty when set up without one)."""

    model: StagedModel
    config: DecodeConfig
    head: str
    prompt_ids: tuple[int, ...] = ()
    chat: bool = False

    @property
    def partition(self) -> tuple[range, ...]:
        """The layers of each stage, stage 1 first."""
        return stage_layers(self.model.num_layers, self.config.exit_layer, self.config.num_stages)

    def with_method(self, method: str) -> "RunSetup":
        """The same run with another decoder (every other setting, already checked, kept)."""
        return replace(self, config=replace(self.config, method=method))

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The token ids that end a run before `max_new_tokens`: the model's EOS."""
        return self.model.info.eos_token_ids

    def steps(self, *, executor: Executor | None = None, stopwatch: Stopwatch | None = None) -> Iterator[Step]:
        """The run's steps, live, from its decoder on `executor` (default: in process)."""
        stopwatch = stopwatch or Stopwatch(device_sync(self.model))
        executor = executor or InProcessExecutor(self.model, self.partition, stopwatch)
        executor.begin(stopwatch)
        try:
            yield from _inference_mode(DECODERS[self.config.method](
                executor, list(self.prompt_ids), self.config, self.stop_ids))
        finally:
            executor.end()


def device_sync(model: StagedModel) -> Callable[[], None] | None:
    """What a stopwatch on `model`'s device waits for before it reads the time: CUDA kernels run
    asynchronously, so without it a stamp would time their launch, not their work."""
    return torch.cuda.synchronize if model.info.device.startswith("cuda") else None


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


def resolve_config(model_name: str, num_layers: int, config: DecodeConfig) -> DecodeConfig:
    """`config` checked against a model of `num_layers` layers, with E filled when it is None: the
    shipped head's E for `model_name` and K, else L/K (ValueError names a bad value). Needs no
    weights, so an entry point can refuse bad settings before it loads any."""
    if config.exit_layer is None and config.num_stages in stage_bounds(num_layers)[1]:
        config = replace(config, exit_layer=default_exit_layer(model_name, num_layers, config.num_stages))
    return config.resolved(num_layers)


def set_up(model: StagedModel, config: DecodeConfig | None = None, *, exit_head: str | None = None,
           prompt_ids: list[int] | tuple[int, ...] | None = None, chat: bool = False) -> RunSetup:
    """The run `config` asks for on `model` (default: PPSD, K = 2, the model's default E).

    `exit_head`: "auto" (the shipped head for these weights and E when there is one, else shared),
    "shared", or a `train-head` directory. Left None, a head already given to `model`
    (`with_exit_head`) is kept, and a bare model gets "auto". With no E given and no shipped head
    fitting the weights, E falls back to the balanced L/K. ValueError names what is wrong.
    """
    config = config or DecodeConfig()
    if exit_head is None and model.exit_head_given:
        resolved, head = resolve_config(model.info.name, model.num_layers, config), "given to the model"
    else:
        resolved, choice = _resolve_with_head(model, config, exit_head or AUTO_HEAD)
        model, head = model.with_exit_head(choice.head), choice.label
    ids = tuple(prompt_ids) if prompt_ids is not None else ()
    if prompt_ids is not None:
        check_prompt_length(len(ids), model.info.max_context, resolved.max_new_tokens)
    return RunSetup(model, resolved, head, ids, chat)


def set_up_text(model: StagedModel, tokenizer, text: str, config: DecodeConfig | None = None, *,
                exit_head: str | None = None, chat: bool | None = None) -> RunSetup:
    """`set_up` for a prompt given as text: a chat user turn when `chat` (default: whenever the
    tokenizer has a chat template), else raw text to continue."""
    chat = use_chat(tokenizer, chat)
    ids = encode_prompt(tokenizer, check_text(text), chat=chat)
    return set_up(model, config, exit_head=exit_head, prompt_ids=ids, chat=chat)


def check_prompt_length(tokens: int, max_context: int, max_new_tokens: int) -> None:
    """ValueError when the prompt is empty or prompt plus output exceeds the context, by numbers
    alone: an entry point checks a prompt against the model's config before its weights load."""
    if not tokens:
        raise ValueError(EMPTY_PROMPT)
    room = max_context - max_new_tokens
    if tokens > room:
        raise ValueError(
            f"prompt of {tokens} tokens is too long: with max_new_tokens={max_new_tokens} "
            f"the model's context of {max_context} allows at most {max(room, 0)}"
        )


def _resolve_with_head(model: StagedModel, config: DecodeConfig, spec: str) -> tuple[DecodeConfig, HeadChoice]:
    """The resolved config and the head `spec` names. A default E taken from a shipped head that
    does not fit these weights (a model that only shares the default's name) falls back to L/K."""
    resolved = resolve_config(model.info.name, model.num_layers, config)
    choice = _head(model, resolved.exit_layer, spec)
    balanced = balanced_exit_layer(model.num_layers, config.num_stages)
    if config.exit_layer is None and spec.strip() in ("", AUTO_HEAD) and choice.path is None \
            and resolved.exit_layer != balanced:
        resolved = replace(resolved, exit_layer=balanced).resolved(model.num_layers)
        choice = _head(model, balanced, spec)
    return resolved, choice


_HEADS: "weakref.WeakKeyDictionary[object, dict[tuple[str, int], HeadChoice]]" = weakref.WeakKeyDictionary()
_HEADS_LOCK = threading.Lock()  # a server sets up runs on several threads


def _head(model: StagedModel, exit_layer: int, spec: str) -> HeadChoice:
    """`choose_exit_head`, loaded once per weights, E and spec: `generate` on a bare model sets up
    every call, and a trained head is megabytes read from disk."""
    key = (spec.strip() or AUTO_HEAD, exit_layer)
    with _HEADS_LOCK:
        heads = _HEADS.setdefault(model.hf_model, {})
        if key not in heads:
            heads[key] = choose_exit_head(model, exit_layer, spec)
        return heads[key]

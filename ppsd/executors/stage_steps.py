"""`StageSteps`: every in-process executor's stage steps on one static KV cache and static inputs.

Boundary: what a stage computes, and the buffers it computes from; no schedule, no timing, no
host read and no choice of device. How a step is launched (run eagerly, compiled, or replayed as
a CUDA graph) and where (in turn, on threads, on streams) is its backends'
(`ppsd.executors.backends`); which steps run, and the host lengths, are the runtime's.

A stage's step goes from its input (token ids for stage 1, hidden states after that) and its
positions, a device tensor, to its hidden output, plus the draft logits and their argmax (stage 1
drafting) or the final logits and theirs (stage K). A one-token step reads its inputs from static
buffers (`static_step`: the token and every stage's position in one device tensor, each stage's
hidden input in a buffer of its own), so a graph can capture it and a compiler can fix its shapes.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch

from ..model import StagedModel
from ..static_cache import StaticKVCache, bucket_for
from . import schedule
from .base import Feed, logit_width, stage_forward

StepResult = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]  # hidden, logits, their argmax


@dataclass
class Done:
    """One action's device results, not yet read: its hidden output, the logits it gives (draft
    or final) and their argmax, and its start and end (floats on a CPU, CUDA events on a GPU)."""

    action: schedule.Action
    hidden: torch.Tensor
    logits: torch.Tensor | None
    best: torch.Tensor | None
    start: object
    end: object
    replayed: bool = False  # the tensors are its graph's outputs, overwritten by the next replay


class StageSteps:
    """Every stage's pure step for `partition`, on one static cache and one set of static inputs
    (pinned host staging where `pinned`: a CUDA copy in is then non-blocking). With `layers` the
    cache holds those layers' buffers alone (the K-process coordinator's stage 1), and every
    layer's host lengths."""

    def __init__(self, model: StagedModel, partition: tuple[range, ...], *, pinned: bool,
                 layers: range | None = None) -> None:
        self.model, self.partition = model, partition
        self.device = model.info.device
        self.cache = StaticKVCache.for_model(model.hf_model, layers)
        hidden_size = model.hf_model.config.hidden_size
        with torch.inference_mode(False):  # static buffers outlive any one run's inference mode
            # Device inputs of one-token steps: [token, position of stage 1, ..., of stage K].
            self._dev_in = torch.zeros(1 + len(partition), dtype=torch.long, device=self.device)
            self._host_in = torch.zeros(1 + len(partition), dtype=torch.long, pin_memory=pinned)
            self._stage_in = [torch.zeros(1, 1, hidden_size, dtype=self.cache.dtype, device=self.device)
                              for _ in partition]
        self._host_values = self._host_in.numpy()  # written per call without a torch op each
        self._model_key: str | None = None  # `shape_key`'s model part, made once

    def set_inputs(self, actions: tuple[schedule.Action, ...], feed: Feed | None) -> None:
        """The call's token and every acting stage's position, in one copy to the device."""
        for a in actions:
            self._host_values[1 + a.index] = a.item.position
        if feed is not None:
            self._host_values[0] = feed.tokens[0]
        self._dev_in.copy_(self._host_in, non_blocking=True)

    def set_stage_input(self, k: int, hidden: torch.Tensor) -> None:
        """Stage k's hidden input, into the static buffer its one-token step reads."""
        self._stage_in[k].copy_(hidden)

    def set_stale_position(self, k: int, bucket: int) -> None:
        """Stage k's position at `bucket`'s last: at or past its length, so what a warm-up writes
        there is stale (masked, and overwritten before any query reads it)."""
        self._dev_in[1 + k] = bucket - 1

    def step(self, k: int, x: torch.Tensor, positions: torch.Tensor, bucket: int, *, draft: bool,
             logits_for: int) -> StepResult:
        """Stage k's pure step (`base.stage_forward`) on the cache's `bucket`, positions (T,) all it
        knows of where: (hidden out, logits or None, their argmax or None)."""
        hidden, logits = stage_forward(self.model, self.partition, k, x, self.cache.view(positions, bucket),
                                       draft=draft, logits_for=logits_for)
        return hidden, logits, None if logits is None else logits.argmax(-1).view(-1)

    def shape_key(self) -> tuple:
        """What fixes a compiled step's graph besides its arguments (`ppsd.kept_steps`): the static
        buffers' size and the model as the step traces it (config, stages, exit head's weights)."""
        if self._model_key is None:
            head = self.model.exit_head
            tensors = {} if head is None else {**head.state_dict(), **dict(head.named_buffers())}
            weights = sorted((name, tuple(t.shape), str(t.dtype)) for name, t in tensors.items() if t is not None)
            self._model_key = repr((self.model.hf_model.config.to_json_string(), self.cache.dtype, self.partition,
                                    type(head).__name__, getattr(head, "exit_layer", None), weights))
        return self.cache.capacity, self._model_key

    def static_step(self, k: int, bucket: int, draft: bool) -> StepResult:
        """The one-token step on the static inputs: what a graph captures and a CPU runs."""
        x = self._dev_in[0:1].view(1, 1) if k == 0 else self._stage_in[k]
        return self.step(k, x, self._dev_in[1 + k:2 + k], bucket, draft=draft, logits_for=1)

    def run_now(self, action: schedule.Action, hidden: torch.Tensor | None, feed: Feed | None,
                one_token) -> StepResult:
        """`action`'s step run now, a one-token piece through `one_token(k, bucket, draft)` (the
        static step, compiled or replayed); the caller has advanced the host lengths."""
        k, item = action.index, action.item
        bucket = bucket_for(item.position + item.width)
        draft = action.kind == "draft"
        if item.width == 1:
            if hidden is not None:
                self.set_stage_input(k, hidden)
            return one_token(k, bucket, draft)
        positions = self._dev_in[1 + k] + self.cache.key_index[:item.width]
        x = hidden if k > 0 else torch.tensor([feed.tokens], dtype=torch.long, device=self.device)
        return self.step(k, x, positions, bucket, draft=draft, logits_for=logit_width(item.kind, item.width))

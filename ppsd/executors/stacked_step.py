"""`SlotStep`: the stacked executor's slot as one pure step on static buffers, two sets of them.

Boundary: what a stacked slot computes and the buffers it computes from; no schedule, no guess,
no timing, no host read and no choice of device. How a slot is launched (replayed as a CUDA graph,
or run eagerly) is its backend's (`ppsd.executors.backends`).

Row k is stage k's token, layer j of every live stage one batched product (`StackedLlama.chain`).
Two sets of buffers (parities) alternate, so the slot in flight never overwrites what the slot
before it feeds on.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..llama_step import StackedLlama
from ..model import StagedModel
from . import schedule
from .base import Feed
from .waiting import Waiting


class SlotOutput(NamedTuple):
    """A stacked slot's device results: the exit logits (V,) when stage 1 drafted, the final
    logits (1, V) when stage K ran, and their argmax ids, exit first (None: neither ran)."""

    exit_logits: torch.Tensor | None
    final_logits: torch.Tensor | None
    best: torch.Tensor | None


class Span(NamedTuple):
    """When a slot ran: floats on the run's clock on a CPU, CUDA events on a GPU."""

    start: object
    end: object


class SlotStep:
    """The stacked slot for `partition` on its static buffers (pinned host staging where `pinned`:
    a CUDA copy in is then non-blocking)."""

    def __init__(self, model: StagedModel, partition: tuple[range, ...], *, pinned: bool) -> None:
        self.partition, self.device = partition, model.info.device
        self.engine = StackedLlama(model, partition)
        self.cache = self.engine.cache
        k, hidden = len(partition), model.hf_model.config.hidden_size
        with torch.inference_mode(False):  # static buffers outlive any one run's inference mode
            # Per parity: [token, position of row 1, ..., of row K] on the host and the device, and
            # the rows in and out.
            self._host_in = [torch.zeros(1 + k, dtype=torch.long, pin_memory=pinned) for _ in range(2)]
            self._dev_in = [torch.zeros(1 + k, dtype=torch.long, device=self.device) for _ in range(2)]
            self._rows_in = [torch.zeros(k, 1, hidden, dtype=self.cache.dtype, device=self.device) for _ in range(2)]
            self._rows_out = [torch.zeros(k, 1, hidden, dtype=self.cache.dtype, device=self.device) for _ in range(2)]

    def set_inputs(self, parity: int, actions: tuple[schedule.Action, ...], feed: Feed | None,
                   token: torch.Tensor | None, waiting: Waiting) -> None:
        """`parity`'s inputs: stage 1's token from `feed`, or from `token` (an id on the device,
        from the slot before); every row's position; the other rows from the queues' heads."""
        host = self._host_in[parity].numpy()
        host[:] = 0
        for a in actions:
            host[1 + a.index] = a.item.position
        if feed is not None:
            host[0] = feed.tokens[0]
        self._dev_in[parity].copy_(self._host_in[parity], non_blocking=True)
        if token is not None:
            self._dev_in[parity][0:1].copy_(token)
        for a in actions:
            if a.index > 0:
                self._rows_in[parity][a.index].copy_(waiting.head(a.index)[0])

    def row_out(self, parity: int, index: int) -> torch.Tensor:
        """Row `index`'s output in `parity`'s buffers, as a (1, 1, hidden) view."""
        return self._rows_out[parity][index:index + 1]

    def run(self, parity: int, bucket: int, live: tuple[int, ...], draft: bool) -> SlotOutput:
        """The stacked slot on the static buffers of `parity`: what a graph captures and a CPU runs."""
        engine, lo, hi = self.engine, live[0], live[-1]
        ids = self._dev_in[parity]
        x = self._rows_in[parity][lo:hi + 1]
        if lo == 0:
            x = torch.cat((engine.embed(ids[0:1].view(1, 1)), x[1:]))
        positions = ids[1 + lo:2 + hi].view(-1, 1)
        # As long as the longest live stage: a row alone (AR) skips the pads that make its stage
        # as long as the longest.
        steps = max(len(self.partition[k]) for k in range(lo, hi + 1))
        y = engine.chain(x, slice(lo, hi + 1), positions, bucket, engine.table(live), steps=steps)
        self._rows_out[parity][lo:hi + 1].copy_(y)
        final = hi == len(self.partition) - 1
        if draft and final and engine.shared_head:  # the exit head is the LM head: one product for both rows
            logits = engine.final_logits(y[::hi] if hi else y)
            return SlotOutput(logits[0, 0], logits[-1], logits.argmax(-1).view(-1))
        exit_logits = engine.exit_logits(y[0:1], positions[0], bucket) if draft else None
        final_logits = engine.final_logits(y[-1]) if final else None
        best = [t.argmax(-1).view(-1) for t in (exit_logits, final_logits) if t is not None]
        return SlotOutput(exit_logits, final_logits, torch.cat(best) if best else None)

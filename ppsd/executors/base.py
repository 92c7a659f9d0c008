"""What every executor shares: the call's input (`Feed`) and result (`Output`), the `Executor`
protocol the decoders drive, the error a failed pipeline raises (`PipelineError`), and the
compute at the pipeline's two ends.

Boundary: no schedule (that is `schedule`) and no processes; the K-process pipeline's coordinator
and its workers compute their stages with `stage_forward`, on the same static KV cache and forward
path (`StagedModel.run_static`) as the runtime's steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ..model import StagedModel
from ..static_cache import CacheView
from ..steps import Event, Kind
from ..trace import Stopwatch


@dataclass(frozen=True)
class Feed:
    """Tokens entering stage 1 at `position`. Kind `draft` asks for exit-head logits;
    `from_final` says the first token was committed by the final stage (a restart)."""

    position: int
    tokens: tuple[int, ...]
    kind: Kind
    from_final: bool = False


@dataclass(frozen=True)
class Output:
    """What one executor call produced, and the stage work it did (in recording order:
    later stages first within a slot, so each event's input was recorded before it). The logits
    are valid until the executor's next call (the graphed executor's are its graphs' buffers):
    read or copy them before it."""

    events: tuple[Event, ...]
    exit_logits: torch.Tensor | None = None  # (V,) draft logits for the last fed position
    final_position: int | None = None  # first position whose final logits are given
    final_logits: torch.Tensor | None = None  # (T, V) next-token logits for those positions
    # The argmax of each, when the executor took it on the device and read it with the call's one
    # host read (the graphed executor): greedy decoding then never waits on the logits.
    exit_best: int | None = None
    final_best: tuple[int, ...] | None = None

    def exit_choice(self) -> tuple[torch.Tensor, int | None]:
        """The draft logits and their argmax when known: what `Sampler.pick` takes."""
        return self.exit_logits, self.exit_best

    def final_choice(self, row: int) -> tuple[torch.Tensor, int | None]:
        """Row `row` of the final logits and its argmax when known."""
        return self.final_logits[row], None if self.final_best is None else self.final_best[row]


class Executor(Protocol):
    """`slot` advances every stage by one token (PPSD's verify-while-draft tick, AR on the
    pipeline), `push` runs stage 1 alone (EESD drafting), `flow` runs stages 2..K once over
    everything queued (prefill, EESD verification), `rollback` drops queued work and truncates
    the caches: the only rollback there is. `begin` and `end` bracket one run: an executor
    shared between threads admits one run at a time there (`begin` waits for, or refuses, a
    second), so its callers need no lock of their own."""

    partition: tuple[range, ...]
    device: str
    concurrent: bool  # do the stages run at the same time (so the measured clock shows overlap)?

    def begin(self, stopwatch: Stopwatch) -> None: ...  # a run starts: empty caches, stamp on this clock
    def slot(self, feed: Feed | None, *, slot: int) -> Output: ...
    def push(self, feed: Feed) -> Output: ...
    def flow(self) -> Output: ...
    def rollback(self, length: int) -> None: ...
    def end(self) -> None: ...  # the run is over (finished, stopped or failed)


class PipelineError(RuntimeError):
    """A worker died, hung or failed; the pool has been shut down. Raised by the K-process
    pipeline (`distributed`), defined here so a caller (the comparison, a front end) catches it
    without importing that package and torch.distributed."""


class PipelineBusy(ValueError):
    """Another run held the executor for longer than its timeout (the K-process pipeline's). Nothing
    was sent: the pool is fine, so it is not a `PipelineError` (callers close the pool on those)."""


def logit_width(kind: Kind, width: int) -> int:
    """How many of a final-stage piece's last positions get logits: a prefill needs only the
    next token's (the LM head is skipped on the rest), anything else every position's."""
    return 1 if kind == "prefill" else width


def final_position(item) -> int:
    """The first position whose final logits a final-stage piece `item` (a `schedule.Item`) gives."""
    return item.position + item.width - logit_width(item.kind, item.width)


def stage_forward(model: StagedModel, partition: tuple[range, ...], k: int, x, view: CacheView, *, draft: bool,
                  logits_for: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Stage k's forward on the static cache at `view`'s positions, the one every executor's stages
    run (the runtime's steps, the K-process coordinator's stage 1 and its workers' stages): stage 1
    embeds token ids `x` (a list, or a (1, T) device tensor) and, drafting, gives the exit head's
    (V,) logits; stage K gives the final (logits_for, V) logits of its last positions; others take
    hidden states `x`. Returns (hidden (1, T, hidden), those logits or None)."""
    hidden = model.embed(x) if k == 0 else x
    hidden = model.run_static(hidden, partition[k], positions=view.write, cache=view)
    if k == 0 and draft:
        return hidden, model.exit_logits(hidden, position=view.write, cache=view)
    if k + 1 == len(partition):
        return hidden, model.final_logits(hidden[:, hidden.shape[1] - logits_for:])
    return hidden, None

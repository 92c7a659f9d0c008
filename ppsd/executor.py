"""Executors run stage work for the decoders; the decoders decide what runs.

A pipeline of K stages: stage 1 is layers [0, E) plus the exit head, stage K ends with the final
head. Each stage has an input queue of hidden states. `slot` advances every stage by one token
(PPSD's verify-while-draft tick, AR on the pipeline), `push` runs stage 1 alone (EESD drafting),
`flow` runs stages 2..K once over everything queued (prefill, EESD verification), and `rollback`
drops queued work and truncates the caches: the only rollback there is. `begin` and `end`
bracket one run.

`InProcessExecutor` runs the stages in turn on one device, so its trace is measured but not
concurrent; the projected clock (`Trace.project`) replays it on K workers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from .model import KVCache, StagedModel
from .steps import Event, Kind
from .trace import Stopwatch


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
    later stages first within a slot, so each event's input was recorded before it)."""

    events: tuple[Event, ...]
    exit_logits: torch.Tensor | None = None  # (V,) draft logits for the last fed position
    final_position: int | None = None  # first position whose final logits are given
    final_logits: torch.Tensor | None = None  # (T, V) next-token logits for those positions


def logit_width(kind: Kind, width: int) -> int:
    """How many of a final-stage piece's last positions get logits: a prefill needs only the
    next token's (the LM head is skipped on the rest), anything else every position's."""
    return 1 if kind == "prefill" else width


class Executor(Protocol):
    stages: tuple[range, ...]
    device: str
    concurrent: bool  # do the stages run at the same time (so the measured clock shows overlap)?

    def begin(self, stopwatch: Stopwatch) -> None: ...  # a run starts: empty caches, stamp on this clock
    def slot(self, feed: Feed | None, *, slot: int) -> Output: ...
    def push(self, feed: Feed) -> Output: ...
    def flow(self) -> Output: ...
    def rollback(self, length: int) -> None: ...
    def end(self) -> None: ...  # the run is over (finished, stopped or failed)


@dataclass
class _Item:
    position: int
    token_id: int
    kind: Kind
    hidden: torch.Tensor  # (1, T, hidden), input to the stage that holds it


@dataclass
class _Collected:
    """What the stages of one call produced, gathered into an `Output` at the end."""

    events: list[Event] = field(default_factory=list)
    exit_logits: torch.Tensor | None = None
    final_position: int | None = None
    final_logits: torch.Tensor | None = None

    def output(self) -> Output:
        return Output(tuple(self.events), self.exit_logits, self.final_position, self.final_logits)


class InProcessExecutor:
    """All stages in this process, run one after the other, each timed where it ran."""

    concurrent = False

    def __init__(self, model: StagedModel, stages: tuple[range, ...], stopwatch: Stopwatch) -> None:
        self.model = model
        self.stages = stages
        self.device = model.info.device
        self.cache = KVCache()
        self._clock = stopwatch
        self._queues: list[list[_Item]] = [[] for _ in stages]

    def begin(self, stopwatch: Stopwatch) -> None:
        self._clock = stopwatch
        self.rollback(0)

    def end(self) -> None:
        pass

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        out = _Collected()
        for k in reversed(range(len(self.stages))):  # back to front: each stage reads last slot's output
            if k == 0 and feed is not None:
                self._run_stage1(feed, out, slot=slot)
            elif k > 0 and self._queues[k]:
                self._run(k, self._queues[k].pop(0), out, slot=slot)
        return out.output()

    def push(self, feed: Feed) -> Output:
        out = _Collected()
        self._run_stage1(feed, out, slot=None)
        return out.output()

    def flow(self) -> Output:
        out = _Collected()
        for k in range(1, len(self.stages)):
            queued, self._queues[k] = self._queues[k], []
            if queued:
                merged = _Item(queued[0].position, queued[0].token_id, queued[0].kind,
                               torch.cat([item.hidden for item in queued], dim=1))
                self._run(k, merged, out, slot=None)
        return out.output()

    def rollback(self, length: int) -> None:
        self._queues = [[] for _ in self.stages]
        self.cache.truncate(length)

    def _run_stage1(self, feed: Feed, out: _Collected, *, slot: int | None) -> None:
        start = self._clock.now()
        hidden = self.model.embed(list(feed.tokens))
        hidden = self.model.run_layers(hidden, self.stages[0], position=feed.position, cache=self.cache)
        if feed.kind == "draft":
            out.exit_logits = self.model.exit_logits(hidden, position=feed.position, cache=self.cache)
        kind: Kind = "prefill" if feed.kind == "prefill" else "verify"
        self._emit(0, _Item(feed.position, feed.tokens[0], kind, hidden), out)
        out.events.append(Event(
            stage=1, position=feed.position, kind=feed.kind, start=start, end=self._clock.now(),
            token_id=feed.tokens[0], width=len(feed.tokens), slot=slot, from_final=feed.from_final))

    def _run(self, k: int, item: _Item, out: _Collected, *, slot: int | None) -> None:
        start = self._clock.now()
        hidden = self.model.run_layers(item.hidden, self.stages[k], position=item.position, cache=self.cache)
        self._emit(k, _Item(item.position, item.token_id, item.kind, hidden), out)
        out.events.append(Event(
            stage=k + 1, position=item.position, kind=item.kind, start=start, end=self._clock.now(),
            token_id=item.token_id, width=hidden.shape[1], slot=slot))

    def _emit(self, k: int, item: _Item, out: _Collected) -> None:
        if k + 1 < len(self.stages):
            self._queues[k + 1].append(item)
            return
        width = item.hidden.shape[1]
        kept = logit_width(item.kind, width)
        out.final_position = item.position + width - kept
        out.final_logits = self.model.final_logits(item.hidden[:, width - kept:])

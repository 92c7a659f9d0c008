"""`StackedExecutor`: a slot's K stages as one chain of stacked layers, fed on the device.

Boundary: a kind of the one runtime (`ppsd.executors.runtime.Runtime`): the same `schedule`, the
same queues, host lengths and rollback; what differs is how a slot computes and when the host
waits. A slot whose pieces are one token each (every PPSD and AR slot) runs as one chain of
`ppsd.llama_step.StackedLlama` over the live stages' rows: row k is stage k's token, layer j of
every live stage one batched product. Everything else (the prefill, EESD's drafts and
verification) is the runtime's eager path, stage by stage, on the same packed cache (a
`StaticKVCache` whose layers are views of one tensor).

Fed on the device: after launching slot s the executor launches its guess of slot s + 1 before
it reads slot s. The guess is what the decoder asks next when nothing goes wrong: the draft
stage 1 just made, still on the device, as stage 1's next token (PPSD); the full model's token
as the next feed (AR); or no feed. The next call adopts the slot in flight when its feed and the
queues are the guessed ones; otherwise (a correction's `rollback`, a sampled draft, the run's
end) the slot in flight is discarded: its writes lie at or past every layer's length, stale and
masked, and the slot is launched again. Host lengths and queues change only when a slot is
adopted, so the runtime's `rollback` stays the one rollback there is. Once a run's fed token
differs from the argmax (sampling), the executor stops guessing tokens for that run.

The slot itself is `ppsd.executors.stacked_step.SlotStep`: two sets of static buffers alternate,
so the slot in flight never overwrites what the slot before it feeds on. How it runs is the one
backend chosen at construction (`ppsd.executors.backends`): on CUDA a CUDA graph per (bucket, live
rows, drafting, parity) (`CudaGraphSlots`); on a CPU the same step eagerly (`EagerSlots`: the tests
record its ops); it is not faster there: a CPU is bandwidth-bound and stacking adds no bandwidth,
and a discarded guess is a slot computed for nothing.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Iterator

import torch

from ..model import StagedModel
from ..static_cache import bucket_for
from ..trace import Stopwatch
from . import schedule
from .backends import SlotBackend
from .backends.cpu import Clocked, EagerSlots, EagerStep
from .backends.cuda import CudaGraphSlots
from .base import Feed, Output, final_position
from .runtime import Runtime
from .stacked_step import SlotOutput, SlotStep, Span


@dataclass
class SlotStats:
    """What the stacked slots cost the host: slots adopted, guesses discarded, seconds spent
    launching and reading (the wait for the device excluded), seconds waiting."""

    slots: int = 0
    discarded: int = 0
    host_seconds: float = 0.0
    wait_seconds: float = 0.0


@dataclass(eq=False)
class _Slot:
    """One stacked slot launched on the device and not yet read."""

    plan: schedule.Plan
    queues: schedule.Queues  # what it was planned from
    feed: Feed | None  # None with `guess`: stage 1's token is read from the slot before
    parity: int
    out: SlotOutput
    span: Span
    guess: _Guess | None = None
    values: list[int] = field(default_factory=list)  # its ids, once read

    def guessed_feed(self) -> Feed | None:
        return self.feed if self.guess is None else self.guess.resolved()


@dataclass(frozen=True, eq=False)
class _Guess:
    """The next feed as guessed before slot `before` is read: `feed`, whose token is id `index` of
    `before`'s ids (0: stage 1's draft; -1: the final token), a placeholder until then."""

    before: _Slot
    index: int
    feed: Feed

    def token(self) -> torch.Tensor:
        """The guessed token, still on the device."""
        return self.before.out.best[self.index:][:1]

    def resolved(self) -> Feed:
        """The guessed feed with its token, once `before` is read."""
        return replace(self.feed, tokens=(self.before.values[self.index],))


class StackedExecutor(Runtime):
    """All K stages in this process as one stacked chain a slot: CUDA graphs on a GPU, eager on a CPU."""

    concurrent = True  # a slot runs every stage at once, in one chain: the measured clock shows it

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch | None = None, *,
                 lookahead: bool = True) -> None:
        super().__init__(model, partition, name="stacked")
        cuda = self.device.startswith("cuda")
        self.step = SlotStep(model, partition, pinned=cuda)
        self.engine = self.step.engine
        # The runtime's steps (every piece that is not a stacked slot) run on the packed cache too:
        # one cache, one set of host lengths, one rollback.
        self.cache = self.steps.cache = self.step.cache
        clock = stopwatch or Stopwatch()
        self.backend: SlotBackend = CudaGraphSlots(self.step) if cuda else EagerSlots(self.step, clock)
        self.where, self.how = Clocked(clock), EagerStep(self.steps)  # what is not a stacked slot
        self.lookahead = lookahead
        self.stats = SlotStats()
        self._inflight: _Slot | None = None
        self._guess_tokens = True
        self._parity = 0

    # The Executor protocol: the runtime's, a stacked slot where one can run -------------------

    def begin(self, stopwatch: Stopwatch) -> None:
        super().begin(stopwatch)
        self._guess_tokens = True  # until a feed shows this run samples
        self.backend.begin(stopwatch)

    def end(self) -> None:
        self._discard()
        super().end()

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        began = time.perf_counter()
        plan = schedule.slot(self._queues, feed)
        if not _stackable(plan):
            with self._unstacked():
                return super().slot(feed, slot=slot)
        run = self._adopt(feed) or self._launch(plan, feed)
        self._commit(run)
        if self.lookahead:
            self._inflight = self._guess_next(run)
        return self._read_slot(run, slot, began)

    def push(self, feed: Feed) -> Output:
        with self._unstacked():
            return super().push(feed)

    def flow(self) -> Output:
        with self._unstacked():
            return super().flow()

    def rollback(self, length: int) -> None:
        """The runtime's rollback, after the slot in flight is discarded."""
        self._discard()
        super().rollback(length)

    def close(self) -> None:
        self._discard()
        super().close()
        self.backend.close()

    def _reserve(self, length: int) -> None:
        """The runtime's, and a grown (reallocated) cache drops the slots' graphs too."""
        if self.cache.reserve(length):
            self.how.grown()
            self.backend.grown()

    @contextmanager
    def _unstacked(self) -> Iterator[None]:
        """A call on the runtime's eager path: no slot in flight, the queued views of a stacked
        slot's rows copied (the next slot would overwrite them), and no autograd (outside inference
        mode a write with grad through one layer's view of the packed tensor makes the next
        layer's view refuse its own)."""
        self._discard()
        self._waiting = self._waiting.copied()
        with torch.no_grad():
            yield

    # Slots in flight ----------------------------------------------------------------------------

    def _adopt(self, feed: Feed | None) -> _Slot | None:
        """The slot in flight, when it is the one asked for now; else it is discarded."""
        run = self._inflight
        guessed = None if run is None else run.guessed_feed()
        if run is not None and run.queues == self._queues and guessed == feed:
            self._inflight = None
            run.plan = schedule.slot(self._queues, feed)  # the same work, with the token as fed
            return run
        if guessed is not None and feed is not None and guessed.tokens != feed.tokens and \
                (guessed.position, guessed.kind) == (feed.position, feed.kind):
            self._guess_tokens = False  # a sampled run: its tokens are not the argmax, stop guessing them
        self._discard()
        return None

    def _discard(self) -> None:
        if self._inflight is not None:
            # Its inputs' buffers are reused by the slot launched in its place.
            self.backend.settle(self._inflight.parity)
            self._inflight = None
            self.stats.discarded += 1

    def _guess_next(self, run: _Slot) -> _Slot | None:
        """Launch what the decoder most likely asks next, before `run` is read: stage 1's draft
        fed back (PPSD), the full model's token fed (AR, once stage K has it), or no feed."""
        guess = self._next_feed(run)
        if guess is not None and not self._guess_tokens:
            return None  # the next feed's token is the decoder's draw: launch nothing ahead
        plan = schedule.slot(self._queues, None if guess is None else guess.feed)
        if not _stackable(plan):
            return None
        return self._launch(plan, None, guess=guess)

    def _next_feed(self, run: _Slot) -> _Guess | None:
        """The feed the decoder asks after `run` when nothing goes wrong (None: no feed)."""
        stages = {a.index: a for a in run.plan.actions}
        first, last = stages.get(0), stages.get(len(self.partition) - 1)
        if first is not None and first.kind == "draft":
            return _Guess(run, 0, Feed(first.item.position + 1, (0,), "draft"))
        if first is None and last is not None:
            return _Guess(run, -1, Feed(last.item.position + 1, (0,), "verify", from_final=True))
        return None

    # One stacked slot ---------------------------------------------------------------------------

    def _launch(self, plan: schedule.Plan, feed: Feed | None, *, guess: _Guess | None = None) -> _Slot:
        """Start `plan`'s stacked slot: stage 1's token from `feed`, or from `guess` (an id on the
        device, from the slot before); the other rows from the queues' heads."""
        actions, parity = plan.actions, self._parity
        live = tuple(sorted(a.index for a in actions))
        draft = any(a.index == 0 and a.kind == "draft" for a in actions)
        bucket = bucket_for(max(a.item.position for a in actions) + 1)
        self._reserve(bucket)
        self.engine.table(live)  # made once, outside the step
        token = None if guess is None else guess.token()
        self.step.set_inputs(parity, actions, feed, token, self._waiting)
        out, span = self.backend.launch(parity, bucket, live, draft)
        return _Slot(plan, self._queues, feed, parity, out, span, guess)

    def _commit(self, run: _Slot) -> None:
        """`run` is now the slot that ran: host lengths advance (checked), stages take their
        inputs off the queues and queue their outputs (views of `run`'s rows, read next slot)."""
        for a in run.plan.actions:
            self.cache.advance(self.partition[a.index], a.item.position, 1)
            self._waiting.take(a)  # already in the slot's rows
            self._waiting.pass_on(a.index, self.step.row_out(run.parity, a.index))
        self._queues = run.plan.queues
        self._parity ^= 1
        self.stats.slots += 1

    def _read_slot(self, run: _Slot, slot: int, began: float) -> Output:
        """The call's one host read: `run`'s ids, after one wait for it alone."""
        waited = time.perf_counter()
        best = run.out.best
        run.values = [] if best is None else self.backend.read(run.parity, best)
        read = time.perf_counter()
        start, end = self.backend.times(run.span)
        results: dict = {}
        for a in run.plan.actions:
            if a.index == 0:
                results["exit_logits"] = run.out.exit_logits
                results["exit_best"] = run.values[0] if run.out.exit_logits is not None else None
            if a.index + 1 == len(self.partition):
                results.update(final_logits=run.out.final_logits, final_position=final_position(a.item),
                               final_best=(run.values[-1],))
        output = Output(tuple(a.event(start, end, slot) for a in run.plan.actions), **results)
        self.stats.wait_seconds += read - waited
        self.stats.host_seconds += (waited - began) + (time.perf_counter() - read)
        return output


def _stackable(plan: schedule.Plan) -> bool:
    """A slot of one-token pieces: one stacked chain."""
    return bool(plan.actions) and all(a.item.width == 1 for a in plan.actions)

"""Forced acceptance, for timing only: every verdict on a draft becomes a seeded, evenly dealt coin.

Boundary: an executor wrapper; it changes the argmax ids an executor reports for the final
stage, nothing else. With greedy decoding the decoder then accepts a share `acceptance` of the
drafts it judges and otherwise commits another token (the draft's successor id), so a
random-weight model can be timed at any acceptance: the work per slot is the real work,
rollbacks and discarded slots included, but **the tokens are not the model's**. Every output
that uses it must say so (`FORCED_NOTE`). `ForcedSetup` runs a whole comparison so: every
method then decodes exactly `max_new_tokens` (EOS ignored), so every ratio compares equal work.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import torch

from ..executors import Executor, InProcessExecutor
from ..executors.base import Feed, Output
from ..setup import RunSetup, device_sync
from ..trace import Stopwatch

FORCED_NOTE = "forced acceptance (timing only): each verdict is a seeded coin, the tokens are not the model's"


class ForcedAcceptance:
    """`executor` with each verdict on a draft replaced by a coin that accepts a share `acceptance`.

    The coin is dealt evenly, not tossed: after n verdicts it has accepted floor(n a + phase)
    drafts, the phase in [0, 1) drawn from `seed`, so the measured acceptance is a up to one
    draft (whole drafts only). Tossed, 63 verdicts at a = 0.2 came out 0.10 (seed 0), and the run
    timed the work of an acceptance it was not asked for."""

    def __init__(self, executor, acceptance: float, *, vocab_size: int, seed: int = 0) -> None:
        if not 0.0 <= acceptance <= 1.0:
            raise ValueError(f"forced acceptance {acceptance} is outside [0, 1]")
        self.executor, self.acceptance, self.vocab_size = executor, acceptance, vocab_size
        self.partition, self.device, self.concurrent = executor.partition, executor.device, executor.concurrent
        self._phase = random.Random(seed).random()
        self._drafts: dict[int, int] = {}  # position -> the draft made for it
        self.forced = 0

    def begin(self, stopwatch) -> None:
        self._drafts.clear()
        self.executor.begin(stopwatch)

    def end(self) -> None:
        self.executor.end()

    def rollback(self, length: int) -> None:
        self.executor.rollback(length)

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        return self._force(feed, self.executor.slot(feed, slot=slot))

    def push(self, feed: Feed) -> Output:
        return self._force(feed, self.executor.push(feed))

    def flow(self) -> Output:
        return self._force(None, self.executor.flow())

    def _force(self, feed: Feed | None, out: Output) -> Output:
        if feed is not None and out.exit_logits is not None:
            best = out.exit_best if out.exit_best is not None else int(torch.argmax(out.exit_logits))
            self._drafts[feed.position + len(feed.tokens)] = best
        if out.final_logits is None or out.final_logits.shape[0] != 1:
            return out  # the prologue's flow, EESD's verification: left as the model decides
        draft = self._drafts.pop(out.final_position + 1, None)
        if draft is None:
            return out
        token = draft if self._accepts(self.forced) else (draft + 1) % self.vocab_size
        self.forced += 1
        return replace(out, final_best=(token,))

    def _accepts(self, n: int) -> bool:
        """Whether verdict `n` (0-based) is an accept: the evenly dealt count steps up there."""
        a, phase = self.acceptance, self._phase
        return math.floor((n + 1) * a + phase) > math.floor(n * a + phase)


@dataclass(frozen=True)
class ForcedSetup(RunSetup):
    """A `RunSetup` whose runs decode on their executor wrapped in `ForcedAcceptance`: the real
    work of every slot at acceptance `acceptance`, rollbacks and flushes included, for timing
    only (the tokens are not the model's). AR makes no drafts, so its verdicts are untouched.
    EOS never ends a run (`stop_ids`): PPSD's forced tokens are not AR's, so with it AR stopped
    at its EOS (47 tokens) and PPSD ran on to the limit (64), and the ratio compared unequal work."""

    acceptance: float = 0.0

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return ()

    def steps(self, *, executor: Executor | None = None, stopwatch: Stopwatch | None = None):
        stopwatch = stopwatch or Stopwatch(device_sync(self.model))
        inner = executor or InProcessExecutor(self.model, self.partition, stopwatch)
        # One seed for every run: each round forces the same verdicts, so the rounds time the same work.
        wrapped = ForcedAcceptance(inner, self.acceptance, vocab_size=self.model.info.vocab_size, seed=0)
        return super().steps(executor=wrapped, stopwatch=stopwatch)

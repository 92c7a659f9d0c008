"""`StackedExecutor`: a slot's K stages as one chain of stacked layers, fed on the device.

Boundary: the same `schedule` plans and `Output`s as `InProcessExecutor`; what differs is how a
slot computes and when the host waits. A slot whose pieces are one token each (every PPSD and AR
slot) runs as one chain of `ppsd.llama_step.StackedLlama` over the live stages' rows: row k is
stage k's token, layer j of every live stage one batched product. Wider pieces (the prefill,
EESD's drafts and verification) run stage by stage on the same engine, one row each.

Fed on the device: after launching slot s the executor launches its guess of slot s + 1 before
it reads slot s. The guess is what the decoder asks next when nothing goes wrong: the draft
stage 1 just made, still on the device, as stage 1's next token (PPSD); the full model's token
as the next feed (AR); or no feed. The next call adopts the slot in flight when its feed and the
queues are the guessed ones; otherwise (a correction's `rollback`, a sampled draft, the run's
end) the slot in flight is discarded: its writes lie at or past every layer's length, stale and
masked, and the slot is launched again. Host lengths and queues change only when a slot is
adopted, so `rollback` stays the one rollback there is. Once a run's fed token differs from the
argmax (sampling), the executor stops guessing tokens for that run.

On CUDA each stacked slot is a CUDA graph per (bucket, live rows, drafting, parity): two sets of
static buffers alternate, so the slot in flight never overwrites what the slot before it feeds
on. On a CPU the same step runs eagerly (the tests record its ops); it is not faster there: a CPU
is bandwidth-bound and stacking adds no bandwidth, and a discarded guess is a slot computed for
nothing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from ..llama_step import StackedLlama
from ..model import StagedModel
from ..static_cache import bucket_for
from ..trace import Stopwatch
from . import schedule
from .base import Feed, Output, final_position, logit_width


@dataclass
class SlotStats:
    """What the stacked slots cost the host: slots adopted, guesses discarded, seconds spent
    launching and reading (the wait for the device excluded), seconds waiting."""

    slots: int = 0
    discarded: int = 0
    host_seconds: float = 0.0
    wait_seconds: float = 0.0


@dataclass
class _Slot:
    """One stacked slot launched on the device and not yet read."""

    plan: schedule.Plan
    queues: schedule.Queues  # what it was planned from
    feed: Feed | None  # None with `guess`: stage 1's token is read from the slot before
    parity: int
    out: tuple  # (exit logits or None, final logits or None, argmax ids (exit first) or None)
    times: tuple  # (start, end): floats on a CPU, CUDA events on a GPU
    guess: tuple | None = None  # (slot before, index of its id, position, kind, from_final)
    values: list[int] = field(default_factory=list)  # its ids, once read

    def guessed_feed(self) -> Feed | None:
        if self.guess is None:
            return self.feed
        before, index, position, kind, from_final = self.guess
        return Feed(position, (before.values[index],), kind, from_final)


class StackedExecutor:
    """All K stages in this process as one stacked chain a slot: CUDA graphs on a GPU, eager on a CPU."""

    concurrent = True  # a slot runs every stage at once, in one chain: the measured clock shows it

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch | None = None, *,
                 lookahead: bool = True) -> None:
        if len(partition) < 2:
            raise ValueError("the stacked executor runs a pipeline of K >= 2 stages")
        self.model, self.partition, self.device = model, partition, model.info.device
        self.cuda = self.device.startswith("cuda")
        if not (self.cuda or self.device == "cpu"):
            raise ValueError(f"the stacked executor runs on CPU or CUDA, not {self.device}")
        self.engine = StackedLlama(model, partition)
        self.cache = self.engine.cache
        self.lookahead = lookahead
        self.stats = SlotStats()
        self._clock = stopwatch or Stopwatch()
        self._queues = schedule.empty(len(partition))
        self._hidden: list[deque[torch.Tensor]] = [deque() for _ in partition]
        self._inflight: _Slot | None = None
        self._guess_tokens = True
        self._parity = 0
        self._run_lock = threading.Lock()
        k, hidden = len(partition), model.hf_model.config.hidden_size
        with torch.inference_mode(False):  # static buffers outlive any one run's inference mode
            # Per parity: [token, position of row 1, ..., of row K] on the host and the device, the
            # rows in and out, and the ids read back.
            self._host_in = [torch.zeros(1 + k, dtype=torch.long, pin_memory=self.cuda) for _ in range(2)]
            self._dev_in = [torch.zeros(1 + k, dtype=torch.long, device=self.device) for _ in range(2)]
            self._rows_in = [torch.zeros(k, 1, hidden, dtype=self.cache.dtype, device=self.device) for _ in range(2)]
            self._rows_out = [torch.zeros(k, 1, hidden, dtype=self.cache.dtype, device=self.device) for _ in range(2)]
            self._host_out = [torch.zeros(2, dtype=torch.long, pin_memory=self.cuda) for _ in range(2)]
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple]] = {}
        if self.cuda:
            self._pool = torch.cuda.graph_pool_handle()
            self._marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(2)]
            self._done = [torch.cuda.Event() for _ in range(2)]
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin_at = 0.0

    # The Executor protocol -------------------------------------------------------------------

    def begin(self, stopwatch: Stopwatch) -> None:
        self._run_lock.acquire()
        self._clock = stopwatch
        self.rollback(0)
        self._guess_tokens = True  # until a feed shows this run samples
        if self.cuda:
            self._origin.record()
            self._origin.synchronize()
            self._origin_at = stopwatch.now()

    def end(self) -> None:
        self._discard()
        self._run_lock.release()

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        began = time.perf_counter()
        plan = schedule.slot(self._queues, feed)
        if not _stackable(plan):
            return self._one_by_one(plan, feed, slot)
        run = self._adopt(feed) or self._launch(plan, feed)
        self._commit(run)
        if self.lookahead:
            self._inflight = self._guess_next(run)
        return self._read(run, slot, began)

    def push(self, feed: Feed) -> Output:
        return self._one_by_one(schedule.enter(self._queues, feed), feed, None)

    def flow(self) -> Output:
        return self._one_by_one(schedule.flow(self._queues), None, None)

    def rollback(self, length: int) -> None:
        """The one rollback: the slot in flight, the queues, and every layer's length."""
        self._discard()
        self._queues = schedule.empty(len(self.partition))
        self._hidden = [deque() for _ in self.partition]
        self.cache.truncate(length)

    def close(self) -> None:
        self._discard()
        self._graphs.clear()

    def __enter__(self) -> "StackedExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
            if self.cuda:  # its inputs' buffers are reused by the slot launched in its place
                self._done[self._inflight.parity].synchronize()
            self._inflight = None
            self.stats.discarded += 1

    def _guess_next(self, run: _Slot) -> _Slot | None:
        """Launch what the decoder most likely asks next, before `run` is read: stage 1's draft
        fed back (PPSD), the full model's token fed (AR, once stage K has it), or no feed."""
        stages = {a.index: a for a in run.plan.actions}
        first, last = stages.get(0), stages.get(len(self.partition) - 1)
        guess = None  # (slot before, index of its id, position, kind, from_final) of the next feed
        if first is not None and first.kind == "draft":
            guess = (run, 0, first.item.position + 1, "draft", False)
        elif first is None and last is not None:
            guess = (run, -1, last.item.position + 1, "verify", True)
        if guess is not None and not self._guess_tokens:
            return None  # the next feed's token is the decoder's draw: launch nothing ahead
        plan = schedule.slot(self._queues, None if guess is None else Feed(guess[2], (0,), guess[3], guess[4]))
        if not _stackable(plan):
            return None
        token = None if guess is None else run.out[2][guess[1]:][:1]
        return self._launch(plan, None, token=token, guess=guess)

    # One stacked slot ---------------------------------------------------------------------------

    def _launch(self, plan: schedule.Plan, feed: Feed | None, *, token: torch.Tensor | None = None,
                guess: tuple | None = None) -> _Slot:
        """Start `plan`'s stacked slot: stage 1's token from `feed`, or from `token` (an id on the
        device, from the slot before); the other rows from the queues' heads."""
        actions, parity = plan.actions, self._parity
        live = tuple(sorted(a.index for a in actions))
        draft = any(a.index == 0 and a.kind == "draft" for a in actions)
        bucket = bucket_for(max(a.item.position for a in actions) + 1)
        self._reserve(bucket)
        self.engine.table(live)  # made once, outside the step
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
                self._rows_in[parity][a.index].copy_(self._hidden[a.index][0][0])
        if not self.cuda:
            start = self._clock.now()
            out = self._step(parity, bucket, live, draft)
            times = (start, self._clock.now())
        else:
            key = (parity, bucket, live, draft)
            if key not in self._graphs:
                self._graphs[key] = self._capture(*key)
            begun, ended = self._marks[parity]
            begun.record()
            self._graphs[key][0].replay()
            ended.record()
            out = self._graphs[key][1]
            if out[2] is not None:
                self._host_out[parity][:out[2].numel()].copy_(out[2], non_blocking=True)
            self._done[parity].record()
            times = (begun, ended)
        return _Slot(plan, self._queues, feed, parity, out, times, guess)

    def _reserve(self, length: int) -> None:
        """Room in the cache for positions [0, length); a grown cache drops the graphs captured
        against the old one, once the device is done with them (a slot may still be running)."""
        if self.cache.reserve(length) and self._graphs:
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self._graphs.clear()

    def _step(self, parity: int, bucket: int, live: tuple[int, ...], draft: bool):
        """The stacked slot on the static buffers of `parity`: what a graph captures and a CPU runs.
        Returns (exit logits (V,) or None, final logits (1, V) or None, their argmax ids)."""
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
            return logits[0, 0], logits[-1], logits.argmax(-1).view(-1)
        exit_logits = engine.exit_logits(y[0:1], positions[0], bucket) if draft else None
        final_logits = engine.final_logits(y[-1]) if final else None
        best = [t.argmax(-1).view(-1) for t in (exit_logits, final_logits) if t is not None]
        return exit_logits, final_logits, torch.cat(best) if best else None

    def _capture(self, parity: int, bucket: int, live: tuple[int, ...], draft: bool):
        """The slot's step captured: warmed up on a side stream with this slot's own inputs (it
        writes what the replay writes again), then captured in the executor's one memory pool (its
        graphs replay one after another on one stream, never at once)."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # lazy initialisation (cuBLAS handles, workspaces) outside the capture
                self._step(parity, bucket, live, draft)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self._step(parity, bucket, live, draft)
        return graph, outputs

    def _commit(self, run: _Slot) -> None:
        """`run` is now the slot that ran: host lengths advance (checked), stages take their
        inputs off the queues and queue their outputs (views of `run`'s rows, read next slot)."""
        for a in run.plan.actions:
            self.cache.advance(self.partition[a.index], a.item.position, 1)
            if a.index > 0:
                self._hidden[a.index].popleft()
            if a.index + 1 < len(self.partition):
                self._hidden[a.index + 1].append(self._rows_out[run.parity][a.index:a.index + 1])
        self._queues = run.plan.queues
        self._parity ^= 1
        self.stats.slots += 1

    def _read(self, run: _Slot, slot: int, began: float) -> Output:
        """The call's one host read: `run`'s ids, after one wait for it alone."""
        waited = time.perf_counter()
        best = run.out[2]
        if best is None:
            run.values = []
        elif self.cuda:
            self._done[run.parity].synchronize()
            run.values = self._host_out[run.parity][:best.numel()].tolist()
        else:
            run.values = best.tolist()
        read = time.perf_counter()
        exit_logits, final_logits, _ = run.out
        start, end = self._times(run.times)
        results: dict = {}
        for a in run.plan.actions:
            if a.index == 0:
                results["exit_logits"] = exit_logits
                results["exit_best"] = run.values[0] if exit_logits is not None else None
            if a.index + 1 == len(self.partition):
                results.update(final_logits=final_logits, final_position=final_position(a.item),
                               final_best=(run.values[-1],))
        output = Output(tuple(a.event(start, end, slot) for a in run.plan.actions), **results)
        self.stats.wait_seconds += read - waited
        self.stats.host_seconds += (waited - began) + (time.perf_counter() - read)
        return output

    def _times(self, times: tuple) -> tuple[float, float]:
        if not self.cuda:
            return times
        return tuple(self._origin_at + self._origin.elapsed_time(t) / 1e3 for t in times)

    # Everything else: one stage at a time ------------------------------------------------------

    def _one_by_one(self, plan: schedule.Plan, feed: Feed | None, slot: int | None) -> Output:
        """`plan`'s actions in recording order, each stage alone on one row (wide pieces)."""
        self._discard()
        # Queued views of a stacked slot's rows would be overwritten by the next one: keep copies.
        self._hidden = [deque(t.clone() for t in queue) for queue in self._hidden]
        engine, results, events, bests = self.engine, {}, [], []
        for a in plan.actions:
            k, item = a.index, a.item
            bucket = bucket_for(item.position + item.width)
            self._reserve(bucket)
            self.cache.advance(self.partition[k], item.position, item.width)
            start = self._clock.now()
            positions = self.cache.key_index[item.position:item.position + item.width]
            if k == 0:
                x = engine.embed(torch.tensor([feed.tokens], dtype=torch.long, device=self.device))
            else:
                taken = [self._hidden[k].popleft() for _ in range(a.take)]
                x = taken[0] if len(taken) == 1 else torch.cat(taken, dim=1)
            y = engine.stage(x, k, positions, bucket)
            if k == 0:
                results["exit_logits"] = engine.exit_logits(y, positions, bucket) if a.kind == "draft" else None
                bests.append(results["exit_logits"])
            if k + 1 < len(self.partition):
                self._hidden[k + 1].append(y)
            else:
                results["final_logits"] = engine.final_logits(y[0, item.width - logit_width(item.kind, item.width):])
                results["final_position"] = final_position(item)
                bests.append(results["final_logits"])
            events.append(a.event(start, self._clock.now(), slot))
        self._queues = plan.queues
        ids = [t.argmax(-1).view(-1) for t in bests if t is not None]
        values = torch.cat(ids).tolist() if ids else []  # the call's one host read
        if results.get("exit_logits") is not None:
            results["exit_best"], values = values[0], values[1:]
        if "final_logits" in results:
            results["final_best"] = tuple(values)
        return Output(tuple(events), **results)


def _stackable(plan: schedule.Plan) -> bool:
    """A slot of one-token pieces: one stacked chain."""
    return bool(plan.actions) and all(a.item.width == 1 for a in plan.actions)

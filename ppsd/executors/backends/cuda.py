"""The CUDA backends: one-token steps and stacked slots captured once as CUDA graphs and replayed,
timed by CUDA events placed on the run's clock by one stamp per run.

Boundary: capture, replay, streams, events and the pinned copy out; what a step computes is
`StageSteps`'s and `SlotStep`'s. They run only on a GPU (`tools/device_check.sh` runs their tests).

`CudaGraphStages` (graphed): a one-token step is captured once per (stage, bucket, drafting), each
stage in a memory pool of its own (their graphs replay at once), and a slot replays its stages on
one stream per stage from this one thread. A call makes one pinned non-blocking copy in (the token
and the positions), one copy out (the argmax ids) and one host wait. Pieces wider than one token
(the prefill, EESD's verification) run the same step eagerly, on the stage's stream.

`CudaGraphSlots` (stacked): a slot is a CUDA graph per (parity, bucket, live rows, drafting), all
in one memory pool (its graphs replay one after another on one stream, never at once); its ids
are copied out, pinned and non-blocking, behind its graph, and read after a wait for it alone.
"""

from __future__ import annotations

import torch

from ...static_cache import bucket_for, buckets_to
from ...trace import Stopwatch
from .. import schedule
from ..base import Feed
from ..graphed_steps import Done, Launch, StageSteps
from ..stacked_step import SlotOutput, SlotStep, Span


class _RunClock:
    """CUDA events placed on the run's clock: one stamp per run (a device-wide sync per event would
    serialise the streams)."""

    def __init__(self) -> None:
        self._origin = torch.cuda.Event(enable_timing=True)
        self._origin_at = 0.0

    def begin(self, stopwatch: Stopwatch) -> None:
        self._origin.record()
        self._origin.synchronize()
        self._origin_at = stopwatch.now()

    def at(self, event) -> float:
        return self._origin_at + self._origin.elapsed_time(event) / 1e3


class CudaGraphStages:
    """The graphed executor's one-token steps as CUDA graphs, a stream and a memory pool per stage."""

    concurrent = True

    def __init__(self, steps: StageSteps) -> None:
        num_stages = len(steps.partition)
        self.steps, self.device = steps, steps.device
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, tuple]] = {}
        self._streams = [torch.cuda.Stream(self.device) for _ in range(num_stages)]
        self._pools = [torch.cuda.graph_pool_handle() for _ in range(num_stages)]
        self._marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in range(num_stages)]
        self._clock = _RunClock()
        self._done = torch.cuda.Event()
        self._host_out = torch.zeros(0, dtype=torch.long)

    def begin(self, stopwatch: Stopwatch) -> None:
        self._clock.begin(stopwatch)

    def end(self) -> None:
        pass

    def close(self) -> None:
        self.graphs.clear()

    def grown(self) -> None:
        self.graphs.clear()  # captured against the old buffers

    def prepare(self, length: int) -> None:
        """Every stage's one-token step captured at every bucket a run writing [0, length) reads,
        drafting or not: no capture then lands in a timed run."""
        for bucket in buckets_to(length):
            for k in range(len(self.steps.partition)):
                for draft in (True, False):
                    if (k, bucket, draft) not in self.graphs:
                        self.graphs[(k, bucket, draft)] = self._capture(k, bucket, draft)

    def ready(self, actions: tuple[schedule.Action, ...]) -> list:
        """Each one-token action's graph (captured on first use), host lengths advanced; None for
        a wider piece (run eagerly at launch)."""
        return [self._graph(a) if a.item.width == 1 else None for a in actions]

    def _graph(self, action: schedule.Action):
        k, item = action.index, action.item
        self.steps.cache.advance(self.steps.partition[k], item.position, item.width)
        key = (k, bucket_for(item.position + 1), action.kind == "draft")
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        return self.graphs[key]

    def launch(self, work: Launch, feed: Feed | None) -> Done:
        """`work`'s graph replayed on its stage's stream, or its step run eagerly there; done once
        `join` has joined the stream."""
        action, hidden, graph = work
        k = action.index
        begun, ended = self._marks[k]
        stream = self._streams[k]
        if graph is not None and hidden is not None:
            self.steps.set_stage_input(k, hidden)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            begun.record(stream)
            if graph is not None:
                graph[0].replay()
                out = graph[1]
            else:
                if hidden is not None:
                    hidden.record_stream(stream)  # made on another stream
                out = self.steps.run_now(action, hidden, feed, self.steps.static_step)
            ended.record(stream)
        return Done(action, *out, begun, ended, replayed=graph is not None)

    def at_once(self, work: list[Launch], feed: Feed | None) -> list[Done]:
        """A slot's actions: the launches return at once, each stage on its stream."""
        return [self.launch(w, feed) for w in work]

    def join(self, done: list[Done]) -> None:
        """This thread's stream waits for the stages' streams, where their outputs are read next."""
        caller = torch.cuda.current_stream()
        for d in done:
            caller.wait_stream(self._streams[d.action.index])
            if not d.replayed:
                for t in (d.hidden, d.logits, d.best):
                    if t is not None:
                        t.record_stream(caller)  # made on the stage's stream

    def read(self, bests: list[torch.Tensor]) -> list[int]:
        """Every argmax in one pinned copy, after one wait."""
        packed = torch.cat(bests) if bests else None
        if packed is not None:
            if self._host_out.numel() < packed.numel():
                self._host_out = torch.zeros(bucket_for(packed.numel()), dtype=torch.long, pin_memory=True)
            self._host_out[:packed.numel()].copy_(packed, non_blocking=True)
        self._done.record()
        self._done.synchronize()
        return self._host_out[:packed.numel()].tolist() if packed is not None else []

    def times(self, done: Done) -> tuple[float, float]:
        return self._clock.at(done.start), self._clock.at(done.end)

    def _capture(self, k: int, bucket: int, draft: bool):
        """Stage k's one-token step at `bucket`, captured in the stage's own memory pool."""
        torch.cuda.synchronize(self.device)
        # Warm-up runs write their keys at the bucket's last position: at or past stage k's
        # length, so stale (masked, and overwritten before any query reads it).
        self.steps.set_stale_position(k, bucket)
        stream = self._streams[k]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # lazy initialisation (cuBLAS handles, workspaces) outside the capture
                self.steps.static_step(k, bucket, draft)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pools[k], stream=stream):
            outputs = self.steps.static_step(k, bucket, draft)
        torch.cuda.synchronize(self.device)
        return graph, outputs


class CudaGraphSlots:
    """The stacked executor's slots as CUDA graphs, two parities of events and pinned ids."""

    def __init__(self, step: SlotStep) -> None:
        self.step, self.device = step, step.device
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, SlotOutput]] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self._marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(2)]
        self._done = [torch.cuda.Event() for _ in range(2)]
        self._clock = _RunClock()
        with torch.inference_mode(False):  # static buffers outlive any one run's inference mode
            self._host_out = [torch.zeros(2, dtype=torch.long, pin_memory=True) for _ in range(2)]

    def begin(self, stopwatch: Stopwatch) -> None:
        self._clock.begin(stopwatch)

    def close(self) -> None:
        self.graphs.clear()

    def grown(self) -> None:
        """Drop the graphs captured against the old cache, once the device is done with them (a
        slot may still be running)."""
        if self.graphs:
            torch.cuda.synchronize(self.device)
            self.graphs.clear()

    def launch(self, parity: int, bucket: int, live: tuple[int, ...], draft: bool) -> tuple[SlotOutput, Span]:
        """The slot's graph replayed (captured on first use), its ids copied out behind it."""
        key = (parity, bucket, live, draft)
        if key not in self.graphs:
            self.graphs[key] = self._capture(*key)
        begun, ended = self._marks[parity]
        begun.record()
        self.graphs[key][0].replay()
        ended.record()
        out = self.graphs[key][1]
        if out.best is not None:
            self._host_out[parity][:out.best.numel()].copy_(out.best, non_blocking=True)
        self._done[parity].record()
        return out, Span(begun, ended)

    def settle(self, parity: int) -> None:
        self._done[parity].synchronize()

    def read(self, parity: int, best: torch.Tensor) -> list[int]:
        self._done[parity].synchronize()
        return self._host_out[parity][:best.numel()].tolist()

    def times(self, span: Span) -> tuple[float, float]:
        return self._clock.at(span.start), self._clock.at(span.end)

    def _capture(self, parity: int, bucket: int, live: tuple[int, ...], draft: bool):
        """The slot's step captured: warmed up on a side stream with this slot's own inputs (it
        writes what the replay writes again), then captured in the backend's one memory pool."""
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # lazy initialisation (cuBLAS handles, workspaces) outside the capture
                self.step.run(parity, bucket, live, draft)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs = self.step.run(parity, bucket, live, draft)
        return graph, outputs

"""The CUDA backends: a stream per stage, timed by CUDA events placed on the run's clock by one
stamp per run; one-token steps and stacked slots captured once as CUDA graphs and replayed.

Boundary: streams, events, capture, replay and the pinned copy out; what a step computes is
`StageSteps`'s and `SlotStep`'s. They run only on a GPU (`tools/device_check.sh` runs their tests).

`Streams` (where): a slot's stages each launched on a stream of their own, from this thread (the
captured steps) or from stage threads (the threads kind); the caller's stream waits for them only
once all are launched (joining each as it was launched serialised them). A call makes one pinned
non-blocking copy in (the token and the positions, `StageSteps.set_inputs`), one copy out (the
argmax ids) and one host wait.

`CudaGraphStep` (how): a one-token step captured once per (stage, bucket, drafting), each stage in
a memory pool of its own, so different stages' graphs can replay at once. Pieces wider than one
token (the prefill, EESD's verification) run the same step eagerly.

`CudaGraphSlots` (stacked): a slot is a CUDA graph per (parity, bucket, live rows, drafting), all
in one memory pool (its graphs replay one after another on one stream, never at once); its ids
are copied out, pinned and non-blocking, behind its graph, and read after a wait for it alone.
"""

from __future__ import annotations

import torch

from ...static_cache import bucket_for, buckets_to
from ...trace import Stopwatch
from .. import schedule
from ..stacked_step import SlotOutput, SlotStep, Span
from ..stage_steps import Done, StageSteps, StepResult
from . import Job, Ran
from .stage_threads import HERE, Here, OnPool, StageThreads


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


class Streams(OnPool):
    """Each of `num_stages` stages on a CUDA stream of its own, launched from `pool`'s threads (a
    slot's launches return at once, each stage on its stream)."""

    concurrent = True

    def __init__(self, device: str, num_stages: int, pool: Here | StageThreads = HERE) -> None:
        self.pool = pool
        self.streams = [torch.cuda.Stream(device) for _ in range(num_stages)]
        self._marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in range(num_stages)]
        self._clock = _RunClock()
        self._done = torch.cuda.Event()
        self._host_out = torch.zeros(0, dtype=torch.long)

    def begin(self, stopwatch: Stopwatch) -> None:
        self._clock.begin(stopwatch)
        self.pool.begin()

    def launch(self, job: Job) -> Ran:
        """`job` on its stage's stream, after what the caller's stream has queued; done once `join`
        has joined the stream."""
        stream, (begun, ended) = self.streams[job.k], self._marks[job.k]
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            if job.hidden is not None:
                job.hidden.record_stream(stream)  # made on another stream
            begun.record(stream)
            out = job.compute()
            ended.record(stream)
        return out, begun, ended

    def join(self, done: list[Done]) -> None:
        """This thread's stream waits for the stages' streams, where their outputs are read next."""
        caller = torch.cuda.current_stream()
        for d in done:
            caller.wait_stream(self.streams[d.action.index])
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


class CudaGraphStep:
    """The one-token steps as CUDA graphs, captured on first use, a memory pool per stage."""

    reuses_outputs = True

    def __init__(self, steps: StageSteps) -> None:
        num_stages = len(steps.partition)
        self.steps, self.device = steps, steps.device
        self.graphs: dict[tuple[int, int, bool], tuple[torch.cuda.CUDAGraph, StepResult]] = {}
        self._pools = [torch.cuda.graph_pool_handle() for _ in range(num_stages)]
        self._capturing = torch.cuda.Stream(self.device)

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
                    self._graph(k, bucket, draft)

    def ready(self, actions: tuple[schedule.Action, ...]) -> None:
        """Each one-token action's graph captured (before the inputs are set: a capture writes them)."""
        for a in actions:
            if a.item.width == 1:
                self._graph(a.index, bucket_for(a.item.position + 1), a.kind == "draft")

    def one_token(self, k: int, bucket: int, draft: bool) -> StepResult:
        graph, outputs = self.graphs[(k, bucket, draft)]
        graph.replay()
        return outputs

    def anywhere(self, actions: tuple[schedule.Action, ...]) -> bool:
        return True  # a replay captures nothing

    def _graph(self, k: int, bucket: int, draft: bool) -> None:
        if (k, bucket, draft) not in self.graphs:
            self.graphs[(k, bucket, draft)] = self._capture(k, bucket, draft)

    def _capture(self, k: int, bucket: int, draft: bool):
        """Stage k's one-token step at `bucket`, captured in the stage's own memory pool."""
        torch.cuda.synchronize(self.device)
        # Warm-up runs write their keys at the bucket's last position: at or past stage k's
        # length, so stale (masked, and overwritten before any query reads it).
        self.steps.set_stale_position(k, bucket)
        stream = self._capturing
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

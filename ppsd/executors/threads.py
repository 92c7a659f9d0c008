"""`ThreadedExecutor`: every stage in this process, each on a thread of its own, at once.

Boundary: the same `schedule` plans as `InProcessExecutor`, on the same model and KV cache (each
stage writes only its own layers), with one difference: in a `slot` the stages compute at the same
time, stage 1 on the caller's thread and stage k on a thread kept for it, each with one intra-op
thread (torch releases the GIL inside its kernels) and, where the OS allows, on a core of its own.
So its trace is measured and concurrent, with nothing sent between processes. It starts no child
process, so it runs where worker processes cannot (a daemonic process, as a ZeroGPU call is).
`push` and `flow` chain stages within one call, so they run as in `InProcessExecutor`.

On a GPU, stages overlap only as kernels on separate CUDA streams: each stage gets a stream of
its own, a slot's streams start after the caller's stream and it waits for all of them before
the slot returns, and each stage is timed by CUDA events on its stream (a device-wide sync per
stamp would serialise the streams), placed on the run's clock by one stamp per slot. Every
tensor one stream hands to another is marked as used there (`record_stream`), so the caching
allocator cannot give its memory away while a kernel still reads it.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from ..model import StagedModel
from ..trace import Stopwatch
from . import schedule
from .base import Feed, Output
from .local import InProcessExecutor


class ThreadedExecutor(InProcessExecutor):
    """All stages here; within a slot, at once, each on its own thread (and core, where it can)."""

    concurrent = True

    def __init__(self, model: StagedModel, partition: tuple[range, ...], stopwatch: Stopwatch | None = None) -> None:
        device = model.info.device
        if not device.startswith(("cpu", "cuda")):
            raise ValueError(f"the threads executor runs on CPU or CUDA, not {device}: use one process "
                             "(projected clock)")
        super().__init__(model, partition, stopwatch or Stopwatch())
        self._streams = [torch.cuda.Stream(device) for _ in partition] if device.startswith("cuda") else None
        self.threads = StageThreads(len(partition))

    @property
    def cores(self) -> list[set[int]] | None:
        return self.threads.cores

    def begin(self, stopwatch: Stopwatch) -> None:
        """One run at a time: a second waits. The caller's thread becomes stage 1's (one intra-op
        thread, its core) until `end`."""
        self.threads.begin()
        try:
            super().begin(stopwatch)
        except BaseException:
            self.threads.end()
            raise

    def end(self) -> None:
        self.threads.end()

    def close(self) -> None:
        self.threads.close()

    def __enter__(self) -> "ThreadedExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def slot(self, feed: Feed | None, *, slot: int) -> Output:
        plan = schedule.slot(self._queues, feed)
        # A slot's stages take what earlier calls queued for them, so every input is taken
        # before any stage runs, and every output delivered after all have run.
        work = [(action, self._waiting.take(action)) for action in plan.actions]
        compute = self._compute if self._streams is None else self._compute_on_stream
        timing = _SlotTiming(self._streams, self._clock)
        running = {action.index: self.threads.submit(action.index, compute, action, hidden, feed, slot)
                   for action, hidden in work if action.index > 0}
        here = {action.index: compute(action, hidden, feed, slot) for action, hidden in work if action.index == 0}
        done = timing.finish({**here, **{k: future.result() for k, future in running.items()}})
        results: dict = {}
        events = [self._deliver(action, done[action.index], results) for action, _ in work]
        self._queues = plan.queues
        return Output(tuple(events), **results)

    def _compute_on_stream(self, action: schedule.Action, hidden: torch.Tensor | None, feed: Feed | None,
                           slot: int | None) -> tuple:
        """`_compute` on stage k's CUDA stream, bracketed by CUDA events instead of clock stamps
        (`_SlotTiming.finish` turns them into the event)."""
        stream = self._streams[action.index]
        with torch.cuda.stream(stream):
            if hidden is not None:
                hidden.record_stream(stream)  # made on the stream of the stage before
            begun, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begun.record(stream)
            hidden, logits = self._layers(action, hidden, feed)
            ended.record(stream)
        return hidden, logits, (action, slot, begun, ended)


class _SlotTiming:
    """On CUDA, one slot's streams start after the caller's stream and it waits for all of them
    at `finish`, which also turns each stage's CUDA events into its event on the run's clock; on
    CPU it does nothing."""

    def __init__(self, streams: list | None, clock: Stopwatch) -> None:
        self.streams = streams
        if streams is None:
            return
        self.caller = torch.cuda.current_stream(streams[0].device)
        self.mark = torch.cuda.Event(enable_timing=True)
        self.mark.record(self.caller)
        self.at = clock.now()  # synchronises the device: `mark` has been reached, at about this time
        for stream in streams:
            stream.wait_stream(self.caller)

    def finish(self, done: dict[int, tuple]) -> dict[int, tuple]:
        if self.streams is None:
            return done
        for stream in self.streams:
            self.caller.wait_stream(stream)
        timed = {}
        for k, (hidden, logits, (action, slot, begun, ended)) in done.items():
            ended.synchronize()
            for tensor in (hidden, logits):
                if tensor is not None:
                    tensor.record_stream(self.caller)  # read next on the caller's stream or another stage's
            timed[k] = (hidden, logits, action.event(self.at + self.mark.elapsed_time(begun) / 1e3,
                                                     self.at + self.mark.elapsed_time(ended) / 1e3, slot))
        return timed


class StageThreads:
    """A thread for each of stages 2..K and, while a run lasts, the caller's thread as stage 1's:
    each with one intra-op thread and, where the process may use K cores, a core of its own. One
    run at a time: `begin` waits for the run before to `end`."""

    def __init__(self, num_stages: int) -> None:
        self.cores = _stage_cores(num_stages)
        self._stages = [ThreadPoolExecutor(1, f"ppsd-stage-{k + 1}", initializer=_pin, initargs=(self.cores, k))
                        for k in range(1, num_stages)]
        self._run_lock = threading.Lock()
        self._caller: tuple[int, set[int] | None] | None = None  # intra-op threads and cores to give back

    def begin(self) -> None:
        self._run_lock.acquire()
        try:
            self._caller = (torch.get_num_threads(), _affinity())
            _pin(self.cores, 0)
        except BaseException:
            self._run_lock.release()
            raise

    def end(self) -> None:
        if self._caller is not None:
            threads, cores = self._caller
            torch.set_num_threads(threads)
            if cores is not None:
                os.sched_setaffinity(0, cores)
            self._caller = None
        self._run_lock.release()

    def submit(self, k: int, fn, *args):
        """`fn(*args)` on stage k's thread (k >= 1), under the caller's inference and grad modes."""
        modes = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())  # thread-local: passed on
        return self._stages[k - 1].submit(_in_modes, modes, fn, *args)

    def close(self) -> None:
        for stage in self._stages:
            stage.shutdown(wait=True)


def _in_modes(modes: tuple[bool, bool], compute, *args):
    """`compute(*args)` under the caller's inference and grad modes, which torch keeps per thread."""
    inference, grad = modes
    with torch.inference_mode(inference), torch.set_grad_enabled(grad):
        return compute(*args)


def _stage_cores(num_stages: int) -> list[set[int]] | None:
    """A core for each stage when this process may use at least K, else None (threads roam)."""
    cores = sorted(_affinity() or ())
    if len(cores) < num_stages:
        return None
    return [{cores[k]} for k in range(num_stages)]


def _affinity() -> set[int] | None:
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None


def _pin(cores: list[set[int]] | None, k: int) -> None:
    """Keep the calling thread to stage k's core (Linux: affinity is per thread) with one intra-op
    thread: two stages on one core would take turns instead of overlapping."""
    torch.set_num_threads(1)
    if cores is not None:
        os.sched_setaffinity(0, cores[k])
